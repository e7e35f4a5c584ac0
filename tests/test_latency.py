"""The latency lab's measurements, checked by what holds whatever the machine's speed: counts, shapes, the
arithmetic from samples to statistics (on a fake clock where the value itself matters) and relations that hold by
construction. How fast things are is for the benchmark scripts; a loaded CI machine must not fail these tests."""

import subprocess
import types

import numpy as np
import pytest
import torch

from decisionkit.course import latency
from decisionkit.course.latency import (
    Scaling,
    Timing,
    cold_start,
    decision_timings,
    head_scaling,
    naive_scaling,
    time_calls,
)

STATS = ["calls", "mean", "p50", "p95", "p99", "min", "max"]


def test_timing_stats_are_ordered_and_give_a_p99_only_from_enough_calls():
    few = Timing("x", np.array([5.0, 1.0, 3.0, 2.0, 100.0])).stats()
    assert few["calls"] == 5 and few["min"] == 1.0 and few["max"] == 100.0 and few["p50"] == 3.0
    assert few["min"] <= few["p50"] <= few["p95"] <= few["max"]
    assert np.isnan(few["p99"])  # 5 timings: the p99 would be the largest one, not a tail
    many = Timing("y", np.arange(1.0, latency.P99_MIN_TIMINGS + 1)).stats()
    assert many["p95"] <= many["p99"] <= many["max"]
    assert many["p99"] == pytest.approx(np.percentile(np.arange(1.0, latency.P99_MIN_TIMINGS + 1), 99))


