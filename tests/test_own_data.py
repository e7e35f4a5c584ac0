"""Training on a user's own decisions, end to end: ``decisionkit train --data FILE --schema FILE --out DIR`` and
``decisionkit.train(data, out=..., schema=...)`` on a CSV export of JSON states with no split or workflow column, the
saved record of the data, ``decisionkit evaluate DIR`` on the test rows the model kept, text states (heads and the lexical part,
said), and a failed run that leaves nothing that looks finished. The backbone is the tiny random Llama: these tests
check the path, not what it learns (notebook 08 and the expenses scenario show that on MiniLM). Last, a project
scenario (the tickets, text states) trained by the same trainer and answering."""

import csv
import json

import pandas as pd
import pytest

import decisionkit
from decisionkit.cli import main
from decisionkit.contract.systemone import disagreements
from decisionkit.core.precision import ANSWER_TOLERANCE
from decisionkit.data.metrics import score, uniform_predictions
from decisionkit.data.scenarios import load_scenario
from decisionkit.model.decision_model import FeatureSpec
from decisionkit.training import pipeline, presets
from decisionkit.training.evaluation import evaluate
from decisionkit.training.report import RunReport
from decisionkit.training.trainer import fit_model, preset

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
    assert "data: 60 rows from" in printed and "39 train, 4 validation, 17 test" in printed  # carved, and said
    assert "states: 60 JSON, 0 text" in printed and f"decisionkit serve {out}" in printed
    record = json.loads((out / "data.json").read_text())
    assert record["source"] == str(data) and record["rows total"] == 60 and len(record["rows sha256"]) == 64
    assert record["rows"] == {"train": {"decisions": 39}, "validation": {"decisions": 4}, "test": {"decisions": 17}}
    assert set(record["schema"]["decisions"]) == {"approve", "route", "risk"} and not record["benchmark"]
    report = json.loads((out / "report.json").read_text())
    assert report["data"]["rows sha256"] == record["rows sha256"]
    assert {"majority per question (17 test cases)", "heads alone (17 test cases)", "trees alone (17 test cases)"} \
        <= set(report["baselines"])  # its own baselines, no benchmark rows
    assert "Quoted references" not in (out / "report.md").read_text() and "## Data" in (out / "report.md").read_text()
    assert report["calibration"]["method"] == "out of fold (train) and validation"
    routing = report["routing"]  # checked on the off-domain set read as claims, and on its own test rows
    assert routing["off_domain sent to a human"] > routing["test sent to a human"]
    assert set(routing["share sent to a human by off-domain kind"]) >= {"poem", "code"}
    model = decisionkit.load(out)
    assert model.route(POEM)["verdict"] == "human"
    assert main(["evaluate", str(out)]) == 0  # no --data: the test rows it kept
    assert "17 rows of the test rows it kept scored; 51 decisions" in capsys.readouterr().out
    evaluated = json.loads((out / "eval-test.json").read_text())
    assert evaluated["accuracy"] == pytest.approx(report["test"]["accuracy"])
    assert main(["evaluate", str(out), "--split", "validation"]) == 0  # read again from the recorded source
    assert json.loads((out / "eval-validation.json").read_text())["accuracy"] == pytest.approx(
        report["validation"]["accuracy"])
    data.write_text(data.read_text().replace("claim 3 for", "claim three for"))  # the source changed since
    assert main(["evaluate", str(out), "--split", "validation"]) == 2
    assert "holds other rows than" in capsys.readouterr().err
    # the working folder was moved into place; the lock file that kept a second run out stays, hidden and empty
    assert [p.name for p in tmp_path.glob(".model*")] == [".model.lock"]


def test_one_call_trains_a_dataframe_and_keeps_its_test_rows(tmp_path, tiny_hybrid):
    frame = pd.DataFrame([{**r, "state": json.dumps(r["state"]), "workflow": "expenses"} for r in claims()])
    trained = decisionkit.train(frame, tmp_path / "df", schema=SCHEMA, preset=tiny_hybrid, progress=False)
    assert trained.data.record["source"] == "in memory (DataFrame)" and trained.model.schema.keys() == {"expenses"}
    assert trained.model.structured is not None and trained.model.router is not None
    assert RunReport.load(tmp_path / "df").data["rows"]["test"] == {"expenses": 17}
    kept = decisionkit.evaluate(tmp_path / "df")  # the test rows it kept: scored wherever the DataFrame went
    assert kept.overall()["accuracy"] == pytest.approx(trained.report.scores["test"].overall()["accuracy"])
    with pytest.raises(ValueError, match=r"in memory \(DataFrame\): only its test rows were kept"):
        decisionkit.evaluate(tmp_path / "df", "validation")
    again = decisionkit.evaluate(tmp_path / "df", "test", frame)  # other data: here the very rows it trained on
    assert again.overall()["decisions"] == 3 * 17 and again.left_out == {"trained on (its train rows)": 39,
                                                                         "calibrated and routed on (its validation rows)": 4}
    assert again.overall()["accuracy"] == pytest.approx(kept.overall()["accuracy"])  # only its held-out rows


