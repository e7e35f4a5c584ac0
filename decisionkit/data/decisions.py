"""Your own decisions, from whatever table holds them: one loader for every training path.

``load_decisions(data, schema=None)`` reads the past cases of a workflow and what people decided about them, and
returns a ``Decisions``: train, validation and test ``Split``s (what the trainer, the metrics and ``decide`` read),
the questions of each workflow, and a ``record`` of what was read (the source, a hash of the rows, the rows per split
and workflow, how many states were JSON, how the splits were made), which a trained model keeps beside itself.

Sources (``data``):

- a file: ``.jsonl`` (one object a line), ``.json`` (a list of objects), ``.csv``, ``.parquet``;
- a folder: ``schema.json`` beside one examples file (``.jsonl``, ``.json``, ``.csv`` or ``.parquet``), or the
  benchmark's own layout (``train.jsonl`` and ``test.jsonl``, rows with ``questions`` and ``gold``);
- in memory: a pandas DataFrame, a list of dicts, a ``datasets.Dataset``.

A row (a line, a CSV row, a dict):

- ``state``: the case as a JSON object or as text (``text`` is read as the state too). A string is parsed: if it
  is a JSON object (as a CSV cell holds one), the state is that object, else the text itself. JSON states give
  the hybrid's trees their fields; text states are read by the language model alone.
- ``id`` (optional; else the row's number), ``workflow`` (optional; else one workflow named after the file or
  folder, or ``workflow=``), ``split`` (optional: ``train``, ``validation`` or ``test``).
- A label for every question: a key (or CSV column) named after the question, or inside ``labels``, or the
  benchmark's ``gold`` object (``{question: {"probabilities": {...}}}``). A label is an option key; for a noul
  (yes/no) ``true``/``false``, a JSON boolean or ``0``/``1``; for a score an integer level or its string; or a
  distribution over options (``{"billing": 0.7, "sales": 0.3}``, options left out get 0; in a CSV cell, as JSON).
- The questions: ``schema`` (a dict, or a ``schema.json`` path) in the System One question shape, for one workflow
  (``{question: {...}}``) or several (``{workflow: {question: {...}}}``); a folder's ``schema.json``; or per row
  (``questions``, as the benchmark's rows have them).

Splits. Rows that name their split keep it. When no row names a test split, ``TEST_SHARE`` of each workflow's
rows is held out for test; when none names validation, ``held_out_validation_rows(n)`` rows of each workflow are held out of
train for it (at most ``VALIDATION_PER_WORKFLOW``, the benchmark's own 20). Both are chosen by a hash of ``seed`` and
the row's id (stratified by workflow, deterministic whatever the row order); with the default seed the validation
rows of typed-decisions are the benchmark's 80. Every workflow must keep ``MIN_TRAIN_PER_WORKFLOW`` train rows.

Every refusal is a ``DataError`` that names the row (file and line, or row number) and the field, before anything is
trained: a label that is not an option, a distribution that does not sum to 1, a missing label, a state that is
neither text nor an object, a question the schema lacks, a duplicate id, too few rows, an empty or unreadable file.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pandas as pd

from ..core import settings
from .cases import (
    VALIDATION_PER_WORKFLOW,
    WORKFLOWS,
    Case,
    Gold,
    Split,
    _hashed_ids,
    jsonl_rows,
    load_typed_decisions,
    probability_vector,
)
from .questions import DataError, Question

SPLITS = ("train", "validation", "test")
TEST_SHARE = 0.2  # of each workflow's rows, held out for test when the data names no test split
VALIDATION_SHARE = 0.1  # of each workflow's train rows, held out for validation when the data names none (at most
# VALIDATION_PER_WORKFLOW, the benchmark's own 20 a workflow)
MIN_TRAIN_PER_WORKFLOW = 20  # rows a workflow must keep in train: heads, a dev slice and trees need this many
FILE_KINDS = (".jsonl", ".json", ".csv", ".parquet")
# the columns of a row that are not labels
ROW_KEYS = ("id", "workflow", "split", "state", "text", "labels", "gold", "questions")
IN_MEMORY = "in memory"


@dataclass
class Decisions:
    """What ``load_decisions`` read: the three splits, the questions of each workflow, and the record of it all."""

    splits: dict[str, Split]
    schema: dict[str, dict[str, Question]]
    record: dict = field(default_factory=dict)
    rows: Split | None = None  # every row in the source's order, whatever its split (a file of new cases to score)

    def __getitem__(self, split: str) -> Split:
        return self.splits[split]

    @property
    def benchmark(self) -> bool:
        """True for typed-decisions itself: its layout and only its workflows."""
        return bool(self.record.get("benchmark"))

    @property
    def text_workflows(self) -> list[str]:
        """Workflows none of whose train states is a JSON object: trees have no fields to read there."""
        train = self.splits["train"]
        return [w for w in train.workflows if not any(isinstance(c.state, dict) for c in train if c.workflow == w)]

    def table(self) -> pd.DataFrame:
        """Rows per workflow (index) and split (columns): the counts the report and the CLI print."""
        counts = pd.DataFrame(self.record["rows"]).fillna(0).astype(int)
        return counts.reindex(columns=[s for s in SPLITS if s in counts.columns])

    def summary(self) -> str:
        """One line: where the data came from, the split sizes and how they were made, JSON against text states."""
        sizes = ", ".join(f"{len(self.splits[s])} {s}" for s in SPLITS)
        states = self.record["states"]
        return (f"{self.record['rows total']} rows from {self.record['source']} ({len(self.schema)} workflow(s)): "
                f"{sizes} ({self.record['split rule']}); states: {states['json']} JSON, {states['text']} text")


# ----- questions ----------------------------------------------------------------------------------------------------
def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise DataError(f"duplicate keys {repeated}: every question name and option must be unique")
    return dict(pairs)


def _read_json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
    except DataError as err:
        raise DataError(f"{path}: {err}") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None


def _is_question(value: Any) -> bool:
    return isinstance(value, dict) and "type" in value


def load_schema(schema: dict | str | Path, where: str = "schema") -> dict[str, Question]:
    """The questions of one workflow, from a dict written in a notebook or a JSON file (duplicate names or options
    refused)."""
    if not isinstance(schema, dict):
        where = str(schema)
        schema = _read_json_file(Path(schema))
    if not isinstance(schema, dict) or not schema:
        raise DataError(f"{where}: a schema is an object of question name -> question, with at least one question")
    return {name: Question.from_json(name, question, where) for name, question in schema.items()}


def load_schemas(schema: dict | str | Path, where: str = "schema") -> dict[str | None, dict[str, Question]]:
    """A schema for one workflow (``{question: {...}}``: key None, it applies to every workflow of the data) or for
    several (``{workflow: {question: {...}}}``), as workflow -> question -> Question."""
    if not isinstance(schema, dict):
        where = str(schema)
        schema = _read_json_file(Path(schema))
    if not isinstance(schema, dict) or not schema:
        raise DataError(f"{where}: a schema is an object of question name -> question (one workflow) or of workflow "
                        "-> question name -> question, with at least one question")
    if all(_is_question(v) for v in schema.values()):
        return {None: load_schema(schema, where)}
    if all(isinstance(v, dict) and v and all(_is_question(q) for q in v.values()) for v in schema.values()):
        return {str(w): load_schema(qs, f"{where}: workflow {w!r}") for w, qs in schema.items()}
    bad = next(k for k, v in schema.items() if not _is_question(v))
    raise DataError(f"{where}: field {bad!r} is neither a question (an object with a 'type') nor a workflow's "
                    "questions; expected {question: {type, instructions, criteria}} or {workflow: {question: ...}}")


# ----- labels -------------------------------------------------------------------------------------------------------
def _scalar(value: Any) -> Any:
    """numpy and pandas scalars as plain Python values; NaN and None as None."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)) and np.ndim(value) == 0:
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _hard_key(question: Question, label: Any) -> str | None:
    """The option key a hard label names, or None when it names none."""
    if isinstance(label, bool):
        return str(label).lower() if question.type == "noul" else None
    if isinstance(label, float) and label.is_integer():
        label = int(label)
    if isinstance(label, int):
        key = str(label)
        if question.type == "noul":
            return {"0": "false", "1": "true"}.get(key)
        return key if key in question.options else None
    if isinstance(label, str):
        key = label.strip()
        if question.type == "noul":
            key = {"0": "false", "1": "true"}.get(key, key.lower())
        return key if key in question.options else None
    return None


