"""Training a decision model on typed-decisions: soft-gold cross-entropy, one API, three modes.

- ``heads``: the backbone stays frozen; its pooled features are extracted once (cached on disk) and the heads
  train on them in seconds. The L2 strength is picked on the validation split.
- ``lora``:  the heads are first fitted as in ``heads`` (a linear probe, then fine-tune: a good start keeps the
  adapters from being pulled around by random heads), then LoRA adapters and heads train together.
- ``qlora``: ``lora`` on a 4-bit NF4 base (Unsloth on a GPU; bitsandbytes + peft elsewhere).

The second stage rides on ``accelerate``: ``accelerate launch -m decisionkit train --preset gpu`` spreads it over
several GPUs. Validation runs every epoch; the best epoch by validation loss is the model that is saved; a
checkpoint after every epoch lets an interrupted run resume. The test split is never loaded here.
"""

from __future__ import annotations

import json
import platform
import random
import resource
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import settings

from .backbone import LoraSettings, load_backbone
from .data import Split, load_typed_decisions, token_lengths
from .heads import batch_loss, fit_heads, targets, weight_norm
from .model import DecisionModel, FeatureSpec, load

CHECKPOINT_DIR = "checkpoint"  # inside the output folder: the last finished epoch, for resuming
HISTORY_FILE = "history.json"


@dataclass(frozen=True)
class Preset:
    """Everything that defines a training run. Quick presets shrink sizes only; the code path is the same."""

    name: str
    mode: str  # "heads", "lora" or "qlora"
    backbone: str | None = None  # None: SmolLM2-135M-Instruct, offline
    dataset: str = "typed-decisions"  # or a scenario: "tickets", "ngs-qc", or a folder with schema.json
    features: FeatureSpec = FeatureSpec()
    train_per_workflow: int | None = None  # None: all 280 train cases of each workflow
    validation_per_workflow: int | None = None  # None: all 20
    l2_grid: tuple[float, ...] = (1e-3, 3e-3, 1e-2)  # head L2 strengths tried on validation
    head_steps: int = 400  # full-batch AdamW steps per L2 strength, on cached features
    head_lr: float = 0.003  # Adam moves every weight ~lr a step: with 2,304 inputs a larger rate overfits in 50 steps
    lora: LoraSettings | None = None
    epochs: int = 0  # second stage (LoRA + heads); 0 in heads mode
    lr: float = 1e-4  # LoRA peak learning rate (heads: head_lr / 10); 5e-4 diverged on cpu-full within an epoch
    max_grad_norm: float = 1.0  # gradient clipping, as transformers' Trainer does by default
    warmup: float = 0.05  # fraction of the updates with a linear warm-up; then cosine decay to zero
    batch_size: int = 8  # cases per step
    grad_accum: int = 1  # steps per optimizer update
    seed: int = 3407

    def __post_init__(self):
        if self.mode not in ("heads", "lora", "qlora"):
            raise ValueError(f"mode is {self.mode!r}; expected heads, lora or qlora")
        if self.mode != "heads" and (self.lora is None or self.epochs < 1):
            raise ValueError(f"mode {self.mode!r} needs lora settings and epochs >= 1")