def test_time_calls_warms_up_then_times_every_input(monkeypatch):
    clock = {"now": 100.0}  # seconds; each call below takes exactly x milliseconds of it
    monkeypatch.setattr(latency, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    seen = []

    def call(x):
        seen.append(x)
        clock["now"] += x / 1e3

    timing = time_calls("append", call, [1, 2, 3], warmup=2)
    assert seen == [1, 2, 1, 2, 3]  # two untimed warm-up calls, then one timed call per input
    assert timing.samples_ms == pytest.approx([1.0, 2.0, 3.0])  # milliseconds, the warm-up calls not among them


def test_slope_of_a_line():
    assert Scaling("s", [1, 2, 4], [10.0, 12.0, 16.0]).slope_ms == pytest.approx(2.0)


def test_decision_timings_and_cold_start(quick_model, splits):
    path, model = quick_model
    cases = splits["validation"].head(1)
    result = decision_timings(model, cases, warmup=1)
    table = result.table()
    names = ["tokenize", "forward + heads", "tokenize + forward + heads"]
    assert list(table.index) == names and list(table.columns) == STATS
    assert (table["calls"] == len(cases)).all()
    for name in names:  # one sample per case, and the table is those samples' statistics
        samples = result[name].samples_ms
        assert len(samples) == len(cases) and np.isfinite(samples).all() and (samples > 0).all()
        assert table.loc[name, "p50"] == pytest.approx(np.median(samples))
        assert table.loc[name, "min"] == samples.min() and table.loc[name, "max"] == samples.max()
    assert {"cpu", "torch threads"} <= set(result.hardware)
    assert [trace.name for trace in result.figure().data] == names
    cold = cold_start(path, cases[0])
    assert set(cold) == {"import (s)", "load (s)", "first decide (ms)"}
    assert all(np.isfinite(v) and v > 0 for v in cold.values())
    with pytest.raises(subprocess.CalledProcessError):  # the fresh process really loads the folder it is given
        cold_start(path.parent / "no-such-model", cases[0])


def test_extra_heads_share_one_encoding_and_naive_questions_cost_a_pass(quick_model, splits, monkeypatch):
    _, model = quick_model
    case = splits["validation"][0]
    encodings = []
    real_encode = model.encode
    monkeypatch.setattr(model, "encode", lambda batch: encodings.append(1) or real_encode(batch))
    head_calls = []  # the synthetic heads (4 options each) that ran
    real_linear = torch.nn.Linear.forward
    monkeypatch.setattr(torch.nn.Linear, "forward", lambda self, x: (
        head_calls.append(1) if self.out_features == 4 else None) or real_linear(self, x))
    heads, encode_ms = head_scaling(model, case.text, counts=(1, 8, 32), repeats=20)
    monkeypatch.setattr(torch.nn.Linear, "forward", real_linear)
    # The encoding is timed max(3, 20 // 40) = 3 times and computed once more for the heads to read: however many
    # heads answer, no head runs the backbone again.
    assert len(encodings) == 3 + 1
    assert heads.counts == [1, 8, 32] and len(heads.ms) == 3
    # each point times n heads, 20 times; 32 more run once as a warm-up
    assert len(head_calls) == 32 + 20 * (1 + 8 + 32)
    passes, autocast = [], []  # the prompt length of every forward pass of the backbone, and whether autocast ran
    hook = model.backbone.body.register_forward_pre_hook(
        lambda module, args, kwargs: passes.append(kwargs["input_ids"].shape[1])
        or autocast.append(torch.is_autocast_enabled("cpu")), with_kwargs=True)
    try:
        naive = naive_scaling(model.backbone, case, counts=(1, 2, 3), max_length=128, repeats=1)
    finally:
        hook.remove()
    assert naive.counts == [1, 2, 3] and len(naive.ms) == 3
    assert len(passes) == 1 + (1 + 2 + 3)  # a warm-up pass, then one forward pass per question asked
    state_alone = len(model.backbone.tokenizer(case.text)["input_ids"])
    assert all(min(state_alone, 128) <= n <= 128 for n in passes)  # each pass re-reads the state (and its question)
    # in the compute dtype of the shared encoding it is compared with
    assert set(autocast) == {model.backbone.precision.dtype == "bfloat16"}


def test_question_costs_time_each_question_with_its_real_trees(quick_model, splits, monkeypatch):
    from decisionkit.model.fields import Fields
    from decisionkit.model.trees import Trees

    _, model = quick_model
    case = splits["validation"][0]
    real = model.structured.trees[case.workflow]
    read, fields_read = [], []
    real_probabilities, real_encode = Trees.probabilities, Fields.encode
    monkeypatch.setattr(Trees, "probabilities", lambda self, x: read.append(self) or real_probabilities(self, x))
    monkeypatch.setattr(Fields, "encode", lambda self, states: fields_read.append(self) or real_encode(self, states))
    costs = latency.question_costs(model, case, counts=(1, 8), repeats=3)
    assert costs.trees.counts == costs.heads.counts == [1, 8] and costs.fields_ms > 0
    # Per call: the workflow's fields read once, then one real tree set per question, the workflow's in turn. Calls:
    # 3 timing the fields alone, a warm-up at 8 questions, then 3 timed at 1 question and 3 at 8.
    assert fields_read == [model.structured.fields[case.workflow]] * (3 + 1 + 3 + 3)
    eight = [list(real.values())[i % len(real)] for i in range(8)]
    assert read == eight + eight[:1] * 3 + eight * 3
    table = costs.table()
    assert list(table.columns) == ["heads only (ms)", "heads + trees (ms)"] and list(table.index) == [1, 8]
    assert table["heads + trees (ms)"].tolist() == pytest.approx([ms - costs.encode_ms for ms in costs.trees.ms])
    side = latency.head_costs([costs])
    assert side.loc[costs.backbone, "one more head + trees (µs)"] == pytest.approx(costs.trees.slope_ms * 1e3)
    assert side.loc[costs.backbone, "head + trees / encoding"] == pytest.approx(costs.trees.slope_ms / costs.encode_ms)


def test_decide_timings_take_turns_and_ask_the_first_n_questions(quick_model, splits, monkeypatch):
    _, model = quick_model
    case = splits["validation"][0]
    asked = []
    real_decide = model.decide
    monkeypatch.setattr(model, "decide", lambda state, questions, workflow: asked.append(list(questions))
                        or real_decide(state, questions, workflow=workflow))
    result = latency.decide_timings(model, case, counts=(1, 3), calls=4, warmup=2)
    first = list(case.questions)
    assert asked == [first[:1], first[:3]] * (1 + 4)  # the warm-up pair, then the counts in turn
    table = result.table()
    assert list(table.index) == ["decide, 1 question", "decide, 3 questions"] and (table["calls"] == 4).all()
    with pytest.raises(ValueError, match="asks up to 9 questions"):
        latency.decide_timings(model, case, counts=(1, 9))


def test_length_sweep_cuts_every_input_to_each_length(quick_model, splits, monkeypatch):
    from decisionkit.course.latency import length_sweep

    _, model = quick_model
    texts = splits["validation"].head(1).texts[:2]
    shapes = []
    real_encode = model.encode
    monkeypatch.setattr(model, "encode", lambda batch: shapes.append(tuple(batch["input_ids"].shape))
                        or real_encode(batch))
    sweep = length_sweep(model, texts, lengths=(16, 64, 256), repeats=2)
    assert list(sweep.index) == [16, 64, 256] and list(sweep.columns) == ["mean tokens", "median ms"]
    full = [len(model.backbone.tokenizer(t)["input_ids"]) for t in texts]  # counted without the sweep's code
    assert min(full) > 64 and min(full) < 256 < max(full)  # 16 and 64 cut both texts, 256 only the longer one
    for n in (16, 64, 256):
        assert sweep.loc[n, "mean tokens"] == np.mean([min(k, n) for k in full])
    # per length: one warm-up pass (the first text), then ``repeats`` timed passes of each text, cut to that length
    assert shapes == [(1, min(full[i], n)) for n in (16, 64, 256) for i in (0, 0, 0, 1, 1)]
    assert np.isfinite(sweep["median ms"]).all() and (sweep["median ms"] > 0).all()


def test_speed_table_times_and_scores_each_variant_against_float32(tiny_backbone, splits):
    """The table's mechanics (rows, batching, re-fitted heads, floors, the float32 row against ``predict``) on the
    tiny backbone: on a CPU without bfloat16 kernels (AVX2 only) SmolLM2's bfloat16 rows took 21 minutes."""
    import copy

    from decisionkit.core.precision import Precision
    from decisionkit.course.speed import forward_flops, speed_table
    from decisionkit.data.metrics import score
    from decisionkit.model.decision_model import DecisionModel
    from decisionkit.model.features import FeatureSpec
    from decisionkit.model.fitting import HeadRecipe

    torch.manual_seed(0)
    model = DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec(max_length=128))
    for head in model.heads.heads.values():
        torch.nn.init.normal_(head.weight, std=0.5)  # random heads that answer something other than uniform
    model.head_recipe = HeadRecipe(l2=1.0, steps=5)
    cases, train = splits["validation"].head(2), splits["train"].head(2)
    names = ("float32, batch 1", "bfloat16 autocast, batch 4", "int8 dynamic (torch), heads re-fitted")
    table = speed_table(model, cases, train, names, warmup=1)
    assert list(table.index) == list(names) and table.loc["float32, batch 1", "speed-up"] == 1.0
    assert table["heads re-fitted"].tolist() == [False, False, True]
    # Batch 4 on these 8 cases: two batches, each case charged a quarter of its batch's time, so the median case
    # time is the mean and cases/s is exactly 1000 / (median ms per case).
    assert len(cases) == 8 and np.isfinite(table["cases/s"]).all() and (table["cases/s"] > 0).all()
    batched = table.loc["bfloat16 autocast, batch 4"]
    assert batched["cases/s"] * batched["median ms per case"] == pytest.approx(1000.0)
    assert table["speed-up"].tolist() == pytest.approx(
        (table["median ms per case"].iloc[0] / table["median ms per case"]).tolist())
    # The floor: the same forward FLOPs over each dtype's measured matmul rate; int8 has no measured rate.
    floors, attrs = table["arithmetic floor ms"], table.attrs
    assert attrs["float32 matmul GFLOP/s"] > 0 and attrs["bfloat16 matmul GFLOP/s"] > 0
    expected = forward_flops(model.backbone, int(attrs["median tokens"])) / (
        attrs["float32 matmul GFLOP/s"] * 1e9) * 1e3
    assert floors.iloc[0] == pytest.approx(expected)
    assert floors.iloc[1] / floors.iloc[0] == pytest.approx(
        attrs["float32 matmul GFLOP/s"] / attrs["bfloat16 matmul GFLOP/s"])
    assert np.isnan(floors.iloc[2])
    # The float32 row reproduces what the model itself predicts when it computes in float32.
    in_float32 = copy.deepcopy(model)
    in_float32.backbone.precision = Precision("cpu", "float32", "test")
    assert table.loc["float32, batch 1", "accuracy"] == pytest.approx(
        score(cases, in_float32.predict(cases, raw=True)).overall()["accuracy"], abs=1e-9)
    assert model.backbone.model.model.layers[0].self_attn.q_proj.__class__.__name__ == "Linear"  # original untouched
    with pytest.raises(ValueError, match="re-fit its heads"):
        speed_table(model, cases, None, names[2:], warmup=0)


