"""The compute dtype, chosen at run time: bfloat16 autocast where this machine runs it faster, else float32.

Machines of one kind differ: on a CPU with AVX2 only, bfloat16 ran several times *slower* than float32; on one with
``avx512_bf16``, a SmolLM2 forward ran about twice as fast under bfloat16 autocast with the same pooled features
(measured in ``../shared/notes/cpu-facts.md``). So nothing is assumed: ``choose(device)`` asks torch whether the CPU has bfloat16 instructions and, if so, times
one small matrix product in both dtypes (about 0.1 s, once per process). ``DECISIONKIT_DTYPE`` (``float32``,
``bfloat16`` or ``auto``) overrides the choice. Every timing and training record carries ``Precision.describe()``.

Autocast runs the matrix products in bfloat16 and keeps the weights, the optimizer and the heads in float32, so a
model trained under one dtype loads and answers under the other. It loads under its own, though (``as_saved``): a
saved model records the dtype it was trained under, since a probe on a busy machine can land on either side of
``MIN_SPEEDUP`` and the answers then move within the tolerance below. ``DECISIONKIT_DTYPE`` still wins. A model saved
under bfloat16, loaded where there are no bfloat16 instructions (a CPU without them, a GPU without bfloat16), runs
in float32: bfloat16 emulated there ran several times slower, and float32 is the more exact of the two, its answers
within bfloat16's tolerance of the saved model's (as a bfloat16 answer in another batch is).

What each dtype guarantees (``ANSWER_TOLERANCE``): the same state answered alone (``decide``), in a batch
(``decide_many``) or through the server (which batches) gives every probability, ``confidence`` and ``noul`` within
1e-5 in float32, and within 0.02 in bfloat16. The kernels a CPU picks for a bfloat16 matrix product depend on its
shape, so a state's features move with the batch it is padded into (most on Intel AMX: issue 21;
``benchmarks/results/numerics_*.json`` for the CPUs measured since). A ``choice`` or ``score`` can change only where
its top two options lie within twice the tolerance. ``systemone.disagreements`` checks two answers against it;
``benchmarks/numerics.py`` measures it on the machine it runs on.
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from .errors import ModelFolderError, SettingError

DTYPE_ENV = "DECISIONKIT_DTYPE"
PROBE_SIZE = 512  # a 512x512 product: long enough to time, short enough to run on every start
MIN_SPEEDUP = 1.2  # bfloat16 must beat float32 by this much to be worth its rounding
# How far an answer may move between alone, batched and served (see above); the tests assert these numbers.
ANSWER_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
CPU_FAMILIES = (("amx_bf16", "amx"), ("avx512_bf16", "avx512_bf16"), ("avx2", "avx2"))  # /proc/cpuinfo flag, name


@dataclass(frozen=True)
class Precision:
    """How the backbone's matrix products run: ``dtype`` is "bfloat16" (autocast) or "float32"."""

    device: str
    dtype: str
    reason: str  # why: the probe's measured speed-up, the missing instructions, or the override

    def autocast(self):
        """The context that runs the backbone in this dtype (autocast for bfloat16, nothing for float32)."""
        if self.dtype == "bfloat16":
            return torch.autocast(device_type=self.device, dtype=torch.bfloat16)
        return nullcontext()

    @contextmanager
    def frozen_weights_cast(self, model: nn.Module):
        """While entered, under bfloat16: the frozen float32 weights and biases of ``model``'s linear layers are
        bfloat16 copies, put back on exit (float32: nothing changes). Autocast casts a weight that needs no gradient
        again on every call, so a decoding loop paid a cast of every matrix per token, which made it slower than
        float32 here; a cast made once gives the same products to the last bit (autocast's cast, done earlier).

        The copies are made once per process and kept beside each layer (``bfloat16_copy``): later entries swap them
        in without casting again, until the float32 tensor changes (its in-place version counter moves, or it is
        replaced). Safe under threads: a layer another thread has swapped already is left to that thread, whose
        exit puts the float32 tensors back; a forward pass that meets them then autocasts, with the same products."""
        saved = []
        if self.dtype == "bfloat16":
            for module in model.modules():
                if isinstance(module, nn.Linear) and module.weight.dtype == torch.float32 \
                        and not module.weight.requires_grad:
                    weight, bias = module.weight, module.bias
                    saved.append((module, weight, bias))
                    module.weight, module.bias = bfloat16_copy(module, weight, bias)
        try:
            yield
        finally:
            for module, weight, bias in saved:
                module.weight, module.bias = weight, bias

    def describe(self) -> dict:
        return {"device": self.device, "compute_dtype": self.dtype, "reason": self.reason, **kernels()}


