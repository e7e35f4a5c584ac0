"""The seed scoreboard: every figure the seed published, beside the one this course measured, and why they differ.

The seed is the reference run this course reproduces and explains: Qwen3.5-4B in 4-bit NF4 with LoRA r16, trained
through Unsloth on one GPU; a second seed work distilled that teacher into small models. ``data.seed.SEED`` quotes
its figures, each with where it states them and why this course's differs (quoted, never recomputed, in that one
place).

- ``Measured(value, how)``: one figure of this course's run, with how it was measured (what, on how many cases).
- ``scoreboard(measured, machine, gpu_run, ratio)``: a ``Scoreboard``, one row per seed figure in ``SEED``'s order (a
  figure nothing measured says so), the ratio of the two latencies the seed set against each other beside ours on
  one backbone (``ratio``), and the ``gpu`` row:
  the course's ``gpu`` preset is the seed's recipe, and the row says "not run" unless ``gpu_run`` names a saved run of
  it (``find_run``). ``Scoreboard.table()`` is the table, ``markdown()`` the same rendered (a notebook shows it as a
  Markdown table).
- ``beside(rows)``: a few seed figures beside this run's, in the notebook that teaches them (04's ECE, 06's cost of
  one more question), in the scoreboard's columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd

from ..data.seed import SEED

GPU_PRESET = "gpu"  # the course's preset of the seed's recipe (training.presets)

# The seed set these two against each other on one backbone; ours is measured the same way, on one backbone and the
# same cases (its own Measured: the rows of the two figures hold the main model's decide call, on another backbone).
RATIO = ("generated JSON latency", "decision latency")
RATIO_REASON = ("both set one backbone's generated JSON against its own decide call, on the same cases: the seed's "
                "4B, ours SmolLM2-135M (the hybrid notebook 05 trains); the ratio moves with the reply's length in "
                "tokens and with what one generated token costs against one whole pass on each machine")


def seed_value(figure: str) -> float:
    """The seed's value of ``figure`` (a fraction for a %); a range gives its middle."""
    value = SEED[figure].value
    return sum(value) / 2 if isinstance(value, tuple) else float(value)


@dataclass(frozen=True)
class Measured:
    """One figure measured in this course's run, and how: what was timed or scored, on how many cases or calls."""

    value: float | None  # None: not measured
    how: str


def _shown(value: float | None, unit: str, decimals: int) -> str:
    if value is None or value != value:  # None or NaN
        return "not measured"
    if unit == "%":
        return f"{value * 100:,.{decimals}f}%"
    if unit == "x":
        return f"{value:,.{decimals}f}x"
    return f"{value:,.{decimals}f}" + (f" {unit}" if unit else "")


COLUMNS = ["seed", "seed source", "ours", "ours measured as", "why they differ"]


@dataclass(frozen=True)
class Row:
    figure: str
    seed: str
    source: str
    ours: str
    how: str
    reason: str
    value: float | None = None  # ours, as a number (a fraction for a %), for checks and ratios


@dataclass(repr=False)
class Scoreboard:
    """The seed's figures beside this run's, one ``Row`` each, with where this run's were measured."""

    rows: list[Row]
    machine: str  # the CPU or GPU, threads and compute dtype of this run's measurements

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([[r.seed, r.source, r.ours, r.how, r.reason] for r in self.rows],
                            index=pd.Index([r.figure for r in self.rows], name="figure"), columns=COLUMNS)

    def __getitem__(self, figure: str) -> Row:
        return next(r for r in self.rows if r.figure == figure)

    def markdown(self) -> str:
        """The table in Markdown, under a line saying where this run measured its figures."""
        table = self.table().map(lambda text: str(text).replace("|", "/"))
        return f"Ours measured on: {self.machine}.\n\n" + table.to_markdown()

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return self.markdown()


