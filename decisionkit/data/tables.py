"""Where a user's rows come from: files, folders and tables in memory, each row with the place it came from.

``read_source(data, delimiter=None)`` gives a ``Source``: every row of ``data`` as ``(where, row, split the file
gives it)``, ``where`` naming the file and line (a CSV's line, a JSONL's line, a JSON list's or a table's row
number) for the loader's messages; the name the record gives the source; a ``schema.json`` found beside the data.

Files, by their name's ending in any case (``.CSV`` too), each read as UTF-8 with or without a byte-order mark:

- ``.csv`` and ``.tsv`` (Python's ``csv`` module: every cell a string, as exported; cells of any size): the delimiter
  of a ``.csv`` is found from its first rows among ``,`` ``;`` tab and ``|`` (``delimiter=`` forces one; a ``.tsv``
  is tab-separated). A ``;`` file is a European export: its numbers may have a decimal comma (``Source.decimal_comma``);
- ``.jsonl`` (one object a line), ``.json`` (a list of objects); each of these four also gzipped (``.csv.gz``);
- ``.parquet`` (pandas, with pyarrow).

Folders: ``schema.json`` beside one examples file, or the benchmark's layout (``train.jsonl`` and ``test.jsonl``, the
file naming the split). In memory: a pandas DataFrame, a list of dicts, a ``datasets.Dataset``.

A pandas index column, written by ``DataFrame.to_csv()`` without ``index=False`` (a first column with no name, or
``Unnamed: 0`` once read back and saved again), is recognised by its name and its integers and left out
(``Source.index_column``). A table column of integers with some cells empty, which pandas stores as floats
(``3.0``), is read as integers again. A file that cannot be read is a ``DataError`` that says why and where.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pandas as pd

from ..core.errors import MissingFile
from ..core.extras import require
from .cases import jsonl_rows, not_utf8, open_text
from .labels import read_json_file
from .questions import DataError

FILE_KINDS = (".csv", ".tsv", ".jsonl", ".json", ".parquet")  # and .gz of the first four
TEXT_KINDS = (".csv", ".tsv", ".jsonl", ".json")
DELIMITERS = (",", ";", "\t", "|")
SNIFF_CHARS = 1 << 16  # the delimiter is found from the rows in the file's first 64 KiB
IN_MEMORY = "in memory"
INDEX_NAME = re.compile(r"(Unnamed: \d+)?")  # what pandas names a column without a header
WHOLE_FLOAT = re.compile(r"-?\d+\.0+")  # 3.0: how pandas writes an integer of a column with gaps


def file_kind(path: Path) -> str | None:
    """The kind of a data file by its name, in any case (``claims.CSV.gz`` -> ``.csv``), or None."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] == ".gz":
        return suffixes[0] if len(suffixes) == 2 and suffixes[0] in TEXT_KINDS else None
    return suffixes[-1] if suffixes and suffixes[-1] in FILE_KINDS else None


@contextmanager
def _any_cell_size() -> Iterator[None]:
    """The csv module's cell limit (128 KiB by default) lifted while a file is read: a thread of e-mails in one cell
    is a normal export."""
    previous = csv.field_size_limit()
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a C long on every platform
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def sniff_delimiter(sample: str) -> str:
    """The delimiter among ``DELIMITERS`` that splits the sample's header into the most columns with the most rows
    of the same width (the last record of the sample may be cut, and is not counted); ``,`` for one column."""
    records = sample.splitlines(keepends=True)
    best, best_score = ",", (0.0, 1)
    for delimiter in DELIMITERS:
        with _any_cell_size():
            try:
                rows = list(csv.reader(io.StringIO(sample), delimiter=delimiter))
            except csv.Error:
                continue
        if len(records) > 1 and not sample.endswith(("\n", "\r")):
            rows = rows[:-1]
        rows = [r for r in rows if r]
        if not rows or len(rows[0]) < 2:
            continue
        width = len(rows[0])
        score = (sum(len(r) == width for r in rows) / len(rows), width)
        if score > best_score:
            best, best_score = delimiter, score
    return best


def _is_index(name: str, values: Iterable[Any]) -> bool:
    """A column pandas wrote for its index: no name (or ``Unnamed: N``) and integers only."""
    if not INDEX_NAME.fullmatch(name.strip()):
        return False
    return all(re.fullmatch(r"-?\d+", str(v).strip()) for v in values if str(v).strip() != "")


