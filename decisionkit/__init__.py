"""decisionkit: decision models for a course. One forward pass, pooled, answers every typed question.

The library is in subpackages, lowest layer first (``tests/test_layers.py`` holds them to it): ``core`` (settings,
atomic saves, the compute dtype, the machine, figures), ``data`` (typed-decisions, the scenarios, the benchmark's
metrics), ``contract`` (System One), ``model`` (what a decision model is made of, loading and answering),
``training`` (presets, the training call, calibration, routing, reports), ``loop`` (the decision log, the review
queue, training on reviews and promoting), ``serving`` (the HTTP server) and
``course`` (the notebooks' labs). The names below are imported from them on first use, so ``import decisionkit``
and ``decisionkit.load`` pull in no training, course or plotting code, and a server starts without them.
"""

from __future__ import annotations

import importlib

from ._version import __version__

# public name -> the module that defines it
_MODULES = {"settings": "core.settings", "plots": "core.plots"}  # dk.settings.quick_mode(), dk.plots.notebook_setup()
_EXPORTS = {
    **dict.fromkeys(["Backbone", "LoraSettings", "QuantSettings", "load_backbone", "resolve_backbone"],
                    "model.backbone"),
    **dict.fromkeys(["Case", "DataError", "Question", "Split", "load_typed_decisions", "render_state",
                     "token_lengths"], "data.cases"),
    "load_scenario": "data.scenarios",
    **dict.fromkeys(["Decisions", "load_decisions"], "data.decisions"),
    **dict.fromkeys(["FeatureSpec", "extract_features"], "model.features"),
    **dict.fromkeys(["DecisionModel", "load"], "model.decision_model"),
    **dict.fromkeys(["POOLINGS", "pool"], "model.pooling"),
    "QuestionError": "contract.systemone",
    **dict.fromkeys(["PRESETS", "Preset", "preset"], "training.presets"),
    "evaluate": "training.evaluation",
    "predict": "model.predict",
    "export": "model.saving",
    "train": "training.pipeline",
    "calibrate": "training.calibration",
    "fit_router": "training.anomaly",
    "serve": "serving.app",
    "DecisionLog": "loop.log",
    **dict.fromkeys(["reviews", "answer"], "loop.reviews"),
    **dict.fromkeys(["promote", "train_with_reviews"], "loop.retrain"),
}

__all__ = ["__version__", *_MODULES, *_EXPORTS]


def __getattr__(name: str):
    from .core.extras import needs_extra

    with needs_extra(f"decisionkit.{name}"):  # dk.serve without the [serve] extra says which to install
        if name in _MODULES:
            value = importlib.import_module(f".{_MODULES[name]}", __name__)
        elif name in _EXPORTS:
            value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        else:
            raise AttributeError(f"module 'decisionkit' has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES) | set(_EXPORTS))
