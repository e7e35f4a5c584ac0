"""A case's state as its author meant it: one reading for training, batch prediction and answering a request.

A state is a JSON object (a claim, an incident: fields the hybrid's trees read, ``model/fields.py``) or a text (a
ticket). Exports hold them in many ways, and each is read to the same value here:

- ``read_state(value, where)``: a ``state`` cell or value. An object stays one; a string that begins with ``{`` is
  JSON and must parse into an object (else a ``DataError`` with the file, line, column and the parser's message; a
  Python ``repr`` such as pandas writes for a column of dicts, ``{'a': 1}``, is named as such, and a cell cut at
  Excel's 32,767 characters is said to be); any other string is text. ``--text-column`` reads a column as text
  whatever it begins with.
- ``flat_state(cells, where)``: a state built from a flat table's columns, one field a column (what a database, a
  ticketing tool or pandas writes): each cell typed as a user means it (``typed_cell``: numbers as numbers, ``true``
  / ``false`` as booleans, a JSON object or array as itself, an empty cell missing; with ``decimal_comma``, the
  ``1234,5`` of a European export), and dotted column names (``employee.level``, as ``pandas.json_normalize``
  writes them) nested back into objects.
- ``normal(value)``: inside a JSON state, numbers stored as strings (``"184.50"``) read as numbers, numpy and pandas
  scalars as Python values, arrays as lists, ``NaN`` (and other non-finite numbers) as missing: a key with one is
  left out, as an empty cell is; dates as their ISO text. ``Normalized.numbers_from_strings`` counts what it read
  so, for the data record. Training and answering both read states through it (``json_state``), so a model reads
  a state the same way in both.
- ``state_digest(state)``: a short SHA-256 of a state's canonical JSON: the id of a row that has none
  (``content_id``; re-sorting or filtering an export keeps each row's id and so its split), and the fingerprint by
  which a model remembers the rows it trained on (``decisionkit evaluate`` leaves them out).

A string is a number when it reads as one in JSON (``-12``, ``0.5``, ``3e4``; spaces around it aside) and has no
leading zero (``"007"`` and ``"02139"`` stay text: codes, not quantities).
"""

from __future__ import annotations

import ast
import datetime
import decimal
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd

from .questions import DataError

NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
DECIMAL_COMMA = re.compile(r"-?(?:0|[1-9]\d*),\d+")
MISSING_CELLS = {"", "null", "NULL", "\\N", "NaN", "nan", "#N/A"}  # what exports write for no value
EXCEL_CELL_LIMIT = 32_767  # characters Excel keeps of a cell; it cuts the rest without a word
DIGEST_CHARS = 16  # hex digits of a state's digest: 64 bits, no collision expected below billions of rows
MISSING = object()  # a flat cell with no value: its field is left out of the state


@dataclass
class Normalized:
    """Counts of what ``normal`` changed, summed over the states it read (the data record keeps them)."""

    numbers_from_strings: int = 0
    missing_numbers: int = 0  # NaN and infinities read as missing


def _number(text: str) -> int | float | None:
    """The number a string holds, by the rule above, or None."""
    text = text.strip()
    if not NUMBER.fullmatch(text):
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    value = float(text)
    return value if math.isfinite(value) else None


def _scalar(value: Any, counts: Normalized, where: str, path: str) -> Any:
    """One leaf of a state as a plain JSON value, or MISSING for a non-finite number."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            counts.missing_numbers += 1
            return MISSING
        return value
    if isinstance(value, str):
        number = _number(value)
        if number is not None:
            counts.numbers_from_strings += 1
            return number
        return value
    if value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, decimal.Decimal):
        return _scalar(float(value), counts, where, path)
    if isinstance(value, (datetime.date, datetime.time)):  # pandas' Timestamp is a datetime
        return value.isoformat()
    raise DataError(f"{where}: field {path!r} is a {type(value).__name__} ({value!r:.60}); a state holds JSON "
                    "values: objects, arrays, strings, numbers, booleans and null")


def normal(value: Any, counts: Normalized | None = None, where: str = "state", path: str = "state") -> Any:
    """``value`` (a state or part of one) with every leaf read as above; a key whose value is missing is left out,
    an array's missing item becomes null."""
    counts = counts if counts is not None else Normalized()
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            item = normal(item, counts, where, f"{path}.{key}")
            if item is not MISSING:
                out[str(key)] = item
        return out
    if isinstance(value, (list, tuple, np.ndarray)):
        items = (normal(item, counts, where, f"{path}[]") for item in value)
        return [None if item is MISSING else item for item in items]
    return _scalar(value, counts, where, path)


