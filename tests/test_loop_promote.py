"""``promote`` and the pointer it writes, on folders that stand for runs (the files a version is hashed from, and a
report's ``loop`` section): refused when the new run is worse beyond the interval on any set, the old run untouched;
otherwise ``promoted.json`` written and followed (a chain too, a circle refused); a comparison made against another
version than the one served now is not reused."""

import json

import pytest

from decisionkit.cli import main
from decisionkit.core.errors import MissingFile, ModelFolderError, RunError
from decisionkit.loop.promotion import PROMOTED_FILE, served_folder
from decisionkit.loop.retrain import promote
from decisionkit.model.saving import CONFIG_FILE, HEADS_FILE, REPORT_FILE, model_version
from decisionkit.training.comparison import comparison_lines, comparison_table


def run(folder, content: str):
    folder.mkdir()
    (folder / CONFIG_FILE).write_text(json.dumps({"content": content}))
    (folder / HEADS_FILE).write_bytes(content.encode())
    return folder


def row(old: float, new: float, worse=()) -> dict:
    return {"cases": 40, "decisions": 200, "old": {"accuracy": old, "sent to a human": 0.1, "ece": 0.05},
            "new": {"accuracy": new, "sent to a human": 0.1, "ece": 0.05},
            "difference": {"accuracy": [new - old, new - old - 0.02, new - old + 0.02],
                           "sent to a human": [0.0, -0.01, 0.01], "ece": [0.0, -0.01, 0.01]},
            "worse": list(worse)}


def report(folder, served_version: str, comparison: dict) -> None:
    loop = {"log": "log.db", "served": {"model": "run1", "version": served_version, "folder": "x"},
            "reviews": {"train": 30, "review test": 10, "audit": 5, "not a case": 2, "left out": {},
                        "agreement": {}}, "comparison": comparison}
    (folder / REPORT_FILE).write_text(json.dumps({"loop": loop}))


def test_a_worse_run_is_refused_and_the_served_run_untouched(tmp_path):
    old, new = run(tmp_path / "run1", "a"), run(tmp_path / "run2", "b")
    report(new, model_version(old), {"test": row(0.80, 0.78), "audit": row(0.7, 0.6, worse=["accuracy"])})
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    with pytest.raises(RunError, match=r"not promoted: .* beyond the 95% interval on audit: accuracy"):
        promote(new, old)
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert main(["promote", str(new), "--over", str(old)]) == 2  # one line, exit status 2


def test_promotion_writes_the_pointer_a_server_follows(tmp_path, capsys):
    old, new, newer = run(tmp_path / "run1", "a"), run(tmp_path / "run2", "b"), run(tmp_path / "run3", "c")
    report(new, model_version(old), {"test": row(0.80, 0.81), "review test": row(0.5, 0.8)})
    assert main(["promote", str(new), "--over", str(old)]) == 0
    assert "promoted" in capsys.readouterr().out
    pointer = json.loads((old / PROMOTED_FILE).read_text())
    assert pointer["run"] == str(new.absolute()) and pointer["version"] == model_version(new)
    assert pointer["over version"] == model_version(old)
    assert served_folder(old) == new.absolute()
    # the next promotion over run1 is compared with what run1 serves now: run2
    report(newer, model_version(old), {"test": row(0.80, 0.82)})  # made against run1's own model: not reused
    with pytest.raises(MissingFile, match="keeps no record of its data"):  # compared anew on its test rows: none here
        promote(newer, old)
    report(newer, model_version(new), {"test": row(0.81, 0.82)})
    promote(newer, old)
    assert served_folder(old) == newer.absolute()
    with pytest.raises(RunError, match="serves"):
        promote(newer, old)


def test_a_circle_of_promotions_is_refused(tmp_path):
    a, b = run(tmp_path / "a", "a"), run(tmp_path / "b", "b")
    (a / PROMOTED_FILE).write_text(json.dumps({"run": str(b)}))
    (b / PROMOTED_FILE).write_text(json.dumps({"run": str(a)}))
    with pytest.raises(ModelFolderError, match="circle"):
        served_folder(a)


def test_the_report_shows_the_comparison():
    loop = {"served": {"model": "run1", "version": "abc"}, "reviews": {"train": 3, "review test": 1, "audit": 2,
                                                                         "not a case": 0},
            "comparison": {"test": row(0.8, 0.81), "audit": row(0.6, 0.5, worse=["accuracy"])}}
    lines = comparison_lines(loop)
    assert "3 reviewed cases trained on" in lines[0] and "version abc" in lines[0]
    assert "0.800 -> 0.810" in lines[1] and "worse on accuracy" in lines[2]
    table = comparison_table(loop)
    assert table.loc[("audit (40 cases)", "accuracy"), "worse"] and not table.loc[("test (40 cases)", "ece"), "worse"]