def gold_from_label(question: Question, label: Any, where: str, field_name: str | None = None) -> Gold:
    """A hard label or a distribution over options (a dict, or its JSON in a string) as a gold distribution;
    a DataError naming ``where`` and the field otherwise."""
    name = field_name or question.id
    label = _scalar(label)
    if isinstance(label, str) and label.strip().startswith("{"):
        try:
            label = json.loads(label)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: field '{name}' is not valid JSON ({err.msg}); expected an option of "
                            f"{list(question.options)} or a distribution such as {{\"{question.options[0]}\": 1.0}}"
                            ) from None
    if isinstance(label, dict):
        if not label:
            raise DataError(f"{where}: field '{name}' is an empty distribution; expected option -> probability")
        if "probabilities" in label:  # the benchmark's gold object: its own reader, its stored label kept
            return Gold.from_json(question, label, where)
        label = {str(k): _scalar(v) for k, v in label.items()}
        if question.type == "noul":
            label = {_hard_key(question, k) or k: v for k, v in label.items()}
        unknown = sorted(set(label) - set(question.options))
        if unknown:
            raise DataError(f"{where}: field '{name}' has options {unknown}; expected some of {list(question.options)}")
        probs = probability_vector(question, {o: label.get(o, 0.0) for o in question.options}, where, name)
        return Gold(probs, question.options[int(np.argmax(probs))])
    if label is None or (isinstance(label, str) and not label.strip()):
        raise DataError(f"{where}: field '{name}' is missing; every row needs a label for question {question.id!r} "
                        f"(one of {list(question.options)}, or a distribution over them)")
    key = _hard_key(question, label)
    if key is None:
        hint = " (or true/false, 0/1)" if question.type == "noul" else ""
        raise DataError(f"{where}: field '{name}' is {label!r}; expected one of {list(question.options)}{hint} or a "
                        "distribution over them")
    probs = np.zeros(len(question.options))
    probs[question.options.index(key)] = 1.0
    return Gold(probs, key)


