"""The course's time records (timings.json) and the tables read from them: mechanics on records written here."""

import json

import pytest

from decisionkit.course.course_times import README_END, README_START, course_times, record, update_readme


def _run(cache="empty", seconds=(60.0, 120.0), cpu="AMD EPYC", date="2026-12-06"):
    return {"cpu": cpu, "cpu family": "avx2", "torch threads": 2, "dtype": "float32", "mode": "full", "cache": cache,
            "date": date, "notebooks": {"00_setup_check": seconds[0], "01_pooling": seconds[1]}}


def test_a_run_replaces_the_earlier_run_of_its_kind_and_keeps_the_others(tmp_path):
    path = tmp_path / "timings.json"
    record(path, _run("empty", (60.0, 120.0), date="2026-12-01"))
    record(path, _run("warm", (30.0, 60.0)))
    times = record(path, _run("empty", (90.0, 150.0)))
    assert [r["cache"] for r in times.records] == ["empty", "warm"]  # the empty cache first
    assert json.loads(path.read_text())["runs"] == times.records
    table = times.table()
    empty, warm = table.columns
    assert empty.startswith("empty cache, full mode: AMD EPYC (avx2), 2 threads, float32")
    assert table.loc["01_pooling", empty] == 2.5 and table.loc["whole course", empty] == 4.0
    assert table.loc["whole course", warm] == 1.5
    assert "2026-12-06" in times.markdown() and "2026-12-01" not in times.markdown()


def test_no_record_gives_an_empty_table(tmp_path):
    assert course_times(tmp_path / "timings.json").table().empty


def test_the_readme_table_is_rewritten_between_its_markers_only(tmp_path):
    times = record(tmp_path / "timings.json", _run())
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{README_START}\nold table\n{README_END}\nafter\n")
    update_readme(readme, times)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# Title\n\nbefore\n") and text.endswith(f"{README_END}\nafter\n")
    assert "| 01_pooling" in text and "whole course" in text
    update_readme(readme, times)
    assert readme.read_text() == text  # idempotent
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    update_readme(plain, times)
    assert plain.read_text() == "no markers\n"


@pytest.mark.parametrize("kind", ["cpu", "dtype", "mode"])
def test_runs_on_another_machine_dtype_or_mode_are_kept_apart(tmp_path, kind):
    path = tmp_path / "timings.json"
    record(path, _run())
    other = {**_run(), kind: "other"}
    assert len(record(path, other).records) == 2


def test_each_run_is_set_against_the_budget_of_its_dtype(tmp_path):
    path = tmp_path / "timings.json"
    record(path, _run("empty", (60.0, 20 * 60.0)))  # a 20-minute notebook: over the 15 a notebook may take
    times = record(path, _run("warm", (60.0, 120.0)))
    budget = times.budget()
    assert list(budget["within both"]) == [False, True]
    assert list(budget["course budget"]) == [120, 120]  # float32
    assert budget.iloc[0]["longest notebook"] == "01_pooling (20.0)"
    assert "within both" in times.markdown()
