"""Your own decisions, from whatever table holds them: one loader for every training path.

``load_decisions(data, schema=None, **reading)`` reads the past cases of a workflow and what people decided about
them, and returns a ``Decisions``: train, validation and test ``Split``s (what the trainer, the metrics and ``decide``
read), the questions of each workflow, and a ``record`` of what was read (the source, how it was read, a hash of the
rows, the rows per split and workflow, how many states were JSON, how the splits were made), which a trained model
keeps beside itself.

Sources (``data``; ``tables.py`` reads them): a ``.csv`` (its delimiter found: ``,`` ``;`` tab ``|``), ``.tsv``,
``.jsonl``, ``.json`` or ``.parquet`` file (any case, the text ones gzipped too, a UTF-8 BOM skipped); a folder
(``schema.json`` beside one examples file, or the benchmark's ``train.jsonl`` and ``test.jsonl``); a pandas
DataFrame, a list of dicts, a ``datasets.Dataset``.

A row (``rows.py`` reads it; ``reading``: the options that say how, ``rows.Reading``): the state (a ``state``
column holding a JSON object, one encoded in the cell, or text; a ``text`` column or ``text_column``: text;
``state_columns``: a state of those columns; with none of these, a flat table: every column that is not an id,
workflow, split or label is a field of the state), ``id`` (or ``id_column``; with none, a hash of the row's state,
``states.content_id``, so re-sorting or filtering an export moves no row between splits), ``workflow`` (else
``reading.workflow``, else ``decisions``), ``split`` (``train``, ``validation`` or ``test``), and a label for every
question: a column named after it, or inside ``labels``, or the benchmark's ``gold``. A label is an option key; for a
noul (yes/no) ``true``/``false``, ``yes``/``no``, ``y``/``n`` or ``1``/``0`` in any case, or a JSON boolean; for a
score its level's number or text; or a distribution over options (``{"billing": 0.7, "sales": 0.3}``). The
questions come from ``schema`` (a dict or a ``schema.json`` path, one workflow or several), a folder's
``schema.json``, or each row's ``questions``. ``labelled=False`` reads rows to answer: labels not needed, and left
out of the state.

Splits. Rows that name their split keep it. When no row names a test split, each row is held out for test by
itself, when a hash of ``seed`` and its id falls in the first ``TEST_SHARE`` of the hash's range (about a fifth of
each workflow, at least one row): the same rows on every run and machine, and re-sorting, filtering or adding to an
export never moves a row into or out of test. When none names validation, ``held_out_validation_rows(n)`` of each
workflow's other rows are held out of train for it (a tenth, at most ``VALIDATION_PER_WORKFLOW``, the benchmark's own
20: the lowest hashes); with the default seed the validation rows of typed-decisions are the benchmark's 80. Rows of
one state and no id are held out together. Every workflow must keep ``MIN_TRAIN_PER_WORKFLOW`` train rows.

Every refusal is a ``DataError`` that names the row (file and line, or row number) and the field, before anything is
trained: a label that is not an option, a distribution that does not sum to 1, a missing label, a state that is
neither text nor an object, a cell that begins like JSON and is not, a column nothing reads, a question the schema
lacks, a duplicate id, too few rows, an empty or unreadable file. With ``skip_bad``, a bad row is left out instead and
named in ``record["skipped"]`` (batch prediction's ``--skip-bad``).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ..core import settings
from .cases import VALIDATION_PER_WORKFLOW, WORKFLOWS, Case, Split, load_typed_decisions
from .labels import load_schemas
from .questions import DataError, Question, schema_json
from .rows import Reading, Row, parse_row
from .states import Normalized, canonical, content_id, state_digest
from .tables import read_source

SPLITS = ("train", "validation", "test")
TEST_SHARE = 0.2  # of each workflow's rows, held out for test when the data names no test split
VALIDATION_SHARE = 0.1  # of each workflow's train rows, held out for validation when the data names none (at most
# VALIDATION_PER_WORKFLOW, the benchmark's own 20 a workflow)
MIN_TRAIN_PER_WORKFLOW = 20  # rows a workflow must keep in train: heads, a dev slice and trees need this many


@dataclass
class Decisions:
    """What ``load_decisions`` read: the three splits, the questions of each workflow, and the record of it all."""

    splits: dict[str, Split]
    schema: dict[str, dict[str, Question]]
    record: dict = field(default_factory=dict)
    rows: Split | None = None  # every row in the source's order, whatever its split (a file of new cases to score)
    places: dict[str, str] = field(default_factory=dict)  # id -> where the row is (file and line), for messages

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
        """One line: where the data came from, the split sizes and how they were made, JSON against text states,
        and what the reading changed (ids from content, numbers read from strings, a pandas index left out)."""
        sizes = ", ".join(f"{len(self.splits[s])} {s}" for s in SPLITS)
        states = self.record["states"]
        columns = [c for c in self.record.get("state columns", []) if c not in ("state", "text")]
        notes = [note for note in (
            f"states from the columns {', '.join(columns)} (--state-columns to pick others)" if columns else "",
            "ids from each row's state" if self.record.get("ids") == "from the state" else "",
            f"{states['numbers read from strings']} numbers read from strings" if states.get(
                "numbers read from strings") else "",
            "a pandas index column left out" if self.record.get("index column") is not None else "",
        ) if note]
        return (f"{self.record['rows total']} rows from {self.record['source']} ({len(self.schema)} workflow(s)): "
                f"{sizes} ({self.record['split rule']}); states: {states['json']} JSON, {states['text']} text"
                + "".join(f"; {n}" for n in notes))

    def digests(self) -> dict[str, list[str]]:
        """Each split's states as digests (``states.state_digest``): how a model remembers the rows it was trained
        on, and ``evaluate`` tells them from new ones."""
        return {s: [state_digest(c.state) for c in split] for s, split in self.splits.items()}


# ----- splits -------------------------------------------------------------------------------------------------------
def held_out_validation_rows(rows: int) -> int:
    """Validation rows held out of a workflow's ``rows`` train rows: a tenth, at least 1 (none of a single row), at
    most 20."""
    return 0 if rows < 2 else max(1, min(VALIDATION_PER_WORKFLOW, round(VALIDATION_SHARE * rows)))


def _draw(salt: str, key: str) -> float:
    """A number in [0, 1) drawn by the SHA-256 of ``salt`` and ``key``: the same for a row on every run and machine."""
    return int(hashlib.sha256(f"{salt}{key}".encode()).hexdigest()[:16], 16) / 2**64


def _test_rows(cases: list[Case], salt: str, group: dict[str, str]) -> set[str]:
    """Ids of the cases held out for test: each row by itself, when its group's draw (``_draw``) falls below
    ``TEST_SHARE`` (about a fifth of each workflow, and at least its lowest draw), so re-sorting or filtering an export
    never moves a row into or out of test."""
    by_workflow: dict[str, dict[str, list[str]]] = {}
    for case in cases:
        by_workflow.setdefault(case.workflow, {}).setdefault(group[case.id], []).append(case.id)
    chosen: set[str] = set()
    for groups in by_workflow.values():
        draws = {key: _draw(salt, key) for key in groups}
        held = [key for key, u in draws.items() if u < TEST_SHARE] or [min(draws, key=draws.get)]
        for key in held:
            chosen.update(groups[key])
    return chosen


def _carve(cases: list[Case], count, salt: str, group: dict[str, str]) -> set[str]:
    """Ids of about ``count(n)`` cases of each workflow (of n), chosen by the SHA-256 of ``salt`` and each case's
    group (its id, or for rows without one their state's: repeated states are held out together, so one is never
    trained on while its twin is scored)."""
    by_workflow: dict[str, dict[str, list[str]]] = {}
    for case in cases:
        by_workflow.setdefault(case.workflow, {}).setdefault(group[case.id], []).append(case.id)
    chosen: set[str] = set()
    for groups in by_workflow.values():
        wanted, taken = count(sum(map(len, groups.values()))), 0
        for key in sorted(groups, key=lambda g: hashlib.sha256(f"{salt}{g}".encode()).hexdigest()):
            if taken >= wanted:
                break
            chosen.update(groups[key])
            taken += len(groups[key])
    return chosen


def _salt(seed: int | None, split: str) -> str:
    # the default (None) is the benchmark's own rule for validation: the first 20 ids of each workflow by SHA-256
    return "" if seed is None and split == "validation" else f"{split}:{seed if seed is not None else ''}:"


def rows_sha256(cases: Iterable[Case]) -> str:
    """A hash of the rows as read (id, workflow, state, questions, gold), whatever their order: the saved model's
    data record, and how a working folder knows the rows it was made from."""
    rows = sorted(hashlib.sha256(canonical([c.id, c.workflow, c.state, {q: v.to_json() for q, v in c.questions.items()},
                                            {q: g.probabilities.round(6).tolist() for q, g in c.gold.items()}]).encode()
                                 ).hexdigest() for c in cases)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def _with_ids(rows: list[Row]) -> dict[str, str]:
    """Give every row without an id its state's (``states.content_id``; a repeated state ``.2``, ``.3`` in order);
    return each row's group for ``_carve``: its id, or its state's id for those that had none."""
    group, repeats = {}, Counter()
    for row in rows:
        if row.id is None:
            base = content_id(row.state)
            repeats[base] += 1
            row.id = base if repeats[base] == 1 else f"{base}.{repeats[base]}"
            group[row.id] = base
        else:
            group[row.id] = row.id
    return group


def _parsed(source, schemas, reading: Reading, splits, counts: Normalized, skip_bad: bool, labelled: bool
            ) -> tuple[list[Row], list[Case], list[dict], bool, dict[str, str]]:
    """Every row of ``source`` read (``rows.parse_row``), given its id (``_with_ids``) and made a Case; with
    ``skip_bad`` a bad row is left out and named (``where``, ``error``), else its DataError stops the load. Also:
    whether every row named its id, and each row's group for the carve."""
    rows, skipped = [], []

    def skip(where: str, err: DataError) -> None:
        if not skip_bad:
            raise err
        skipped.append({"where": where, "error": str(err)})

    for where, raw, file_split in source.rows:
        try:
            row = parse_row(raw, where, schemas, reading, splits, counts, source.decimal_comma)
        except DataError as err:
            skip(where, err)
            continue
        if file_split is not None:  # the benchmark's layout: the file is the split (validation carved from train)
            row.split = row.split or file_split
        rows.append(row)
    given = all(row.id is not None for row in rows)
    group = _with_ids(rows)
    kept, cases = [], []
    for row in rows:
        try:
            cases.append(row.case(labelled))
        except DataError as err:
            skip(row.where, err)
            continue
        kept.append(row)
    return kept, cases, skipped, given, group


