"""Training presets: everything that defines a run, by name (``preset("cpu-best")``, ``decisionkit train --preset``).

Each preset says why it is set as it is; quick presets shrink sizes only, the code path is the same.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..core.errors import SettingError
from ..data.cases import DEV_PER_WORKFLOW
from ..model.backbone import ENCODER_BACKBONE, LoraSettings
from ..model.features import FeatureSpec
from ..model.saving import HISTORY_FILE
from ..model.trees import TREE_ROUNDS

MODES = ("heads", "full", "lora", "qlora")
DEFAULT_PRESET = "cpu-fast"  # the main job's hybrid (make demo): what `decisionkit train` fits unless told


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
    off_domain_per_kind: int | None = None  # off-domain inputs a run report routes, per kind; None: all 176
    dev_per_workflow: int = DEV_PER_WORKFLOW  # held out of train to pick L2 and steps; 0: pick on validation
    l2_grid: tuple[float, ...] = (1e-3, 3e-3, 1e-2)  # head L2 strengths tried on the dev slice
    head_steps: int = 400  # full-batch AdamW steps per L2 strength, on cached features
    head_lr: float = 0.003  # Adam moves every weight ~lr a step: with 2,304 inputs a larger rate overfits in 50 steps
    ordinal: float = 0.0  # weight of the expected level distance added to score questions' loss
    structured: bool = False  # the hybrid: trees on the state's fields, averaged with the heads (heads mode)
    lexical: bool = True  # a hybrid's lexical part (model/lexical.py: TF-IDF, a linear model per question) joins it
    tree_rounds: int = TREE_ROUNDS  # the hybrid's boosting rounds per tree; the learning rate scales inversely
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
        if self.tree_rounds < 1:
            raise ValueError(f"tree_rounds is {self.tree_rounds}; expected a positive number of boosting rounds")
        if self.structured and self.mode != "heads":
            raise ValueError(f"structured (the hybrid) needs mode 'heads', got {self.mode!r}: its weights are chosen "
                             "on cross-fitted heads, which a fine-tuned backbone has no cached features for")

    def to_json(self) -> dict:
        return {**asdict(self), "features": self.features.to_json()}


# Stage 2 on CPU: the stage-1 heads stay frozen, the backbone moves slowly, and a run stops after four evaluations
# without a better dev loss (the measurements: benchmarks/results/choices.md#stage-2).
_FULL = dict(mode="full", epochs=2, lr=1e-5, finetune_head_lr=0.0, weight_decay=0.01, eval_every=20, patience=4)
PRESETS = {
    # CI, tests and the notebooks' quick mode: a few cases, short windows, one model shared by the tests and every
    # notebook's quick run (its features are extracted once a session). max_length is the window, not a cut: a state
    # is read whole in windows of 128 tokens (2.2 a typed-decisions state on average, 4 at most; the cap is 8), as
    # the quick presets below read theirs in windows of 64. A slower rate and a strong L2, or 40 cases
    # are overfitted before the first step checked; 30 boosting rounds at 5x the rate, as the trees' time grows with
    # the rounds (benchmarks/results/choices.md#cpu-quick).
    "cpu-quick": Preset("cpu-quick", "heads", features=FeatureSpec(max_length=128), train_per_workflow=10,
                        validation_per_workflow=10, test_per_workflow=10, dev_per_workflow=5, head_steps=100,
                        head_lr=3e-4, l2_grid=(1.0, 10.0), tree_rounds=30, off_domain_per_kind=3),
    # The demo's hybrid (cpu-fast, MiniLM-L6) at quick sizes: MiniLM extracts about 6x faster than SmolLM2, so it
    # keeps 20 train cases a workflow and 256 tokens (at cpu-quick's 10 and 128, notebook 09's confidence rule no
    # longer sent the worse answers to a human); cpu-quick's 100 head steps.
    "cpu-fast-quick": Preset("cpu-fast-quick", "heads", backbone=ENCODER_BACKBONE, structured=True,
                             features=FeatureSpec(max_length=256), train_per_workflow=20, validation_per_workflow=10,
                             test_per_workflow=10, dev_per_workflow=5, head_steps=100, head_lr=3e-4,
                             l2_grid=(1.0, 10.0), tree_rounds=30, off_domain_per_kind=3),
    # Heads on frozen SmolLM2 features, full data: the baseline of the hybrid.
    "cpu-heads": Preset("cpu-heads", "heads"),
    # The best recipe measured on 2 CPU cores: the hybrid, cpu-heads' heads averaged with trees on the state's
    # fields; it beats both parts out of fold on train and on test, and what was tried against it is listed with
    # its measurements in benchmarks/results/choices.md#hybrids.
    "cpu-best": Preset("cpu-best", "heads", structured=True),
    # The same hybrid on the 22.7M-parameter MiniLM-L6 encoder: close to cpu-best at a fraction of its extraction
    # time and latency, so it is what `make demo` trains (benchmarks/results/choices.md#hybrids).
    "cpu-fast": Preset("cpu-fast", "heads", backbone=ENCODER_BACKBONE, structured=True),
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
    # Your own decisions (notebook 08): the main model's recipe (cpu-fast's frozen MiniLM-L6 hybrid) on the project's
    # scenario data. Their states are text, which has no fields for trees to split on (model.fields.leaves), so the
    # hybrid mixes the heads and the lexical part. Small sets want a stronger L2. A fifth of train (65 of 325 tickets, 40 of
    # 196 reports) is the dev slice that picks L2 and steps, so the validation split (46 and 28 cases) is left to
    # calibration alone: picked on it too, its temperatures were fitted to the same few cases the heads had stopped on.
    "tickets": Preset("tickets", "heads", backbone=ENCODER_BACKBONE, dataset="tickets", dev_per_workflow=65, structured=True,
                      l2_grid=(3e-3, 1e-2, 3e-2, 1e-1)),
    "ngs-qc": Preset("ngs-qc", "heads", backbone=ENCODER_BACKBONE, dataset="ngs-qc", dev_per_workflow=40, structured=True,
                     l2_grid=(3e-3, 1e-2, 3e-2, 1e-1)),
    # The reference run: Qwen3.5-4B in 4-bit NF4, LoRA r16 / alpha 16, Unsloth, one 24 GB GPU.
    "gpu": Preset("gpu", "qlora", backbone="unsloth/Qwen3.5-4B", features=FeatureSpec("mean", (0.5, 1.0), 1024),
                  lora=LoraSettings(), epochs=3, lr=2e-4, finetune_head_lr=2e-4, batch_size=16, micro_batch=8,
                  gradient_checkpointing=True),  # the reference's rate; checkpointing pays at 1,024 tokens
}


def of_run(folder: str | Path, **overrides) -> Preset:
    """The preset the run in ``folder`` was trained with (its ``history.json``), with ``overrides``: a served model's
    own recipe, for the model that would replace it (``loop.retrain``)."""
    saved = json.loads((Path(folder) / HISTORY_FILE).read_text(encoding="utf-8"))["preset"]
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()
              if k not in ("name", "features", "lora")}
    fields["features"] = FeatureSpec.from_json(saved["features"])
    lora = saved.get("lora")
    fields["lora"] = None if lora is None else LoraSettings(**{k: tuple(v) if isinstance(v, list) else v
                                                              for k, v in lora.items()})
    return preset(saved["name"], **{**fields, **overrides})


def preset(name: str, **overrides) -> Preset:
    if name not in PRESETS:
        raise SettingError(f"preset {name!r} is unknown; expected one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)
