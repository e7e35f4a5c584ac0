"""Latency you can trust: warm-up calls, percentiles, cold start apart, clocks read after the device finishes.

- ``time_calls(name, fn, inputs)``: one timed call per input after a few warm-up calls; ``Timing.stats()`` gives
  mean, p50, p95, p99, min and max in milliseconds.
- ``decision_timings(model, cases)``: the decision model per case, tokenization and forward pass (backbone,
  pooling, heads) timed apart, and their sum.
- ``cold_start(path, case)``: a fresh process importing decisionkit, loading a saved model and answering once,
  each timed: what the first request after a deploy waits for.
- ``head_scaling`` and ``naive_scaling``: the cost of one more question, on one shared encoding (extra heads)
  against one prompt and one forward pass per question; ``Scaling.slope_ms`` is the fitted cost per question.
  ``question_costs`` adds a hybrid's trees: each more question is a head and its trees, mixed; ``head_costs`` sets
  backbones side by side; ``decide_timings`` times the whole ``decide`` call asking 1 or all questions, in turns.
- ``speed_table``: every way to run the decision pass (``SPEED_VARIANTS``: float32 and bfloat16, batch 1, 4 and
  16, int8 in torch and in ONNX Runtime with heads re-fitted on their features, ONNX Runtime float32, another
  backbone), each against float32 at batch 1 and against its arithmetic floor: the forward pass's FLOPs over this
  CPU's measured matmul rate (``matmul_rate``; torch's, so another engine can beat it a little).

Every result carries ``hardware()``: the CPU or GPU, torch's thread count and versions. Offline numbers like
these (batch 1, warm, one process) are not online serving numbers: see notebook 05's last section.
"""

from __future__ import annotations

import copy
import json
import math
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy.stats import bootstrap
from torch import nn

from ..core.environment import environment, synchronize
from ..core.precision import Precision, matmul_times
from ..data.metrics import score
from ..model.features import standardization, tokenize
from ..model.fitting import refit_heads
from ..model.heads import HeadSet

PERCENTILES = (50, 95, 99)
P99_MIN_TIMINGS = 100  # fewer timings than this give no p99: it would be one of the last one or two samples


def percentiles(samples_ms) -> dict[str, float]:
    """p50, p95 and p99 of ``samples_ms``; the p99 is NaN below ``P99_MIN_TIMINGS`` samples."""
    s = np.asarray(samples_ms, dtype=float)
    return {f"p{q}": float(np.percentile(s, q)) if q < 99 or len(s) >= P99_MIN_TIMINGS else float("nan")
            for q in PERCENTILES}


def median_ratio(numerator_ms, denominator_ms, resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float, float]:
    """How many times slower ``numerator_ms`` is than ``denominator_ms`` at the median, timed on the same inputs
    (sample i of both is input i), and the percentile bootstrap interval at ``level``: inputs are resampled, the
    same ones for both, so an input slow for both moves both medians (``scipy.stats.bootstrap``; no interval, NaN,
    from one input)."""
    a, b = np.asarray(numerator_ms, dtype=float), np.asarray(denominator_ms, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"timings must pair input by input: {a.shape} against {b.shape}")
    ratio = float(np.median(a) / np.median(b))
    if len(a) < 2:  # one input: nothing to resample
        return ratio, math.nan, math.nan
    drawn = bootstrap((a, b), lambda x, y, axis: np.median(x, axis=axis) / np.median(y, axis=axis), paired=True,
                      n_resamples=resamples, confidence_level=level, method="percentile", rng=seed)
    low, high = drawn.confidence_interval
    return ratio, float(low), float(high)


def tail_percentile(timings: int) -> int:
    """The tail percentile a table can show from ``timings`` samples: 99 from ``P99_MIN_TIMINGS`` on, else 90."""
    return 99 if timings >= P99_MIN_TIMINGS else 90


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
        """Calls, mean, p50, p95, p99 (NaN below ``P99_MIN_TIMINGS`` calls), min and max."""
        s = self.samples_ms
        return {"calls": len(s), "mean": float(s.mean()), **percentiles(s), "min": float(s.min()),
                "max": float(s.max())}

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
        from ..core.plots import latency_boxes

        return latency_boxes(self.timings, title)


