"""Where the memory of a (Q)LoRA run goes: counted on the model you loaded, estimated for models you cannot load.

- ``parameter_table(backbone)``: every parameter of the loaded model grouped by role (embeddings, attention,
  MLP, norms, LoRA adapters), with its count, whether it trains, and the bytes it really occupies (4-bit weights
  are stored two values a byte plus their quantization constants).
- ``estimate(shape, setup)``: the peak memory of a training run from the model's shapes, term by term: 4-bit base
  weights, LoRA weights with their gradients and Adam moments, and the activations kept for the backward pass.
  ``ModelShape.from_config`` reads the shapes of any transformers config, so the estimate can be checked against
  a model you do load (notebook 02 does this for SmolLM2).
- ``core.environment.peak_rss_gb()`` (kept there, as training reports it too): the peak resident memory this process
  has measured so far, on Linux, macOS and Windows (what a CPU training run reports as its peak memory).
- ``measure_step(preset)`` / ``measure_peaks(shape, setups)``: one training step of a setup run in a fresh Python
  process, its memory just before the step and at the step's peak, beside ``estimate`` for the same setup. A peak
  read in the notebook's own process is its lifetime high-water mark: whatever ran before counts in it.

The activation count follows the tensors a Llama-style layer saves for its backward pass (Korthikanti et al.,
2022, "Reducing Activation Recomputation in Large Transformer Models", adapted to SwiGLU and grouped-query
attention, with a fused attention kernel that keeps no score matrix). It leaves out the allocator's slack and the
CUDA context, which a measured peak includes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ..core.environment import GB
from ..model.backbone import Backbone, LoraSettings, QuantSettings, weight_count

NF4_BLOCK = 64  # bitsandbytes quantizes weights in blocks of 64 values, one absmax constant per block
NF4_BLOCK2 = 256  # double quantization: the absmax constants are quantized to 8 bits in blocks of 256


def nf4_bits_per_weight(quant: QuantSettings = QuantSettings()) -> float:
    """Stored bits per 4-bit weight: 4, plus its share of the block constants (fp32, or 8-bit when doubled)."""
    if quant.double_quant:
        return 4 + 8 / NF4_BLOCK + 32 / (NF4_BLOCK * NF4_BLOCK2)
    return 4 + 32 / NF4_BLOCK


def _role(name: str) -> str:
    if "lora_" in name:
        return "LoRA adapters"
    if "embed" in name or "lm_head" in name:
        return "embeddings / LM head"
    if "norm" in name:
        return "norms"
    if any(k in name for k in ("q_proj", "k_proj", "v_proj", "o_proj", "self_attn")):
        return "attention"
    if "mlp" in name or any(k in name for k in ("gate_proj", "up_proj", "down_proj")):
        return "MLP"
    return "other"


@dataclass
class ParameterTable:
    """Parameters of a loaded model by role: count, trainable count and bytes in memory."""

    rows: pd.DataFrame

    def table(self) -> pd.DataFrame:
        total = self.rows.sum(numeric_only=True).rename("total")
        table = pd.concat([self.rows, total.to_frame().T])
        table["MB"] = (table.pop("bytes") / 1e6).round(1)
        return table.astype({"parameters": int, "trainable": int})

    @property
    def trainable(self) -> int:
        return int(self.rows["trainable"].sum())

    @property
    def total(self) -> int:
        return int(self.rows["parameters"].sum())

    @property
    def megabytes(self) -> float:
        return float(self.rows["bytes"].sum()) / 1e6


def parameter_table(backbone: Backbone) -> ParameterTable:
    """Count every parameter of ``backbone.model``; a 4-bit tensor counts the weights it stands for."""
    rows: dict[str, dict[str, float]] = {}
    for name, param in backbone.model.named_parameters():
        count = weight_count(param)
        stored = param.numel() * param.element_size()
        if count > param.numel():  # packed 4-bit: the block constants live beside the weights
            stored += count * (nf4_bits_per_weight(backbone.quantize or QuantSettings()) - 4) / 8
        row = rows.setdefault(_role(name), {"parameters": 0, "trainable": 0, "bytes": 0.0})
        row["parameters"] += count
        row["trainable"] += count if param.requires_grad else 0
        row["bytes"] += stored
    return ParameterTable(pd.DataFrame.from_dict(rows, orient="index").sort_index())


@dataclass(frozen=True)
class ModelShape:
    """The shapes that decide a decoder's memory (Llama/Qwen style: GQA attention, SwiGLU MLP)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = True

    @classmethod
    def from_config(cls, config, name: str | None = None) -> "ModelShape":
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(name or getattr(config, "name_or_path", "model") or "model", config.num_hidden_layers,
                   config.hidden_size, config.intermediate_size, heads,
                   getattr(config, "num_key_value_heads", None) or heads, head_dim, config.vocab_size,
                   bool(getattr(config, "tie_word_embeddings", False)))

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection in one layer: the modules LoRA and 4-bit act on."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}

    @property
    def linear_parameters(self) -> int:
        return self.layers * sum(i * o for i, o in self.linears().values())

    @property
    def other_parameters(self) -> int:
        """Embeddings (and an untied LM head) plus the norms: what 4-bit loading leaves in 16 bits."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + (2 * self.layers + 1) * self.hidden

    @property
    def parameters(self) -> int:
        return self.linear_parameters + self.other_parameters

    def lora_parameters(self, lora: LoraSettings) -> int:
        adapted = self.layers - round(lora.first_layer * self.layers)
        per_layer = sum(lora.r * (i + o) for name, (i, o) in self.linears().items() if name in lora.target_modules)
        return adapted * per_layer

    def activation_values_per_token_layer(self) -> int:
        """Values one layer keeps for backward per token: norm outputs, q/k/v, attention output, the four SwiGLU
        tensors (gate, up, activation, product) and the two residual sums."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * self.hidden + q + 2 * kv + q + 4 * self.intermediate + 2 * self.hidden


