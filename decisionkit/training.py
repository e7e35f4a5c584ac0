"""Training a decision model: soft-gold cross-entropy, one API, four modes.

- ``heads``: the backbone stays frozen; its pooled features are extracted once (cached on disk) and the heads
  train on them in seconds (stage 1, ``fit_heads``; every mode starts with it). The L2 strength and the number of steps are picked on a dev slice of train; the heads
  are then fitted again on all of train with that choice.
- ``full``:  every backbone weight trains with the heads (stage 2), starting from the stage-1 heads: a linear probe
  first, then fine-tuning, so random heads never pull the backbone around (LP-FT, Kumar et al. 2022).
- ``lora``:  stage 2 with only LoRA adapters trainable in the backbone.
- ``qlora``: ``lora`` on a 4-bit NF4 base (Unsloth on a GPU; bitsandbytes + peft elsewhere).

Stage 2, and the measurement behind each choice (``../shared/notes/cpu-facts.md`` and notebook 03):

- Every optimizer step sees every workflow (``mixed_steps``). With batches grouped by length, 82% of a batch was
  one workflow (the workflows' states differ in length), so each step moved the shared backbone for one
  workflow's heads; validation accuracy fell 0.730 -> 0.648 in 70 steps, against 0.738 with mixed batches.
- A step's cases run as micro-batches of similar length inside one workflow: no padding to the longest state.
- The backbone and the heads have their own learning rates (the heads can be frozen), with warm-up and cosine
  decay; gradients are clipped.
- The dev slice is scored every ``eval_every`` steps and the best step is what is saved: training loss keeps
  falling after held-out loss turns. A checkpoint (safetensors + JSON) at each evaluation lets a run resume.
- The backbone runs in the compute dtype chosen for this machine (``precision.py``).

The validation split (80 cases) is left for temperatures and routing thresholds; the test split is never loaded
here. ``accelerate launch -m decisionkit train --preset gpu`` spreads stage 2 over several GPUs.
"""

from __future__ import annotations

import copy
import json
import math
import platform
import random
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from . import settings
from .atomic import write_text
from .backbone import ENCODER_BACKBONE, LoraSettings, load_backbone
from .data import DEV_PER_WORKFLOW, Split, dev_slice, load_typed_decisions, token_lengths
from .heads import HeadSet, Targets, decision_loss, group_rows, targets, weight_norm
from .memory import peak_rss_gb
from .metrics import Scores, score
from .model import BACKBONE_DIR, DecisionModel, DecisionOutput, FeatureSpec, load
from .report import HISTORY_FILE
from .structured import StructuredPart, mix_weights, mixed

MODES = ("heads", "full", "lora", "qlora")
PARTS = ("heads", "trees", "hybrid")  # what ``fit_structured`` scores out of fold
STRUCTURED_FOLDS = 5  # folds of train the hybrid's mixing weights are chosen on
CHECKPOINT_DIR = "checkpoint"  # inside the output folder: the last evaluated step, for resuming
TRAINER_TENSORS = "trainer.safetensors"  # optimizer moments
TRAINER_STATE = "trainer.json"  # step, history, scheduler; written last: its presence means the checkpoint is whole