@torch.inference_mode()
def decision_timings(model, cases, warmup: int = 2) -> LatencyResult:
    """Per case: tokenization, the forward pass (backbone, pooling, every head of the case) and the whole
    ``decide`` call, each timed on its own."""
    device = model.backbone.device
    texts, workflows, states = cases.texts, cases.case_workflows, cases.states

    def forward(batch: dict, i: int) -> None:
        model.readout(model(**batch, workflows=[workflows[i]], states=[states[i]]))

    batches = [model.tokenize([t]) for t in texts]
    index = list(range(len(texts)))
    return LatencyResult([
        time_calls("tokenize", lambda i: model.tokenize([texts[i]]), index, warmup, device),
        time_calls("forward + heads", lambda i: forward(batches[i], i), index, warmup, device),
        time_calls("tokenize + forward + heads", lambda i: forward(model.tokenize([texts[i]]), i), index, warmup,
                   device),
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
    batch = model.tokenize([text])
    encode_ms = _median_ms(lambda: model.encode(batch), max(3, repeats // 40), device)
    features = model.encode(batch)
    heads = [nn.Linear(features.shape[-1], options).to(device) for _ in range(max(counts))]

    def answer(n: int) -> None:
        for head in heads[:n]:
            torch.softmax(head(features), dim=-1)

    answer(max(counts))  # warm-up
    return Scaling("shared encoding + n heads", list(counts),
                   [encode_ms + _median_ms(lambda: answer(n), repeats, device) for n in counts]), encode_ms


@dataclass
class QuestionCosts:
    """What more questions about one state cost a model (``question_costs``): the encoding, n heads on it, and for a
    hybrid n heads each with its trees, mixed as the model mixes them, after the state's fields are read once."""

    backbone: str
    encode_ms: float  # median of the encoding alone: tokens to standardized pooled features
    heads: Scaling  # the encoding + n heads and their softmax
    trees: Scaling | None = None  # a hybrid's: the encoding + the fields + n heads with their trees; None: heads only
    fields_ms: float | None = None  # a hybrid's: reading the state's fields once (encode + surprise), every n shares it

    def table(self) -> pd.DataFrame:
        """Milliseconds per number of questions, beyond the encoding: the heads alone and, for a hybrid, the heads
        with their trees (the fields read once included)."""
        table = pd.DataFrame({"heads only (ms)": np.asarray(self.heads.ms) - self.encode_ms}, index=self.heads.counts)
        if self.trees is not None:
            table["heads + trees (ms)"] = np.asarray(self.trees.ms) - self.encode_ms
        return table.rename_axis("questions")


@torch.inference_mode()
def question_costs(model, case, counts=(1, 2, 4, 8, 16, 32, 64), repeats: int = 200) -> QuestionCosts:
    """``head_scaling`` on ``case``'s text and, for a hybrid model, the same questions with their trees: each of n
    heads gets the trees and mixing weight of one of the workflow's real questions in turn (the trees' cost depends
    on their size, so the real ones are timed), mixed through ``StructuredPart.mix`` after one read of the state's
    fields (``Fields.encode`` and ``surprise``), as ``decide`` reads them. Heads are synthetic as in
    ``head_scaling``, with each tree's number of options."""
    from ..model.structured import StructuredPart

    heads, encode_ms = head_scaling(model, case.text, counts, repeats=repeats)
    name = model.backbone.name.split("/")[-1]
    part = model.structured
    if part is None:
        return QuestionCosts(name, encode_ms, heads)
    device, workflow = model.backbone.device, case.workflow
    real = list(part.trees[workflow])
    asked = [(f"{real[i % len(real)]} #{i}", real[i % len(real)]) for i in range(max(counts))]
    synthetic = StructuredPart({workflow: part.fields[workflow]},
                               {workflow: {q: part.trees[workflow][r] for q, r in asked}},
                               {workflow: {q: part.weights[workflow][r] for q, r in asked}})
    features = model.encode(model.tokenize([case.text]))
    linear = {q: nn.Linear(features.shape[-1], part.trees[workflow][r].options).to(device) for q, r in asked}
    fields = part.fields[workflow]
    fields_ms = _median_ms(lambda: fields.surprise([case.state], fields.encode([case.state])), repeats, device)

    def answer(n: int) -> None:
        logits = {workflow: {q: linear[q](features) for q, _ in asked[:n]}}
        mixed, _ = synthetic.mix(logits, [case.state], {workflow: [0]})
        for z in mixed[workflow].values():
            torch.softmax(z, dim=-1)

    answer(max(counts))  # warm-up
    trees = Scaling("shared encoding + n heads with their trees", list(counts),
                    [encode_ms + _median_ms(lambda: answer(n), repeats, device) for n in counts])
    return QuestionCosts(name, encode_ms, heads, trees, fields_ms)


@torch.inference_mode()
def decide_timings(model, case, counts=(1, 5), calls: int = 100, warmup: int = 2) -> LatencyResult:
    """``model.decide`` on ``case``, end to end (tokenization, the forward pass, the heads, a hybrid's fields and
    trees, a router's distance, the System One answers), asking the first n of its questions for each n of
    ``counts``, ``calls`` times each. The counts take turns call by call, so a drift in the machine's speed falls on
    each alike."""
    questions = [(q, x.to_json()) for q, x in case.questions.items()]
    if max(counts) > len(questions):
        raise ValueError(f"counts asks up to {max(counts)} questions; case {case.id} has {len(questions)}")
    asked = {n: dict(questions[:n]) for n in counts}
    order = [n for _ in range(calls) for n in counts]
    timing = time_calls("decide", lambda n: model.decide(case.state, asked[n], workflow=case.workflow), order, warmup,
                        model.backbone.device)
    return LatencyResult([Timing(f"decide, {n} question{'s' * (n > 1)}", timing.samples_ms[np.asarray(order) == n])
                          for n in counts])


def head_costs(costs: Sequence[QuestionCosts]) -> pd.DataFrame:
    """Per backbone (``question_costs``' results): the encoding, one more head, one more question with its trees, the
    fields read once, and what one more question costs against the encoding."""
    rows = {}
    for c in costs:
        rows[c.backbone] = {"encoding (ms)": c.encode_ms, "one more head (µs)": c.heads.slope_ms * 1e3,
                            "one more head + trees (µs)": np.nan if c.trees is None else c.trees.slope_ms * 1e3,
                            "fields, once (µs)": np.nan if c.fields_ms is None else c.fields_ms * 1e3,
                            "head / encoding": c.heads.slope_ms / c.encode_ms,
                            "head + trees / encoding": np.nan if c.trees is None else c.trees.slope_ms / c.encode_ms}
    return pd.DataFrame.from_dict(rows, orient="index")


@torch.inference_mode()
def naive_scaling(backbone, case, counts=(1, 2, 3, 4, 5), max_length: int = 512, repeats: int = 3) -> Scaling:
    """The naive way: one prompt per question (the state plus that question), one forward pass each."""
    from ..training.zeroshot import question_block

    questions = list(case.questions.values())
    prompts = [f"{case.text}\n\n{question_block(questions[i % len(questions)])}" for i in range(max(counts))]
    batches = [tokenize(backbone, [p], max_length) for p in prompts]

    def ask(n: int) -> None:
        for batch in batches[:n]:
            with backbone.precision.autocast():  # the compute dtype the shared encoding it is compared with runs in
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
        return OnnxEncoder(quantize(path) if int8 else path)

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


def matmul_rate(dtype: str, size: int = 2048, repeats: int = 5) -> float:
    """This CPU's peak GFLOP/s for one ``size`` x ``size`` matrix product in ``dtype`` (float32 or bfloat16): the
    fastest of ``repeats`` timed products after a warm-up (``precision.matmul_times``), so a floor computed from it
    is a floor."""
    return 2 * size ** 3 / min(matmul_times(getattr(torch, dtype), size, repeats)) / 1e9


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
        return float(np.median([len(m.backbone.tokenizer(t)["input_ids"][:m.spec.max_length]) for t in texts]))

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
        overall = score(cases, *base.readout(base.read((pooled - mean) / std, cases.case_workflows, heads=heads,
                                                       states=cases.states))).overall()
        per_case = np.concatenate([[m / len(b["input_ids"])] * len(b["input_ids"]) for m, b in zip(ms, batches)])
        length = tokens if base is model else median_tokens(base)
        floor = forward_flops(base.backbone, int(length)) / (rates.get(variant.dtype, np.nan) * 1e9) * 1e3
        rows[name] = {"median ms per case": float(np.median(per_case)), "p95 ms per case": float(
            np.percentile(per_case, 95)), "cases/s": len(texts) / (sum(ms) / 1e3), "accuracy": overall["accuracy"],
            "kl": overall["kl"], "heads re-fitted": variant.refit, "arithmetic floor ms": floor}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.insert(3, "speed-up", table["median ms per case"].iloc[0] / table["median ms per case"])
    table.attrs.update({"median tokens": tokens, **{f"{d} matmul GFLOP/s": r for d, r in rates.items()}})
    return table
