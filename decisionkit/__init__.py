"""decisionkit: decision models for a course. One forward pass, pooled, answers every typed question."""

from .backbone import Backbone, LoraSettings, QuantSettings, load_backbone, resolve_backbone
from .data import Case, DataError, Question, Split, load_typed_decisions, render_state, token_lengths
from .features import extract_features
from .pooling import POOLINGS, pool

__version__ = "0.1.0"

__all__ = [
    "Backbone", "Case", "DataError", "LoraSettings", "POOLINGS", "QuantSettings", "Question", "Split",
    "extract_features", "load_backbone", "load_typed_decisions", "pool", "render_state", "resolve_backbone",
    "token_lengths",
]
