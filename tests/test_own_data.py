"""Training on a user's own decisions, end to end: ``decisionkit train --data FILE --schema FILE --out DIR`` and
``decisionkit.train(data, out=..., schema=...)`` on a CSV export of JSON states with no split or workflow column, the
saved record of the data, ``decisionkit evaluate DIR`` on the test rows the model kept, text states (heads alone,
said), and a failed run that leaves nothing that looks finished. The backbone is the tiny random Llama: these tests
check the path, not what it learns (notebook 08 and the expenses scenario show that on MiniLM). Last, a project
scenario (the tickets, text states) trained by the same trainer and answering."""

import csv
import json

import pandas as pd
import pytest

import decisionkit
from decisionkit.cli import main
from decisionkit.data.metrics import score, uniform_predictions
from decisionkit.data.scenarios import load_scenario
from decisionkit.model.decision_model import FeatureSpec
from decisionkit.training import pipeline, presets
from decisionkit.training.report import RunReport
from decisionkit.training.trainer import evaluate, fit_model, preset

SCHEMA = {
    "approve": {"type": "noul", "instructions": "Reimburse the claim as filed?"},
    "route": {"type": "choice", "instructions": "Who acts on it?",
              "criteria": {"auto": "nothing to check", "manager": "a manager looks", "audit": "an auditor looks"}},
    "risk": {"type": "score", "instructions": "How risky is it?", "criteria": ["low", "some", "high"]},
}
POEM = "autumn wind combs the golden leaves\nthe moon keeps its own counsel\nand the river forgets my name"


def claims(n: int = 60) -> list[dict]:
    """Expense claims as an export holds them: a JSON state (numbers, a flag, a category, a note), hard labels."""
    rows = []
    for i in range(n):
        amount = 15 + (i * 37) % 400
        receipt = i % 4 != 0
        risk = min(2, int(amount > 250) + int(not receipt))
        rows.append({"state": {"amount_usd": amount, "receipt_attached": receipt,
                               "category": ("meals", "travel", "software")[i % 3], "note": f"claim {i} for the team"},
                     "approve": "true" if risk == 0 else "false", "route": ("auto", "manager", "audit")[risk],
                     "risk": risk})
    return rows


def write_export(folder, rows):
    path = folder / "claims.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["state", "approve", "route", "risk"])
        for r in rows:
            writer.writerow([json.dumps(r["state"]), r["approve"], r["route"], r["risk"]])
    (folder / "schema.json").write_text(json.dumps(SCHEMA))
    return path, folder / "schema.json"


@pytest.fixture
def tiny_hybrid(monkeypatch, tiny_backbone_path):
    """The default preset (the hybrid) on the tiny backbone, at test sizes; the command line picks it by name."""
    tiny = presets.preset(presets.DEFAULT_PRESET, backbone=str(tiny_backbone_path), features=FeatureSpec(max_length=48),
                          head_steps=20, l2_grid=(1.0,), tree_rounds=20, off_domain_per_kind=2)
    monkeypatch.setitem(presets.PRESETS, presets.DEFAULT_PRESET, tiny)
    return tiny


