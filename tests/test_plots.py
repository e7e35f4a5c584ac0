"""Every figure function builds the figure it says, from small real inputs: its traces (count, kind, names), its
axes and titles, and the values it carries. ``notebook_setup`` and ``mimebundle`` add a PNG where Chromium is
installed (Debian's ``chromium``), which is what GitHub and nbviewer show."""

import base64
import shutil
import struct

import numpy as np
import pandas as pd
import pytest

from decisionkit import plots
from decisionkit.course.latency import Scaling, Timing
from decisionkit.course.memory import compare
from decisionkit.course.probe import LearningCurve, ProbeComparison, ProbeResult
from decisionkit.data.cases import LengthStats
from decisionkit.data.metrics import reliability_bins, score, uniform_predictions, wilson_interval

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def kinds(fig) -> list[str]:
    return [trace.type for trace in fig.data]


def test_length_histogram_one_trace_per_workflow():
    stats = LengthStats("validation", np.array([10, 20, 30, 40, 50]), ["a", "a", "b", "b", "b"])
    fig = plots.length_histogram(stats)
    assert kinds(fig) == ["histogram", "histogram"] and [t.name for t in fig.data] == ["a", "b"]
    assert list(fig.data[0].x) == [10, 20] and list(fig.data[1].x) == [30, 40, 50]
    assert fig.layout.title.text == "Token lengths (validation split)"
    assert fig.layout.xaxis.title.text == "tokens per rendered state" and fig.layout.yaxis.title.text == "cases"


def test_probe_bars_one_bar_group_per_probe(splits):
    cases = splits["validation"].head(1)
    uniform = score(cases, uniform_predictions(cases))
    results = [ProbeResult(name, 0.01, uniform, pd.DataFrame()) for name in ("mean, last", "last token")]
    fig = plots.probe_bars(ProbeComparison(results))
    assert kinds(fig) == ["bar", "bar"] and [t.name for t in fig.data] == ["mean, last", "last token"]
    by_type = uniform.summary("type")["accuracy"]
    assert list(fig.data[0].x) == ["all", *by_type.index]  # "accuracy" then one bar per question type
    assert list(fig.data[0].y) == pytest.approx([round(uniform.overall()["accuracy"], 3),
                                                 *by_type.round(3).tolist()])
    low, high = wilson_interval(fig.data[0].y, [uniform.overall()["decisions"], *uniform.summary("type")["decisions"]])
    assert list(fig.data[0].error_y.array) == pytest.approx(high - fig.data[0].y)
    assert list(fig.data[0].error_y.arrayminus) == pytest.approx(fig.data[0].y - low)
    assert (low < high).all() and fig.layout.title.text.endswith("(bars: 95% interval)")
    assert tuple(fig.layout.yaxis.range) == (0, 1)


def test_learning_curve_figure_two_panels_and_the_floor():
    rows = pd.DataFrame({"accuracy": [0.5, 0.6], "held-out cross-entropy": [1.0, 0.9],
                         "train cross-entropy": [0.5, 0.7]}, index=pd.Index([35, 70], name="train cases"))
    fig = plots.learning_curve_figure(LearningCurve(rows, floor=0.4))
    assert kinds(fig) == ["scatter"] * 3 and [t.name for t in fig.data] == ["accuracy", "held-out", "train"]
    assert [t.xaxis for t in fig.data] == ["x", "x2", "x2"]  # accuracy left, both cross-entropies right
    assert list(fig.data[1].y) == [1.0, 0.9] and list(fig.data[0].x) == [35, 70]
    assert [a.text for a in fig.layout.annotations] == ["held-out accuracy", "soft cross-entropy",
                                                        "gold entropy (floor)"]
    assert [s.y0 for s in fig.layout.shapes] == [0.4] and fig.layout.xaxis.type == "log"
    assert "log" in fig.layout.xaxis.title.text and fig.layout.yaxis.title.text and fig.layout.yaxis2.title.text