def test_onnx_export_gives_the_torch_features(tiny_backbone, splits, tmp_path):
    """On the tiny random backbone: the export's mechanics (layers, pooling, padding, dynamic shapes) are the same as
    SmolLM2's, at a few seconds instead of a minute."""
    from decisionkit.core.precision import Precision
    from decisionkit.course.onnx_runtime import OnnxEncoder, export
    from decisionkit.model.decision_model import DecisionModel, FeatureSpec
    from decisionkit.model.windows import tokenize

    model = DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec(max_length=128))
    path = export(model, tmp_path / "onnx")
    assert export(model, tmp_path / "onnx") == path  # written once
    texts = splits["validation"].head(1).texts[:2]
    batch = tokenize(model.backbone, texts, model.spec.max_length)  # two lengths: padding in the batch
    windowed = model.tokenize(texts)  # states of several windows of 128 tokens: merged after the graph
    assert len(windowed["owner"]) > len(texts)
    model.backbone.precision, saved = Precision("cpu", "float32", "test"), model.backbone.precision
    try:
        with torch.inference_mode():
            expected, merged = model.pooled(batch), model.pooled(windowed)
    finally:
        model.backbone.precision = saved
    assert torch.allclose(OnnxEncoder(path)(batch), expected, atol=1e-3, rtol=1e-3)
    assert torch.allclose(OnnxEncoder(path, pooling=model.spec.pooling)(windowed), merged, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="pass pooling="):
        OnnxEncoder(path)(windowed)


def test_median_ratio_pairs_inputs_and_brackets_the_ratio():
    base = np.array([10.0, 20.0, 30.0, 40.0, 500.0])
    assert latency.median_ratio(3 * base, base) == (3.0, 3.0, 3.0)  # every input 3x slower: every draw says 3
    noisy = base * np.array([1.0, 4.0, 2.0, 3.0, 2.5])
    ratio, low, high = latency.median_ratio(noisy, base, resamples=500)
    assert ratio == pytest.approx(np.median(noisy) / np.median(base)) and low < ratio < high
    with pytest.raises(ValueError, match="pair input by input"):
        latency.median_ratio(base, base[:3])