# Shapes for the three backbone sizes the course talks about. The Qwen3.5 configs are not readable offline, so
# these are dense Qwen3-style shapes picked to land on the nominal sizes: assumptions, labelled as such. With a
# hub connection, ``ModelShape.from_config(AutoConfig.from_pretrained(hub_id))`` replaces them.
ASSUMED_SHAPES = (
    ModelShape("~0.8B (assumed shape)", 24, 1280, 4608, 16, 8, 128, 151_936),
    ModelShape("~4B (assumed shape)", 36, 2560, 9728, 32, 8, 128, 151_936),
    ModelShape("~9B (assumed shape)", 40, 4096, 12_288, 32, 8, 128, 151_936, tied_embeddings=False),
)

# Quoted, not measured here: the reference run's peak for Qwen3.5-4B in 4-bit (24 GB GPU, Unsloth, LoRA r16) and
# the same author's guess for a 9B backbone.
QUOTED_PEAK_GB = {ASSUMED_SHAPES[1].name: (7.95, 7.95), ASSUMED_SHAPES[2].name: (14.0, 16.0)}


@dataclass(frozen=True)
class TrainingSetup:
    """What a training step holds in memory, besides the model's shapes."""

    batch_size: int = 8  # cases per micro-batch (gradient accumulation does not add activations)
    seq_len: int = 1024  # tokens per case: the gpu preset's max_length, padded batches take the longest
    lora: LoraSettings = LoraSettings()
    quant: QuantSettings | None = QuantSettings()  # None: the base stays in 16 bits
    value_bytes: int = 2  # bf16 activations and unquantized weights on a GPU; 4 (float32) on CPU
    gradient_checkpointing: bool = True  # Unsloth's default: keep one tensor per layer, recompute the rest


@dataclass
class MemoryEstimate:
    """Peak training memory of one shape and setup, in GB, term by term."""

    shape: ModelShape
    setup: TrainingSetup
    terms: dict[str, float] = field(default_factory=dict)
    generative_logits_gb: float = 0.0  # what generative fine-tuning would add: logits over the vocabulary

    @property
    def total_gb(self) -> float:
        return sum(self.terms.values())


