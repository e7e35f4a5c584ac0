"""Your own decisions: a schema of typed questions, your labelled examples, the same trainer.

A scenario is a folder with ``schema.json`` (questions in the System One shape: ``type``, ``instructions``,
``criteria``) and one examples file, JSON Lines or CSV. Each example has an ``id``, a ``split`` (train,
validation or test), a ``text`` (the state the model reads) and one label per question: an option key
(``"billing"``, ``"true"``, ``"2"``) or, for an ambiguous example, a distribution over options
(``{"billing": 0.6, "account_management": 0.4}``; options left out get 0). In a CSV, each question is a column
and a distribution is written as JSON in its cell.

``load_scenario("tickets", "train")`` returns a ``Split`` like ``load_typed_decisions``, so ``train``, ``metrics``
and ``decide`` work unchanged; the workflow name is the scenario's name. The project ships two scenarios as
package data in ``decisionkit/scenario_data/``: ``tickets`` (support tickets) and ``ngs-qc`` (sequencing
quality-control reports).

A scenario may also hold a **scored-only** split in a file of its own (``SCORED_ONLY``): cases that nothing is
trained on or chosen with, only scored. ``load_scenario("tickets", "other-voice")`` reads the tickets' one:
40 tickets written by an author who wrote none of ``tickets.jsonl``, in other registers, to measure how far the
model's scores carry to text written by other people.
"""

from __future__ import annotations

import csv
import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from .cases import Case, Gold, Split, jsonl_rows, probability_vector
from .questions import DataError, Question

# The project's own scenario folders, as package data (pyproject.toml lists them) so a wheel install finds them.
DATA_DIR = Path(str(files("decisionkit") / "scenario_data"))
SCENARIOS = ("tickets", "ngs-qc")
SPLIT_NAMES = ("train", "validation", "test")
# Scored-only splits: split name -> the file beside the examples that holds it (every row's ``split`` is the name).
# Nothing is trained on them or chosen with them; the trainer reads train, validation and test only.
SCORED_ONLY = {"other-voice": "other_voice.jsonl"}


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise DataError(f"duplicate keys {repeated}: every question name and option must be unique")
    return dict(pairs)