PRESETS = {
    # CI, tests and the notebooks' quick mode: a few cases, short inputs, heads only. About a minute on 2 cores.
    "cpu-quick": Preset("cpu-quick", "heads", features=FeatureSpec(max_length=256), train_per_workflow=20,
                        validation_per_workflow=10),
    # Heads on frozen SmolLM2 features, full data: about 20 minutes on 2 cores, mostly the one-off extraction.
    "cpu-heads": Preset("cpu-heads", "heads"),
    # LoRA on SmolLM2, full data, on 2 CPU cores: the course's full CPU run (about an hour). Adapters on the upper
    # half only: the backward pass stops at layer 15, a third less work per step, for the same number of epochs.
    "cpu-full": Preset("cpu-full", "lora", lora=LoraSettings(first_layer=0.5), epochs=2, batch_size=8),
    # The LoRA path on a handful of cases: for tests and quick demos of the second stage.
    "cpu-lora-quick": Preset("cpu-lora-quick", "lora", features=FeatureSpec(max_length=64), train_per_workflow=3,
                             validation_per_workflow=2, head_steps=50, lora=LoraSettings(), epochs=1, batch_size=4),
    # Your own decisions (notebook 08): heads on the project's scenario data; small sets want a stronger L2.
    "tickets": Preset("tickets", "heads", dataset="tickets", l2_grid=(3e-3, 1e-2, 3e-2, 1e-1)),
    "ngs-qc": Preset("ngs-qc", "heads", dataset="ngs-qc", l2_grid=(3e-3, 1e-2, 3e-2, 1e-1)),
    # The reference run: Qwen3.5-4B in 4-bit NF4, LoRA r16 / alpha 16, Unsloth, one 24 GB GPU.
    "gpu": Preset("gpu", "qlora", backbone="unsloth/Qwen3.5-4B", features=FeatureSpec("mean", (0.5, 1.0), 1024),
                  lora=LoraSettings(), epochs=3, lr=2e-4, batch_size=8, grad_accum=2),  # the reference's rate
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
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB


@dataclass
class TrainResult:
    """What a run did: the training curves, the best validation loss, wall time and peak memory."""

    preset: Preset
    history: pd.DataFrame
    best_val_loss: float
    seconds: float
    peak_memory_gb: float
    out: Path
    extra: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"value": {
            "preset": self.preset.name, "mode": self.preset.mode, "best validation loss": round(self.best_val_loss, 4),
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


def _load_splits(p: Preset, data_dir) -> tuple[Split, Split]:
    train = load_split(p.dataset, "train", data_dir)
    validation = load_split(p.dataset, "validation", data_dir)
    if p.train_per_workflow:
        train = train.head(p.train_per_workflow)
    if p.validation_per_workflow:
        validation = validation.head(p.validation_per_workflow)
    return train, validation


def train(p: Preset | str, out: str | Path, data_dir=None, resume: bool = True, progress: bool = True) -> TrainResult:
    """Train preset ``p`` and save the best model to ``out`` (``decisionkit.load(out)`` opens it)."""
    p = preset(p) if isinstance(p, str) else p
    out = Path(out)
    seed_everything(p.seed)
    started = time.perf_counter()
    backbone = load_backbone(p.backbone, quantize="4bit" if p.mode == "qlora" else None)
    train_split, validation = _load_splits(p, data_dir)
    spec = p.features.resolved(backbone.num_layers)
    model = DecisionModel(backbone, train_split.schema(), spec)

    # Stage 1: heads on frozen, cached features.
    train_raw = model.raw_split_features(train_split)
    model.set_normalization(train_raw.cpu().numpy())
    train_x = model.normalize(train_raw)
    val_x = model.normalize(model.raw_split_features(validation))
    fit = fit_heads(model.heads, train_split, validation, train_x, val_x, p.l2_grid, p.head_steps, p.head_lr,
                    progress)
    history, best_val, l2 = fit.history, fit.best_val_loss, fit.l2
    extra = {"head L2": l2, "train cases": len(train_split), "validation cases": len(validation)}

    if p.mode != "heads":
        history, best_val = _fit_lora(model, train_split, validation, p, out, history, best_val, l2, resume, progress)
    else:
        model.save(out)
    seconds = time.perf_counter() - started
    peak = peak_memory_gb(backbone.device)
    result = TrainResult(p, pd.DataFrame(history), best_val, seconds, peak, out, extra)
    (out / HISTORY_FILE).write_text(json.dumps({
        "preset": {**asdict(p), "features": p.features.to_json()}, "history": history, "best_val_loss": best_val,
        "seconds": seconds, "peak_memory_gb": peak, "device": backbone.device, "machine": platform.platform(),
        **extra}, indent=2, default=str))
    return result


def _fit_lora(model: DecisionModel, train_split: Split, validation: Split, p: Preset, out: Path, history: list,
              best_val: float, l2: float, resume: bool, progress: bool) -> tuple[list, float]:
    """Stage 2: LoRA adapters and heads together, with accelerate; checkpoint every epoch, keep the best."""
    from accelerate import Accelerator
    from transformers import get_cosine_schedule_with_warmup
    from transformers.trainer_pt_utils import LengthGroupedSampler

    model.attach_lora(p.lora)
    accelerator = Accelerator(gradient_accumulation_steps=p.grad_accum, cpu=model.backbone.device == "cpu")
    params = [{"params": [q for q in model.encoder.parameters() if q.requires_grad], "lr": p.lr},
              {"params": model.heads.parameters(), "lr": p.head_lr / 10}]
    optimizer = torch.optim.AdamW(params, weight_decay=0.0)
    generator = torch.Generator().manual_seed(p.seed)
    # Batches of similar length (shuffled in groups, as transformers' Trainer does with group_by_length): padding
    # to the longest state in a batch is wasted work, about a quarter of it on typed-decisions.
    lengths = [min(n, model.spec.max_length) for n in token_lengths(train_split, model.backbone.tokenizer).lengths]
    sampler = LengthGroupedSampler(p.batch_size, lengths=lengths, generator=generator)
    loader = torch.utils.data.DataLoader(list(range(len(train_split))), batch_size=p.batch_size, sampler=sampler,
                                         collate_fn=list)
    updates = p.epochs * -(-len(loader) // p.grad_accum)
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(p.warmup * updates), updates)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    core = accelerator.unwrap_model(model)
    start_epoch = 1
    checkpoint = out / CHECKPOINT_DIR
    if resume and (checkpoint / "state.pt").is_file():
        state = torch.load(checkpoint / "state.pt", weights_only=False)
        core.load_trained(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        history, best_val, start_epoch = state["history"], state["best_val"], state["epoch"] + 1
    elif best_val < float("inf"):
        core.save(out)  # the stage-1 model is the best so far
    for epoch in range(start_epoch, p.epochs + 1):
        core.train()
        for rows in tqdm(loader, desc=f"epoch {epoch}/{p.epochs}", disable=not progress or settings.progress_hidden()):
            with accelerator.accumulate(model):
                features = model([train_split[i].text for i in rows])
                data_loss = batch_loss(core.heads, features, targets(train_split, rows, features.device))
                accelerator.backward(data_loss + l2 * weight_norm(core.heads))
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), p.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            history.append({"stage": "lora", "epoch": epoch, "train_loss": data_loss.item()})  # as in stage 1
        core.eval()
        with torch.no_grad():
            val_x = core.split_features(validation)
            val_loss = batch_loss(core.heads, val_x, targets(validation, device=val_x.device)).item()
        history.append({"stage": "lora", "epoch": epoch, "val_loss": val_loss})
        if val_loss < best_val:
            best_val = val_loss
            core.save(out)
        core.save(checkpoint)
        state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "generator": generator.get_state(), "epoch": epoch,
                 "history": history, "best_val": best_val}
        torch.save(state, checkpoint / "state.pt.tmp")
        os.replace(checkpoint / "state.pt.tmp", checkpoint / "state.pt")  # written last: the epoch is complete
    shutil.rmtree(checkpoint, ignore_errors=True)  # finished: the best model is in ``out``
    return history, best_val


def evaluate(path_or_model, split: str = "validation", data_dir=None, dataset: str = "typed-decisions"):
    """Scores of a saved (or in-memory) model on ``split`` of ``dataset``; ``metrics.Scores`` breaks them down."""
    from .metrics import score

    model = load(path_or_model) if isinstance(path_or_model, (str, Path)) else path_or_model
    cases = load_split(dataset, split, data_dir)
    return score(cases, model.predict(cases))

