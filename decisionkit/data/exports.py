"""A scenario written the way users' tools export their decisions: to show, test and time that every shape reads to
the same rows.

``write_export(scenario, path, shape)`` writes the rows of a project scenario (``expenses``: JSON states with fields)
in one of ``SHAPES``:

- ``flat``: one column a field (``pandas.json_normalize``: ``employee.level``, ``policy_limit.amount_usd``), a list in
  a cell as JSON, the id and the labels beside them, no state column: what a database or pandas writes
  (``DataFrame.to_csv(index=False)``; integer columns with gaps come out as ``3.0``);
- ``indexed``: the same with pandas' index as a first, unnamed column (``to_csv()`` with its default);
- ``excel``: the flat table as a European Excel saves it: ``;`` between cells, decimal commas, a byte-order mark;
- ``parquet``: the flat table as parquet;
- ``jsonl.gz``: one object a line with the state as an object, gzipped (a log);
- ``tsv``: the scenario's own columns (the state a JSON cell), tab-separated.

Each reads back (``load_decisions`` with the scenario's schema) to the same rows' hash and splits as the scenario's
own file (``tests/test_shapes.py``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd

from ..core.extras import require
from .scenarios import examples_file, scenario_folder

SHAPES = ("flat", "indexed", "excel", "parquet", "jsonl.gz", "tsv")
SUFFIX = {"flat": ".csv", "indexed": ".csv", "excel": ".csv", "parquet": ".parquet", "jsonl.gz": ".jsonl.gz",
          "tsv": ".tsv"}


def _rows(scenario: str) -> tuple[pd.DataFrame, list[dict]]:
    """The scenario's examples file as its cells, and each row's state as an object."""
    frame = pd.read_csv(examples_file(scenario_folder(scenario)), dtype=str, keep_default_na=False)
    return frame, [json.loads(s) for s in frame["state"]]


def flat_table(scenario: str) -> pd.DataFrame:
    """The scenario as a flat table: the id, one column a field of the state (lists as JSON), the labels."""
    frame, states = _rows(scenario)
    fields = pd.json_normalize(states)
    for name in fields.columns:  # a list stays a list in JSON: a flat table holds it as text
        if any(isinstance(v, list) for v in fields[name]):
            fields[name] = [json.dumps(v, ensure_ascii=False) if isinstance(v, list) else v for v in fields[name]]
    labels = [c for c in frame.columns if c not in ("id", "state")]
    return pd.concat([frame[["id"]], fields, frame[labels]], axis=1)


def _european(table: pd.DataFrame) -> pd.DataFrame:
    """Numbers as a European spreadsheet writes them: whole numbers plain, others with a decimal comma."""
    out = table.astype(object).where(table.notna(), "")
    for name in table.columns:
        if table[name].dtype.kind == "f":
            known = table[name].dropna()
            whole = bool(len(known)) and bool((known == known.round()).all())
            out[name] = ["" if pd.isna(v) else str(int(v)) if whole else str(v).replace(".", ",")
                         for v in table[name]]
    return out


def write_export(scenario: str, path: str | Path, shape: str = "flat") -> Path:
    """Write the scenario's rows to ``path`` in ``shape`` (see the module docstring); returns the path."""
    if shape not in SHAPES:
        raise ValueError(f"shape is {shape!r}; expected one of {', '.join(SHAPES)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if shape == "jsonl.gz":
        frame, states = _rows(scenario)
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            for row, state in zip(frame.to_dict(orient="records"), states):
                handle.write(json.dumps({**row, "state": state}, ensure_ascii=False) + "\n")
    elif shape == "tsv":
        _rows(scenario)[0].to_csv(path, sep="\t", index=False)
    elif shape == "parquet":
        require("pyarrow", "writing parquet")
        flat_table(scenario).to_parquet(path)
    elif shape == "excel":
        _european(flat_table(scenario)).to_csv(path, sep=";", index=False, encoding="utf-8-sig")
    else:
        flat_table(scenario).to_csv(path, index=shape == "indexed")
    return path


def write_shapes(scenario: str, folder: str | Path) -> dict[str, Path]:
    """The scenario in every shape of ``SHAPES``, in ``folder``: shape -> file."""
    folder = Path(folder)
    return {shape: write_export(scenario, folder / f"{scenario}-{shape.split('.')[0]}{SUFFIX[shape]}", shape)
            for shape in SHAPES}
