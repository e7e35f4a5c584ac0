"""Nothing of the user's is lost by a run (``training/run_folder.py``): an ``--out`` that holds the user's files is
refused before anything trains, an earlier model is replaced beside the files kept with it, two runs into one
``out`` do not race, a working folder is resumed only by the run that made it; and the command line's errors: a
user's mistake in one line, a bug as a traceback. Nothing here trains a model: the refusals come first."""

import json
import os
import warnings

import pytest

from decisionkit.cli import main
from decisionkit.core.errors import RunError
from decisionkit.model.saving import CONFIG_FILE, HEADS_FILE, REPORT_FILE
from decisionkit.training import pipeline
from decisionkit.training.run_folder import (
    RUN_FILE,
    StartedOver,
    check_out,
    claimed,
    prepare_work,
    publish_run,
    working_folder,
)

SCHEMA = {"approve": {"type": "noul"}}


def user_folder(tmp_path):
    """A folder of the user's: their export and their notes."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "export.csv").write_text("state,approve\n" + "".join(f"case {i},yes\n" for i in range(40)),
                                     encoding="utf-8")
    (mine / "notes.txt").write_text("who decided what", encoding="utf-8")
    (mine / "schema.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    return mine


def test_an_out_folder_of_the_users_files_is_refused_before_anything_trains(tmp_path, capsys):
    mine = user_folder(tmp_path)
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    code = main(["train", "--data", str(mine / "export.csv"), "--schema", str(mine / "schema.json"), "--out",
                 str(mine), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a decisionkit model (it holds export.csv, notes.txt, schema.json)" in err
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before  # every file as it was, nothing added
    with pytest.raises(RunError, match="is a file"):
        check_out(mine / "notes.txt")
    assert check_out(tmp_path / "new") == tmp_path / "new"  # a new folder: allowed


def test_an_earlier_model_is_replaced_and_the_files_beside_it_are_kept(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    for name, text in ((CONFIG_FILE, "old config"), (HEADS_FILE, "old heads"), (REPORT_FILE, "old report"),
                       ("eval-test.json", "old scores"), ("my_notes.txt", "mine")):
        (out / name).write_text(text, encoding="utf-8")
    (out / "plots").mkdir()
    (out / "plots" / "a.png").write_bytes(b"png")
    check_out(out)  # an earlier model: allowed
    work = working_folder(out)
    work.mkdir()
    (work / CONFIG_FILE).write_text("new config", encoding="utf-8")
    (work / HEADS_FILE).write_text("new heads", encoding="utf-8")
    (work / RUN_FILE).write_text("{}", encoding="utf-8")
    publish_run(work, out)
    assert sorted(p.name for p in out.iterdir()) == [CONFIG_FILE, HEADS_FILE, "my_notes.txt", "plots"]
    assert (out / CONFIG_FILE).read_text(encoding="utf-8") == "new config"  # the run's own files: the new run's
    assert (out / "my_notes.txt").read_text(encoding="utf-8") == "mine" and (out / "plots" / "a.png").is_file()
    assert not work.exists()


def test_two_runs_into_one_out_do_not_race(tmp_path, capsys):
    mine = user_folder(tmp_path)
    out = tmp_path / "runs" / "model"
    with claimed(out):  # another run holds it, and says who it is in its working folder
        prepare_work(out, {"preset": "a"})
        code = main(["train", "--data", str(mine / "export.csv"), "--schema", str(mine / "schema.json"), "--out",
                     str(out), "--quiet"])
        assert code == 2
        err = capsys.readouterr().err
        assert f"{out} is being trained by process {os.getpid()} on " in err and "give another --out" in err
    with claimed(out):  # released: the next run takes it
        pass
    assert not out.exists()


def test_a_working_folder_is_resumed_only_by_the_run_that_made_it(tmp_path):
    out = tmp_path / "model"
    made = {"preset": {"name": "cpu-fast"}, "schema": SCHEMA, "rows": "abc"}
    work = prepare_work(out, made)
    (work / "checkpoint").mkdir()  # an interrupted fine-tune
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare_work(out, made) == work and (work / "checkpoint").is_dir()  # the same run: resumed
    relabelled = {**made, "rows": "def"}
    with pytest.warns(StartedOver, match=r"was left by an interrupted run of another rows; starting over"):
        prepare_work(out, relabelled)
    assert not (work / "checkpoint").exists()
    (work / "my_export.csv").write_text("x", encoding="utf-8")  # not a file any run writes: refused, not removed
    with pytest.raises(RunError, match="holds my_export.csv, which no decisionkit run writes"):
        prepare_work(out, made)
    assert (work / "my_export.csv").is_file()


def test_a_path_means_the_path_and_scenarios_are_named_as_such(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tickets").mkdir()  # the user's own folder named like the project's scenario
    assert main(["train", "--data", "tickets", "--out", "m", "--quiet"]) == 2
    assert "tickets must hold schema.json and exactly one examples file" in capsys.readouterr().err
    assert main(["train", "--data", "scenario:nope", "--out", "m", "--quiet"]) == 2
    assert "scenario:nope: no such scenario; the project's are scenario:expenses" in capsys.readouterr().err


def test_a_users_mistake_is_one_line_and_a_bug_a_traceback(tmp_path, monkeypatch, capsys):
    mine = user_folder(tmp_path)
    (mine / "export.csv").write_text("state,approve\ncase,maybe\n", encoding="utf-8")
    args = ["train", "--data", str(mine / "export.csv"), "--schema", str(mine / "schema.json"), "--out",
            str(tmp_path / "m"), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("decisionkit: error: ") and err.count("\n") == 1 and "export.csv:2: field 'approve'" in err
    monkeypatch.setenv("DECISIONKIT_DEBUG", "1")
    with pytest.raises(ValueError, match="field 'approve' is 'maybe'"):
        main(args)
    monkeypatch.delenv("DECISIONKIT_DEBUG")

    def broken(*args, **kwargs):
        raise ValueError("a bug of the package")

    monkeypatch.setattr(pipeline, "check_out", broken)
    monkeypatch.setattr("decisionkit.training.run_folder.check_out", broken)
    with pytest.raises(ValueError, match="a bug of the package"):  # not dressed as a user's error
        main(args)