def test_text_states_train_the_heads_and_the_lexical_part_and_the_report_says_why(tmp_path, tiny_hybrid):
    rows = [{**r, "state": r["state"]["note"] + f", {r['state']['amount_usd']} dollars"} for r in claims()]
    trained = decisionkit.train(rows, tmp_path / "text", schema=SCHEMA, preset=tiny_hybrid, progress=False)
    assert trained.data.record["states"]["text"] == 60
    assert trained.model.structured.parts("decisions") == ["heads", "lexical"] and not trained.model.structured.trees
    assert trained.report.training["parts"] == {"decisions": ["heads", "lexical"]}
    assert "none for decisions: their states are text" in trained.report.training["trees"]
    assert "trees      none for decisions" in trained.report.card()
    parts = {name.split(" (")[0] for name in trained.report.baselines}
    assert {"heads alone", "lexical alone"} <= parts and "trees alone" not in parts
    again = decisionkit.load(tmp_path / "text")  # saved and read back: the same parts answer
    case = rows[0]
    assert again.decide(case["state"], workflow="decisions") == trained.model.decide(case["state"],
                                                                                      workflow="decisions")


def test_a_failed_run_leaves_no_model_that_looks_finished(tmp_path, tiny_hybrid, monkeypatch):
    data, schema = write_export(tmp_path, claims())
    out = tmp_path / "model"
    out.mkdir()
    (out / "report.json").write_text("{}")  # a previous run's folder stays as it was
    (out / "decisionkit.json").write_text("{}")

    def fail(*args, **kwargs):
        raise RuntimeError("killed during calibration")

    monkeypatch.setattr(pipeline, "calibrate_out_of_fold", fail)
    with pytest.raises(RuntimeError, match="killed during calibration"):
        decisionkit.train(data, out, schema=schema, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["decisionkit.json", "report.json"]
    assert (out / "report.json").read_text() == "{}"
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
    accuracy = evaluate(model, "validation", "scenario:tickets").overall()["accuracy"]
    assert accuracy > score(validation, uniform_predictions(validation)).overall()["accuracy"] + 0.1


def flat_export(path, rows, delimiter=";"):
    """The claims as a European spreadsheet exports them: one column a field (no state column), an id column of the
    tool's own name, a column nobody should read, the yes/no question as yes/no, a BOM."""
    with path.open("w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(["claim_ref", "amount_usd", "receipt_attached", "category", "note", "exported_by", "approve",
                         "route", "risk"])
        for i, r in enumerate(rows):
            s = r["state"]
            writer.writerow([f"CL-{i:03d}", str(s["amount_usd"]).replace(".", ","), str(s["receipt_attached"]).upper(),
                             s["category"], s["note"], "finance-bot", "yes" if r["approve"] == "true" else "no",
                             r["route"], r["risk"]])
    return path


