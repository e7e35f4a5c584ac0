"""The speed table: every way to run the decision pass, each against float32 at batch 1 and against its floor.

``speed_table``: every variant of ``SPEED_VARIANTS`` (float32 and bfloat16, batch 1, 4 and 16, int8 in torch and in
ONNX Runtime with heads re-fitted on their features, ONNX Runtime float32, another backbone): milliseconds per case,
accuracy and KL, the speed-up over float32 at batch 1 and the arithmetic floor, the forward pass's FLOPs over this
CPU's measured matmul rate (``matmul_rate``; torch's, so another engine can beat it a little). Timings follow
``latency.py``'s rules (warm-up, the clock read after the device finishes).
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..core.precision import Precision, matmul_times
from ..data.metrics import score
from ..model.features import standardization
from ..model.fitting import refit_heads
from ..model.heads import HeadSet
from ..model.output import read
from ..model.windows import window_lengths


def _computing_in(dtype: str):
    """A variant that runs the backbone's matrix products in ``dtype`` (whatever this machine would choose)."""
    def variant(model):
        model = copy.deepcopy(model)
        model.backbone.precision = Precision(model.backbone.device, dtype, "set by the speed variant")
        return model.pooled

    return variant


def _int8(model):
    model = copy.deepcopy(model)
    model.backbone.precision = Precision(model.backbone.device, "float32", "dynamic int8 takes float32 activations")
    # torch 2.13 deprecates eager-mode quantization in favour of torchao, whose CPU int8 path is not the one this
    # row measures (fbgemm's dynamic int8 kernels, as ONNX Runtime's row beside it); torch 2.13 still ships it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.ao.quantization is deprecated", DeprecationWarning)
        from torch.ao.quantization import quantize_dynamic

        quantize_dynamic(model.backbone.model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model.pooled


def _onnx(int8: bool):
    def variant(model):
        from .onnx_runtime import OnnxEncoder, export, quantize

        path = export(model)
        return OnnxEncoder(quantize(path) if int8 else path, pooling=model.spec.pooling)

    return variant


@dataclass(frozen=True)
class SpeedVariant:
    """One way to run the decision pass: how to build its encoder, at which batch size, and whether the heads must
    be re-fitted on its features (int8 changes them: unchanged heads on dynamic int8 fell to 0.408 accuracy)."""

    build: Callable  # model -> (tokenized batch -> pooled features, unstandardized)
    batch_size: int = 1
    refit: bool = False
    dtype: str = "float32"  # for the arithmetic floor: which measured matmul rate bounds it


SPEED_VARIANTS = {
    "float32, batch 1": SpeedVariant(_computing_in("float32")),  # the reference row: speed-ups are against it
    "bfloat16 autocast, batch 1": SpeedVariant(_computing_in("bfloat16"), dtype="bfloat16"),  # CPUs with bf16 only
    "bfloat16 autocast, batch 4": SpeedVariant(_computing_in("bfloat16"), 4, dtype="bfloat16"),
    "bfloat16 autocast, batch 16": SpeedVariant(_computing_in("bfloat16"), 16, dtype="bfloat16"),
    "int8 dynamic (torch), heads re-fitted": SpeedVariant(_int8, refit=True, dtype="int8"),
    "ONNX Runtime float32": SpeedVariant(_onnx(False)),
    "ONNX Runtime int8, heads re-fitted": SpeedVariant(_onnx(True), refit=True, dtype="int8"),
}


def matmul_rate(dtype: str, size: int = 2048, repeats: int = 5, enough: float = 0.02) -> float:
    """This CPU's peak GFLOP/s for a square matrix product in ``dtype`` (float32 or bfloat16): the fastest of
    ``repeats`` timed products after a warm-up (``precision.matmul_times``), so a floor computed from it is a floor.
    The side doubles from 256 up to ``size`` while one product takes under ``enough`` seconds: where the dtype has no
    kernels of its own (bfloat16 on an AVX2-only CPU, about 1 GFLOP/s) a 2048 x 2048 product takes tens of seconds,
    and a smaller one already shows the rate."""
    side = 256
    while True:
        times = matmul_times(getattr(torch, dtype), side, repeats)
        if side >= size or min(times) >= enough:
            return 2 * side ** 3 / min(times) / 1e9
        side *= 2


def forward_flops(backbone, tokens: int) -> float:
    """Multiply-adds x 2 of one forward pass over ``tokens`` tokens: every weight matrix once per token (the
    embedding and the unused LM head excluded), plus the attention scores and their weighted sum."""
    config = backbone.model.config
    body = sum(p.numel() for n, p in backbone.body.named_parameters() if p.dim() == 2 and "embed" not in n)
    return 2 * body * tokens + 4 * config.num_hidden_layers * tokens ** 2 * config.hidden_size


def _features(encoder, batches) -> tuple[torch.Tensor, list[float]]:
    """Pooled features of every batch and the milliseconds each batch took."""
    out, ms = [], []
    for batch in batches:
        start = time.perf_counter()
        out.append(encoder(batch))
        ms.append((time.perf_counter() - start) * 1e3)
    return torch.cat(out).float(), ms


def _batches(model, texts: Sequence[str], size: int) -> tuple[list[dict], list[int]]:
    """Tokenized batches of ``size`` texts of similar length (as ``decide_many`` makes them) and the row order."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    groups = [order[i:i + size] for i in range(0, len(order), size)]
    return [model.tokenize([texts[i] for i in g]) for g in groups], [i for g in groups for i in g]


@torch.inference_mode()
def speed_table(model, cases, train=None, names: Sequence[str] = tuple(SPEED_VARIANTS), warmup: int = 2,
                encoder_model=None) -> pd.DataFrame:
    """Each way to run the decision pass (``SPEED_VARIANTS``), on ``cases``: median and p95 milliseconds per case,
    cases per second, accuracy and KL (the heads re-fitted on ``train``'s features of that variant where it changes
    them), the speed-up over float32 at batch 1 and the arithmetic floor: the forward pass's FLOPs at the median
    case length over this CPU's measured matmul rate in that dtype. ``encoder_model`` (a model on another backbone,
    e.g. MiniLM) adds one row with its own heads. A speed-up counts only if accuracy stays within 0.01 of float32."""
    texts = cases.texts

    def median_tokens(m) -> float:
        return float(np.median(window_lengths(m.backbone, texts, m.spec.max_length, m.spec.max_windows)[0]))

    tokens = median_tokens(model)
    rates = {d: matmul_rate(d) for d in ("float32", "bfloat16")}
    rows = {}
    entries = [(name, model, SPEED_VARIANTS[name]) for name in names]
    if encoder_model is not None:
        entries.append((f"{encoder_model.backbone.name} (its own heads), batch 1", encoder_model,
                        SpeedVariant(lambda m: m.pooled, dtype=encoder_model.backbone.precision.dtype)))
    for name, base, variant in entries:
        encode = variant.build(base)
        batches, order = _batches(base, texts, variant.batch_size)
        for batch in batches[:warmup]:
            encode(batch)
        pooled, ms = _features(encode, batches)
        pooled = pooled[np.argsort(order)]  # back to case order
        heads, mean, std = base.heads, base.feature_mean, base.feature_std
        if variant.refit:
            if train is None or base.head_recipe is None:
                raise ValueError(f"{name} changes the features: pass the train split (and a model whose heads were "
                                 f"fitted in stage 1) to re-fit its heads")
            train_batches, train_order = _batches(base, train.texts, 16)
            train_pooled = _features(encode, train_batches)[0][np.argsort(train_order)]
            mean, std = standardization(train_pooled)
            with torch.inference_mode(False), torch.enable_grad():  # a short full-batch fit, outside inference mode
                heads = HeadSet(base.schema, pooled.shape[1])
                refit_heads(heads, train, ((train_pooled - mean) / std).clone(), base.head_recipe)
        output = read(base.schema, heads, base.structured, (pooled - mean) / std, cases.case_workflows,
                      states=cases.states)
        overall = score(cases, *base.readout(output)).overall()
        cases_in = [int(b["owner"].max()) + 1 for b in batches]  # a batch's states (its rows are their windows)
        per_case = np.concatenate([[m / n] * n for m, n in zip(ms, cases_in)])
        length = tokens if base is model else median_tokens(base)
        floor = forward_flops(base.backbone, int(length)) / (rates.get(variant.dtype, np.nan) * 1e9) * 1e3
        rows[name] = {"median ms per case": float(np.median(per_case)), "p95 ms per case": float(
            np.percentile(per_case, 95)), "cases/s": len(texts) / (sum(ms) / 1e3), "accuracy": overall["accuracy"],
            "kl": overall["kl"], "heads re-fitted": variant.refit, "arithmetic floor ms": floor}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.insert(3, "speed-up", table["median ms per case"].iloc[0] / table["median ms per case"])
    table.attrs.update({"median tokens": tokens, **{f"{d} matmul GFLOP/s": r for d, r in rates.items()}})
    return table
