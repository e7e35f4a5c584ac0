"""Run the whole course and record how long each notebook took: what ``make notebooks`` calls.

``run_course(folder)`` executes every notebook of ``folder`` in order, in the mode the environment sets (full unless
``DECISIONKIT_QUICK=1``), saves each with its outputs (execution counts 1..N, no widget state) and times it. One
compute dtype serves the whole run: the one this CPU gets, probed once here and handed to every kernel (a probe in
each kernel could land on either side of its threshold on a busy machine). The run is recorded in ``timings.json``
beside the notebooks, one record per CPU, dtype, mode and cache state ("empty": the feature cache held nothing when
the run began; "warm": it held features of earlier runs), the newest of each kind kept. Notebook 00 is executed
once more at the end (not timed again), so that the course time table it shows is this run's. The README's table,
between ``README_START`` and ``README_END``, is rewritten from the same records.

``course_times(path)`` reads the records back as ``CourseTimes``, whose ``table()`` a notebook shows and whose
``markdown()`` the README holds. ``python -m decisionkit.course.course_times notebooks`` runs the course.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core import settings
from ..core.atomic import write_text

TIMINGS_FILE = "timings.json"
PARTIAL_FILE = "timings.partial.json"  # the run so far, kept after each notebook (``run_course(resume=True)``)
README_START = "<!-- course times: written by make notebooks -->"
README_END = "<!-- end of course times -->"
SETUP_NOTEBOOK = "00"  # the notebook whose table shows the run: executed once more at the end
# The course in one sitting (issue 47): the whole course, by compute dtype, and any one notebook, in minutes
COURSE_BUDGET_MIN = {"bfloat16": 60, "float32": 120}
NOTEBOOK_BUDGET_MIN = 15


def _feature_entries() -> int:
    features = settings.cache_dir() / "features"
    return sum(1 for _ in features.iterdir()) if features.is_dir() else 0


def _machine() -> dict:
    """The CPU, its kernel family, the cores torch uses and the compute dtype the course runs in."""
    import torch

    from ..core.precision import choose, kernels
    from .latency import hardware

    return {"cpu": hardware()["cpu"], "cpu family": kernels()["cpu_family"], "torch threads": torch.get_num_threads(),
            "dtype": choose().dtype}


def execute(path: Path, timeout: int | None = None) -> float:
    """Execute the notebook at ``path`` in its folder, save it with its outputs in place; the seconds it took."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", store_widget_state=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    write_text(path, nbformat.writes(notebook) + "\n")
    return seconds


@dataclass
class CourseTimes:
    """The recorded runs of the whole course: one record per CPU, dtype, mode and cache state."""

    records: list[dict]

    def table(self) -> pd.DataFrame:
        """Minutes per notebook (rows, and the whole course last), one column per recorded run."""
        columns = {}
        for record in self.records:
            label = (f"{record['cache']} cache, {record['mode']} mode: {record['cpu']} ({record['cpu family']}), "
                     f"{record['torch threads']} threads, {record['dtype']}"
                     + (f"; resumed at {', '.join(record['resumed at'])}" if record.get("resumed at") else ""))
            minutes = {name: seconds / 60 for name, seconds in record["notebooks"].items()}
            columns[label] = {**minutes, "whole course": sum(minutes.values())}
        table = pd.DataFrame(columns)
        table.index.name = "notebook (minutes)"
        return table.round(1)

    def budget(self) -> pd.DataFrame:
        """Each recorded run against the course's budget: the whole course and its longest notebook, in minutes."""
        rows = {}
        for label, record in zip(self.table().columns, self.records):
            minutes = {name: seconds / 60 for name, seconds in record["notebooks"].items()}
            longest = max(minutes, key=minutes.get)
            whole, budget = sum(minutes.values()), COURSE_BUDGET_MIN.get(record["dtype"])
            rows[label] = {"whole course": round(whole, 1), "course budget": budget,
                           "longest notebook": f"{longest} ({minutes[longest]:.1f})",
                           "notebook budget": NOTEBOOK_BUDGET_MIN,
                           "within both": (budget is None or whole <= budget)
                           and minutes[longest] <= NOTEBOOK_BUDGET_MIN}
        return pd.DataFrame(rows).T.rename_axis("run (minutes)")

    def markdown(self) -> str:
        """The table as Markdown, with the date of each run."""
        dates = "; ".join(f"{r['cache']} cache: {r['date']}" for r in self.records)
        return (f"{self.table().to_markdown()}\n\n{self.budget().to_markdown()}\n\n"
                f"Recorded by `make notebooks` ({dates}).")