def load_schema(schema: dict | str | Path, where: str = "schema") -> dict[str, Question]:
    """Questions from a dict written in a notebook or from a JSON file (duplicate names or options refused)."""
    if not isinstance(schema, dict):
        where = str(schema)
        try:
            schema = json.loads(Path(schema).read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
        except DataError as err:
            raise DataError(f"{where}: {err}") from None
    if not isinstance(schema, dict) or not schema:
        raise DataError(f"{where}: a schema is an object of question name -> question, with at least one question")
    return {name: Question.from_json(name, question, where) for name, question in schema.items()}


def gold_from_label(question: Question, label: Any, where: str) -> Gold:
    """A hard label (an option key) or a distribution over options, as a gold distribution."""
    field = f"labels.{question.id}"
    if isinstance(label, bool) and question.type == "noul":
        label = str(label).lower()
    if isinstance(label, (str, int)) and not isinstance(label, bool):
        key = str(label)
        if key not in question.options:
            raise DataError(f"{where}: field '{field}' is {label!r}; expected one of {list(question.options)}")
        probs = np.zeros(len(question.options))
        probs[question.options.index(key)] = 1.0
        return Gold(probs, key)
    if isinstance(label, dict) and label:
        unknown = sorted(set(label) - set(question.options))
        if unknown:
            raise DataError(f"{where}: field '{field}' has options {unknown}; expected some of {list(question.options)}")
        probs = probability_vector(question, {o: label.get(o, 0.0) for o in question.options}, where, field)
        return Gold(probs, question.options[int(np.argmax(probs))])
    raise DataError(f"{where}: field '{field}' must be an option of {list(question.options)} or a distribution")


def example_case(row: Any, schema: dict[str, Question], workflow: str, where: str,
                 splits: tuple[str, ...] = SPLIT_NAMES) -> tuple[str, Case]:
    """(split, Case) of one labelled example whose ``split`` is one of ``splits``."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: an example must be an object with id, split, text and labels")
    for key in ("id", "text", "labels"):
        if key not in row:
            raise DataError(f"{where}: field '{key}' is missing; an example needs id, split, text and labels")
    split = row.get("split")
    if split not in splits:
        raise DataError(f"{where}: field 'split' is {split!r}; expected one of {', '.join(splits)}")
    text = row["text"]
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{where}: field 'text' is empty; every example needs the text the model reads")
    labels = row["labels"]
    if not isinstance(labels, dict):
        raise DataError(f"{where}: field 'labels' must be an object of question name -> label")
    missing = [q for q in schema if q not in labels]
    if missing:
        raise DataError(f"{where}: field 'labels' has no label for {missing}")
    extra = sorted(set(labels) - set(schema))
    if extra:
        raise DataError(f"{where}: field 'labels' names questions {extra} that the schema does not have")
    gold = {q: gold_from_label(question, labels[q], where) for q, question in schema.items()}
    return split, Case(str(row["id"]), workflow, text, dict(schema), gold)


def _csv_rows(path: Path, schema: dict[str, Question]):
    with path.open(encoding="utf-8", newline="") as handle:
        for lineno, row in enumerate(csv.DictReader(handle), start=2):
            labels = {}
            for q in schema:
                cell = row.get(q)
                if cell is not None and cell.strip().startswith("{"):
                    try:
                        cell = json.loads(cell)
                    except json.JSONDecodeError as err:
                        raise DataError(f"{path}:{lineno}: field 'labels.{q}' is not valid JSON ({err.msg})") from None
                if cell not in (None, ""):
                    labels[q] = cell
            yield f"{path}:{lineno}", {"id": row.get("id"), "split": row.get("split"), "text": row.get("text"),
                                       "labels": labels}


def load_examples(path: str | Path, schema: dict[str, Question], workflow: str, split: str) -> Split:
    """The examples of one split from a JSONL or CSV file, checked against ``schema``. A scored-only split's file
    (``SCORED_ONLY``) holds that split alone: a row of another split there is refused, as is one of it elsewhere."""
    names = SPLIT_NAMES + tuple(SCORED_ONLY)
    if split not in names:
        raise ValueError(f"split is {split!r}; expected one of {', '.join(names)}")
    allowed = (split,) if split in SCORED_ONLY else SPLIT_NAMES
    path = Path(path)
    rows = _csv_rows(path, schema) if path.suffix == ".csv" else jsonl_rows(path)
    cases, seen = [], set()
    for where, row in rows:
        row_split, case = example_case(row, schema, workflow, where, allowed)
        if case.id in seen:
            raise DataError(f"{where}: field 'id' {case.id!r} is used twice")
        seen.add(case.id)
        if row_split == split:
            cases.append(case)
    if not cases:
        raise DataError(f"{path}: no examples in split {split!r}")
    return Split(split, cases, str(path))


def scenario_folder(name_or_folder: str | Path) -> Path:
    folder = DATA_DIR / str(name_or_folder) if str(name_or_folder) in SCENARIOS else Path(name_or_folder)
    if not (folder / "schema.json").is_file():
        raise FileNotFoundError(f"{folder} has no schema.json; a scenario is one of {', '.join(SCENARIOS)} or a "
                                "folder with schema.json and one examples file (.jsonl or .csv)")
    return folder


def load_scenario(name_or_folder: str | Path, split: str = "train") -> Split:
    """One split of a scenario folder (``tickets``, ``ngs-qc`` or your own): train, validation or test from its
    examples file, or a scored-only split (``"other-voice"``) from that split's own file."""
    folder = scenario_folder(name_or_folder)
    if split in SCORED_ONLY:
        path = folder / SCORED_ONLY[split]
        if not path.is_file():
            raise FileNotFoundError(f"{folder} has no {SCORED_ONLY[split]}, the file of the scored-only split "
                                    f"{split!r} (the tickets scenario has one)")
        return load_examples(path, load_schema(folder / "schema.json"), folder.name, split)
    examples = sorted(p for p in folder.iterdir()
                      if p.suffix in (".jsonl", ".csv") and p.name not in SCORED_ONLY.values())
    if len(examples) != 1:
        raise FileNotFoundError(f"{folder} must hold exactly one examples file (.jsonl or .csv) beside any "
                                f"scored-only split's ({', '.join(SCORED_ONLY.values())}); found "
                                f"{[p.name for p in examples]}")
    schema = load_schema(folder / "schema.json")
    return load_examples(examples[0], schema, folder.name, split)
