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