def history(stage_rows: list[dict]) -> pd.DataFrame:
    heads = [{"stage": "heads", "l2": l2, "step": s, "train_loss": 1.0, "val_loss": v}
             for l2, values in ((1e-3, (1.3, 1.1)), (1e-2, (1.3, 1.2))) for s, v in zip((0, 10), values)]
    return pd.DataFrame(heads + stage_rows)


def test_training_curves_one_line_per_l2_then_fine_tuning():
    heads_only = plots.training_curves(history([]))
    assert [t.name for t in heads_only.data] == ["heads, L2=0.001 (dev)", "heads, L2=0.01 (dev)"]
    assert list(heads_only.data[0].y) == [1.3, 1.1] and list(heads_only.data[1].x) == [0, 10]
    tuned = [{"stage": "full", "step": 1, "epoch": 0.5, "train_loss": 0.9},
             {"stage": "full", "step": 2, "epoch": 1.0, "val_loss": 1.05, "val_accuracy": 0.6}]
    fig = plots.training_curves(history(tuned))
    assert len(fig.data) == 3 and fig.data[2].name == "full fine-tuning (dev)" and fig.data[2].xaxis == "x2"
    assert list(fig.data[2].y) == [1.05]  # evaluations only, not the training steps
    assert fig.layout.xaxis2.title.text == "fine-tuning step" and fig.layout.yaxis.title.text == "soft cross-entropy"


def test_finetune_curves_start_at_the_stage_one_heads():
    tuned = [{"stage": "lora", "step": 2, "epoch": 1.0, "val_loss": 1.05, "val_accuracy": 0.6}]
    fig = plots.finetune_curves({"lora": history(tuned)})
    assert kinds(fig) == ["scatter", "scatter"]
    assert list(fig.data[0].x) == [0, 1.0] and list(fig.data[0].y) == [1.1, 1.05]  # best stage-1 loss at epoch 0
    assert list(fig.data[1].y) == [0.6] and fig.data[1].showlegend is False
    assert fig.data[0].line.color == fig.data[1].line.color == plots.PALETTE[0]


def test_memory_bars_stack_the_terms_and_mark_the_quoted_figures():
    comparison = compare()
    fig = plots.memory_bars(comparison)
    terms = list(comparison.estimates[0].terms)
    names = [e.shape.name for e in comparison.estimates]
    assert kinds(fig)[:len(terms)] == ["bar"] * len(terms) and [t.name for t in fig.data[:len(terms)]] == terms
    for k, term in enumerate(terms):
        assert list(fig.data[k].y) == pytest.approx([e.terms[term] for e in comparison.estimates])
        assert list(fig.data[k].x) == names
    quoted = [n for n in names if n in comparison.references]
    assert len(fig.data) == len(terms) + bool(quoted) and fig.layout.barmode == "stack"
    if quoted:
        marks = fig.data[-1]
        assert marks.name == "quoted figure" and list(marks.x) == quoted
        assert list(marks.y) == pytest.approx([sum(comparison.references[n]) / 2 for n in quoted])


def test_reliability_diagram_carries_the_bins():
    table = reliability_bins(np.array([0.95, 0.9, 0.35, 0.3]), np.array([1, 0, 0, 0]))
    fig = plots.reliability_diagram({"before": table}, title="T")
    assert [t.name for t in fig.data] == ["perfect calibration", "before"] and fig.layout.title.text == "T"
    assert list(fig.data[1].x) == pytest.approx([0.325, 0.925]) and list(fig.data[1].y) == [0.0, 0.5]
    assert list(fig.data[1].customdata[:, 0]) == [2, 2]  # decisions per bin, shown on hover
    bars = fig.data[1].error_y  # each bin's accuracy interval, up and down from the point
    assert list(bars.array) == pytest.approx(table["accuracy high"] - table["accuracy"])
    assert list(bars.arrayminus) == pytest.approx(table["accuracy"] - table["accuracy low"])
    assert fig.layout.xaxis.title.text == "mean confidence of the top answer"


