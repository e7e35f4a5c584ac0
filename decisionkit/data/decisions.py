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

The sources are read by ``tables.py``, the schema and the labels by ``labels.py``. Every refusal is a
``DataError`` that names the row (file and line, or row number) and the field, before anything is trained: a label
that is not an option, a distribution that does not sum to 1, a missing label, a state that is
neither text nor an object, a question the schema lacks, a duplicate id, too few rows, an empty or unreadable file.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ..core import settings
from .cases import (
    VALIDATION_PER_WORKFLOW,
    WORKFLOWS,
    Case,
    Split,
    _hashed_ids,
    json_state,
    load_typed_decisions,
)
from .labels import gold_from_label, load_schemas, scalar
from .questions import DataError, Question
from .tables import read_source

SPLITS = ("train", "validation", "test")
TEST_SHARE = 0.2  # of each workflow's rows, held out for test when the data names no test split
VALIDATION_SHARE = 0.1  # of each workflow's train rows, held out for validation when the data names none (at most
# VALIDATION_PER_WORKFLOW, the benchmark's own 20 a workflow)
MIN_TRAIN_PER_WORKFLOW = 20  # rows a workflow must keep in train: heads, a dev slice and trees need this many
# the columns of a row that are not labels
ROW_KEYS = ("id", "workflow", "split", "state", "text", "labels", "gold", "questions")


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


# ----- rows ---------------------------------------------------------------------------------------------------------
def _state(value: Any, where: str) -> tuple[Any, bool]:
    """(state, read as JSON): an object stays one; a string holding a JSON object becomes that object; other text
    stays text. Anything else is refused."""
    value = json_state(scalar(value))
    if isinstance(value, dict):
        return value, True
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: field 'state' is empty; every row needs the state the model reads")
        return value, False
    if value is None:
        raise DataError(f"{where}: field 'state' is missing; every row needs a state (a JSON object or text)")
    raise DataError(f"{where}: field 'state' is {type(value).__name__} {value!r}; expected a JSON object or text")


def _json_field(value: Any, name: str, where: str) -> Any:
    """A nested field (``questions``, ``labels``, ``gold``) that a CSV or parquet stores as a JSON string."""
    value = scalar(value)
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
    case_id = scalar(row.get("id"))
    case_id = str(number) if case_id is None or str(case_id).strip() == "" else str(case_id)
    wf = scalar(row.get("workflow"))
    wf = workflow if wf is None or str(wf).strip() == "" else str(wf)
    split = scalar(row.get("split"))
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
        extra = sorted(k for k in set(labels) - set(questions) if scalar(labels[k]) not in (None, ""))
    if extra:
        raise DataError(f"{where}: field {prefix + extra[0]!r} is not a question of the schema (its questions: "
                        f"{', '.join(questions)}); a row holds id, workflow, split, state and one label per question")
    return _Row(where, case_id, wf, split, state, is_json, questions,
                {q: (labels.get(q), f"{prefix}{q}") for q in questions})


def _case(row: _Row) -> Case:
    gold = {qid: gold_from_label(q, label, row.where, name) for qid, q in row.questions.items()
            for label, name in [row.labels[qid]]}
    return Case(row.id, row.workflow, row.state, dict(row.questions), gold)


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
    source = read_source(data, workflow)
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