def beside(rows: Mapping[str, tuple[str, Measured]]) -> pd.DataFrame:
    """Seed figures beside this run's, where a lesson teaches them: ``rows`` maps a row's label to (the name of a
    ``SEED`` figure, this run's ``Measured``); several of this run's figures may stand beside one seed figure. The
    columns are the scoreboard's."""
    table = {}
    for label, (figure, m) in rows.items():
        if figure not in SEED:
            raise ValueError(f"no seed figure is named {figure!r}; expected one of {', '.join(SEED)}")
        seed = SEED[figure]
        table[label] = [seed.quoted, seed.source, _shown(m.value, seed.unit, seed.decimals), m.how, seed.reason]
    return pd.DataFrame.from_dict(table, orient="index", columns=COLUMNS)


def find_run(preset_name: str, roots: Iterable[str | Path]) -> Path | None:
    """The first saved run folder under any of ``roots`` (each a folder of run folders) trained with preset
    ``preset_name``, read from its ``report.json`` (a run report) or its ``history.json`` (a trained model); None if
    there is none."""
    from ..model.saving import HISTORY_FILE, REPORT_FILE

    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            try:
                if (folder / REPORT_FILE).is_file():
                    name = json.loads((folder / REPORT_FILE).read_text(encoding="utf-8"))["training"]["preset"]
                elif (folder / HISTORY_FILE).is_file():
                    name = json.loads((folder / HISTORY_FILE).read_text(encoding="utf-8"))["preset"]["name"]
                else:
                    continue
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a folder being written, or not a run
            if name == preset_name:
                return folder
    return None


def _gpu_row(gpu_run: Path | None) -> Row:
    figure, seed = f"the {GPU_PRESET} preset (the seed's recipe): test accuracy", SEED["test accuracy"]
    if gpu_run is None:
        return Row(figure, seed.quoted, seed.source, "not run",
                   f"no saved run of preset {GPU_PRESET} found", "no GPU has been lent to this project: the preset is "
                   "written, never trained here")
    from ..model.saving import REPORT_FILE

    report = Path(gpu_run) / REPORT_FILE
    value = json.loads(report.read_text(encoding="utf-8"))["test"]["accuracy"] if report.is_file() else None
    how = (f"run {Path(gpu_run).name}, trained with preset {GPU_PRESET}" if value is not None else
           f"run {Path(gpu_run).name} (preset {GPU_PRESET}) holds no run report yet")
    return Row(figure, seed.quoted, seed.source, _shown(value, "%", 1), how,
               "the seed's recipe, trained by this course: what is left is the machine and the library versions",
               value)


def scoreboard(measured: Mapping[str, Measured], machine: str, gpu_run: str | Path | None = None,
               ratio: Measured | None = None) -> Scoreboard:
    """Every figure of ``SEED`` beside ``measured[figure]`` (a figure left out shows "not measured"), the ratio of
    the seed's generated-JSON latency to its decision latency beside ``ratio`` (ours, timed on one backbone and the
    same cases as the seed's were; None: "not measured"), and the ``gpu`` row (``gpu_run``: a saved run of the
    ``gpu`` preset, from ``find_run``; None: "not run")."""
    unknown = sorted(set(measured) - set(SEED))
    if unknown:
        raise ValueError(f"no seed figure is named {', '.join(map(repr, unknown))}; expected one of {', '.join(SEED)}")
    rows = []
    for name, seed in SEED.items():
        m = measured.get(name, Measured(None, "not measured in this run"))
        rows.append(Row(name, seed.quoted, seed.source, _shown(m.value, seed.unit, seed.decimals), m.how, seed.reason,
                        m.value))
    seed_ratio = seed_value(RATIO[0]) / seed_value(RATIO[1])
    ratio = ratio or Measured(None, "not measured in this run")
    rows.append(Row(f"{RATIO[0]} / {RATIO[1]}, one backbone", f"{seed_ratio:.1f}x",
                    "the ratio of the seed's two latencies", _shown(ratio.value, "x", 1), ratio.how, RATIO_REASON,
                    ratio.value))
    rows.append(_gpu_row(None if gpu_run is None else Path(gpu_run)))
    return Scoreboard(rows, machine)
