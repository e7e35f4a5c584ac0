"""decisionkit: decision models for a course. One forward pass, pooled, answers every typed question."""

__version__ = "0.1.0"

from . import plots  # noqa: E402  (dk.plots.notebook_setup() in every notebook's first cell)
from .backbone import Backbone, LoraSettings, QuantSettings, load_backbone, resolve_backbone  # noqa: E402
from .data import Case, DataError, Question, Split, load_typed_decisions, render_state, token_lengths  # noqa: E402
from .features import extract_features  # noqa: E402
from .model import DecisionModel, FeatureSpec, QuestionError, load  # noqa: E402
from .pooling import POOLINGS, pool  # noqa: E402
from .training import PRESETS, Preset, evaluate, preset, train  # noqa: E402

__all__ = [
    "plots", "Backbone", "Case", "DataError", "DecisionModel", "FeatureSpec", "LoraSettings", "POOLINGS", "PRESETS", "Preset",
    "QuantSettings", "Question", "QuestionError", "Split", "evaluate", "extract_features", "load", "load_backbone",
    "load_typed_decisions", "pool", "preset", "render_state", "resolve_backbone", "token_lengths", "train",
]