@dataclass(frozen=True)
class Preset:
    """Everything that defines a training run. Quick presets shrink sizes only; the code path is the same."""

    name: str
    mode: str  # "heads", "full", "lora" or "qlora"
    backbone: str | None = None  # None: SmolLM2-135M-Instruct, offline
    dataset: str = "typed-decisions"  # or a scenario: "tickets", "ngs-qc", or a folder with schema.json
    features: FeatureSpec = FeatureSpec()
    train_per_workflow: int | None = None  # None: all 280 train cases of each workflow
    validation_per_workflow: int | None = None  # None: all 20
    test_per_workflow: int | None = None  # test cases a run report scores; None: all 100 (quick presets: a sample)
    dev_per_workflow: int = DEV_PER_WORKFLOW  # held out of train to pick L2 and steps; 0: pick on validation
    l2_grid: tuple[float, ...] = (1e-3, 3e-3, 1e-2)  # head L2 strengths tried on the dev slice
    head_steps: int = 400  # full-batch AdamW steps per L2 strength, on cached features
    head_lr: float = 0.003  # Adam moves every weight ~lr a step: with 2,304 inputs a larger rate overfits in 50 steps
    ordinal: float = 0.0  # weight of the expected level distance added to score questions' loss
    structured: bool = False  # the hybrid: trees on the state's fields, averaged with the heads (heads mode)
    lora: LoraSettings | None = None
    epochs: float = 0  # stage 2 length in passes over the training cases; 0 in heads mode
    lr: float = 1e-4  # backbone peak rate in stage 2; 5e-4 diverged for LoRA on cpu-full within an epoch
    finetune_head_lr: float = 0.0  # heads' peak rate in stage 2; 0 keeps the stage-1 heads frozen
    weight_decay: float = 0.0  # decoupled weight decay on the backbone in stage 2
    max_grad_norm: float = 1.0  # gradient clipping, as transformers' Trainer does by default
    warmup: float = 0.06  # fraction of the steps with a linear warm-up; then cosine decay to zero
    batch_size: int = 8  # cases per optimizer step, spread over the workflows
    micro_batch: int = 4  # cases per forward pass: one workflow, similar lengths (batching gains little on a CPU)
    eval_every: int = 35  # optimizer steps between dev evaluations and checkpoints
    patience: int = 0  # stop after this many evaluations without a better dev loss; 0 runs every step
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: memory for ~40% more time
    seed: int = 3407

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode is {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.mode != "heads" and self.epochs <= 0:
            raise ValueError(f"mode {self.mode!r} needs epochs > 0 (the fine-tuning stage)")
        if self.mode in ("lora", "qlora") and self.lora is None:
            raise ValueError(f"mode {self.mode!r} needs lora settings")
        if self.structured and self.mode != "heads":
            raise ValueError(f"structured (the hybrid) needs mode 'heads', got {self.mode!r}: its weights are chosen "
                             "on cross-fitted heads, which a fine-tuned backbone has no cached features for")

    def to_json(self) -> dict:
        return {**asdict(self), "features": self.features.to_json()}


# Stage 2 on CPU, as measured (notebook 03): the stage-1 heads stay frozen (trained on mini-batches at 1e-3 they
# tore MiniLM's dev loss from 0.98 to 1.94 in 20 steps), and the backbone moves slowly.
# Every fine-tuning run measured on CPU scored worse on dev than its start for hundreds of steps, so the run stops
# after four evaluations (80 steps) without a better dev loss.
_FULL = dict(mode="full", epochs=2, lr=1e-5, finetune_head_lr=0.0, weight_decay=0.01, eval_every=20, patience=4)
PRESETS = {
    # CI, tests and the notebooks' quick mode: a few cases, short inputs, heads only. About a minute on 2 cores.
    # A slower rate and a strong L2: at the full recipe's (0.003, L2 1e-3 to 1e-2) 60 cases are overfitted before
    # step 10, the first step checked, so the fit kept its uniform start (validation accuracy 0.275). Here it keeps
    # step 50 (L2 1) and reaches 0.505 on the 80 validation cases.
    "cpu-quick": Preset("cpu-quick", "heads", features=FeatureSpec(max_length=256), train_per_workflow=20,
                        validation_per_workflow=10, test_per_workflow=10, dev_per_workflow=5, head_lr=3e-4,
                        l2_grid=(1.0, 10.0)),
    # Heads on frozen SmolLM2 features, full data: the fast baseline (about 6 minutes with bfloat16, mostly the
    # one-off extraction), and what `make demo` trains.
    "cpu-heads": Preset("cpu-heads", "heads"),
    # The best recipe measured on 2 CPU cores, and what make demo trains: the hybrid, cpu-heads' heads averaged
    # with trees on the state's fields (out of fold on train: heads 0.722, trees 0.683, hybrid 0.760; test 0.722,
    # 0.688, 0.769; benchmarks/results/hybrid_*.json). Tried against the heads alone before, on the dev slice or by
    # 5-fold cross-validation on train, none better by more than noise: other layers and poolings, per-question
    # attention pooling, feature dropout, an ordinal loss, another rendering of the state, both backbones' features
    # together, key-order augmentation, sharpened targets, and fine-tuning: LoRA moved the dev loss by -0.0005 in
    # 240 steps (test as its start), the top layers or every weight of SmolLM2 or of MiniLM raised it.
    "cpu-best": Preset("cpu-best", "heads", structured=True),
    # LoRA on SmolLM2, adapters on the upper half only: the backward pass stops at layer 15.
    "cpu-lora": Preset("cpu-lora", "lora", lora=LoraSettings(first_layer=0.5), epochs=2, lr=1e-4,
                       finetune_head_lr=0.0, eval_every=20, patience=4),
    # Every SmolLM2 weight trains.
    "cpu-full": Preset("cpu-full", **_FULL),
    # Every weight of the 22.7M-parameter MiniLM encoder trains: about 6x less arithmetic per case than SmolLM2.
    "cpu-encoder": Preset("cpu-encoder", backbone=ENCODER_BACKBONE, **{**_FULL, "lr": 5e-5, "epochs": 3}),
    # The second stage on a handful of cases: for tests and quick demos of fine-tuning.
    "cpu-full-quick": Preset("cpu-full-quick", "full", features=FeatureSpec(max_length=64), train_per_workflow=4,
                             validation_per_workflow=2, test_per_workflow=2, dev_per_workflow=1, head_steps=50,
                             epochs=1, lr=1e-5, batch_size=4, eval_every=2),
    "cpu-encoder-quick": Preset("cpu-encoder-quick", backbone=ENCODER_BACKBONE, features=FeatureSpec(max_length=64),
                                train_per_workflow=4, validation_per_workflow=2, test_per_workflow=2,
                                dev_per_workflow=1, head_steps=50, **{**_FULL, "lr": 5e-5, "epochs": 1, "batch_size": 4, "eval_every": 2}),
    "cpu-lora-quick": Preset("cpu-lora-quick", "lora", features=FeatureSpec(max_length=64), train_per_workflow=4,
                             validation_per_workflow=2, test_per_workflow=2, dev_per_workflow=1, head_steps=50,
                             lora=LoraSettings(), epochs=1, batch_size=4, eval_every=2),
    # Your own decisions (notebook 08): heads on the project's scenario data, which has its own validation split;
    # small sets want a stronger L2.
    "tickets": Preset("tickets", "heads", dataset="tickets", dev_per_workflow=0, l2_grid=(3e-3, 1e-2, 3e-2, 1e-1)),
    "ngs-qc": Preset("ngs-qc", "heads", dataset="ngs-qc", dev_per_workflow=0, l2_grid=(3e-3, 1e-2, 3e-2, 1e-1)),
    # The reference run: Qwen3.5-4B in 4-bit NF4, LoRA r16 / alpha 16, Unsloth, one 24 GB GPU.
    "gpu": Preset("gpu", "qlora", backbone="unsloth/Qwen3.5-4B", features=FeatureSpec("mean", (0.5, 1.0), 1024),
                  lora=LoraSettings(), epochs=3, lr=2e-4, finetune_head_lr=2e-4, batch_size=16, micro_batch=8,
                  gradient_checkpointing=True),  # the reference's rate; checkpointing pays at 1,024 tokens
}


def preset(name: str, **overrides) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset {name!r} is unknown; expected one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def peak_memory_gb(device: str) -> float:
    """CUDA max allocated on a GPU; the process's peak resident memory on CPU."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 1e9
    return peak_rss_gb()  # portable: ru_maxrss is KiB on Linux, bytes on macOS; Windows has no resource module


@dataclass
class HeadFit:
    """What stage 1 chose on held-out cases."""

    history: list[dict]  # one row every 10 steps: L2, step, train loss, held-out loss
    best_val_loss: float  # on the held-out cases the (L2, step) was picked on
    l2: float
    step: int


def _head_loss(heads: HeadSet, x: torch.Tensor, target: Targets, ordinal: float = 0.0) -> torch.Tensor:
    return decision_loss(heads.schema, heads.read(x, target.rows), target, ordinal)


def _descent(heads: HeadSet, x: torch.Tensor, target: Targets, l2: float, steps: int, lr: float, ordinal: float):
    """Full-batch AdamW from zero-initialised (uniform) heads: yields ``(step, train loss)`` before each update and
    after the last."""
    for head in heads.heads.values():
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps + 1):
        train_loss = _head_loss(heads, x, target, ordinal)
        yield step, train_loss.item()
        if step < steps:
            optimizer.zero_grad()
            (train_loss + l2 * weight_norm(heads)).backward()
            optimizer.step()


def fit_heads(heads: HeadSet, train: Split, held_out: Split, train_x: torch.Tensor, held_x: torch.Tensor,
              l2_grid=(1e-3, 3e-3, 1e-2), steps: int = 400, lr: float = 0.003, ordinal: float = 0.0,
              progress: bool = True) -> HeadFit:
    """Stage 1: fit every head at once, full batch, on fixed (standardized) features; for each L2 strength in
    ``l2_grid`` train from zero and keep the (L2, step) with the lowest loss on ``held_out``. Loads that state."""
    train_target = targets(train, device=train_x.device)
    held_target = targets(held_out, device=held_x.device)
    history, best = [], (float("inf"), None, None, 0)
    for l2 in tqdm(l2_grid, desc="heads (L2 grid)", disable=not progress or settings.progress_hidden()):
        for step, train_loss in _descent(heads, train_x, train_target, l2, steps, lr, ordinal):
            if step % 10 == 0 or step == steps:  # step 0 is the uniform start: the fit never ends worse
                with torch.no_grad():
                    held_loss = _head_loss(heads, held_x, held_target).item()
                history.append({"stage": "heads", "l2": l2, "step": step, "train_loss": train_loss,
                                "val_loss": held_loss})
                if held_loss < best[0]:
                    best = (held_loss, copy.deepcopy(heads.state_dict()), l2, step)
    heads.load_state_dict(best[1])
    return HeadFit(history, best[0], best[2], best[3])


def refit_heads(heads: HeadSet, cases: Split, x: torch.Tensor, fit: HeadFit, lr: float = 0.003,
                ordinal: float = 0.0) -> None:
    """Train the heads from zero on ``cases`` at the L2 and for the steps that ``fit`` picked on held-out cases:
    once the choice is made, the held-out cases are training data too."""
    for _ in _descent(heads, x, targets(cases, device=x.device), fit.l2, fit.step, lr, ordinal):
        pass


@dataclass
class Fold:
    """One fold of a cross-fit: the positions its models were fitted on and the ones they score, the heads (and
    the hybrid's trees, when asked) fitted on the rest."""

    inside: np.ndarray
    held: np.ndarray
    heads: HeadSet
    structured: StructuredPart | None


def cross_fit(model: DecisionModel, cases: Split, features: torch.Tensor, folds: int, structured: bool = False):
    """Yield a ``Fold`` for each of ``folds`` folds of ``cases`` (``features``: theirs, standardized): heads fitted
    on the other folds at the L2 and steps ``model.head_fit`` holds, and with ``structured`` the trees too (at the
    model's mixing weights, if it has them). The folds are the same for every call on the same cases."""
    fold = np.random.default_rng(0).permutation(len(cases)) % folds
    fit = HeadFit([], float("nan"), model.head_fit["l2"], model.head_fit["steps"])
    weights = model.structured.weights if model.structured is not None else None
    for k in range(folds):
        inside, held = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        rest = Split(f"{cases.name} - fold {k}", [cases[i] for i in inside], cases.source)
        heads = HeadSet(model.schema, features.shape[1]).to(features.device)
        refit_heads(heads, rest, features[inside], fit, model.head_fit["lr"], model.head_fit["ordinal"])
        yield Fold(inside, held, heads.eval(), StructuredPart.fit(rest, weights) if structured else None)


@dataclass
class StructuredFit:
    """How the hybrid was fitted: each part's and the mixture's out-of-fold scores on train, and the weights."""

    scores: pd.DataFrame  # (part, workflow) -> accuracy, KL: heads alone, trees alone, hybrid
    weights: dict[str, dict[str, float]]  # workflow -> question -> weight of the heads

    def table(self) -> pd.DataFrame:
        """Out-of-fold accuracy by workflow (and all), one column per part."""
        return self.scores["accuracy"].unstack("part")[list(PARTS)]


def fit_structured(model: DecisionModel, cases: Split, features: torch.Tensor, folds: int = STRUCTURED_FOLDS
                   ) -> StructuredFit:
    """Make ``model`` the hybrid: trees on the fields of ``cases`` (the heads' training cases; ``features``: theirs,
    standardized), averaged with the heads at a weight per question chosen on out-of-fold predictions of both (each
    case scored by heads and trees fitted on the other folds), then fitted on every case."""
    heads: list[dict] = [{} for _ in cases]
    trees: list[dict] = [{} for _ in cases]
    for fold in cross_fit(model, cases, features, folds, structured=True):
        held = [cases[i] for i in fold.held]
        with torch.no_grad():
            output = model.read(features[fold.held], [c.workflow for c in held], heads=fold.heads)
        for i, logits in zip(fold.held, output.per_case()):
            heads[i] = {qid: torch.softmax(z.double(), -1).cpu().numpy() for qid, z in logits.items()}
        for workflow in fold.structured.fields:
            mine = [i for i in fold.held if cases[i].workflow == workflow]
            found = fold.structured.probabilities([cases[i].state for i in mine], workflow,
                                                  list(fold.structured.trees[workflow]))
            for j, i in enumerate(mine):
                trees[i] = {qid: p[j] for qid, p in found.items()}
    weights = mix_weights(cases, heads, trees)
    hybrid = mixed(cases, heads, trees, weights)
    frames = {}
    for part, predictions in zip(PARTS, (heads, trees, hybrid)):
        scores = score(cases, predictions)
        frames[part] = pd.concat([scores.summary("workflow"), scores.summary()])[["accuracy", "kl"]]
    model.structured = StructuredPart.fit(cases, weights)
    return StructuredFit(pd.concat(frames, names=["part", "workflow"]), weights)


def part_scores(model: DecisionModel, cases: Split) -> dict[str, Scores]:
    """A hybrid's parts scored apart on ``cases``: the heads alone and the trees alone, neither calibrated (the
    parts a hybrid is measured against: it should beat both)."""
    features = model.split_features(cases)
    rows = group_rows(cases.case_workflows)
    with torch.no_grad():
        heads = DecisionOutput(features, cases.case_workflows, model.heads.read(features, rows), rows).per_case()
    trees = [{qid: p[0] for qid, p in model.structured.probabilities([c.state], c.workflow, list(c.questions)).items()}
             for c in cases]
    return {"heads alone": score(cases, [{qid: torch.softmax(z.double(), -1).cpu().numpy() for qid, z in h.items()}
                                         for h in heads]),
            "trees alone": score(cases, trees)}


@dataclass
class TrainResult:
    """What a run did: the training curves, the best held-out loss, wall time and peak memory."""

    preset: Preset
    history: pd.DataFrame
    best_val_loss: float
    seconds: float
    peak_memory_gb: float
    out: Path
    extra: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"value": {
            "preset": self.preset.name, "mode": self.preset.mode, "best dev loss": round(self.best_val_loss, 4),
            "wall time (s)": round(self.seconds, 1), "peak memory (GB)": round(self.peak_memory_gb, 2),
            **self.extra}})

    def figure(self):
        from .plots import training_curves

        return training_curves(self.history)