# ----- rows ---------------------------------------------------------------------------------------------------------
def _state(value: Any, where: str) -> tuple[Any, bool]:
    """(state, read as JSON): an object stays one; a string holding a JSON object becomes that object; other text
    stays text. Anything else is refused."""
    value = _scalar(value)
    if isinstance(value, dict):
        return value, True
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                return parsed, True
        if not text:
            raise DataError(f"{where}: field 'state' is empty; every row needs the state the model reads")
        return value, False
    if value is None:
        raise DataError(f"{where}: field 'state' is missing; every row needs a state (a JSON object or text)")
    raise DataError(f"{where}: field 'state' is {type(value).__name__} {value!r}; expected a JSON object or text")


def _json_field(value: Any, name: str, where: str) -> Any:
    """A nested field (``questions``, ``labels``, ``gold``) that a CSV or parquet stores as a JSON string."""
    value = _scalar(value)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: field '{name}' is a string that is not valid JSON ({err.msg})") from None
    return value


@dataclass
class _Row:
    where: str
    id: str
    workflow: str
    split: str | None
    state: Any
    json_state: bool
    questions: dict[str, Question]
    labels: dict[str, tuple[Any, str]]  # question -> (the label as the row gave it, the field that held it)


def _parse_row(raw: Any, where: str, number: int, schemas: dict[str | None, dict[str, Question]] | None,
               workflow: str, splits: tuple[str, ...]) -> _Row:
    if not isinstance(raw, dict):
        raise DataError(f"{where}: a row must be an object (id?, workflow?, split?, state, labels), got "
                        f"{type(raw).__name__}")
    row = {str(k): v for k, v in raw.items()}
    if "state" not in row and "text" not in row:
        raise DataError(f"{where}: field 'state' is missing; every row needs a state (a JSON object or text)")
    state, is_json = _state(row["state"] if "state" in row else row["text"], where)
    case_id = _scalar(row.get("id"))
    case_id = str(number) if case_id is None or str(case_id).strip() == "" else str(case_id)
    wf = _scalar(row.get("workflow"))
    wf = workflow if wf is None or str(wf).strip() == "" else str(wf)
    split = _scalar(row.get("split"))
    split = None if split is None or str(split).strip() == "" else str(split).strip()
    if split is not None and split not in splits:
        raise DataError(f"{where}: field 'split' is {split!r}; expected one of {', '.join(splits)} (or none: the "
                        "loader then holds out validation and test itself)")
    given = row.get("questions")
    if given is not None:
        questions_json = _json_field(given, "questions", where)
        if not isinstance(questions_json, dict) or not questions_json:
            raise DataError(f"{where}: field 'questions' must be a non-empty object of question name -> question")
        questions = {qid: Question.from_json(qid, q, where) for qid, q in questions_json.items()}
    elif schemas is None:
        raise DataError(f"{where}: no questions: give a schema (schema= or --schema, a schema.json beside the "
                        "examples) or a field 'questions' in every row")
    elif None in schemas:
        questions = schemas[None]
    elif wf in schemas:
        questions = schemas[wf]
    else:
        raise DataError(f"{where}: field 'workflow' is {wf!r}; the schema has questions for {sorted(schemas)}")
    if "labels" in row or "gold" in row:
        key = "labels" if "labels" in row else "gold"
        labels = _json_field(row[key], key, where)
        if not isinstance(labels, dict):
            raise DataError(f"{where}: field '{key}' must be an object of question name -> label")
        prefix = f"{key}."
        extra = sorted(set(labels) - set(questions))
    else:
        labels = {k: v for k, v in row.items() if k not in ROW_KEYS}
        prefix = ""
        extra = sorted(k for k in set(labels) - set(questions) if _scalar(labels[k]) not in (None, ""))
    if extra:
        raise DataError(f"{where}: field {prefix + extra[0]!r} is not a question of the schema (its questions: "
                        f"{', '.join(questions)}); a row holds id, workflow, split, state and one label per question")
    return _Row(where, case_id, wf, split, state, is_json, questions,
                {q: (labels.get(q), f"{prefix}{q}") for q in questions})