def load_decisions(data: Any, schema: dict | str | Path | None = None, *, seed: int | None = None,
                   splits: tuple[str, ...] = SPLITS, min_train: int = MIN_TRAIN_PER_WORKFLOW, carve: bool = True,
                   labelled: bool = True, skip_bad: bool = False, reading: Reading | dict | None = None,
                   **options) -> Decisions:
    """Read labelled decisions from ``data`` (see the module docstring) into train, validation and test splits.

    ``schema``: the questions (a dict or a ``schema.json`` path), unless the rows carry their own or a folder has
    ``schema.json``. ``reading`` (a ``rows.Reading``) or its options as keywords: ``workflow`` (the one workflow
    of rows that name none; default ``decisions``), ``state_columns``, ``text_column``, ``id_column``,
    ``ignore_columns``, ``delimiter``. ``seed``: reshuffles the held-out validation and test rows (default: the
    benchmark's rule). ``splits``: the split names rows may carry (a scored-only file carries its own one, e.g.
    ``("other-voice",)``; nothing is then carved). ``min_train``: train rows each workflow must keep.
    ``carve=False``: no rows are held out (rows that name no split are in ``rows`` only: cases to score).
    ``labelled=False``: rows to answer, whose labels are not read. ``skip_bad``: a bad row is left out and named in
    ``record["skipped"]`` instead of stopping the load."""
    reading = Reading.of(reading, **options)
    source = read_source(data, reading.delimiter)
    schema = schema if schema is not None else source.schema
    schemas = load_schemas(schema) if schema is not None else None
    if not source.rows:
        raise DataError(f"{source.name}: no rows; expected one case a row")
    counts = Normalized()
    parsed, cases, skipped, given_ids, group = _parsed(source, schemas, reading, splits, counts, skip_bad, labelled)
    seen: dict[str, str] = {}
    for row in parsed:
        if row.id in seen:
            raise DataError(f"{row.where}: field {reading.id!r} {row.id!r} is used twice (first at {seen[row.id]}); "
                            "every row needs its own id")
        seen[row.id] = row.where
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
            held = _test_rows(free, _salt(seed, "test"), group)
            split_of.update(dict.fromkeys(held, "test"))
            free = [c for c in free if c.id not in held]
            rule.append(f"test: each row held out with chance {TEST_SHARE:.0%}, by its id's hash")
        if "validation" not in named:
            held = _carve(free, held_out_validation_rows, _salt(seed, "validation"), group)
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
                                f"split given, about {TEST_SHARE:.0%} go to test and {VALIDATION_SHARE:.0%} to "
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
    if isinstance(data, (str, Path)):  # where to read it again from, whatever the working folder then
        record["source path"] = str(Path(source.name).absolute())
    record["states"].update({"numbers read from strings": counts.numbers_from_strings,
                             "numbers missing (NaN)": counts.missing_numbers})
    columns = list(dict.fromkeys(c for row in parsed for c in row.columns))  # what the states were read from
    record.update({"state columns": columns, "reading": reading.to_json(),
                   "ids": "given" if given_ids else "from the state", "delimiter": source.delimiter,
                   "index column": source.index_column})
    if skip_bad:
        record["skipped"] = skipped
    return Decisions(by_split, workflows_schema, record, Split("all", cases, source.name),
                     {row.id: row.where for row in parsed})


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
            "benchmark": benchmark, "schema": schema_json(schema)}