def test_the_command_trains_a_csv_export_into_a_calibrated_routed_model_that_knows_its_data(tmp_path, capsys,
                                                                                             tiny_hybrid):
    data, schema = write_export(tmp_path, claims())
    out = tmp_path / "model"
    assert main(["train", "--data", str(data), "--schema", str(schema), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "data: 60 rows from" in printed and "43 train, 5 validation, 12 test" in printed  # carved, and said
    assert "states: 60 JSON, 0 text" in printed and f"decisionkit serve {out}" in printed
    record = json.loads((out / "data.json").read_text())
    assert record["source"] == str(data) and record["rows total"] == 60 and len(record["rows sha256"]) == 64
    assert record["rows"] == {"train": {"claims": 43}, "validation": {"claims": 5}, "test": {"claims": 12}}
    assert set(record["schema"]["claims"]) == {"approve", "route", "risk"} and not record["benchmark"]
    report = json.loads((out / "report.json").read_text())
    assert report["data"]["rows sha256"] == record["rows sha256"]
    assert {"majority per question (12 test cases)", "heads alone (12 test cases)", "trees alone (12 test cases)"} \
        <= set(report["baselines"])  # its own baselines, no benchmark rows
    assert "Quoted references" not in (out / "report.md").read_text() and "## Data" in (out / "report.md").read_text()
    assert report["calibration"]["method"] == "out of fold (train) and validation"
    routing = report["routing"]  # checked on the off-domain set read as claims, and on its own test rows
    assert routing["off_domain sent to a human"] > routing["test sent to a human"]
    assert set(routing["share sent to a human by off-domain kind"]) >= {"poem", "code"}
    model = decisionkit.load(out)
    assert model.route(POEM)["verdict"] == "human"
    assert main(["evaluate", str(out)]) == 0  # no --data: the test rows it kept
    assert "on the test rows it kept: 36 decisions" in capsys.readouterr().out
    evaluated = json.loads((out / "eval-test.json").read_text())
    assert evaluated["accuracy"] == pytest.approx(report["test"]["accuracy"])
    assert main(["evaluate", str(out), "--split", "validation"]) == 0  # read again from the recorded source
    assert json.loads((out / "eval-validation.json").read_text())["accuracy"] == pytest.approx(
        report["validation"]["accuracy"])
    data.write_text(data.read_text().replace("claim 3 for", "claim three for"))  # the source changed since
    assert main(["evaluate", str(out), "--split", "validation"]) == 2
    assert "holds other rows than" in capsys.readouterr().err
    assert not list(tmp_path.glob(".model*"))  # the working folder was moved into place


def test_one_call_trains_a_dataframe_and_keeps_its_test_rows(tmp_path, tiny_hybrid):
    frame = pd.DataFrame([{**r, "state": json.dumps(r["state"]), "workflow": "expenses"} for r in claims()])
    trained = decisionkit.train(frame, tmp_path / "df", schema=SCHEMA, preset=tiny_hybrid, progress=False)
    assert trained.data.record["source"] == "in memory (DataFrame)" and trained.model.schema.keys() == {"expenses"}
    assert trained.model.structured is not None and trained.model.router is not None
    assert RunReport.load(tmp_path / "df").data["rows"]["test"] == {"expenses": 12}
    kept = decisionkit.evaluate(tmp_path / "df")  # the test rows it kept: scored wherever the DataFrame went
    assert kept.overall()["accuracy"] == pytest.approx(trained.report.scores["test"].overall()["accuracy"])
    with pytest.raises(ValueError, match=r"in memory \(DataFrame\): only its test rows were kept"):
        decisionkit.evaluate(tmp_path / "df", "validation")
    again = decisionkit.evaluate(tmp_path / "df", "test", frame)  # other data: here the same rows, carved alike
    assert again.overall()["decisions"] == 3 * 60  # a source that names no split is scored whole


def test_text_states_train_the_heads_alone_and_the_report_says_why(tmp_path, tiny_hybrid):
    rows = [{**r, "state": r["state"]["note"] + f", {r['state']['amount_usd']} dollars"} for r in claims()]
    trained = decisionkit.train(rows, tmp_path / "text", schema=SCHEMA, preset=tiny_hybrid, progress=False)
    assert trained.model.structured is None and trained.data.record["states"] == {"json": 0, "text": 60}
    assert "left out: the states of decisions are text" in trained.report.training["trees"]
    assert "trees      left out" in trained.report.card()
    assert not any(name.startswith(("heads alone", "trees alone")) for name in trained.report.baselines)


def test_a_failed_run_leaves_no_model_that_looks_finished(tmp_path, tiny_hybrid, monkeypatch):
    data, schema = write_export(tmp_path, claims())
    out = tmp_path / "model"
    out.mkdir()
    (out / "report.json").write_text("{}")  # a previous run's folder stays as it was

    def fail(*args, **kwargs):
        raise RuntimeError("killed during calibration")

    monkeypatch.setattr(pipeline, "calibrate_out_of_fold", fail)
    with pytest.raises(RuntimeError, match="killed during calibration"):
        decisionkit.train(data, out, schema=schema, progress=False)
    assert [p.name for p in out.iterdir()] == ["report.json"] and (out / "report.json").read_text() == "{}"
    new = tmp_path / "new"
    with pytest.raises(RuntimeError):
        decisionkit.train(data, new, schema=schema, progress=False)
    assert not new.exists()  # only the hidden working folder, which a rerun resumes from or --restart clears


def test_scenario_trains_with_the_same_trainer_and_decides_on_text(tmp_path):
    # The trainer's mechanics on few cases: the steps are picked on the 10 validation tickets (a dev slice of 10 of
    # 50 train tickets picked step 0, the uniform start); test_scenario_presets_keep_dev_and_validation_apart checks
    # the presets' own dev slices.
    # A window of 256 tokens holds nearly every ticket whole. With 96-token windows the longer tickets are read in
    # several, pooled: the 40-ticket model then scored 0.783 on validation but sent the seed ticket to
    # technical_support, a miss of so small a model, not of the mechanics this test checks.
    p = preset("tickets", head_steps=30, l2_grid=(1e-2,), train_per_workflow=40, dev_per_workflow=0,
               validation_per_workflow=10, features=decisionkit.FeatureSpec(max_length=256))
    result = fit_model(p, tmp_path / "tickets", progress=False)
    assert result.extra["train cases"] == 40
    assert result.extra["head steps"] > 0  # step 0 is the uniform start: the heads would have learned nothing
    model = decisionkit.load(tmp_path / "tickets")
    answers = model.decide("my credit card was charged twice, refund today")
    assert set(answers) == {"team", "priority", "sentiment", "contains_pii", "language"}
    # Uniform heads answer every question with its first option (billing, en): these answers need the text read.
    # Measured with these settings: step 10, validation accuracy 0.787 against 0.543 for uniform answers.
    assert answers["team"]["choice"] == "billing" and answers["language"]["choice"] == "en"
    crash = model.decide("the app crashes every time I open it, please fix the bug")
    assert crash["team"]["choice"] == "technical_support"
    assert model.decide("我的账户被锁定了，无法登录")["language"]["choice"] == "zh"
    assert model.decide("necesito cambiar la contraseña de mi cuenta")["language"]["choice"] == "es"
    validation = load_scenario("tickets", "validation")
    accuracy = evaluate(model, "validation", "tickets").overall()["accuracy"]
    assert accuracy > score(validation, uniform_predictions(validation)).overall()["accuracy"] + 0.1