def load_split(dataset: str, split: str, data_dir=None) -> Split:
    """A split of typed-decisions (from ``data_dir`` or the usual places) or of a scenario folder."""
    if dataset == "typed-decisions":
        return load_typed_decisions(split, data_dir)
    from .scenarios import load_scenario

    return load_scenario(dataset, split)


def training_pool(p: Preset, data_dir=None) -> Split:
    """Every train case preset ``p`` uses, the dev slice included, in file order (features are cached for it)."""
    train = load_split(p.dataset, "train", data_dir)
    return train.head(p.train_per_workflow + p.dev_per_workflow) if p.train_per_workflow else train


def held_out_test(p: Preset, data_dir=None) -> Split:
    """The test cases a run of preset ``p`` is scored on: all, or ``test_per_workflow`` of each workflow."""
    test = load_split(p.dataset, "test", data_dir)
    return test.head(p.test_per_workflow) if p.test_per_workflow else test


def training_splits(p: Preset, data_dir=None) -> tuple[Split, Split, Split]:
    """``(train, dev, validation)`` for preset ``p``: the dev slice is held out of the training pool (or is the
    validation split itself when ``dev_per_workflow`` is 0)."""
    pool = training_pool(p, data_dir)
    validation = load_split(p.dataset, "validation", data_dir)
    if p.validation_per_workflow:
        validation = validation.head(p.validation_per_workflow)
    if p.dev_per_workflow:
        train, dev = dev_slice(pool, p.dev_per_workflow)
    else:
        train, dev = pool, validation
    return train, dev, validation