@pytest.fixture
def flat_run(tmp_path, tiny_hybrid, capsys):
    """A model trained by the command line on the flat export, and the files around it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    data = flat_export(mine / "claims.csv", claims())
    (mine / "schema.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    (mine / "notes.txt").write_text("mine", encoding="utf-8")
    out = tmp_path / "runs" / "claims"
    flags = ["--id-column", "claim_ref", "--ignore-columns", "exported_by"]
    assert main(["train", "--data", str(data), "--schema", str(mine / "schema.json"), "--out", str(out), "--quiet",
                 *flags]) == 0
    printed = capsys.readouterr().out
    return {"mine": mine, "data": data, "out": out, "flags": flags, "printed": printed}


def test_a_flat_european_export_trains_evaluates_honestly_predicts_and_ships_without_its_rows(flat_run, tmp_path,
                                                                                               capsys):
    mine, data, out, flags = flat_run["mine"], flat_run["data"], flat_run["out"], flat_run["flags"]
    assert "60 rows from" in flat_run["printed"] and "states: 60 JSON, 0 text" in flat_run["printed"]
    model = decisionkit.load(out)
    assert model.schema.keys() == {"decisions"} and model.structured is not None  # the trees read its fields
    record = json.loads((out / "data.json").read_text(encoding="utf-8"))
    assert record["reading"] == {"id_column": "claim_ref", "ignore_columns": ["exported_by"]} and record["delimiter"] == ";"
    assert record["ids"] == "given"
    first = decisionkit.load_decisions(data, SCHEMA, id_column="claim_ref", ignore_columns="exported_by").rows[0]
    assert first.state == {"amount_usd": 15, "receipt_attached": False, "category": "meals", "note": "claim 0 for the team"}

    # evaluate on the training export scores only the rows it held out, and says so
    assert main(["evaluate", str(out), "--data", str(data), *flags]) == 0
    said = capsys.readouterr().out
    test_rows = sum(record["rows"]["test"].values())
    assert f"{test_rows} rows of {data} scored; left out " in said and "trained on (its train rows)" in said
    scored = json.loads((out / "eval-claims.json").read_text(encoding="utf-8"))
    kept = json.loads((out / "report.json").read_text(encoding="utf-8"))["test"]
    assert scored["rows"] == test_rows and scored["accuracy"] == pytest.approx(kept["accuracy"])
    renamed = data.rename(mine / "next_month.csv")  # any name: a one-workflow model reads it as its own
    assert main(["evaluate", str(out), "--data", str(renamed), *flags]) == 0
    assert json.loads((out / "eval-next_month.json").read_text(encoding="utf-8"))["rows"] == test_rows
    capsys.readouterr()

    # a batch of new rows: unlabelled, in the same shape, one of them bad
    new = flat_export(tmp_path / "new.csv", claims(8))
    lines = new.read_text(encoding="utf-8-sig").splitlines()
    lines[3] = lines[3].replace("claim 2 for the team", "{'note': 'a repr'}")
    new.write_text("\n".join(lines) + "\n", encoding="utf-8")
    answers = tmp_path / "answers.jsonl"
    assert main(["predict", str(out), "--data", str(new), "--out", str(answers), "--quiet", *flags]) == 2
    assert "new.csv:4: field 'note' begins like JSON" in capsys.readouterr().err and not answers.exists()
    assert main(["predict", str(out), "--data", str(new), "--out", str(answers), "--quiet", "--skip-bad", *flags]) == 0
    assert "skipped" in capsys.readouterr().err
    got = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    assert [g["id"] for g in got] == [f"CL-{i:03d}" for i in range(8) if i != 2]
    assert set(got[0]) == {"id", "answers", "routing"} and set(got[0]["answers"]) == {"approve", "route", "risk"}
    frame = decisionkit.predict(out, new, skip_bad=True, progress=False, **{"id_column": "claim_ref",
                                                                           "ignore_columns": ["exported_by"]})
    states = decisionkit.load_decisions(new, SCHEMA, id_column="claim_ref", ignore_columns="exported_by",
                                        labelled=False, carve=False, min_train=0, skip_bad=True).rows
    for row, state in zip(frame.itertuples(), states):  # batched answers are decide's, within the dtype's tolerance
        assert not disagreements(row.answers, model.route(state.state)["answers"], ANSWER_TOLERANCE[
            model.backbone.precision.dtype])
    table = tmp_path / "answers.csv"
    assert main(["predict", str(out), "--data", str(new), "--out", str(table), "--quiet", "--skip-bad", *flags]) == 0
    columns = pd.read_csv(table).columns.tolist()
    assert columns[:3] == ["id", "approve.noul", "route.choice"] and {"route.probabilities.audit", "risk.score",
                                                                      "confidence", "verdict"} <= set(columns)
    assert main(["predict", str(out), "--data", str(new), "--out", str(table), "--quiet", "--skip-bad", *flags]) == 2
    assert "answers.csv exists" in capsys.readouterr().err

    # shipped without the rows: loads and answers as the run does
    shipped = tmp_path / "shipped"
    assert main(["export", str(out), str(shipped)]) == 0
    assert sorted(p.name for p in shipped.iterdir()) == ["decisionkit.json", "heads.safetensors"]
    assert "claims.csv" not in (shipped / "decisionkit.json").read_text(encoding="utf-8")
    assert decisionkit.load(shipped).route(first.state) == model.route(first.state)
    assert main(["evaluate", str(shipped), "--data", str(renamed), *flags]) == 0  # no record of its rows: said
    assert "keeps no record of the rows it trained on" in capsys.readouterr().out

    # trained again into the same folder: the model is replaced, the user's file beside it kept
    (out / "my_notes.txt").write_text("kept", encoding="utf-8")
    assert main(["train", "--data", str(renamed), "--schema", str(mine / "schema.json"), "--out", str(out), "--quiet",
                 *flags]) == 0
    assert (out / "my_notes.txt").read_text(encoding="utf-8") == "kept" and not (out / "eval-claims.json").exists()
    assert sorted(p.name for p in mine.iterdir()) == ["next_month.csv", "notes.txt", "schema.json"]
