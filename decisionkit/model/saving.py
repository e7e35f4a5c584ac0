"""Saving and loading a decision model: the files of a run folder, written atomically.

``save(model, path)`` writes the model into a folder: ``decisionkit.json`` (backbone id and weights checksum,
rendering version, feature settings, question schemas, temperatures, how the heads were fitted, routing threshold,
a hybrid's fields and mixing weights), ``heads.safetensors`` (the heads and the feature standardization, with the
router's feature density when there is one and a hybrid's trees as arrays) and, for LoRA models, ``adapter/``; for a
fully fine-tuned model, the tuned backbone itself in ``backbone/`` (safetensors, with its tokenizer). A crash
mid-save leaves the previous save whole, and whatever else the folder held (the training history, reports, a
checkpoint: the run folder's other files, named below) is carried over.

Beside it, a trained run keeps what it was trained on (``write_data``): ``data.json`` (the source, a hash of the rows,
the rows per split and workflow, the schema, how the splits were made) and ``test.jsonl`` (its test rows, so
``decisionkit evaluate DIR`` scores them wherever the source went; ``held_out_rows``). ``recorded_split`` reads
another split back from the recorded source, refusing rows that changed since.

``model.load(path)`` opens a saved model as it was trained: ``ModelConfig.read`` checks the folder's format and
rendering version, ``saved_backbone`` says which backbone to load and how (its revision, 4-bit settings and compute
dtype), ``check_backbone`` refuses weights other than the trained ones, and ``restore`` puts the saved state into
the new model (a LoRA model's adapter weights too: a folder without them is refused, not answered by untrained
adapters).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .._version import __version__
from ..core.atomic import atomic_folder, link_or_copy, write_text
from ..core.errors import MissingFile, ModelFolderError, RunError
from ..data.cases import RENDER_VERSION, Case, Split, jsonl_rows
from ..data.decisions import Decisions, load_decisions
from ..data.questions import DataError, Question, schema_json
from ..data.states import DIGEST_CHARS
from ..data.tables import IN_MEMORY
from .backbone import LoraSettings, QuantSettings
from .checksums import weights_sha256
from .fitting import HeadRecipe
from .heads import Temperatures
from .routing import Router
from .structured import StructuredPart

# The model's files
CONFIG_FILE = "decisionkit.json"
HEADS_FILE = "heads.safetensors"
ADAPTER_DIR = "adapter"
ADAPTER_FILE = "adapter_model.safetensors"  # in ADAPTER_DIR: the trained LoRA weights (peft's name)
BACKBONE_DIR = "backbone"  # a fully fine-tuned backbone, saved whole
MODEL_ITEMS = {CONFIG_FILE, HEADS_FILE, ADAPTER_DIR, BACKBONE_DIR}  # what a save writes; the rest of the folder stays
FORMAT_VERSION = 1  # bump when the saved layout changes
# What a run writes beside the model
HISTORY_FILE = "history.json"  # training.train: the training curves, time, memory, what stage 1 chose
REPORT_FILE = "report.json"  # every metric of a run report; written last, so its presence means "complete"
REPORT_PAGE = "report.md"  # the same report, readable
DECISIONS_FILE = "decisions.csv"  # one row per decision the report scored
CHECKPOINT_DIR = "checkpoint"  # the last evaluated step of fine-tuning, for resuming; removed once it finishes
DATA_FILE = "data.json"  # what the model was trained on: source, hash of the rows, rows per split and workflow, schema
HELD_OUT_FILE = "test.jsonl"  # its test rows, in the benchmark's row shape: `decisionkit evaluate DIR` scores them
ROWS_FILE = "rows.json"  # the digest of every row's state, per split: `evaluate --data` leaves out what it trained on
EVALUATION_PREFIX = "eval-"  # decisionkit evaluate writes eval-WHAT.json beside the model
# Everything a run writes in its folder: a new run into the folder replaces these and keeps the rest
RUN_ITEMS = MODEL_ITEMS | {HISTORY_FILE, REPORT_FILE, REPORT_PAGE, DECISIONS_FILE, CHECKPOINT_DIR, DATA_FILE,
                           HELD_OUT_FILE, ROWS_FILE}


def is_run_item(name: str) -> bool:
    """True for a file or folder a training run (or ``decisionkit evaluate``) writes in a run folder."""
    return name in RUN_ITEMS or (name.startswith(EVALUATION_PREFIX) and name.endswith(".json"))


def schema_from_json(obj: dict) -> dict[str, dict[str, Question]]:
    return {wf: {qid: Question.from_json(qid, q, "saved schema") for qid, q in qs.items()} for wf, qs in obj.items()}


@dataclass
class ModelConfig:
    """What ``decisionkit.json`` holds: every part of a model but its tensors, one field per part (the parts' own
    settings as their ``config()`` / ``to_json()`` write them)."""

    # name, weights_sha256, quantize, lora, tuned (and tuned_sha256: the tuned weights in backbone/); revision and
    # compute_dtype since they are kept (``saved_backbone``: a folder saved before has neither)
    backbone: dict
    features: dict  # FeatureSpec
    schema: dict  # workflow -> question id -> question
    temperatures: dict[str, float]  # per question type, for the probabilities
    confidence_temperatures: dict[str, float] | None  # for the confidence field, when fitted apart
    head_fit: dict | None  # HeadRecipe: how stage 1 fitted the heads
    router: dict | None  # Router
    structured: dict | None  # StructuredPart: a hybrid's fields, trees, lexical part and weights
    format: int = FORMAT_VERSION
    decisionkit: str = __version__
    render_version: str = RENDER_VERSION

    @classmethod
    def of(cls, model) -> ModelConfig:
        backbone = model.backbone
        return cls(
            backbone={**(model.base or {"name": backbone.name, "weights_sha256": backbone.checksum,
                                        "revision": backbone.resolved.revision}),
                      "compute_dtype": backbone.precision.dtype,
                      "quantize": asdict(backbone.quantize) if backbone.quantize else None,
                      "lora": asdict(backbone.lora) if backbone.lora else None, "tuned": model.tuned},
            features=model.spec.to_json(), schema=schema_json(model.schema),
            temperatures=dict(model.temperatures.probabilities), confidence_temperatures=model.temperatures.confidence,
            head_fit=asdict(model.head_recipe) if model.head_recipe is not None else None,
            router=model.router.config() if model.router is not None else None,
            structured=model.structured.config() if model.structured is not None else None)

    @classmethod
    def read(cls, path: Path) -> ModelConfig:
        """The ``decisionkit.json`` of the folder ``path``, in a format and rendering this decisionkit reads."""
        config_path = path / CONFIG_FILE
        if not config_path.is_file():
            raise MissingFile(f"{config_path} not found: {path} is not a saved decision model")
        saved = json.loads(config_path.read_text(encoding="utf-8"))
        if saved.get("format") != FORMAT_VERSION:
            raise ModelFolderError(f"{config_path}: format {saved.get('format')!r}; this decisionkit reads {FORMAT_VERSION}")
        if saved.get("render_version") != RENDER_VERSION:
            raise ModelFolderError(f"{config_path}: rendering {saved.get('render_version')!r}; this decisionkit renders "
                             f"{RENDER_VERSION!r}")
        expected = {f.name for f in fields(cls)}
        if set(saved) != expected:
            raise ModelFolderError(f"{config_path}: fields {sorted(set(saved) ^ expected)} differ from format "
                             f"{FORMAT_VERSION}'s; expected exactly {sorted(expected)}")
        return cls(**saved)

    def to_json(self) -> dict:
        return asdict(self)


def save(model, path: str | Path) -> Path:
    """Write ``model`` into the folder ``path`` atomically, keeping whatever else the folder held."""
    path = Path(path)
    with atomic_folder(path) as scratch:
        tensors = {f"heads.{k}": v.detach().cpu().contiguous() for k, v in model.heads.state_dict().items()}
        tensors["feature_mean"] = model.feature_mean.cpu()
        tensors["feature_std"] = model.feature_std.cpu()
        if model.router is not None:
            tensors.update(model.router.density.tensors())
        if model.structured is not None:
            tensors.update({k: torch.from_numpy(v) for k, v in model.structured.tensors().items()})
        save_file(tensors, scratch / HEADS_FILE)
        if model.backbone.lora is not None:
            model.backbone.model.save_pretrained(scratch / ADAPTER_DIR, safe_serialization=True)
        saved = ModelConfig.of(model)
        if model.tuned:
            model.backbone.model.save_pretrained(scratch / BACKBONE_DIR, safe_serialization=True)
            model.backbone.tokenizer.save_pretrained(scratch / BACKBONE_DIR)
            saved.backbone["tuned_sha256"] = weights_sha256(scratch / BACKBONE_DIR)
        (scratch / CONFIG_FILE).write_text(json.dumps(saved.to_json(), indent=2), encoding="utf-8")
        if path.exists():
            _carry_over(path, scratch)
    return path


def _carry_over(previous: Path, new: Path) -> None:
    """Hard-link into ``new`` whatever ``previous`` holds besides a model (training history, reports, a checkpoint):
    saving a model again must not delete the rest of its folder. Links cost no copy and leave ``previous`` whole
    until the swap; a filesystem without them gets copies (``link_or_copy``)."""
    for item in previous.iterdir():
        if item.name in MODEL_ITEMS:
            continue
        if item.is_dir():
            shutil.copytree(item, new / item.name, copy_function=link_or_copy)
        else:
            link_or_copy(item, new / item.name)


def export(run: str | Path, dest: str | Path) -> Path:
    """Write the model of the run folder ``run`` alone into the new folder ``dest``: its config, heads and any adapter
    or tuned backbone (``MODEL_ITEMS``), none of what the run kept of its data (``test.jsonl``, ``rows.json``,
    ``data.json`` with the source's path, ``decisions.csv``, the reports). ``decisionkit.load`` and
    ``decisionkit serve`` read it as they read the run. ``dest`` must not exist, or be an empty folder."""
    run, dest = Path(run).expanduser(), Path(dest).expanduser()
    saved = ModelConfig.read(run)
    lacking = missing_files(run, saved)
    if lacking:
        raise ModelFolderError(f"{run} lacks {', '.join(lacking)}: not a whole model, nothing to export")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RunError(f"{dest} exists and is not empty; export writes a new folder and never over files")
    with atomic_folder(dest) as scratch:
        for name in sorted(MODEL_ITEMS):
            if (run / name).is_dir():
                shutil.copytree(run / name, scratch / name, copy_function=link_or_copy)
            elif (run / name).is_file():
                link_or_copy(run / name, scratch / name)
    return dest


def model_version(path: str | Path) -> str:
    """The version of the model saved in ``path``: the first 12 hex digits of a SHA-256 over its files (the config,
    the heads, a LoRA adapter, a tuned backbone), each by its name in the folder. Two folders holding the same model
    have the same version; a new save has another. The decision log keeps it beside every answer."""
    import hashlib

    path, digest = Path(path), hashlib.sha256()
    files = [path / CONFIG_FILE, path / HEADS_FILE,
             *(f for d in (ADAPTER_DIR, BACKBONE_DIR) for f in sorted((path / d).rglob("*")) if f.is_file())]
    for file in files:
        if file.is_file():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
            with open(file, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:12]


def missing_files(path: Path, saved: ModelConfig) -> list[str]:
    """What the model saved in ``path`` (``saved``: its config) needs and its folder lacks: the heads, a LoRA model's
    adapter weights, a tuned backbone. A server checks this before it loads anything (``serving.catalog``)."""
    needed = [HEADS_FILE, *([f"{ADAPTER_DIR}/{ADAPTER_FILE}"] if saved.backbone.get("lora") else []),
              *([BACKBONE_DIR] if saved.backbone.get("tuned") else [])]
    return [name for name in needed if not (path / name).exists()]


def load_trained(model, path: str | Path) -> dict:
    """Load the heads, the feature standardization and, for a LoRA model, the adapter weights of a saved folder into
    ``model``; the tensors of ``heads.safetensors`` are returned (a hybrid's trees and a router are in them too).
    A LoRA model's folder without its adapter weights is refused: its adapters would answer untrained."""
    path = Path(path)
    tensors = load_file(str(path / HEADS_FILE))
    model.heads.load_state_dict({k[len("heads."):]: v for k, v in tensors.items() if k.startswith("heads.")})
    model.feature_mean.copy_(tensors["feature_mean"])
    model.feature_std.copy_(tensors["feature_std"])
    adapter = path / ADAPTER_DIR / ADAPTER_FILE
    if model.backbone.lora is not None:
        if not adapter.is_file():
            raise MissingFile(f"{adapter} not found: the model at {path} has LoRA adapters, and without their "
                                    "trained weights it would answer with untrained ones; save the model again")
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model.encoder, load_file(str(adapter)))
    return tensors


def saved_backbone(path: Path, saved: ModelConfig) -> tuple[str | Path, dict]:
    """Where the backbone of the model saved in ``path`` is (its own ``backbone/`` when every weight was tuned, else
    the name it was trained on) and how to load it as trained (``load_backbone``'s keywords): its 4-bit settings
    (not the defaults), its revision (the hub commit or the wheel it came from; a folder has none, its checksum pins
    it) and the compute dtype it was saved under (``precision.as_saved``). A folder saved before these two were kept
    loads as it did then: the hub's current revision, the dtype this machine picks."""
    backbone = saved.backbone
    how = {"quantize": QuantSettings(**backbone["quantize"]) if backbone["quantize"] else None,
           "compute_dtype": backbone.get("compute_dtype")}
    if backbone["tuned"]:
        return path / BACKBONE_DIR, how
    return backbone["name"], {**how, "revision": backbone.get("revision")}


def check_backbone(base, path: Path, saved: ModelConfig) -> None:
    """Refuse a backbone whose weights differ from those the model saved in ``path`` was trained on."""
    backbone = saved.backbone
    expected = backbone["tuned_sha256"] if backbone["tuned"] else backbone["weights_sha256"]
    if base.checksum != expected:
        raise ModelFolderError(f"backbone {base.name!r} has weights sha256 {base.checksum[:16]}…; the model at {path} was "
                         f"trained on {backbone['name']!r} with {expected[:16]}…")


def restore(model, path: Path, saved: ModelConfig) -> None:
    """Put the state saved in ``path`` (``saved``: its config) into ``model``, a new model of the saved backbone,
    schema and feature settings."""
    backbone = saved.backbone
    model.tuned = backbone["tuned"]
    if model.tuned:
        model.base = {"name": backbone["name"], "weights_sha256": backbone["weights_sha256"],
                      "revision": backbone.get("revision")}
    lora = backbone["lora"]
    if lora is not None:
        model.attach_lora(LoraSettings(**{**lora, "target_modules": tuple(lora["target_modules"])}))
    tensors = load_trained(model, path)
    model.temperatures = Temperatures(dict(saved.temperatures), saved.confidence_temperatures)
    model.head_recipe = HeadRecipe(**saved.head_fit) if saved.head_fit else None
    if saved.structured:
        arrays = {k: v.numpy() for k, v in tensors.items() if k.startswith(("structured.", "lexical."))}
        model.structured = StructuredPart.from_saved(saved.structured, arrays)
    if saved.router:
        model.router = Router.from_saved(saved.router, tensors)


def write_data(folder: str | Path, decisions: Decisions, test: Split) -> None:
    """Keep in ``folder`` what a model was trained on (``DATA_FILE``: ``decisions.record``, and the test cases it was
    scored on), those test rows (``HELD_OUT_FILE``) and the digest of every row's state by split (``ROWS_FILE``)."""
    folder = Path(folder)
    rows = "".join(json.dumps(c.to_json(), ensure_ascii=False) + "\n" for c in test)
    write_text(folder / HELD_OUT_FILE, rows)
    write_text(folder / ROWS_FILE, json.dumps({"digest": f"sha256 of each state's canonical JSON, first "
                                                         f"{DIGEST_CHARS} hex digits", **decisions.digests()}))
    write_text(folder / DATA_FILE, json.dumps({**decisions.record, "test cases scored": len(test)}, indent=2,
                                              ensure_ascii=False, default=str))


def seen_rows(folder: str | Path) -> dict[str, set[str]] | None:
    """Split -> the digests of the states a saved run was trained, calibrated and tested on (``ROWS_FILE``); None
    for a folder that keeps none (a model saved by ``fit_model`` alone, or exported)."""
    path = Path(folder) / ROWS_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    return {split: set(saved.get(split, ())) for split in ("train", "validation", "test")}


def data_record(folder: str | Path) -> dict:
    """The ``DATA_FILE`` of a saved run, or a FileNotFoundError saying it has none."""
    path = Path(folder) / DATA_FILE
    if not path.is_file():
        raise MissingFile(f"{path} not found: {folder} keeps no record of its data (a model saved by "
                                "fit_model alone, or before decisionkit recorded it); pass the data to score")
    return json.loads(path.read_text(encoding="utf-8"))


def held_out_rows(folder: str | Path) -> Split:
    """The test rows a trained run kept (``HELD_OUT_FILE``) as a split."""
    data_record(folder)
    path = Path(folder) / HELD_OUT_FILE
    return Split("test", [Case.from_json(row, where) for where, row in jsonl_rows(path)], str(path))


def recorded_split(folder: str | Path, split: str) -> Split:
    """``split`` of the data a run recorded, read again from its source with the same rule; refused when the source
    was in memory, is gone, or holds other rows now (its hash differs)."""
    record = data_record(folder)
    if record["source"].startswith(IN_MEMORY):
        raise ModelFolderError(f"{folder} was trained on data {record['source']}: only its test rows were kept; pass the "
                         f"data to score its {split} split")
    reading = record.get("reading", {"workflow": record.get("workflow")})  # how it was read (older runs: workflow)
    decisions = load_decisions(record.get("source path", record["source"]),
                               record["schema"] if not record.get("benchmark") else None,
                               reading=reading, seed=record.get("seed"), min_train=0)
    if decisions.record["rows sha256"] != record["rows sha256"]:
        raise DataError(f"{record['source']} holds other rows than {folder} was trained on (their hash differs); "
                         "pass the data to score")
    return decisions[split]