@functools.lru_cache(maxsize=None)
def kernels() -> dict:
    """Which kernels this CPU runs, recorded with every timing and measurement: torch's vector capability, whether
    oneDNN has bfloat16 instructions here, the CPU family (``amx``, ``avx512_bf16``, ``avx2`` or ``other``, from
    /proc/cpuinfo) and the oneDNN instruction-set cap, if one is set (``ONEDNN_MAX_CPU_ISA``)."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = set(next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), []))
    except OSError:
        flags = set()
    family = next((name for flag, name in CPU_FAMILIES if flag in flags), "other")
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_family": family,
            "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "")}


CAST_ATTRIBUTE = "_decisionkit_bfloat16"  # where a linear layer keeps its bfloat16 copies (``bfloat16_copy``)


def bfloat16_copy(module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None):
    """Frozen bfloat16 copies of a linear layer's float32 ``weight`` and ``bias``: cast on the first call, kept on
    the layer and reused while both tensors are the same objects at the same in-place version (an optimizer step or
    a ``copy_`` moves the version; loading new weights replaces the objects).

    The copies are ordinary tensors even when made under ``torch.inference_mode`` (a later forward that records
    gradients, as LoRA training's, may use them). Weights that are themselves inference tensors keep no version
    counter, so they are cast again at every call, as autocast would."""
    sources = (weight, bias)
    if any(t is not None and t.is_inference() for t in sources):
        return _cast(weight), _cast(bias)
    versions = tuple(None if t is None else t._version for t in sources)
    kept = getattr(module, CAST_ATTRIBUTE, None)
    # weak references: a replaced tensor is told apart from its successor even if the successor reuses its address
    if kept is None or kept[1] != versions or any((r() if r else None) is not t for r, t in zip(kept[0], sources)):
        with torch.inference_mode(False):
            kept = (tuple(None if t is None else weakref.ref(t) for t in sources), versions, _cast(weight),
                    _cast(bias))
        object.__setattr__(module, CAST_ATTRIBUTE, kept)  # not a submodule or parameter: invisible to state_dict
    return kept[2], kept[3]


def _cast(tensor: torch.Tensor | None) -> nn.Parameter | None:
    return None if tensor is None else nn.Parameter(tensor.detach().to(torch.bfloat16), requires_grad=False)


def matmul_times(dtype: torch.dtype, size: int = PROBE_SIZE, repeats: int = 5) -> list[float]:
    """Seconds of each of ``repeats`` products of two ``size`` x ``size`` matrices in ``dtype`` on the CPU, after a
    warm-up product."""
    generator = torch.Generator().manual_seed(0)  # a probe must not move the global random state
    a, b = (torch.randn(size, size, generator=generator).to(dtype) for _ in range(2))
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return times


def matmul_seconds(dtype: torch.dtype, size: int = PROBE_SIZE, repeats: int = 5) -> float:
    """Median seconds of one ``size`` x ``size`` matrix product in ``dtype`` (``matmul_times``)."""
    times = sorted(matmul_times(dtype, size, repeats))
    return times[len(times) // 2]


def _asked() -> str:
    """What ``DECISIONKIT_DTYPE`` asks for: auto, float32 or bfloat16."""
    asked = os.environ.get(DTYPE_ENV, "auto").strip().lower() or "auto"
    if asked not in ("auto", *ANSWER_TOLERANCE):
        raise SettingError(f"{DTYPE_ENV} is {asked!r}; expected auto, float32 or bfloat16")
    return asked


def has_bfloat16(device: str) -> bool:
    """Whether ``device`` runs bfloat16 in its own instructions (a CPU through oneDNN, a GPU natively)."""
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    return device == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def as_saved(device: str, saved: str | None) -> Precision:
    """The compute dtype for a model saved under ``saved`` (None: saved before models kept it, so ``choose``): the
    override in ``DECISIONKIT_DTYPE``, else ``saved``, unless that is bfloat16 and ``device`` has no bfloat16
    instructions, where float32 runs (see above). No probe: a model answers alike on every start."""
    asked = _asked()
    if asked != "auto":
        return Precision(device, asked, f"set by {DTYPE_ENV}")
    if saved is None:
        return choose(device)
    if saved not in ANSWER_TOLERANCE:
        raise ModelFolderError(f"the model was saved under compute dtype {saved!r}; expected float32 or bfloat16")
    if saved == "bfloat16" and not has_bfloat16(device):
        return Precision(device, "float32", f"saved under bfloat16, which {device} runs without its own "
                                            "instructions (slowly): float32, within bfloat16's tolerance")
    return Precision(device, saved, "the dtype the model was saved under")


@functools.lru_cache(maxsize=None)
def choose(device: str = "cpu") -> Precision:
    """The compute dtype for ``device``: the override in ``DECISIONKIT_DTYPE``, else measured (CPU) or the
    GPU's bfloat16 support."""
    asked = _asked()
    if asked != "auto":
        return Precision(device, asked, f"set by {DTYPE_ENV}")
    if device == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision(device, "bfloat16", "the GPU supports bfloat16")
        return Precision(device, "float32", "the GPU has no bfloat16")
    if device != "cpu":
        return Precision(device, "float32", f"no probe for device {device!r}")
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return Precision(device, "float32", "this CPU has no bfloat16 instructions")
    speedup = matmul_seconds(torch.float32) / matmul_seconds(torch.bfloat16)
    dtype = "bfloat16" if speedup >= MIN_SPEEDUP else "float32"
    return Precision(device, dtype, f"bfloat16 matmul ran {speedup:.1f}x float32 on this CPU")
