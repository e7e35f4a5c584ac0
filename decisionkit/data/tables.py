"""Where a user's rows come from: files, folders and tables in memory, each row with the place it came from.

``read_source(data, workflow)`` gives a ``Source``: every row of ``data`` as ``(where, row, split the file gives
it)``, ``where`` naming the file and line (a CSV's line, a JSONL's line, a JSON list's or a table's row number) for
the loader's messages; the name the record gives the source; the workflow name for rows that name none (the file's
or folder's name); a ``schema.json`` found beside the data. Files: ``.jsonl``, ``.json`` (a list of objects),
``.csv`` (Python's ``csv`` module: every cell a string, as exported), ``.parquet`` (pandas). Folders: ``schema.json``
beside one examples file, or the benchmark's layout (``train.jsonl`` and ``test.jsonl``, the file naming the split).
In memory: a pandas DataFrame, a list of dicts, a ``datasets.Dataset``. A file that cannot be read is a ``DataError``
that says why.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import pandas as pd

from ..core.extras import require
from .cases import jsonl_rows
from .labels import read_json_file
from .questions import DataError

FILE_KINDS = (".jsonl", ".json", ".csv", ".parquet")
IN_MEMORY = "in memory"

def _csv_rows(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames:
                return
            if len(set(reader.fieldnames)) != len(reader.fieldnames):
                repeated = sorted({c for c in reader.fieldnames if reader.fieldnames.count(c) > 1})
                raise DataError(f"{path}:1: columns {repeated} appear twice; every column needs its own name")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if None in row:
                    raise DataError(f"{where}: the row has {len(reader.fieldnames) + len(row[None])} cells; the header "
                                    f"has {len(reader.fieldnames)} columns (a cell with a comma needs quotes)")
                yield where, {k: v for k, v in row.items() if v is not None}
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not a readable CSV: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except csv.Error as err:
        raise DataError(f"{path}: not a readable CSV ({err})") from None


def _json_list_rows(path: Path) -> Iterator[tuple[str, Any]]:
    rows = read_json_file(path)
    if not isinstance(rows, list):
        raise DataError(f"{path}: a .json file of rows must hold a list of objects, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        yield f"{path} row {i + 1}", row


def _frame_rows(frame: pd.DataFrame, name: str) -> Iterator[tuple[str, dict]]:
    for i, row in enumerate(frame.to_dict(orient="records")):
        yield f"{name} row {i + 1}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    require("pyarrow", "reading parquet")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several kinds for a file that is not parquet
        raise DataError(f"{path}: not a readable parquet file ({err})") from None
    return _frame_rows(frame, str(path))


def _file_rows(path: Path) -> Iterator[tuple[str, Any]]:
    readers = {".jsonl": jsonl_rows, ".json": _json_list_rows, ".csv": _csv_rows, ".parquet": _parquet_rows}
    if path.suffix not in readers:
        raise DataError(f"{path}: a {path.suffix or 'file without a suffix'} is not read; expected one of "
                        f"{', '.join(FILE_KINDS)}")
    return readers[path.suffix](path)


def _memory_rows(data: Any) -> tuple[Iterable[tuple[str, Any]], str]:
    if isinstance(data, pd.DataFrame):
        return _frame_rows(data, "DataFrame"), "DataFrame"
    if hasattr(data, "features") and hasattr(data, "column_names"):  # a datasets.Dataset (not imported here)
        return ((f"Dataset row {i + 1}", row) for i, row in enumerate(data)), "Dataset"
    if isinstance(data, (list, tuple)):
        return ((f"row {i + 1}", row) for i, row in enumerate(data)), "list"
    raise DataError(f"data is a {type(data).__name__}; expected a file or folder path, a pandas DataFrame, a list of "
                    "dicts or a datasets.Dataset")


@dataclass
class Source:
    rows: list[tuple[str, Any, str | None]]  # (where, row, split the file gives it)
    name: str  # what the record names as the source
    workflow: str  # the default workflow name
    schema: Any  # a schema found beside the data, or None
    benchmark_layout: bool = False  # train.jsonl and test.jsonl, as typed-decisions is laid out


def read_source(data: Any, workflow: str | None) -> Source:
    if not isinstance(data, (str, Path)):
        rows, kind = _memory_rows(data)
        return Source([(w, r, None) for w, r in rows], f"{IN_MEMORY} ({kind})", workflow or "decisions", None)
    path = Path(data).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: expected a {'/'.join(FILE_KINDS)} file or a folder")
    if path.is_file():
        return Source([(w, r, None) for w, r in _file_rows(path)], str(path), workflow or path.stem, None)
    schema = path / "schema.json"
    if (path / "train.jsonl").is_file() and (path / "test.jsonl").is_file():  # the benchmark's layout
        rows = [(w, r, split) for split in ("train", "test") for w, r in jsonl_rows(path / f"{split}.jsonl")]
        return Source(rows, str(path), workflow or path.name, schema if schema.is_file() else None, True)
    examples = sorted(p for p in path.iterdir() if p.suffix in FILE_KINDS and p.name != "schema.json"
                      and not p.name.startswith("."))
    if len(examples) != 1 or not schema.is_file():
        raise FileNotFoundError(f"{path} must hold schema.json and exactly one examples file ({', '.join(FILE_KINDS)}),"
                                f" or train.jsonl and test.jsonl; found {sorted(p.name for p in path.iterdir())}")
    return Source([(w, r, None) for w, r in _file_rows(examples[0])], str(path), workflow or path.name, schema)
