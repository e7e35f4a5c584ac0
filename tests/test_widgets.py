import base64
import json
import struct
from pathlib import Path

import pytest

import decisionkit
from decisionkit import plots
from decisionkit.course.widgets import DecisionPanel, lowest_confidence, parse_state
from decisionkit.training.anomaly import fit_router


def test_parse_state_reads_json_objects_and_keeps_text():
    assert parse_state('{"a": 1}') == {"a": 1}
    assert parse_state("my card was charged twice") == "my card was charged twice"
    assert parse_state("{broken") == "{broken"


def test_panel_driven_like_a_learner(quick_model, splits):
    _, model = quick_model
    case = splits["validation"][0]
    panel = DecisionPanel(model, workflow=case.workflow)
    panel.text.value = json.dumps(case.state)
    panel.threshold.value = 0.0
    panel.button.click()
    assert "verdict: answer" in panel.verdict.value
    assert set(panel.result["answers"]) == set(case.questions)
    panel.threshold.value = 1.0  # moving the slider re-decides without re-running the model
    assert "verdict: human" in panel.verdict.value and "below 100.0%" in panel.verdict.value
    assert lowest_confidence(panel.result["answers"]) < 1.0
    assert len(panel.widget().children) == 5
    panel.button.click()  # a second answer replaces the bars instead of adding to them
    assert [len(o["data"]["application/vnd.plotly.v1+json"]["data"]) for o in panel.plot.outputs] == [
        len(case.questions)]


def test_panel_shows_the_router_verdict_and_scores(quick_model, splits):
    path, _ = quick_model
    model = decisionkit.load(path)
    plain = DecisionPanel(model)  # no router yet: the default slider, and nothing distance-aware to untick
    assert plain.threshold.value == 0.6 and not plain.distance_aware.value and plain.distance_aware.disabled
    router = fit_router(model, splits["train"].head(10), splits["validation"].head(10), folds=2)  # 2 folds: quick
    # A threshold no default could produce, so that the slider can only start there by reading the router (the
    # poem's confidence is 0, below any positive threshold, so its verdict stays what the router would say).
    router.threshold = 0.345
    panel = DecisionPanel(model, text="autumn wind through golden leaves under the moon")
    assert panel.threshold.value == pytest.approx(0.345, abs=1e-3)
    assert panel.distance_aware.value and not panel.distance_aware.disabled
    panel.button.click()
    assert "anomaly scores: " in panel.verdict.value and "mahalanobis" in panel.verdict.value
    assert "verdict: human" in panel.verdict.value and "lowest confidence 0.0%" in panel.verdict.value
    assert lowest_confidence(panel.result["answers"]) < router.threshold
    raw = model.decide(panel.text.value, workflow=panel.workflow.value, raw=True)
    assert panel.result["answers"] != raw, "the poem's distance-aware answers should differ from the heads alone"
    panel.distance_aware.value = False  # the heads alone: re-run at once, the router still sends it to a human
    assert panel.result["answers"] == raw
    assert "verdict: human" in panel.verdict.value


def png_size(b64: str) -> tuple[int, int]:
    """(width, height) from a base64 PNG's IHDR chunk."""
    data = base64.b64decode(b64)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="kaleido needs Chromium to draw the PNG")
def test_panel_output_carries_a_static_rendering_of_the_last_answer(quick_model, splits):
    """What a saved notebook shows without a kernel: beside the widget view, the last answer's bars as a PNG and an
    HTML fallback with the verdict; the same PNG inside the panel's Output, for a widget renderer without plotly."""
    assert plots.static_images(), "kaleido should render with the system Chromium"
    _, model = quick_model
    case = splits["validation"][0]
    panel = DecisionPanel(model, workflow=case.workflow)
    assert "no answer yet" in panel.static_bundle()["text/html"] and "image/png" not in panel.static_bundle()

    panel.text.value = json.dumps(case.state)
    panel.threshold.value = 0.0
    panel.button.click()
    first = panel._repr_mimebundle_()
    view = first["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == panel.widget().model_id  # the live widget, which JupyterLab draws first
    assert panel.widget()._repr_mimebundle_() == first  # a cell ending in panel.widget() shows the same
    # The bars of this answer: one 140-px subplot per question plus 60 px, at the static scale
    assert png_size(first["image/png"])[1] == round(plots.STATIC_SCALE * (140 * len(case.questions) + 60))
    assert "verdict: answer" in first["text/html"] and first["image/png"] in first["text/html"]
    # the live Output gets plotly's JSON alone: JupyterLab shows a PNG beside it instead of the interactive figure
    assert [sorted(o["data"]) for o in panel.plot.outputs] == [["application/vnd.plotly.v1+json"]]

    panel.text.value = "autumn wind through golden leaves under the moon"
    panel.workflow.value = next(wf for wf in panel.workflow.options if wf != case.workflow)
    panel.threshold.value = 1.0
    panel.button.click()
    second = panel._repr_mimebundle_()
    assert second["image/png"] != first["image/png"]  # a new answer, a new picture
    answers = panel.result["answers"]
    assert png_size(second["image/png"])[1] == round(plots.STATIC_SCALE * (140 * len(answers) + 60))
    assert "verdict: human" in second["text/html"] and "verdict: answer" not in second["text/html"]
    assert f"lowest confidence {lowest_confidence(answers):.1%}" in second["text/html"]