def test_confidence_histogram_one_histogram_per_stage():
    frames = {"before": pd.DataFrame({"confidence": [0.2, 0.9]}), "after": pd.DataFrame({"confidence": [0.5]})}
    fig = plots.confidence_histogram(frames)
    assert kinds(fig) == ["histogram", "histogram"] and [t.name for t in fig.data] == ["before", "after"]
    assert list(fig.data[0].x) == [0.2, 0.9] and fig.data[0].xbins.size == 0.05
    assert fig.layout.barmode == "overlay" and fig.layout.yaxis.title.text == "decisions"


def test_risk_coverage_curve_thins_long_curves():
    curve = pd.DataFrame({"coverage": np.linspace(1, 0, 1000), "accuracy": np.linspace(0.5, 1, 1000),
                          "threshold": np.linspace(0, 1, 1000)})
    fig = plots.risk_coverage_curve({"after": curve})
    assert [t.name for t in fig.data] == ["after"] and len(fig.data[0].x) == 500  # every 1000 // 400 = 2nd point
    assert fig.data[0].x[1] == curve["coverage"].iloc[2]
    assert fig.layout.xaxis.title.text == "share of decisions answered (coverage)"


def test_score_distributions_one_violin_per_set_and_the_threshold():
    scores = pd.DataFrame({"set": ["test", "test", "off"], "confidence": [0.9, 0.8, 0.1], "id": ["a", "b", "c"],
                           "kind": ["in-domain", "in-domain", "poem"]})
    fig = plots.score_distributions(scores, "confidence", threshold=0.5, human_below=True)
    assert kinds(fig) == ["violin", "violin"] and [t.name for t in fig.data] == ["test", "off"]
    assert list(fig.data[0].y) == [0.9, 0.8]
    assert [s.y0 for s in fig.layout.shapes] == [0.5]
    assert fig.layout.annotations[0].text == "threshold: below goes to a human"
    assert len(plots.score_distributions(scores, "confidence").layout.shapes) == 0
    assert {t.spanmode for t in fig.data} == {"hard"}  # no density past the scores seen (a confidence above 1)
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text.startswith("confidence")


def test_answer_bars_one_panel_per_question():
    answers = {"team": {"type": "choice", "probabilities": {"billing": 0.7, "tech": 0.3}, "confidence": 0.7},
               "urgent": {"type": "noul", "noul": 0.25}}
    fig = plots.answer_bars(answers)
    assert kinds(fig) == ["bar", "bar"] and [t.orientation for t in fig.data] == ["h", "h"]
    assert list(fig.data[0].y) == ["billing", "tech"] and list(fig.data[0].x) == [0.7, 0.3]
    assert list(fig.data[1].y) == ["false", "true"] and list(fig.data[1].x) == [0.75, 0.25]  # P(false) = 1 - noul
    assert list(fig.data[0].text) == ["70.0%", "30.0%"]
    assert [a.text for a in fig.layout.annotations] == ["team", "urgent"] and fig.layout.height == 2 * 140 + 60


def test_latency_boxes_and_scaling_lines():
    boxes = plots.latency_boxes([Timing("tokenize", np.array([1.0, 2.0])), Timing("forward", np.array([9.0]))])
    assert kinds(boxes) == ["box", "box"] and [t.name for t in boxes.data] == ["tokenize", "forward"]
    assert list(boxes.data[0].y) == [1.0, 2.0] and boxes.layout.yaxis.type == "log"
    line = Scaling("heads", [1, 2, 4], [10.0, 12.0, 16.0])
    fig = plots.scaling_lines([line])
    assert kinds(fig) == ["scatter"] and fig.data[0].name == "heads: 2 ms per question"  # the fitted slope
    assert list(fig.data[0].x) == [1, 2, 4] and list(fig.data[0].y) == [10.0, 12.0, 16.0]
    # every tick of the log axes labelled in full: the counts asked, and milliseconds within the lines
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 4] and list(fig.layout.xaxis.ticktext) == ["1", "2", "4"]
    assert list(fig.layout.yaxis.ticktext) == ["10", "15"]


