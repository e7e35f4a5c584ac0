import json

import numpy as np
import pandas as pd
import pytest

from decisionkit.course.ensemble import average, mean_answers
from decisionkit.data.metrics import score, uniform_predictions
from decisionkit.model.saving import HISTORY_FILE
from decisionkit.training.report import REFERENCES, Ladder, RunReport, comparison, finetune_table


@pytest.fixture
def saved_run(tmp_path, splits):
    """A report of uniform answers, saved as a run folder is (no training needed)."""
    cases = splits["validation"].head(2)
    scores = score(cases, uniform_predictions(cases))
    history = pd.DataFrame([{"stage": "heads", "l2": 0.01, "step": 0, "train_loss": 1.2, "val_loss": 1.3}])
    report = RunReport(backbone={"name": "org/tiny-model", "source": "test", "weights_sha256": "0" * 64},
                       data_source="test", scores={"validation": scores, "test": scores},
                       training={"preset": "cpu-quick", "mode": "heads", "seconds": 90.0, "peak_memory_gb": 1.5,
                                 "best_val_loss": 1.3, "compute_dtype": "bfloat16"},
                       baselines={"uniform": scores}, history=history, routing={"test sent to a human": 0.05},
                       answered={"test": {"accuracy (raw)": 0.5, "accuracy as answered": 0.45, "sent to a human": 0.5,
                                          "answered cases": 1, "accuracy of the answered cases": 0.6}})
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / HISTORY_FILE).write_text(json.dumps({"history": history.to_dict(orient="records")}))
    report.save(folder)
    return folder, report


def test_a_saved_report_loads_back_the_same_tables(saved_run):
    folder, report = saved_run
    loaded = RunReport.load(folder)
    pd.testing.assert_frame_equal(loaded.table(), report.table())
    assert set(loaded.scores) == {"validation", "test"} and set(loaded.baselines) == {"uniform"}
    assert loaded.scores["test"].overall()["kl"] == pytest.approx(report.scores["test"].overall()["kl"])
    assert loaded.routing == report.routing and len(loaded.figure().data) == 1
    assert "routing    test sent to a human 5.0%" in loaded.card()
    assert loaded.answered == report.answered
    assert ("test       raw 0.500; as answered 0.450, 50.0% sent to a human, 0.600 on the 1 cases it answers"
            in loaded.card())
    assert loaded.answered_table().loc["test", "answered cases"] == 1


def test_the_comparison_labels_measured_and_quoted_rows(saved_run, splits):
    folder, report = saved_run
    extra = score(splits["validation"].head(1), uniform_predictions(splits["validation"].head(1)))
    table = comparison({"tiny": folder}, measured={"one case": extra})
    assert list(table.index[:2]) == ["tiny (measured)", "one case (measured)"]
    assert table.loc["tiny (measured)", "training (min)"] == 1.5
    assert table.loc["tiny (measured)", "backbone"] == "tiny-model"
    assert table.loc["tiny (measured)", "accuracy"] == pytest.approx(report.scores["test"].overall()["accuracy"])
    quoted = table[table.index.str.endswith("(quoted)")]
    assert len(quoted) == len(REFERENCES) and quoted["accuracy"].dropna().tolist() == REFERENCES["accuracy"].dropna().tolist()


def test_table_card_and_markdown_carry_every_set(saved_run):
    folder, report = saved_run
    table = report.table()
    assert list(table.index) == ["trained model (validation)", "trained model (test)", "uniform"]
    uniform = report.scores["test"].overall()
    for name in table.index:  # every row is that set's pooled scores
        assert table.loc[name, "kl"] == pytest.approx(uniform["kl"]) and table.loc[name, "decisions"] == 40
    card = report.card()
    assert "backbone   org/tiny-model (test)" in card and "preset cpu-quick, 90 s, peak memory 1.50 GB" in card
    assert f"accuracy {uniform['accuracy']:.3f}  KL {uniform['kl']:.3f}" in card
    markdown = (folder / "report.md").read_text()
    for heading in ("## Scores", "## As answered", "## validation: by question type", "## test: by workflow",
                    "## Quoted references (not measured here)"):
        assert heading in markdown
    saved = json.loads((folder / "report.json").read_text())
    assert saved["test"]["kl"] == pytest.approx(uniform["kl"]) and set(saved["baselines"]) == {"uniform"}
    assert set(saved["test"]["by_type"]) == {"noul", "choice", "score"}