def course_times(path: str | Path) -> CourseTimes:
    """The runs recorded in ``path`` (a ``timings.json``); none recorded yet gives an empty table."""
    path = Path(path)
    return CourseTimes(json.loads(path.read_text(encoding="utf-8"))["runs"] if path.is_file() else [])


def record(path: Path, run: dict) -> CourseTimes:
    """Add ``run`` to the records in ``path``, replacing an earlier run of the same kind; saved atomically."""
    kind = ("cpu", "cpu family", "torch threads", "dtype", "mode", "cache")
    runs = [r for r in course_times(path).records if any(r.get(k) != run[k] for k in kind)] + [run]
    runs.sort(key=lambda r: (r["cpu"], r["dtype"], r["mode"], r["cache"] != "empty"))
    write_text(path, json.dumps({"runs": runs}, indent=1) + "\n")
    return CourseTimes(runs)


def update_readme(readme: Path, times: CourseTimes) -> None:
    """Rewrite the README's course time table between its two markers (a README without them is left alone)."""
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        return
    head, rest = text.split(README_START, 1)
    write_text(readme, f"{head}{README_START}\n{times.markdown()}\n{README_END}{rest.split(README_END, 1)[1]}")


def run_course(folder: str | Path, readme: str | Path | None = None, resume: bool = False) -> CourseTimes:
    """Execute every notebook of ``folder`` in order, record the times in its ``timings.json`` (and the README's
    table), execute notebook 00 again so that it shows them; the records. The run so far is kept in
    ``timings.partial.json`` after each notebook; with ``resume``, a run of the same kind that stopped (a failing
    notebook, an interruption) goes on from the first notebook it has no time for, and its record names the
    notebooks it was resumed at (their times are of runs apart, and the cache state is the first part's)."""
    folder = Path(folder)
    notebooks = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no numbered notebook (NN_name.ipynb) in {folder}")
    machine = _machine()
    os.environ.setdefault("DECISIONKIT_DTYPE", machine["dtype"])  # every kernel inherits the one dtype
    run = {**machine, "mode": "quick" if settings.quick_mode() else "full",
           "cache": "warm" if _feature_entries() else "empty",
           "date": datetime.date.today().isoformat(), "notebooks": {}}
    partial = folder / PARTIAL_FILE
    if resume and partial.is_file():
        earlier = json.loads(partial.read_text(encoding="utf-8"))
        if all(earlier[k] == run[k] for k in machine) and earlier["mode"] == run["mode"]:
            run = {**earlier, "resumed at": earlier.get("resumed at", []) + [
                next(p.stem for p in notebooks if p.stem not in earlier["notebooks"])]}
    for path in notebooks:
        if path.stem in run["notebooks"]:
            continue
        print(f"{path.name} ...", end=" ", flush=True)
        try:
            run["notebooks"][path.stem] = round(execute(path), 1)
        except Exception:
            print(f"failed: {path.name} is left as it was; the run so far is in {PARTIAL_FILE} (--resume goes on "
                  "from this notebook)", flush=True)
            raise
        write_text(partial, json.dumps(run, indent=1) + "\n")
        print(f"{run['notebooks'][path.stem]:.0f} s", flush=True)
    times = record(folder / TIMINGS_FILE, run)
    partial.unlink(missing_ok=True)
    if readme is not None:
        update_readme(Path(readme), times)
    setup = [p for p in notebooks if p.name.startswith(SETUP_NOTEBOOK)]
    if setup:
        execute(setup[0])
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decisionkit.course.course_times",
                                     description="run every notebook in order and record its time (make notebooks)")
    parser.add_argument("folder", help="the notebooks' folder")
    parser.add_argument("--readme", help="a README whose course time table to rewrite")
    parser.add_argument("--resume", action="store_true",
                        help="go on from the notebook where a stopped run of the same kind failed")
    args = parser.parse_args(argv)
    times = run_course(args.folder, args.readme, args.resume)
    print(times.table().to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