def test_log_ticks_label_every_tick_in_full_within_the_values():
    assert plots.log_ticks([130, 220, 1600]) == {
        "tickvals": [150, 200, 300, 500, 700, 1000, 1500],
        "ticktext": ["150", "200", "300", "500", "700", "1,000", "1,500"]}
    wide = plots.log_ticks([2.5, 10_268])  # too many of the finer steps: one a power of ten
    assert wide["tickvals"] == [10, 100, 1000, 10_000] and wide["ticktext"][-1] == "10,000"
    assert plots.log_ticks([126, 131])["ticktext"] == ["126", "131"]  # no step inside: the two ends
    assert plots.log_ticks([0.0007, 0.002])["ticktext"] == ["0.0007", "0.001", "0.0015", "0.002"]
    assert plots.log_ticks([0, -1.0]) == {}


def test_load_curves_one_line_per_batch_size_in_each_panel():
    index = pd.MultiIndex.from_product([[1, 16], [1, 4]], names=["max batch", "clients"])
    table = pd.DataFrame({"requests/s": [5.0, 6.0, 5.0, 9.0], "p99 ms": [100.0, 400.0, 100.0, 250.0]}, index=index)
    fig = plots.load_curves(table)
    assert [t.name for t in fig.data] == ["one request per forward"] * 2 + ["batched (up to 16)"] * 2
    assert [t.xaxis for t in fig.data] == ["x", "x2", "x", "x2"]
    assert list(fig.data[2].y) == [5.0, 9.0] and list(fig.data[3].y) == [0.1, 0.25]  # p99 in seconds
    assert fig.layout.yaxis.title.text == "requests / s" and fig.layout.yaxis2.title.text == "seconds"
    # a p99 line wears its throughput line's colour (the legend shows one entry per batch size); both from zero
    assert fig.data[0].line.color == fig.data[1].line.color != fig.data[2].line.color == fig.data[3].line.color
    assert [t.showlegend for t in fig.data] == [None, False, None, False]
    assert fig.layout.yaxis.rangemode == fig.layout.yaxis2.rangemode == "tozero"
    assert "log" in fig.layout.xaxis.title.text and list(fig.layout.xaxis.tickvals) == [1, 4]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no Chromium for kaleido to drive: figures stay interactive only")
def test_notebook_setup_and_mimebundle_carry_a_png():
    assert plots.notebook_setup() == "plotly_mimetype+png"
    fig = plots.latency_boxes([Timing("forward", np.array([9.0, 11.0]))])
    bundle = plots.mimebundle(fig)
    assert bundle["application/vnd.plotly.v1+json"]["data"][0]["type"] == "box"
    png = base64.b64decode(bundle["image/png"], validate=True)
    width, height = png_size(png)
    # plotly's default 700 x 500, at the static scale
    assert (width, height) == (round(700 * plots.STATIC_SCALE), round(500 * plots.STATIC_SCALE))
    assert len(png) > 5_000


def test_ladder_bars_one_bar_group_per_workflow_and_a_bar_per_model():
    by_workflow = pd.DataFrame({"trees": [0.7, 0.6], "hybrid": [0.8, 0.75]}, index=["invoices", "incidents"])
    fig = plots.ladder_bars(by_workflow)
    assert kinds(fig) == ["bar", "bar"] and [t.name for t in fig.data] == ["trees", "hybrid"]
    assert list(fig.data[1].y) == [0.8, 0.75] and list(fig.data[0].x) == ["invoices", "incidents"]
    assert fig.layout.title.text and fig.layout.yaxis.title.text == "test accuracy" and fig.layout.xaxis.title.text


def test_two_paths_shows_both_paths_box_by_box_and_the_hybrid():
    fig = plots.two_paths()
    texts = [a.text for a in fig.layout.annotations]
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == len(plots._GENERATE) + len(plots._DECIDE) + 1  # a box per step, and the trees
    for label, _ in plots._GENERATE + plots._DECIDE:
        assert label in texts
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    # one arrow between consecutive boxes of each path, the decoding loop, the trees' arrow into the heads
    assert len(arrows) == len(plots._GENERATE) - 1 + len(plots._DECIDE) - 1 + 2
    assert not fig.layout.xaxis.visible and not fig.layout.yaxis.visible and fig.layout.title.text
