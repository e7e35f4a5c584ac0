"""What a server serves: the saved models it is given, each checked once, at start, in the process that starts the
server and before any worker is started (``catalog``): its config read and checked as loading reads it, and the files
it names present. A model that fails is refused there, in one line that names it and why (``decisionkit serve``
prints it and exits with status 2); ``GET /health`` and ``GET /v1/models`` answer from the configs read then.

What only loading shows (a truncated or corrupt tensor file, a backbone that is not there) is found by the inference
worker, which sends its one line back (``app.SystemOneAPI.setup``).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Sequence

from ..contract.systemone import ModelMetadata, ModelMetadataList
from ..core.errors import UserError, one_line
from ..loop.promotion import served_folder
from ..model.features import FeatureSpec
from ..model.saving import CONFIG_FILE, ModelConfig, missing_files, schema_from_json


class UnservableModel(UserError, ValueError):
    """A model the server cannot serve: its message names the model and why, on one line."""


class Catalog(dict):
    """Model name (the run folder's name) -> the folder that answers for it (the run, or the run promoted over it:
    ``promotion.served_folder``), ``asked``: name -> the run folder given, and ``configs``: each model's config, as
    read and checked at start."""

    def __init__(self, folders: dict[str, Path], configs: dict[str, ModelConfig], asked: dict[str, Path] | None = None):
        super().__init__(folders)
        self.configs = configs
        self.asked = dict(folders) if asked is None else asked


def checked(run: Path) -> ModelConfig:
    """The config of the model saved in ``run``, read and checked (its format, fields, features and questions), and
    the files it names present (the heads; a LoRA model's adapter weights; a tuned backbone)."""
    try:
        config = ModelConfig.read(run)
        FeatureSpec.from_json(config.features)
        schema_from_json(config.schema)
        missing = missing_files(run, config)
        if missing:
            raise FileNotFoundError(f"{', '.join(missing)} not found in {run}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UnservableModel(f"model {run.name!r} ({run}) cannot be served: {one_line(err)}") from None
    return config


def catalog(runs: Sequence[str | Path]) -> Catalog:
    """The saved models in ``runs`` by name (each run's folder name, whichever run is promoted over it), each
    ``checked``; two folders of one name are refused."""
    folders: dict[str, Path] = {}
    asked: dict[str, Path] = {}
    configs: dict[str, ModelConfig] = {}
    for run in (Path(r).expanduser() for r in runs):
        if run.name in folders:
            raise UnservableModel(f"two models are named {run.name!r} ({asked[run.name]} and {run}); rename one "
                                  "folder")
        try:
            folder = served_folder(run)
        except UserError as err:
            raise UnservableModel(f"model {run.name!r} ({run}) cannot be served: {one_line(err)}") from None
        asked[run.name], folders[run.name], configs[run.name] = run, folder, checked(folder)
    return Catalog(folders, configs, asked)


def model_list(models: Catalog) -> ModelMetadataList:
    """``GET /v1/models``: name, what each model answers, and the day it was saved."""
    entries = []
    for name, run in models.items():
        config = models.configs[name]
        questions = sum(len(qs) for qs in config.schema.values())
        saved = datetime.date.fromtimestamp((run / CONFIG_FILE).stat().st_mtime).isoformat()
        entries.append(ModelMetadata(name=name, release_date=saved, description=(
            f"decision model on {config.backbone['name']}: {questions} questions in {len(config.schema)} "
            f"workflow(s) ({', '.join(config.schema)}); reads at most {_reads(config)}")))
    return ModelMetadataList(models=entries)


def _reads(config: ModelConfig) -> str:
    """How much of a state a saved model reads, in words: its cap on tokens, in windows of its length."""
    spec = FeatureSpec.from_json(config.features)
    return f"{spec.max_tokens} tokens ({spec.max_windows} windows of {spec.max_length})"


def health(models: Catalog) -> dict:
    """``GET /health``: status, and each model's backbone, workflows with their questions, token limit, routing."""
    described = {}
    for name, config in models.configs.items():
        spec = FeatureSpec.from_json(config.features)
        described[name] = {"backbone": config.backbone["name"], "workflows": config.schema,
                           "max_tokens": spec.max_tokens, "window_tokens": spec.max_length,
                           "routing": config.router is not None}
    return {"status": "ok", "models": described}
