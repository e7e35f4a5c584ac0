"""Latency you can trust: warm-up calls, percentiles, cold start apart, clocks read after the device finishes.

- ``time_calls(name, fn, inputs)``: one timed call per input after a few warm-up calls; ``Timing.stats()`` gives
  mean, p50, p95, p99, min and max in milliseconds.
- ``decision_timings(model, cases)``: the decision model per case, tokenization and forward pass (backbone,
  pooling, heads) timed apart, and their sum.
- ``cold_start(path, case)``: a fresh process importing decisionkit, loading a saved model and answering once,
  each timed: what the first request after a deploy waits for.
- ``head_scaling`` and ``naive_scaling``: the cost of one more question, on one shared encoding (extra heads)
  against one prompt and one forward pass per question; ``Scaling.slope_ms`` is the fitted cost per question.

Every result carries ``hardware()``: the CPU or GPU, torch's thread count and versions. Offline numbers like
these (batch 1, warm, one process) are not online serving numbers: see notebook 05's last section.
"""

from __future__ import annotations

import copy
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from .environment import environment
from .precision import Precision
from .features import tokenize

PERCENTILES = (50, 95, 99)


def synchronize(device: str) -> None:
    """Wait for queued GPU work, so a clock read after it measures the work and not just its launch."""
    if device == "cuda":
        torch.cuda.synchronize()


def hardware() -> dict[str, str]:
    """The machine a timing was taken on."""
    info = environment()
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "device": info["device"], "torch threads": info["torch threads"], "torch": info["torch"],
            "transformers": info["transformers"]}


@dataclass
class Timing:
    """Milliseconds per call of one thing, one sample per input."""

    name: str
    samples_ms: np.ndarray

    def stats(self) -> dict[str, float]:
        s = self.samples_ms
        return {"calls": len(s), "mean": float(s.mean()), **{f"p{q}": float(np.percentile(s, q)) for q in PERCENTILES},
                "min": float(s.min()), "max": float(s.max())}

    @property
    def median(self) -> float:
        return float(np.median(self.samples_ms))


def time_calls(name: str, fn: Callable[[Any], Any], inputs: Sequence[Any], warmup: int = 2,
               device: str = "cpu") -> Timing:
    """Time ``fn(x)`` once per input, after ``warmup`` untimed calls on the first inputs."""
    for x in list(inputs)[:warmup]:
        fn(x)
    synchronize(device)
    samples = []
    for x in inputs:
        start = time.perf_counter()
        fn(x)
        synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return Timing(name, np.asarray(samples))


@dataclass
class LatencyResult:
    """Several timings taken on the same inputs and machine."""

    timings: list[Timing]
    hardware: dict = field(default_factory=hardware)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({t.name: t.stats() for t in self.timings}).T.astype({"calls": int})

    def __getitem__(self, name: str) -> Timing:
        return next(t for t in self.timings if t.name == name)

    def figure(self, title: str = "Latency per request"):
        from .plots import latency_boxes

        return latency_boxes(self.timings, title)


@torch.inference_mode()
def decision_timings(model, cases, warmup: int = 2) -> LatencyResult:
    """Per case: tokenization, the forward pass (backbone, pooling, every head of the case) and the whole
    ``decide`` call, each timed on its own."""
    device = model.backbone.device
    texts, workflows = cases.texts, cases.case_workflows

    def whole(i: int) -> None:
        model.heads.probabilities(model([texts[i]]), workflows[i], None, model.temperatures)

    batches = [tokenize(model.backbone, [t], model.spec.max_length) for t in texts]
    index = list(range(len(texts)))
    return LatencyResult([
        time_calls("tokenize", lambda i: tokenize(model.backbone, [texts[i]], model.spec.max_length), index, warmup,
                   device),
        time_calls("forward + heads", lambda i: model.heads.probabilities(model.encode(batches[i]), workflows[i], None,
                                                                           model.temperatures), index, warmup, device),
        time_calls("tokenize + forward + heads", whole, index, warmup, device),
    ])


_COLD_START = """
import json, sys, time
start = time.perf_counter()
import decisionkit
imported = time.perf_counter()
model = decisionkit.load(sys.argv[1])
loaded = time.perf_counter()
case = json.loads(sys.argv[2])
model.decide(case["state"], workflow=case["workflow"])
answered = time.perf_counter()
print(json.dumps({"import (s)": imported - start, "load (s)": loaded - imported,
                  "first decide (ms)": (answered - loaded) * 1e3}))
"""


def cold_start(path, case) -> dict[str, float]:
    """A fresh Python process: seconds to import decisionkit and load the saved model, then milliseconds of its
    first answer (what the first request after a deploy or a scale-up waits for)."""
    payload = json.dumps({"state": case.state, "workflow": case.workflow})
    out = subprocess.run([sys.executable, "-c", _COLD_START, str(path), payload], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@dataclass
class Scaling:
    """Milliseconds to answer n questions about one input, for several n, and the fitted cost per question."""

    name: str
    counts: list[int]
    ms: list[float]  # median over repeats, per count

    @property
    def slope_ms(self) -> float:
        return float(np.polyfit(self.counts, self.ms, 1)[0])

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"questions": self.counts, f"{self.name} (ms)": self.ms}).set_index("questions")