def estimate(shape: ModelShape, setup: TrainingSetup = TrainingSetup()) -> MemoryEstimate:
    """Peak memory of a (Q)LoRA decision-model training step for ``shape`` (see the module docstring)."""
    v = setup.value_bytes
    if setup.quant is not None:
        base = shape.linear_parameters * nf4_bits_per_weight(setup.quant) / 8 + shape.other_parameters * v
    else:
        base = shape.parameters * v
    lora = shape.lora_parameters(setup.lora) * (4 + 4 + 8)  # fp32 weights, gradients, two Adam moments
    tokens = setup.batch_size * setup.seq_len
    trained_layers = shape.layers - round(setup.lora.first_layer * shape.layers)  # backward stops below these
    per_layer = tokens * shape.activation_values_per_token_layer() * v
    if setup.gradient_checkpointing:
        activations = {"activations: one checkpoint per layer": trained_layers * tokens * shape.hidden * v,
                       "activations: the layer being recomputed": per_layer}
    else:
        activations = {"activations: every trained layer": trained_layers * per_layer}
    terms = {"base weights": base, "LoRA weights, gradients, Adam": lora, **activations}
    logits = tokens * shape.vocab * 4 * 2  # fp32 logits and their gradient, never computed by decision heads
    return MemoryEstimate(shape, setup, {k: x / GB for k, x in terms.items()}, logits / GB)


@dataclass
class MemoryComparison:
    """Estimates for several shapes beside the quoted reference figures."""

    estimates: list[MemoryEstimate]
    references: dict[str, tuple[float, float]] = field(default_factory=dict)  # shape -> quoted GB (low, high)

    def table(self) -> pd.DataFrame:
        rows = {}
        for e in self.estimates:
            rows[e.shape.name] = {"parameters (B)": round(e.shape.parameters / 1e9, 2),
                                  **{k: round(x, 2) for k, x in e.terms.items()},
                                  "estimate (GB)": round(e.total_gb, 2),
                                  "quoted (GB)": _quoted(self.references.get(e.shape.name)),
                                  "generative logits would add (GB)": round(e.generative_logits_gb, 2)}
        return pd.DataFrame.from_dict(rows, orient="index")

    def figure(self):
        from ..core.plots import memory_bars

        return memory_bars(self)


def _quoted(span: tuple[float, float] | None) -> str:
    if span is None:
        return ""
    return f"{span[0]:g}" if span[0] == span[1] else f"{span[0]:g}-{span[1]:g}"


def compare(shapes=ASSUMED_SHAPES, setup: TrainingSetup = TrainingSetup(), references=None) -> MemoryComparison:
    """Estimates for ``shapes`` beside the quoted figures (``QUOTED_PEAK_GB`` unless ``references`` is given)."""
    return MemoryComparison([estimate(s, setup) for s in shapes],
                            dict(QUOTED_PEAK_GB if references is None else references))


# --- measured: one training step of a setup, in a fresh process ---------------------------------------------------

@dataclass
class MeasuredStep:
    """One optimizer step of a preset (``trainer.step_cost``, as training runs it), in a fresh Python process: what
    the process held before the step and at the step's peak. On a CPU, resident memory: ``before_gb`` just before
    the step, ``peak_gb`` its high-water mark reset there (Linux; elsewhere the process's lifetime peak), and
    ``lifetime_peak_gb`` the child's ``ru_maxrss``, loading included. On a GPU, ``torch.cuda`` allocated bytes."""

    name: str
    device: str
    trainable: int  # parameters the step updates
    tokens: int  # tokens the step read
    seconds: float
    before_gb: float
    peak_gb: float
    lifetime_peak_gb: float

    @property
    def step_gb(self) -> float:
        """What the step added on top of what was loaded: the adapters' gradients and optimizer state, and the
        activations (the terms of ``estimate`` besides the base weights)."""
        return self.peak_gb - self.before_gb


def step_setup(p, device: str = "cpu") -> TrainingSetup:
    """The ``TrainingSetup`` of one micro-batch of preset ``p``: its cases at up to its window (times its cap on
    windows), its LoRA, 4-bit base in qlora mode, 4-byte values on a CPU (float32) and 2 on a GPU (bf16)."""
    return TrainingSetup(batch_size=p.micro_batch, seq_len=p.features.max_length * p.features.max_windows,
                         lora=p.lora, quant=QuantSettings() if p.mode == "qlora" else None,
                         value_bytes=4 if device == "cpu" else 2, gradient_checkpointing=p.gradient_checkpointing)


