import json

import pytest

import decisionkit
from decisionkit.anomaly import fit_router
from decisionkit.widgets import DecisionPanel, lowest_confidence, parse_state


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
    router = fit_router(model, splits["train"].head(10), splits["validation"].head(10))
    panel = DecisionPanel(model, text="autumn wind through golden leaves under the moon")
    assert panel.threshold.value == pytest.approx(router.threshold, abs=1e-3) and panel.distance_aware.value
    panel.button.click()
    assert "anomaly scores: " in panel.verdict.value and "mahalanobis" in panel.verdict.value
    assert "verdict: human" in panel.verdict.value and "lowest confidence 0.0%" in panel.verdict.value
    assert lowest_confidence(panel.result["answers"]) < router.threshold
    panel.distance_aware.value = False  # the heads alone: re-run at once, the router still sends it to a human
    assert panel.result["answers"] == model.decide(panel.text.value, workflow=panel.workflow.value, raw=True)
    assert "verdict: human" in panel.verdict.value
