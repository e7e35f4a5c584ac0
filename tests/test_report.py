import json

import pandas as pd
import pytest

from decisionkit.metrics import score, uniform_predictions
from decisionkit.report import HISTORY_FILE, REFERENCES, RunReport, comparison


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
                       baselines={"uniform": scores}, history=history, routing={"test sent to a human": 0.05})
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