def _median_ms(fn: Callable[[], Any], repeats: int, device: str) -> float:
    return time_calls("", lambda _: fn(), range(repeats), 0, device).median


@torch.inference_mode()
def head_scaling(model, text: str, counts=(1, 2, 4, 8, 16, 32, 64), options: int = 4,
                 repeats: int = 200) -> tuple[Scaling, float]:
    """Heads only, on one encoding of ``text``: the time of n linear heads plus their softmax, for each n.
    The heads are synthetic (random, ``options`` outputs each): their cost depends on their shape, not their
    training. Returns the scaling and the median milliseconds of the encoding itself."""
    device = model.backbone.device
    batch = tokenize(model.backbone, [text], model.spec.max_length)
    encode_ms = _median_ms(lambda: model.encode(batch), max(3, repeats // 40), device)
    features = model.encode(batch)
    heads = [nn.Linear(features.shape[-1], options).to(device) for _ in range(max(counts))]

    def answer(n: int) -> None:
        for head in heads[:n]:
            torch.softmax(head(features), dim=-1)

    answer(max(counts))  # warm-up
    return Scaling("shared encoding + n heads", list(counts),
                   [encode_ms + _median_ms(lambda: answer(n), repeats, device) for n in counts]), encode_ms


@torch.inference_mode()
def naive_scaling(backbone, case, counts=(1, 2, 3, 4, 5), max_length: int = 512, repeats: int = 3) -> Scaling:
    """The naive way: one prompt per question (the state plus that question), one forward pass each."""
    from .zeroshot import question_block

    questions = list(case.questions.values())
    prompts = [f"{case.text}\n\n{question_block(questions[i % len(questions)])}" for i in range(max(counts))]
    batches = [tokenize(backbone, [p], max_length) for p in prompts]

    def ask(n: int) -> None:
        for batch in batches[:n]:
            backbone.body(**batch)

    ask(1)  # warm-up
    return Scaling("one prompt + forward per question", list(counts),
                   [_median_ms(lambda: ask(n), repeats, backbone.device) for n in counts])


@torch.inference_mode()
def length_sweep(model, texts: Sequence[str], lengths=(64, 128, 256, 512), repeats: int = 3) -> pd.DataFrame:
    """Median forward-pass milliseconds when the inputs are cut to each token length (latency grows with the
    state, which a benchmark of short clean inputs hides)."""
    device = model.backbone.device
    rows = {}
    for n in lengths:
        batches = [tokenize(model.backbone, [t], n) for t in texts]
        model.encode(batches[0])  # warm-up at this shape
        ms = [_median_ms(lambda: model.encode(b), repeats, device) for b in batches]
        tokens = [int(b["attention_mask"].sum()) for b in batches]
        rows[n] = {"mean tokens": float(np.mean(tokens)), "median ms": float(np.median(ms))}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("max tokens")


def _computing_in(dtype: str):
    """A variant that runs the backbone's matrix products in ``dtype`` (whatever this machine would choose)."""
    def variant(model):
        model.backbone.precision = Precision(model.backbone.device, dtype, "set by the speed variant")
        return model

    return variant


def _int8(model):
    from torch.ao.quantization import quantize_dynamic

    _computing_in("float32")(model)  # dynamic int8 layers take float32 activations
    quantize_dynamic(model.backbone.model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


def _compiled(model):
    model.backbone.body.compile()  # in place; the first calls compile, the warm-up absorbs them
    return model


SPEED_VARIANTS = {
    "float32": _computing_in("float32"),  # the reference row: speed-ups are against it
    "bfloat16 autocast": _computing_in("bfloat16"),  # fast only where the CPU has bfloat16 instructions
    "int8 dynamic (nn.Linear)": _int8,  # weights int8, activations quantized per call: CPU only
    "torch.compile": _compiled,  # in the compute dtype chosen for this machine
}


@torch.inference_mode()
def speed_variants(model, cases, names=tuple(SPEED_VARIANTS), warmup: int = 2) -> pd.DataFrame:
    """Each CPU speed-up applied to a copy of ``model``: forward-pass time per case, the warm-up it needed, and
    accuracy / KL on ``cases`` with the unchanged heads (features are recomputed, never read from the cache).
    A speed-up is worth keeping only if accuracy stays within noise of the first (float32) row."""
    from .heads import predict
    from .metrics import score

    rows = {}
    for name in names:
        variant = SPEED_VARIANTS[name](copy.deepcopy(model))
        batches = [tokenize(variant.backbone, [t], variant.spec.max_length) for t in cases.texts]
        start = time.perf_counter()
        for b in batches[:warmup]:
            variant.encode(b)
        warmup_s = time.perf_counter() - start
        features: list[torch.Tensor] = []
        timing = time_calls(name, lambda i: features.append(variant.encode(batches[i])), range(len(batches)), 0,
                            variant.backbone.device)
        overall = score(cases, predict(variant.heads, torch.cat(features), cases, variant.temperatures)).overall()
        rows[name] = {"median ms": timing.median, "p95 ms": timing.stats()["p95"], "warm-up (s)": warmup_s,
                      "accuracy": overall["accuracy"], "kl": overall["kl"]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["speed-up"] = table["median ms"].iloc[0] / table["median ms"]
    return table