def measure_step(name: str, timeout: float = 900, **overrides) -> MeasuredStep:
    """Run one optimizer step of ``preset(name, **overrides)`` in a fresh Python process and read its memory
    (``MeasuredStep``): a peak read in this process would count whatever ran here before. ``overrides`` are preset
    fields given as JSON values (``max_length`` sets the window and reads one window a case)."""
    import json
    import subprocess
    import sys

    spec = json.dumps({"name": name, "overrides": overrides})
    done = subprocess.run([sys.executable, "-c", f"from {__name__} import _step_here; _step_here({spec!r})"],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the step of {name!r} failed in its process:\n{done.stderr[-2000:]}")
    return MeasuredStep(**json.loads(done.stdout.strip().splitlines()[-1]))


def _resident_gb(field_name: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field_name)) * 1024 / GB


def _step_here(spec: str) -> None:
    """The child of ``measure_step``: one step, memory noted just before it (the trainer's step, wrapped)."""
    import json
    import sys
    import warnings

    import torch

    from ..core.environment import peak_rss_gb
    from ..training import trainer

    warnings.filterwarnings("ignore")
    spec = json.loads(spec)
    p = step_preset(spec["name"], **spec["overrides"])
    cuda = torch.cuda.is_available()
    linux = sys.platform.startswith("linux")
    marks = {}
    step = trainer.optimizer_step

    def noted(*args, **kwargs):
        if cuda:
            marks["before"] = torch.cuda.memory_allocated() / GB
            torch.cuda.reset_peak_memory_stats()
        elif linux:
            marks["before"] = _resident_gb("VmRSS")
            with open("/proc/self/clear_refs", "w") as clear:  # resets VmHWM to the current resident memory
                clear.write("5")
        return step(*args, **kwargs)

    trainer.optimizer_step = noted
    cost = trainer.step_cost(p, steps=1, warmup=0)
    lifetime = peak_rss_gb()
    peak = torch.cuda.max_memory_allocated() / GB if cuda else _resident_gb("VmHWM") if linux else lifetime
    print(json.dumps({"name": p.name, "device": "cuda" if cuda else "cpu", "trainable": cost.trainable,
                      "tokens": int(cost.tokens[0]), "seconds": cost.seconds[0],
                      "before_gb": marks.get("before", float("nan")), "peak_gb": peak, "lifetime_peak_gb": lifetime}))


@dataclass
class StepMemory:
    """Measured steps beside ``estimate`` for the same setups (``measure_peaks``)."""

    rows: pd.DataFrame

    def table(self) -> pd.DataFrame:
        return self.rows.round(3)


def step_preset(name: str, **overrides):
    """``preset(name, **overrides)``, where ``max_length`` sets the window and reads one window a case."""
    from dataclasses import replace

    from ..training.presets import preset

    max_length = overrides.pop("max_length", None)
    p = preset(name, **overrides)
    if max_length is not None:
        p = replace(p, features=replace(p.features, max_length=max_length, max_windows=1))
    return p


def measure_peaks(shape: ModelShape, setups: dict[str, dict]) -> StepMemory:
    """For each setup (label -> ``{"preset": name, **overrides}``, as ``measure_step`` takes them): one step measured
    in its own fresh process, beside ``estimate(shape, step_setup(...))`` of the same setup."""
    rows = {}
    for label, setup in setups.items():
        overrides = {k: v for k, v in setup.items() if k != "preset"}
        measured = measure_step(setup["preset"], **overrides)
        guess = estimate(shape, step_setup(step_preset(setup["preset"], **overrides), measured.device))
        rows[label] = {"trainable parameters": measured.trainable, "tokens in the step": measured.tokens,
                       "step (s)": measured.seconds, "estimate: base weights (GB)": guess.terms["base weights"],
                       "estimate: the step adds (GB)": guess.total_gb - guess.terms["base weights"],
                       "estimate: total (GB)": guess.total_gb,
                       "measured: before the step (GB)": measured.before_gb,
                       "measured: the step adds (GB)": measured.step_gb, "measured: step peak (GB)": measured.peak_gb,
                       "measured: process peak, loading included (GB)": measured.lifetime_peak_gb}
    return StepMemory(pd.DataFrame.from_dict(rows, orient="index"))
