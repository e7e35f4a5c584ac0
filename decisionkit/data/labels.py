"""Questions and labels as a user's data holds them: a schema read into ``Question``s, and each label read as a gold
distribution over its question's options.

- ``load_schema``: one workflow's questions (``{question: {...}}`` in the System One shape) from a dict or a JSON
  file, duplicate names or options refused; ``load_schemas``: the same for one workflow or several
  (``{workflow: {question: {...}}}``).
- ``gold_from_label``: a hard label (an option key; for a noul ``true``/``false``, ``yes``/``no``, ``y``/``n`` or
  ``1``/``0`` in any case, or a JSON boolean; an
  integer level or its string for a score) or a distribution (``{"option": p, ...}``, options left out get 0, as a
  dict or its JSON in a CSV cell; the benchmark's ``{"probabilities": ..., "label"}``) as a ``Gold``, or a
  ``DataError`` naming the row and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import MissingFile
from .cases import Gold, open_text, probability_vector
from .questions import DataError, Question


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise DataError(f"duplicate keys {repeated}: every question name and option must be unique")
    return dict(pairs)


def read_json_file(path: Path) -> Any:
    """A JSON file (``.json`` or ``.json.gz``, UTF-8 with or without a BOM), duplicate keys refused; every way it
    cannot be read is a DataError naming it."""
    if not path.is_file():
        raise MissingFile(f"{path} not found: expected a JSON file")
    try:
        with open_text(path) as handle:
            return json.loads(handle.read(), object_pairs_hook=_no_duplicate_keys)
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
        schema = read_json_file(Path(schema))
    if not isinstance(schema, dict) or not schema:
        raise DataError(f"{where}: a schema is an object of question name -> question, with at least one question")
    return {name: Question.from_json(name, question, where) for name, question in schema.items()}


def load_schemas(schema: dict | str | Path, where: str = "schema") -> dict[str | None, dict[str, Question]]:
    """A schema for one workflow (``{question: {...}}``: key None, it applies to every workflow of the data) or for
    several (``{workflow: {question: {...}}}``), as workflow -> question -> Question."""
    if not isinstance(schema, dict):
        where = str(schema)
        schema = read_json_file(Path(schema))
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


# the ways an export writes yes and no (any case): a noul's options are "false" and "true"
NOUL_WORDS = {"0": "false", "1": "true", "no": "false", "yes": "true", "n": "false", "y": "true",
              "false": "false", "true": "true"}


def scalar(value: Any) -> Any:
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
            return NOUL_WORDS.get(key)
        return key if key in question.options else None
    if isinstance(label, str):
        key = label.strip()
        if question.type == "noul":
            key = NOUL_WORDS.get(key.lower(), key.lower())
        if question.type == "score" and key not in question.options:  # a level named by its text ("moderate")
            named = [o for o, text in zip(question.options, question.descriptions) if text.strip().lower() == key.lower()]
            key = named[0] if len(named) == 1 else key
        return key if key in question.options else None
    return None


def gold_from_label(question: Question, label: Any, where: str, field_name: str | None = None) -> Gold:
    """A hard label or a distribution over options (a dict, or its JSON in a string) as a gold distribution;
    a DataError naming ``where`` and the field otherwise."""
    name = field_name or question.id
    label = scalar(label)
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
        label = {str(k): scalar(v) for k, v in label.items()}
        if question.type in ("noul", "score"):  # true/false, 0/1; a score's levels by their text too
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
        levels = ", ".join(f"{o} = {d!r}" for o, d in zip(question.options, question.descriptions))
        hint = {"noul": " (or yes/no, y/n, true/false, 1/0, in any case)",
                "score": f" (a level's number or its text: {levels})"}.get(question.type, "")
        raise DataError(f"{where}: field '{name}' is {label!r}; expected one of {list(question.options)}{hint} or a "
                        "distribution over them")
    probs = np.zeros(len(question.options))
    probs[question.options.index(key)] = 1.0
    return Gold(probs, key)