@dataclass
class Source:
    rows: list[tuple[str, Any, str | None]]  # (where, row, split the file gives it)
    name: str  # what the record names as the source
    schema: Any  # a schema found beside the data, or None
    benchmark_layout: bool = False  # train.jsonl and test.jsonl, as typed-decisions is laid out
    decimal_comma: bool = False  # a ';' export: numbers may be written 1234,5
    delimiter: str | None = None  # a CSV's, as found or given
    index_column: str | None = None  # a pandas index column left out


def _csv_rows(path: Path, delimiter: str | None) -> tuple[list[tuple[str, dict]], str, str | None]:
    """Every row of a CSV or TSV as (file:line, column -> cell), the delimiter, and the index column left out."""
    line = 1
    try:
        with open_text(path, newline="") as handle, _any_cell_size():
            if delimiter is None:
                delimiter = "\t" if file_kind(path) == ".tsv" else sniff_delimiter(handle.read(SNIFF_CHARS))
                handle.seek(0)
            reader = csv.reader(handle, delimiter=delimiter)
            header = next(reader, None)
            if not header:
                return [], delimiter, None
            header = [name.strip() for name in header]
            line = reader.line_num
            rows = []
            for cells in reader:
                where = f"{path}:{line + 1}"  # the line the record starts on
                line = reader.line_num
                if not any(c.strip() for c in cells):
                    continue
                if len(cells) > len(header):
                    shown = {",": "','", ";": "';'", "\t": "tab", "|": "'|'"}[delimiter] if delimiter in DELIMITERS \
                        else repr(delimiter)
                    raise DataError(f"{where}: the row has {len(cells)} cells; the header has {len(header)} columns "
                                    f"(split at {shown}: a cell holding one needs quotes, or give the file's "
                                    "delimiter with --delimiter)")
                rows.append((where, dict(zip(header, cells + [""] * (len(header) - len(cells))))))
    except UnicodeDecodeError:
        raise not_utf8(path, "(Excel: Save As 'CSV UTF-8')") from None
    except csv.Error as err:
        raise DataError(f"{path}:{line + 1}: not a readable CSV ({err})") from None
    repeated = sorted({c for c in header if header.count(c) > 1 and c})
    if repeated:
        raise DataError(f"{path}:1: columns {repeated} appear twice; every column needs its own name")
    index = header[0] if _is_index(header[0], (r[header[0]] for _, r in rows)) else None
    unnamed = [i + 1 for i, name in enumerate(header) if not name and name != index]
    if unnamed:
        raise DataError(f"{path}:1: column {unnamed[0]} has no name; every column needs one (a first column without "
                        "one is read as a pandas index when it holds integers)")
    if index is not None:
        rows = [(w, {k: v for k, v in r.items() if k != index}) for w, r in rows]
    return _whole_numbers_again(rows, [c for c in header if c != index]), delimiter, index


def _whole_numbers_again(rows: list[tuple[str, dict]], columns: list[str]) -> list[tuple[str, dict]]:
    """A CSV column whose cells are all whole numbers written ``3.0`` with some cells empty (how pandas writes a
    column of integers with gaps) as integers again: the cells lose their ``.0``."""
    for name in columns:
        cells = [r[name].strip() for _, r in rows]
        if "" in cells and any(cells) and all(WHOLE_FLOAT.fullmatch(c) for c in cells if c):
            for _, r in rows:
                r[name] = r[name].strip().split(".")[0]
    return rows


