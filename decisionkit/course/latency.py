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
- ``speed.py`` holds the speed table: every way to run the decision pass, each against float32 and its floor.

Every result carries ``hardware()``: the CPU or GPU, torch's thread count and versions. Offline numbers like
these (batch 1, warm, one process) are not online serving numbers: see notebook 05's last section.
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy.stats import bootstrap
from torch import nn

from ..core.environment import environment, synchronize
from ..model.windows import tokenize

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
    from ..model.lexical import Lexical
    from ..model.structured import StructuredPart

    heads, encode_ms = head_scaling(model, case.text, counts, repeats=repeats)
    name = model.backbone.name.split("/")[-1]
    part = model.structured
    if part is None:
        return QuestionCosts(name, encode_ms, heads)
    device, workflow = model.backbone.device, case.workflow
    real = list(part.weights[workflow])
    asked = [(f"{real[i % len(real)]} #{i}", real[i % len(real)]) for i in range(max(counts))]
    lexical = part.lexical if part.lexical is not None and workflow in part.lexical.models else None
    if lexical is not None:
        lexical = Lexical(lexical.vocabulary, {workflow: {q: lexical.models[workflow][r] for q, r in asked}}, lexical.c)
    has_fields = workflow in part.trees
    synthetic = StructuredPart({workflow: part.fields[workflow]} if has_fields else {},
                               {workflow: {q: part.trees[workflow][r] for q, r in asked}} if has_fields else {},
                               {workflow: {q: part.weights[workflow][r] for q, r in asked}}, lexical=lexical)
    features = model.encode(model.tokenize([case.text]))
    linear = {q: nn.Linear(features.shape[-1], len(case.questions[r].options)).to(device) for q, r in asked}
    fields_ms = 0.0
    if has_fields:
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
                backbone.body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

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
