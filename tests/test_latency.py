import numpy as np
import pytest

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


def test_int8_variant_is_timed_and_scored_against_float32(quick_model, splits):
    from decisionkit.latency import speed_variants

    _, model = quick_model
    cases = splits["validation"].head(2)
    table = speed_variants(model, cases, names=("float32", "int8 dynamic (nn.Linear)"), warmup=1)
    assert list(table.index) == ["float32", "int8 dynamic (nn.Linear)"]
    assert table.loc["float32", "speed-up"] == 1.0
    assert table["accuracy"].between(0, 1).all()
    # The float32 copy reproduces what the model itself predicts when it computes in float32.
    import copy

    from decisionkit.metrics import score
    from decisionkit.precision import Precision
    in_float32 = copy.deepcopy(model)
    in_float32.backbone.precision = Precision("cpu", "float32", "test")
    assert table.loc["float32", "accuracy"] == pytest.approx(
        score(cases, in_float32.predict(cases)).overall()["accuracy"], abs=1e-9)
    assert model.backbone.model.model.layers[0].self_attn.q_proj.__class__.__name__ == "Linear"  # original untouched