def _json_list_rows(path: Path) -> Iterator[tuple[str, Any]]:
    rows = read_json_file(path)
    if not isinstance(rows, list):
        raise DataError(f"{path}: a .json file of rows must hold a list of objects, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        yield f"{path} row {i + 1}", row


def _integers_again(frame: pd.DataFrame) -> pd.DataFrame:
    """Float columns that hold only whole numbers and some missing cells (how pandas stores a column of integers
    with gaps) as integers again, so ``3`` is not read as ``3.0``."""
    out = {}
    for name in frame.columns:
        column = frame[name]
        if column.dtype.kind == "f" and column.isna().any():
            known = column.dropna()
            if len(known) and np.all(np.isfinite(known)) and np.all(known == np.round(known)):
                column = column.astype("Int64").astype(object).where(column.notna(), None)
        out[name] = column
    return pd.DataFrame(out, index=frame.index)


def _frame_rows(frame: pd.DataFrame, name: str) -> tuple[list[tuple[str, dict]], str | None]:
    frame = frame.rename(columns=lambda c: str(c).strip())
    index = None
    if len(frame.columns) and _is_index(frame.columns[0], frame.iloc[:, 0].tolist()):
        index = frame.columns[0]
        frame = frame.drop(columns=[index])
    records = _integers_again(frame).to_dict(orient="records")
    return [(f"{name} row {i + 1}", row) for i, row in enumerate(records)], index


def _parquet_rows(path: Path) -> tuple[list[tuple[str, dict]], str | None]:
    require("pyarrow", "reading parquet")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several kinds for a file that is not parquet
        raise DataError(f"{path}: not a readable parquet file ({err})") from None
    return _frame_rows(frame, str(path))


def _file_source(path: Path, delimiter: str | None) -> Source:
    kind = file_kind(path)
    if kind is None:
        raise DataError(f"{path}: a {''.join(path.suffixes[-2:]) or 'file without a suffix'} is not read; expected "
                        f"one of {', '.join(FILE_KINDS)} (any case), or the first four gzipped (.csv.gz)")
    source = Source([], str(path), None)
    if kind in (".csv", ".tsv"):
        rows, source.delimiter, source.index_column = _csv_rows(path, delimiter)
        source.decimal_comma = source.delimiter == ";"
    elif kind == ".parquet":
        rows, source.index_column = _parquet_rows(path)
    else:
        rows = list(jsonl_rows(path) if kind == ".jsonl" else _json_list_rows(path))
    source.rows = [(w, r, None) for w, r in rows]
    return source


def _memory_source(data: Any) -> Source:
    if isinstance(data, pd.DataFrame):
        rows, index = _frame_rows(data, "DataFrame")
        return Source([(w, r, None) for w, r in rows], f"{IN_MEMORY} (DataFrame)", None, index_column=index)
    if hasattr(data, "features") and hasattr(data, "column_names"):  # a datasets.Dataset (not imported here)
        rows, kind = ((f"Dataset row {i + 1}", row) for i, row in enumerate(data)), "Dataset"
    elif isinstance(data, (list, tuple)):
        rows, kind = ((f"row {i + 1}", row) for i, row in enumerate(data)), "list"
    else:
        raise DataError(f"data is a {type(data).__name__}; expected a file or folder path, a pandas DataFrame, a list "
                        "of dicts or a datasets.Dataset")
    return Source([(w, r, None) for w, r in rows], f"{IN_MEMORY} ({kind})", None)


def read_source(data: Any, delimiter: str | None = None) -> Source:
    """Every row of ``data`` (a path, a folder or a table in memory) with where it came from; ``delimiter`` forces
    a CSV's."""
    if delimiter is not None and delimiter not in DELIMITERS and len(delimiter) != 1:
        raise DataError(f"delimiter is {delimiter!r}; expected one character (',', ';', a tab, '|')")
    if not isinstance(data, (str, Path)):
        return _memory_source(data)
    path = Path(data).expanduser()
    if not path.exists():
        raise MissingFile(f"{path} not found: expected a {'/'.join(FILE_KINDS)} file or a folder")
    if path.is_file():
        return _file_source(path, delimiter)
    schema = path / "schema.json"
    if (path / "train.jsonl").is_file() and (path / "test.jsonl").is_file():  # the benchmark's layout
        rows = [(w, r, split) for split in ("train", "test") for w, r in jsonl_rows(path / f"{split}.jsonl")]
        return Source(rows, str(path), schema if schema.is_file() else None, True)
    examples = sorted(p for p in path.iterdir() if file_kind(p) and p.name != "schema.json"
                      and not p.name.startswith("."))
    if len(examples) != 1 or not schema.is_file():
        raise MissingFile(f"{path} must hold schema.json and exactly one examples file ({', '.join(FILE_KINDS)}), or "
                          f"train.jsonl and test.jsonl; found {sorted(p.name for p in path.iterdir())}")
    source = _file_source(examples[0], delimiter)
    source.name, source.schema = str(path), schema
    return source