def test_finetune_table_sets_the_saved_step_beside_stage_one(saved_run):
    _, report = saved_run
    history = pd.DataFrame([{"stage": "heads", "l2": 0.01, "step": s, "val_loss": v} for s, v in ((0, 1.6), (10, 1.3))]
                           + [{"stage": "lora", "step": 40, "val_loss": 1.1}])
    tuned = RunReport(**{**report.__dict__, "history": history,
                         "training": {**report.training, "best step": 40, "best_val_loss": 1.1}})
    table = finetune_table({"lora": tuned})
    assert table.loc["lora"].to_dict() == {"best step": 40, "best dev loss": 1.1, "stage-1 dev loss": 1.3,
                                           "training (min)": 1.5, "compute dtype": "bfloat16"}


def test_an_ensemble_averages_and_a_ladder_prices_each_step(quick_model, splits):
    _, model = quick_model
    cases = splits["validation"].head(8)
    alone = model.predict(cases)
    twice = average([model, model], cases)
    assert all(np.allclose(twice[i][q], alone[i][q]) for i in range(len(cases)) for q in alone[i])
    with pytest.raises(ValueError, match="models is empty"):
        average([], cases)
    uniform_answers = uniform_predictions(cases)  # answers already predicted average the same way, option by option
    halfway = mean_answers([alone, uniform_answers])
    assert all(np.allclose(halfway[i][q], (alone[i][q] + uniform_answers[i][q]) / 2) for i in range(len(cases))
               for q in alone[i])
    with pytest.raises(ValueError, match="one entry per case"):
        mean_answers([alone, alone[:3]])
    uniform = score(cases, uniform_predictions(cases))
    ladder = Ladder({"uniform": uniform, "model": score(cases, alone), "ensemble of two copies": score(cases, twice)})
    table = ladder.table()
    assert list(table.index) == ["uniform", "model", "ensemble of two copies"]
    gain = table["accuracy gain over the row above"]
    assert np.isnan(gain.iloc[0]) and gain.iloc[1] == pytest.approx(table["accuracy"].iloc[1] - table["accuracy"].iloc[0])
    assert gain.iloc[2] == 0 and table["95% interval, low"].iloc[2] == 0  # the same answers gain nothing
    assert table["95% interval, low"].iloc[1] <= gain.iloc[1] <= table["95% interval, high"].iloc[1]
    assert list(ladder.by_workflow().columns) == list(table.index)
    (low, high), accuracy = ladder.workflow_intervals(), ladder.by_workflow()
    assert (low <= accuracy + 1e-12).all().all() and (accuracy <= high + 1e-12).all().all()
    assert (low["uniform"] < high["uniform"]).any()  # a workflow's cases differ, so its accuracy has a spread
    fig = ladder.figure()
    assert len(fig.data) == 3 and fig.layout.title.text and fig.layout.yaxis.title.text
    assert list(fig.data[1].error_y.array) == pytest.approx((high - accuracy)["model"].tolist())


def test_the_hood_shows_the_code_the_package_runs():
    import inspect

    from decisionkit.course.hood import source
    from decisionkit.model.heads import decision_loss

    shown = source(decision_loss)
    assert list(shown.parts) == ["decisionkit.model.heads.decision_loss"]
    assert shown.parts["decisionkit.model.heads.decision_loss"] == inspect.getsource(decision_loss)
    assert "```python\ndef decision_loss" in shown._repr_markdown_() and "/" not in shown._repr_markdown_().split("\n")[0]
    with pytest.raises(ValueError, match="at least one"):
        source()
