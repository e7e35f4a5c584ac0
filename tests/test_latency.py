import numpy as np
import pytest
import torch

from decisionkit.latency import Scaling, Timing, cold_start, decision_timings, head_scaling, naive_scaling, time_calls


def test_timing_stats_are_ordered():
    t = Timing("x", np.array([5.0, 1.0, 3.0, 2.0, 100.0]))
    s = t.stats()
    assert s["calls"] == 5 and s["min"] == 1.0 and s["max"] == 100.0 and t.median == 3.0
    assert s["min"] <= s["p50"] <= s["p95"] <= s["p99"] <= s["max"]


def test_time_calls_warms_up_then_times_every_input():
    seen = []
    timing = time_calls("append", seen.append, [1, 2, 3], warmup=2)
    assert seen == [1, 2, 1, 2, 3] and len(timing.samples_ms) == 3 and (timing.samples_ms >= 0).all()


def test_slope_of_a_line():
    assert Scaling("s", [1, 2, 4], [10.0, 12.0, 16.0]).slope_ms == pytest.approx(2.0)


def test_decision_timings_and_cold_start(quick_model, splits):
    path, model = quick_model
    cases = splits["validation"].head(1)
    result = decision_timings(model, cases, warmup=1)
    table = result.table()
    assert list(table.index) == ["tokenize", "forward + heads", "tokenize + forward + heads"]
    assert (table["calls"] == len(cases)).all()
    assert result["tokenize"].median < result["forward + heads"].median  # the backbone dominates
    assert {"cpu", "torch threads"} <= set(result.hardware)
    cold = cold_start(path, cases[0])
    assert cold["import (s)"] > 0 and cold["load (s)"] > 0 and cold["first decide (ms)"] > 0


def test_extra_heads_cost_little_and_naive_questions_cost_a_pass(quick_model, splits):
    _, model = quick_model
    case = splits["validation"][0]
    heads, encode_ms = head_scaling(model, case.text, counts=(1, 8, 32), repeats=20)
    naive = naive_scaling(model.backbone, case, counts=(1, 2, 3), max_length=128, repeats=1)
    assert heads.slope_ms < 0.05 * encode_ms  # a head is a tiny projection next to the encoding
    assert naive.slope_ms > 0.3 * encode_ms  # each naive question re-reads the state


def test_length_sweep_grows_with_tokens(quick_model, splits):
    from decisionkit.latency import length_sweep

    _, model = quick_model
    sweep = length_sweep(model, splits["validation"].head(1).texts[:2], lengths=(16, 128), repeats=2)
    assert sweep.loc[16, "mean tokens"] == 16 and sweep.loc[128, "mean tokens"] > 16
    assert sweep.loc[128, "median ms"] > sweep.loc[16, "median ms"]


def test_speed_table_times_and_scores_each_variant_against_float32(quick_model, splits):
    import copy

    from decisionkit.latency import speed_table
    from decisionkit.metrics import score
    from decisionkit.precision import Precision

    _, model = quick_model
    cases, train = splits["validation"].head(2), splits["train"].head(2)
    names = ("float32, batch 1", "bfloat16 autocast, batch 4", "int8 dynamic (torch), heads re-fitted")
    table = speed_table(model, cases, train, names, warmup=1)
    assert list(table.index) == list(names) and table.loc["float32, batch 1", "speed-up"] == 1.0
    assert table["heads re-fitted"].tolist() == [False, False, True]
    assert (table["cases/s"] > 0).all() and table.attrs["float32 matmul GFLOP/s"] > 0
    assert table["arithmetic floor ms"].iloc[:2].gt(0).all() and np.isnan(table["arithmetic floor ms"].iloc[2])
    # The float32 row reproduces what the model itself predicts when it computes in float32.
    in_float32 = copy.deepcopy(model)
    in_float32.backbone.precision = Precision("cpu", "float32", "test")
    assert table.loc["float32, batch 1", "accuracy"] == pytest.approx(
        score(cases, in_float32.predict(cases, raw=True)).overall()["accuracy"], abs=1e-9)
    assert model.backbone.model.model.layers[0].self_attn.q_proj.__class__.__name__ == "Linear"  # original untouched
    with pytest.raises(ValueError, match="re-fit its heads"):
        speed_table(model, cases, None, names[2:], warmup=0)


def test_onnx_export_gives_the_torch_features(quick_model, splits, tmp_path):
    from decisionkit.features import tokenize
    from decisionkit.onnx_runtime import OnnxEncoder, export
    from decisionkit.precision import Precision

    _, model = quick_model
    path = export(model, tmp_path / "onnx")
    assert export(model, tmp_path / "onnx") == path  # written once
    texts = splits["validation"].head(1).texts[:2]
    batch = tokenize(model.backbone, texts, model.spec.max_length)  # two lengths: padding in the batch
    model.backbone.precision, saved = Precision("cpu", "float32", "test"), model.backbone.precision
    try:
        with torch.inference_mode():
            expected = model.pooled(batch)
    finally:
        model.backbone.precision = saved
    assert torch.allclose(OnnxEncoder(path)(batch), expected, atol=1e-3, rtol=1e-3)
