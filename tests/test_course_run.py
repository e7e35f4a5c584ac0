"""make notebooks' runner on a folder of two tiny notebooks: each executed in order and saved with its outputs,
its time recorded, notebook 00 run again at the end, and a failing notebook left as it was with nothing recorded."""

import json

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from decisionkit.course.course_times import TIMINGS_FILE, run_course


def _notebook(path, *sources):
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)


def test_the_course_runs_in_order_and_records_its_times(tmp_path):
    _notebook(tmp_path / "00_setup.ipynb", "from pathlib import Path\n"
              "runs = Path('order.txt'); runs.write_text(runs.read_text() + '00 ' if runs.exists() else '00 ')")
    _notebook(tmp_path / "01_next.ipynb", "from pathlib import Path\n"
              "Path('order.txt').write_text(Path('order.txt').read_text() + '01 ')", "6 * 7")
    times = run_course(tmp_path)
    assert (tmp_path / "order.txt").read_text() == "00 01 00 "  # in order, then 00 once more
    saved = nbformat.read(tmp_path / "01_next.ipynb", as_version=4)
    assert [c.execution_count for c in saved.cells] == [1, 2] and saved.cells[1].outputs[0]["data"]["text/plain"] == "42"
    (run,) = json.loads((tmp_path / TIMINGS_FILE).read_text())["runs"]
    assert list(run["notebooks"]) == ["00_setup", "01_next"] and all(s > 0 for s in run["notebooks"].values())
    assert run["mode"] == "quick"  # the suite runs with DECISIONKIT_QUICK=1
    assert times.table().shape == (3, 1)


def test_a_failing_notebook_stops_the_run_and_records_nothing(tmp_path):
    _notebook(tmp_path / "00_setup.ipynb", "1 + 1")
    _notebook(tmp_path / "01_broken.ipynb", "raise ValueError('broken on purpose')")
    before = (tmp_path / "01_broken.ipynb").read_text()
    with pytest.raises(CellExecutionError, match="broken on purpose"):
        run_course(tmp_path)
    assert (tmp_path / "01_broken.ipynb").read_text() == before
    assert not (tmp_path / TIMINGS_FILE).exists()
    assert "01_broken" not in (tmp_path / "timings.partial.json").read_text()


def test_a_folder_without_notebooks_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no numbered notebook"):
        run_course(tmp_path)


def test_a_stopped_run_resumes_where_it_failed_and_says_so(tmp_path):
    _notebook(tmp_path / "00_setup.ipynb", "1 + 1")
    _notebook(tmp_path / "01_flaky.ipynb", "from pathlib import Path\nassert Path('fixed').exists(), 'not fixed yet'")
    with pytest.raises(CellExecutionError, match="not fixed yet"):
        run_course(tmp_path)
    assert list(json.loads((tmp_path / "timings.partial.json").read_text())["notebooks"]) == ["00_setup"]
    (tmp_path / "fixed").touch()
    times = run_course(tmp_path, resume=True)
    (run,) = times.records
    assert list(run["notebooks"]) == ["00_setup", "01_flaky"] and run["resumed at"] == ["01_flaky"]
    assert "resumed at 01_flaky" in times.table().columns[0]
    assert not (tmp_path / "timings.partial.json").exists()