def train(p: Preset | str, out: str | Path, data_dir=None, resume: bool = True, progress: bool = True) -> TrainResult:
    """Train preset ``p`` and save the best model to ``out`` (``decisionkit.load(out)`` opens it)."""
    p = preset(p) if isinstance(p, str) else p
    out = Path(out)
    started = time.perf_counter()
    backbone = load_backbone(p.backbone, quantize="4bit" if p.mode == "qlora" else None)
    # seeded after the load: a process's first load probes the compute dtype on random matrices, and the dropout
    # masks of stage 2 must not depend on whether this run came first
    seed_everything(p.seed)
    train_split, dev, validation = training_splits(p, data_dir)
    model = DecisionModel(backbone, train_split.schema(), p.features)

    # Stage 1: heads on frozen, cached features; L2 and steps picked on the dev slice.
    pool = training_pool(p, data_dir)  # one cached extraction for train and dev (and the router, later)
    extraction = time.perf_counter()
    raw = dict(zip(pool.ids, model.raw_split_features(pool)))
    extraction = time.perf_counter() - extraction  # a second or two when the on-disk cache has the features
    train_raw = torch.stack([raw[i] for i in train_split.ids])
    dev_raw = model.raw_split_features(dev) if dev is validation else torch.stack([raw[i] for i in dev.ids])
    train_x, dev_x = model.normalize_fitted(train_raw), model.normalize(dev_raw)
    fit = fit_heads(model.heads, train_split, dev, train_x, dev_x, p.l2_grid, p.head_steps, p.head_lr, p.ordinal,
                    progress)
    history, best = fit.history, fit.best_val_loss
    extra = {"head L2": fit.l2, "head steps": fit.step, "train cases": len(train_split), "dev cases": len(dev),
             "validation cases": len(validation), "feature extraction (s)": round(extraction, 1),
             **backbone.precision.describe()}
    if p.mode == "heads":
        model.head_fit = {"l2": fit.l2, "steps": fit.step, "lr": p.head_lr, "ordinal": p.ordinal}
        if p.dev_per_workflow:  # the choice is made: fit again on every training case
            train_x = model.normalize_fitted(torch.stack(list(raw.values())))
            refit_heads(model.heads, pool, train_x, fit, p.head_lr, p.ordinal)
            extra["train cases"] = len(pool)
        if p.structured:
            hybrid = fit_structured(model, pool if p.dev_per_workflow else train_split, train_x)
            extra.update({f"out-of-fold accuracy, {part}": round(float(hybrid.scores.loc[(part, "all"), "accuracy"]), 4)
                          for part in PARTS})
        model.save(out)
    else:
        history, best, step = _finetune(model, train_split, dev, p, out, history, best, fit.l2, resume, progress)
        extra["best step"] = step
    seconds = time.perf_counter() - started
    peak = peak_memory_gb(backbone.device)
    result = TrainResult(p, pd.DataFrame(history), best, seconds, peak, out, extra)
    write_text(out / HISTORY_FILE, json.dumps({
        "preset": p.to_json(), "history": history, "best_val_loss": best, "seconds": seconds, "peak_memory_gb": peak,
        "machine": platform.platform(), **extra}, indent=2, default=str))
    return result


