"""decisionkit: decision models for a course. One forward pass, pooled, answers every typed question."""

from . import plots  # dk.plots.notebook_setup() in every notebook's first cell
from ._version import __version__
from .backbone import Backbone, LoraSettings, QuantSettings, load_backbone, resolve_backbone
from .data import Case, DataError, Question, Split, load_typed_decisions, render_state, token_lengths
from .features import FeatureSpec, extract_features
from .model import DecisionModel, load
from .pooling import POOLINGS, pool
from .presets import PRESETS, Preset, preset
from .systemone import QuestionError
from .training import evaluate, train

__all__ = [
    "__version__", "plots", "Backbone", "Case", "DataError", "DecisionModel", "FeatureSpec", "LoraSettings", "POOLINGS", "PRESETS", "Preset",
    "QuantSettings", "Question", "QuestionError", "Split", "evaluate", "extract_features", "load", "load_backbone",
    "load_typed_decisions", "pool", "preset", "render_state", "resolve_backbone", "token_lengths", "train",
]