def _not_json(text: str, err: json.JSONDecodeError, where: str, name: str, hint: str) -> DataError:
    """The refusal of a cell that begins like JSON and does not parse: where the parser stopped and why, what the
    cell looks like instead."""
    why = f"{err.msg} at line {err.lineno}, column {err.colno}"
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        looks = ""
    else:
        looks = ("; it is a Python repr (single quotes, True/False/None), as pandas writes a column of dicts: "
                 "write the column with json.dumps, or the table with DataFrame.to_json(orient='records', lines=True)")
    if not looks and len(text) == EXCEL_CELL_LIMIT:
        looks = (f"; it is {EXCEL_CELL_LIMIT:,} characters long, where Excel cuts a cell: export it from the tool "
                 "that holds the data, not from a sheet")
    return DataError(f"{where}: field '{name}' begins like JSON and is not valid JSON ({why}){looks or hint}")


def read_state(value: Any, where: str, name: str = "state", counts: Normalized | None = None) -> tuple[Any, bool]:
    """(state, read as JSON) from a ``state`` value: an object (or a string holding one) read through ``normal``;
    other text as it is. A string that begins with ``{`` and does not parse as an object is refused."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise _not_json(value, err, where, name, f" (a text state that begins with '{{': read the column as "
                                                     f"text with --text-column {name})") from None
        if not isinstance(value, dict):
            raise DataError(f"{where}: field '{name}' holds JSON {type(value).__name__}; expected an object or text")
    if isinstance(value, dict):
        return normal(value, counts, where, name), True
    return value, False


def typed_cell(text: str, where: str, name: str, decimal_comma: bool = False) -> Any:
    """A flat table's cell as a user means it: MISSING when empty, a number, a boolean, a JSON object or array
    (a Python repr refused), else the text."""
    stripped = text.strip()
    if stripped in MISSING_CELLS:
        return MISSING
    if stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    number = _number(stripped)
    if number is not None:
        return number
    if decimal_comma and DECIMAL_COMMA.fullmatch(stripped):
        return float(stripped.replace(",", "."))
    if stripped[0] in "{[":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError as err:
            refusal = _not_json(stripped, err, where, name, "")
            if stripped[0] == "{" or "Python repr" in str(refusal):
                raise refusal from None
    return text


def _nested(cells: dict[str, Any]) -> dict[str, Any]:
    """Dotted names (``a.b``) nested into objects, in column order; a name that clashes with another (``a`` and
    ``a.b`` both) or has an empty part stays as it is."""
    plain = {name for name in cells if "." not in name}
    out: dict[str, Any] = {}
    for name, value in cells.items():
        parts = name.split(".")
        if len(parts) == 1 or "" in parts or parts[0] in plain:
            out[name] = value
            continue
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # ``a.b`` and ``a.b.c``: keep the deeper one flat
                node = None
                break
            node = child
        if node is None or parts[-1] in node:
            out[name] = value
        else:
            node[parts[-1]] = value
    return out


def flat_state(cells: Iterable[tuple[str, Any]], where: str, decimal_comma: bool = False,
               counts: Normalized | None = None) -> dict[str, Any]:
    """A state from a flat row's ``(column, cell)`` pairs: text cells typed (``typed_cell``), other values read
    through ``normal``; missing ones left out; dotted names nested."""
    counts = counts if counts is not None else Normalized()
    state = {}
    for name, value in cells:
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, float) and math.isnan(value) or value is pd.NA:  # a table's empty cell
            continue
        value = typed_cell(value, where, name, decimal_comma) if isinstance(value, str) else value
        if value is not MISSING and value is not None:
            value = normal(value, counts, where, name)
        if value is not MISSING and value is not None:
            state[name] = value
    if not state:
        raise DataError(f"{where}: every state column is empty; a row needs the state the model reads")
    return _nested(state)


def json_state(state: Any) -> Any:
    """A request's state as training read it: a string holding a JSON object is that object (a malformed one stays
    text: a request is answered, not refused, for a text that begins with '{'), and an object is read through
    ``normal``. Used by ``systemone.checked``, so ``decide``, ``decide_many`` and the server all read it so."""
    if isinstance(state, str) and state.lstrip().startswith("{"):
        try:
            parsed = json.loads(state)
        except json.JSONDecodeError:
            return state
        state = parsed if isinstance(parsed, dict) else state
    return normal(state) if isinstance(state, dict) else state


def _whole(value: Any) -> Any:
    """``value`` with every whole float as an int (``300.0`` as ``300``): a table cannot tell them apart."""
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def canonical(state: Any) -> str:
    """A state's canonical JSON: keys sorted, no spaces, whole numbers without ``.0`` (equal states, equal text,
    whatever their key order and whichever shape of export held them)."""
    return json.dumps(_whole(state), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def state_digest(state: Any) -> str:
    """The first ``DIGEST_CHARS`` hex digits of the SHA-256 of ``canonical(state)``."""
    return hashlib.sha256(canonical(state).encode()).hexdigest()[:DIGEST_CHARS]


def content_id(state: Any) -> str:
    """The id of a row that names none: ``row-`` and its state's digest."""
    return f"row-{state_digest(state)}"