def mixed_steps(workflows: list[str], lengths: list[int], batch_size: int, micro_batch: int,
                seed: int) -> list[list[list[int]]]:
    """One epoch of optimizer steps over cases ``0..n-1``. Each step holds ``batch_size`` cases with the workflows
    mixed in proportion (each workflow shuffled, then interleaved evenly); its cases run as micro-batches of at most
    ``micro_batch`` cases of one workflow, sorted by length so little is padded."""
    rng = np.random.default_rng(seed)
    keyed = []
    for workflow in sorted(set(workflows)):
        members = rng.permutation([i for i, w in enumerate(workflows) if w == workflow])
        offset = rng.random()
        keyed += [((k + offset) / len(members), int(i)) for k, i in enumerate(members)]
    stream = [i for _, i in sorted(keyed)]
    steps = []
    for lo in range(0, len(stream), batch_size):
        micro = []
        for workflow in sorted({workflows[i] for i in stream[lo:lo + batch_size]}):
            group = sorted((i for i in stream[lo:lo + batch_size] if workflows[i] == workflow), key=lambda i: lengths[i])
            micro += [group[k:k + micro_batch] for k in range(0, len(group), micro_batch)]
        steps.append(micro)
    return steps


def _save_checkpoint(folder: Path, core: DecisionModel, optimizer, scheduler, state: dict) -> None:
    """The model, the optimizer moments and the random state (safetensors: a resumed run draws the dropout masks the
    run would have drawn) and the trainer state (JSON, written last)."""
    core.save(folder)
    flat, meta = {"rng.cpu": torch.get_rng_state()}, {}
    if torch.cuda.is_available():
        flat["rng.cuda"] = torch.cuda.get_rng_state()
    for index, moments in optimizer.state_dict()["state"].items():
        for name, value in moments.items():
            if torch.is_tensor(value):
                flat[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                meta.setdefault(str(index), {})[name] = value
    save_file(flat, folder / TRAINER_TENSORS)
    payload = {**state, "optimizer_state": meta, "param_groups": optimizer.state_dict()["param_groups"],
               "scheduler": scheduler.state_dict()}
    write_text(folder / TRAINER_STATE, json.dumps(payload, default=float))


def _load_checkpoint(folder: Path, core: DecisionModel, optimizer, scheduler) -> dict:
    core.load_trained(folder)
    if core.tuned:  # a full fine-tune goes on from the checkpoint's backbone, not from the one it started with;
        # not strict: a causal LM's output layer, tied to its embeddings, is not saved apart
        core.encoder.load_state_dict({k: v for part in sorted((folder / BACKBONE_DIR).glob("*.safetensors"))
                                      for k, v in load_file(str(part)).items()}, strict=False)
    payload = json.loads((folder / TRAINER_STATE).read_text())
    tensors = load_file(str(folder / TRAINER_TENSORS))
    torch.set_rng_state(tensors.pop("rng.cpu"))
    if "rng.cuda" in tensors:
        torch.cuda.set_rng_state(tensors.pop("rng.cuda"))
    state: dict = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for index, moments in payload.pop("optimizer_state").items():
        state.setdefault(int(index), {}).update(moments)
    optimizer.load_state_dict({"state": state, "param_groups": payload.pop("param_groups")})
    scheduler.load_state_dict(payload.pop("scheduler"))
    return payload


@torch.no_grad()
def dev_scores(core: DecisionModel, dev: Split) -> dict:
    """Soft cross-entropy and accuracy (the benchmark's rule) of the current model on ``dev``."""
    output = core.split_output(dev, loss=True)
    gold = targets(dev).gold
    right = sum(int((z.argmax(-1).cpu() == gold[workflow][qid].argmax(-1)).sum())
                for workflow, per_question in output.logits.items() for qid, z in per_question.items())
    return {"val_loss": output.loss.item(), "val_accuracy": right / sum(len(g) for q in gold.values()
                                                                     for g in q.values())}


def _finetune(model: DecisionModel, train_split: Split, dev: Split, p: Preset, out: Path, history: list,
              best: float, l2: float, resume: bool, progress: bool) -> tuple[list, float, int]:
    """Stage 2: the backbone (all of it, or LoRA adapters) and the heads together; the dev slice is scored every
    ``eval_every`` steps, the best step is saved to ``out``, and a checkpoint lets an interrupted run resume."""
    from accelerate import Accelerator
    from transformers import get_cosine_schedule_with_warmup

    if p.mode == "full":
        model.unfreeze_backbone()
    else:
        model.attach_lora(p.lora)
    if p.gradient_checkpointing and model.backbone.engine != "unsloth":  # Unsloth's adapters bring their own
        model.backbone.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.heads.requires_grad_(p.finetune_head_lr > 0)
    accelerator = Accelerator(cpu=model.backbone.device == "cpu")
    backbone_params = [q for q in model.encoder.parameters() if q.requires_grad]
    groups = [{"params": backbone_params, "lr": p.lr, "weight_decay": p.weight_decay}]
    if p.finetune_head_lr > 0:
        groups.append({"params": list(model.heads.parameters()), "lr": p.finetune_head_lr, "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups)
    optimizer.zero_grad()  # stage 1 leaves its last gradients on the heads: the first step must not add them
    lengths = [min(n, model.spec.max_length) for n in token_lengths(train_split, model.backbone.tokenizer).lengths]
    workflows = train_split.case_workflows
    per_epoch = math.ceil(len(train_split) / p.batch_size)
    total = max(1, round(p.epochs * per_epoch))
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(p.warmup * total), total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    core = accelerator.unwrap_model(model)
    checkpoint = out / CHECKPOINT_DIR
    step, best_step, stale = 0, 0, 0
    if resume and (checkpoint / TRAINER_STATE).is_file():
        state = _load_checkpoint(checkpoint, core, optimizer, scheduler)
        history, best, step, best_step, stale = (state[k] for k in ("history", "best", "step", "best_step", "stale"))
    else:
        core.save(out)  # the stage-1 model is the best so far
    bar = tqdm(total=total, initial=step, desc=f"{p.mode} fine-tuning", unit="step",
               disable=not progress or settings.progress_hidden())
    while step < total and not (p.patience and stale >= p.patience):
        epoch, within = divmod(step, per_epoch)
        plan = mixed_steps(workflows, lengths, p.batch_size, p.micro_batch, p.seed + epoch)[within]
        core.train()
        decisions = sum(len(train_split[i].questions) for micro in plan for i in micro)
        data_loss = 0.0
        for k, rows in enumerate(plan):
            target = targets(train_split, rows, core.backbone.device)
            output = model([train_split[i].text for i in rows], [workflows[i] for i in rows], target, p.ordinal)
            loss = output.loss * (target.decisions / decisions)
            if p.finetune_head_lr > 0:
                loss = loss + l2 * weight_norm(core.heads) / len(plan)
            with accelerator.no_sync(model) if k < len(plan) - 1 else nullcontext():
                accelerator.backward(loss)
            plain = decision_loss(core.schema, output.logits, target) if p.ordinal else output.loss  # no ordinal term
            data_loss += plain.item() * target.decisions / decisions
        accelerator.clip_grad_norm_(model.parameters(), p.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        bar.update()
        history.append({"stage": p.mode, "step": step, "epoch": step / per_epoch, "train_loss": data_loss,
                        "lr": scheduler.get_last_lr()[0]})
        if step % p.eval_every == 0 or step == total:
            core.eval()
            scores = dev_scores(core, dev)
            history.append({"stage": p.mode, "step": step, "epoch": step / per_epoch, **scores})
            bar.set_postfix(dev_loss=f"{scores['val_loss']:.4f}", dev_acc=f"{scores['val_accuracy']:.3f}")
            if scores["val_loss"] < best:
                best, best_step, stale = scores["val_loss"], step, 0
                core.save(out)
            else:
                stale += 1
            _save_checkpoint(checkpoint, core, optimizer, scheduler,
                             {"history": history, "best": best, "step": step, "best_step": best_step, "stale": stale})
    bar.close()
    shutil.rmtree(checkpoint, ignore_errors=True)  # finished: the best model is in ``out``
    return history, best, best_step


def evaluate(path_or_model, split: str = "validation", data_dir=None, dataset: str = "typed-decisions"):
    """Scores of a saved (or in-memory) model on ``split`` of ``dataset``; ``metrics.Scores`` breaks them down."""
    model = load(path_or_model) if isinstance(path_or_model, (str, Path)) else path_or_model
    cases = load_split(dataset, split, data_dir)
    return score(cases, *model.outputs(cases))