def _case(row: _Row) -> Case:
    gold = {qid: gold_from_label(q, label, row.where, name) for qid, q in row.questions.items()
            for label, name in [row.labels[qid]]}
    return Case(row.id, row.workflow, row.state, dict(row.questions), gold)


# ----- sources ------------------------------------------------------------------------------------------------------
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
    rows = _read_json_file(path)
    if not isinstance(rows, list):
        raise DataError(f"{path}: a .json file of rows must hold a list of objects, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        yield f"{path} row {i + 1}", row


def _frame_rows(frame: pd.DataFrame, name: str) -> Iterator[tuple[str, dict]]:
    for i, row in enumerate(frame.to_dict(orient="records")):
        yield f"{name} row {i + 1}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
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
class _Source:
    rows: list[tuple[str, Any, str | None]]  # (where, row, split the file gives it)
    name: str  # what the record names as the source
    workflow: str  # the default workflow name
    schema: Any  # a schema found beside the data, or None
    benchmark_layout: bool = False  # train.jsonl and test.jsonl, as typed-decisions is laid out


def _source(data: Any, workflow: str | None) -> _Source:
    if not isinstance(data, (str, Path)):
        rows, kind = _memory_rows(data)
        return _Source([(w, r, None) for w, r in rows], f"{IN_MEMORY} ({kind})", workflow or "decisions", None)
    path = Path(data).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: expected a {'/'.join(FILE_KINDS)} file or a folder")
    if path.is_file():
        return _Source([(w, r, None) for w, r in _file_rows(path)], str(path), workflow or path.stem, None)
    schema = path / "schema.json"
    if (path / "train.jsonl").is_file() and (path / "test.jsonl").is_file():  # the benchmark's layout
        rows = [(w, r, split) for split in ("train", "test") for w, r in jsonl_rows(path / f"{split}.jsonl")]
        return _Source(rows, str(path), workflow or path.name, schema if schema.is_file() else None, True)
    examples = sorted(p for p in path.iterdir() if p.suffix in FILE_KINDS and p.name != "schema.json"
                      and not p.name.startswith("."))
    if len(examples) != 1 or not schema.is_file():
        raise FileNotFoundError(f"{path} must hold schema.json and exactly one examples file ({', '.join(FILE_KINDS)}),"
                                f" or train.jsonl and test.jsonl; found {sorted(p.name for p in path.iterdir())}")
    return _Source([(w, r, None) for w, r in _file_rows(examples[0])], str(path), workflow or path.name, schema)


# ----- splits -------------------------------------------------------------------------------------------------------
def held_out_validation_rows(rows: int) -> int:
    """Validation rows held out of a workflow's ``rows`` train rows: a tenth, at least 1 (none of a single row), at
    most 20."""
    return 0 if rows < 2 else max(1, min(VALIDATION_PER_WORKFLOW, round(VALIDATION_SHARE * rows)))


def held_out_test_rows(rows: int) -> int:
    """Test rows held out of a workflow's ``rows`` rows: a fifth, at least 1."""
    return max(1, round(TEST_SHARE * rows))


def _carve(cases: list[Case], count, salt: str) -> set[str]:
    """Ids of ``count(n)`` cases of each workflow (of n), chosen by the hash of ``salt`` and the id."""
    per_workflow = Counter(c.workflow for c in cases)
    return _hashed_ids(cases, {w: count(n) for w, n in per_workflow.items()}, salt)


def _salt(seed: int | None, split: str) -> str:
    # the default (None) is the benchmark's own rule for validation: the first 20 ids of each workflow by SHA-256
    return "" if seed is None and split == "validation" else f"{split}:{seed if seed is not None else ''}:"


def rows_sha256(cases: Iterable[Case]) -> str:
    """A hash of the rows as read (id, workflow, state, questions, gold), in order: the saved model's data record."""
    digest = hashlib.sha256()
    for c in cases:
        digest.update(json.dumps([c.id, c.workflow, c.state, {q: v.to_json() for q, v in c.questions.items()},
                                  {q: g.probabilities.round(6).tolist() for q, g in c.gold.items()}],
                                 sort_keys=True, ensure_ascii=False, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def load_decisions(data: Any, schema: dict | str | Path | None = None, *, workflow: str | None = None,
                   seed: int | None = None, splits: tuple[str, ...] = SPLITS,
                   min_train: int = MIN_TRAIN_PER_WORKFLOW, carve: bool = True) -> Decisions:
    """Read labelled decisions from ``data`` (see the module docstring) into train, validation and test splits.

    ``schema``: the questions (a dict or a ``schema.json`` path), unless the rows carry their own or a folder has
    ``schema.json``. ``workflow``: the name of the one workflow when rows name none (default: the file's or
    folder's name). ``seed``: reshuffles the held-out validation and test rows (default: the benchmark's rule).
    ``splits``: the split names rows may carry (a scored-only file carries its own one, e.g. ``("other-voice",)``;
    nothing is then carved). ``min_train``: train rows each workflow must keep. ``carve=False``: no rows are held
    out (rows that name no split are in ``rows`` only: cases to score)."""
    source = _source(data, workflow)
    schema = schema if schema is not None else source.schema
    schemas = load_schemas(schema) if schema is not None else None
    if not source.rows:
        raise DataError(f"{source.name}: no rows; expected one labelled case a row")
    parsed, seen = [], {}
    for number, (where, raw, file_split) in enumerate(source.rows, start=1):
        row = _parse_row(raw, where, number, schemas, source.workflow, splits)
        if file_split is not None:  # the benchmark's layout: the file is the split (validation is carved from train)
            row.split = row.split or file_split
        if row.id in seen:
            raise DataError(f"{where}: field 'id' {row.id!r} is used twice (first at {seen[row.id]}); every row needs "
                            "its own id")
        seen[row.id] = where
        parsed.append(row)
    cases = [_case(row) for row in parsed]
    split_of = {row.id: row.split for row in parsed}
    named = {s for s in split_of.values() if s is not None}
    rule = []
    if splits == SPLITS and carve:
        if any(s is None for s in split_of.values()) and named - {"train"}:
            where = next(r.where for r in parsed if r.split is None)
            raise DataError(f"{where}: field 'split' is empty while other rows name theirs; give every row a split, "
                            "or none (the loader then holds out validation and test itself)")
        free = [c for c in cases if split_of[c.id] in (None, "train")]
        if "test" not in named:
            held = _carve(free, held_out_test_rows, _salt(seed, "test"))
            split_of.update(dict.fromkeys(held, "test"))
            free = [c for c in free if c.id not in held]
            rule.append(f"test: {TEST_SHARE:.0%} of each workflow held out")
        if "validation" not in named:
            held = _carve(free, held_out_validation_rows, _salt(seed, "validation"))
            split_of.update(dict.fromkeys(held, "validation"))
            rule.append(f"validation: {VALIDATION_SHARE:.0%} of each workflow's train rows held out "
                        f"(at most {VALIDATION_PER_WORKFLOW})")
        split_of = {k: v or "train" for k, v in split_of.items()}
    by_split = {s: Split(s, [c for c in cases if split_of[c.id] == s], source.name) for s in splits}
    if splits == SPLITS and carve:
        train = Counter(by_split["train"].case_workflows)
        for wf in dict.fromkeys(c.workflow for c in cases):
            if train[wf] < min_train:
                total = sum(1 for c in cases if c.workflow == wf)
                raise DataError(f"{source.name}: workflow {wf!r} has {train[wf]} train rows ({total} in all); at least "
                                f"{min_train} are needed to fit its heads, hold out a dev slice and fit trees. With no "
                                f"split given, {TEST_SHARE:.0%} go to test and about {VALIDATION_SHARE:.0%} to "
                                f"validation, so give it {math.ceil(min_train / (1 - TEST_SHARE - VALIDATION_SHARE))} "
                                "rows or more")
    workflows_schema: dict[str, dict[str, Question]] = {}
    for c in cases:
        known = workflows_schema.setdefault(c.workflow, c.questions)
        if known != c.questions:
            raise DataError(f"{seen[c.id]}: field 'questions' differs from the first row of workflow {c.workflow!r}; "
                            "every row of a workflow asks the same questions")
    # typed-decisions itself (its layout, its workflows): its own off-domain set and quoted references apply
    benchmark = source.benchmark_layout and set(workflows_schema) <= set(WORKFLOWS)
    record = _record(source.name, by_split, workflows_schema, "; ".join(rule) or "as the data gives them", seed,
                     benchmark)
    record["workflow"] = workflow  # the name given to rows that name none (None: the file's or folder's)
    return Decisions(by_split, workflows_schema, record, Split("all", cases, source.name))


def typed_decisions(folder: str | Path | None = None) -> Decisions:
    """The typed-decisions benchmark as ``Decisions``: from ``folder``, else ``$DECISIONKIT_DATA``, else the hub
    (``cases.load_typed_decisions`` reads it there), with the benchmark's own splits."""
    folder = folder if folder is not None else settings.data_dir()
    if folder is not None:
        return load_decisions(folder)
    splits = {s: load_typed_decisions(s) for s in SPLITS}
    schema = splits["train"].schema()
    return Decisions(splits, schema, _record(splits["test"].source, splits, schema, "the benchmark's own", None, True))


def _record(source: str, splits: dict[str, Split], schema: dict[str, dict[str, Question]], rule: str,
            seed: int | None, benchmark: bool) -> dict:
    """What a model trained on these splits keeps of its data (``Decisions.record``)."""
    cases = [c for split in splits.values() for c in split]
    json_states = sum(isinstance(c.state, dict) for c in cases)
    return {"source": source, "rows total": len(cases), "rows sha256": rows_sha256(cases),
            "rows": {s: dict(Counter(split.case_workflows)) for s, split in splits.items()},
            "states": {"json": json_states, "text": len(cases) - json_states}, "split rule": rule, "seed": seed,
            "benchmark": benchmark, "schema": {w: {q: v.to_json() for q, v in qs.items()} for w, qs in schema.items()}}
