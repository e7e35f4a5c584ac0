"""One row of a user's export read into a case: which column is what, and how the state is made.

``Reading`` holds how an export's columns are read, the same options for ``decisionkit train``, ``evaluate`` and
``predict`` (flags) and for ``decisionkit.train``, ``evaluate``, ``predict`` and ``load_decisions`` (keyword
arguments): ``workflow`` (the one workflow of rows that name none; default ``decisions``, never the file's name, so
renaming an export changes nothing), ``state_columns``, ``text_column``, ``id_column``, ``ignore_columns`` and
``delimiter`` (a CSV's, else found from its rows).

A row's columns, by role: its id (``id``, or ``id_column``), ``workflow``, ``split``, the labels (a column per
question, or a ``labels`` / ``gold`` object), per-row ``questions``, the ignored columns, and the state, which is

- ``text_column``: that column, as text whatever it holds;
- ``state_columns``: a state built from those columns (``states.flat_state``);
- else a ``state`` column (a JSON object, one encoded in the cell, or text: ``states.read_state``) or a ``text``
  column (text);
- else, a **flat table**, every other column: the state's fields, one a column, typed as the user means them.

A column that is none of these is refused with the flag that would read it, so nothing is read without being named.
``parse_row`` reads one row (``Row``); ``Row.case`` its labels into gold distributions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Sequence

from .cases import Case, json_field
from .labels import gold_from_label, scalar
from .questions import DataError, Question
from .states import Normalized, flat_state, read_state

DEFAULT_WORKFLOW = "decisions"  # the workflow of rows that name none, unless Reading.workflow names it
ROLES = ("workflow", "split", "questions", "labels", "gold")  # with the id column: what a row holds beside its state


def _columns(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Column names given as a list or as one comma-separated string (``--ignore-columns a,b``)."""
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(str(n).strip() for n in names if str(n).strip())
    if not names:
        raise DataError("an empty list of columns; name at least one (a,b,c)")
    return names


@dataclass(frozen=True)
class Reading:
    """How the rows of an export are read (see the module docstring); every field optional."""

    workflow: str | None = None
    state_columns: tuple[str, ...] | None = None
    text_column: str | None = None
    id_column: str | None = None
    ignore_columns: tuple[str, ...] = ()
    delimiter: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "state_columns", _columns(self.state_columns))
        object.__setattr__(self, "ignore_columns", _columns(self.ignore_columns) if self.ignore_columns else ())
        if self.state_columns and self.text_column:
            raise DataError("give state_columns (a state of several columns) or text_column (a text state), not both")

    @classmethod
    def of(cls, reading: "Reading | dict | None" = None, **options) -> "Reading":
        """A Reading from another, a dict (a saved record's) or keyword arguments (None ones left out)."""
        base = asdict(reading) if isinstance(reading, Reading) else dict(reading or {})
        unknown = sorted((set(base) | set(options)) - set(READING_OPTIONS))
        if unknown:
            raise TypeError(f"unknown reading options {unknown}; expected some of {', '.join(READING_OPTIONS)}")
        return cls(**{**base, **{k: v for k, v in options.items() if v is not None}})

    def to_json(self) -> dict:
        """The options set (what the data record keeps, to read the source again the same way)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if v not in (None, ())}

    @property
    def id(self) -> str:
        return self.id_column or "id"


READING_OPTIONS = tuple(f.name for f in fields(Reading))


@dataclass
class Row:
    """One row as read: where it is, its id (None: it names none, and gets its content's), workflow, split, state,
    questions and labels (question -> the label as the row gave it, and the field that held it)."""

    where: str
    id: str | None
    workflow: str
    split: str | None
    state: Any
    questions: dict[str, Question]
    labels: dict[str, tuple[Any, str]]
    columns: tuple[str, ...] = ()  # the columns the state was read from

    def case(self, labelled: bool = True) -> Case:
        """The row as a Case: its labels read as gold distributions (none when ``labelled`` is False: rows to
        answer)."""
        gold = {qid: gold_from_label(q, label, self.where, name) for qid, q in self.questions.items()
                for label, name in [self.labels[qid]]} if labelled else {}
        return Case(self.id, self.workflow, self.state, dict(self.questions), gold)


def _text(value: Any, where: str, name: str) -> str:
    value = scalar(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{where}: field '{name}' is {'empty' if value is not None else 'missing'}; every row needs "
                        "the state the model reads")
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{name}' is {type(value).__name__} {value!r}; expected text")
    return value


def _state(value: Any, where: str, counts: Normalized) -> Any:
    """The state of a ``state`` value: an object (or a cell holding one), else text."""
    value, is_json = read_state(scalar(value), where, counts=counts)
    if is_json:
        return value
    if isinstance(value, str):
        return _text(value, where, "state")
    if value is None:
        raise DataError(f"{where}: field 'state' is missing; every row needs a state (a JSON object or text)")
    raise DataError(f"{where}: field 'state' is {type(value).__name__} {value!r}; expected a JSON object or text")


def _questions(row: dict, where: str, schemas: dict[str | None, dict[str, Question]] | None,
               workflow: str) -> dict[str, Question]:
    given = row.get("questions")
    if given is not None:
        questions_json = json_field(scalar(given), "questions", where)
        if not isinstance(questions_json, dict) or not questions_json:
            raise DataError(f"{where}: field 'questions' must be a non-empty object of question name -> question")
        return {qid: Question.from_json(qid, q, where) for qid, q in questions_json.items()}
    if schemas is None:
        raise DataError(f"{where}: no questions: give a schema (schema= or --schema, a schema.json beside the "
                        "examples) or a field 'questions' in every row")
    if None in schemas:
        return schemas[None]
    if workflow in schemas:
        return schemas[workflow]
    raise DataError(f"{where}: field 'workflow' is {workflow!r}; the schema has questions for {sorted(schemas)}")


def _unread(name: str, where: str, questions: dict, reading: Reading) -> DataError:
    return DataError(f"{where}: column {name!r} is none of the id ({reading.id!r}), workflow, split, state and the "
                     f"questions' labels ({', '.join(questions)}); --id-column {name} reads it as the row's id, "
                     f"--ignore-columns {name} leaves it out, --state-columns builds the state from columns that "
                     "include it (the keyword arguments id_column, ignore_columns, state_columns alike)")


def parse_row(raw: Any, where: str, schemas: dict[str | None, dict[str, Question]] | None, reading: Reading,
              splits: tuple[str, ...], counts: Normalized, decimal_comma: bool = False) -> Row:
    """One row read by its columns' roles (the module docstring); a DataError names the row and the field."""
    if not isinstance(raw, dict):
        raise DataError(f"{where}: a row must be an object (id?, workflow?, split?, state, labels), got "
                        f"{type(raw).__name__}")
    row = {str(k).strip(): v for k, v in raw.items()}
    wf = scalar(row.get("workflow"))
    wf = (reading.workflow or DEFAULT_WORKFLOW) if wf is None or str(wf).strip() == "" else str(wf)
    questions = _questions(row, where, schemas, wf)
    nested = "labels" if "labels" in row else "gold" if "gold" in row else None
    roles = {reading.id, *ROLES, *reading.ignore_columns, *([] if nested else questions)}
    if reading.text_column:
        state, used = _text(row.get(reading.text_column), where, reading.text_column), [reading.text_column]
    elif reading.state_columns:
        absent = [c for c in reading.state_columns if c not in row]
        if absent:
            raise DataError(f"{where}: state column {absent[0]!r} is missing; the row has {', '.join(row)}")
        used = list(reading.state_columns)
        state = flat_state(((c, row[c]) for c in reading.state_columns), where, decimal_comma, counts)
    elif "state" in row:
        state, used = _state(row["state"], where, counts), ["state"]
    elif "text" in row:
        state, used = _text(row["text"], where, "text"), ["text"]
    else:  # a flat table: every other column is a field of the state
        used = [c for c in row if c not in roles]
        if not used:
            raise DataError(f"{where}: the row has no state: no 'state' or 'text' column and no column besides the id, "
                            "workflow, split and labels; give the state's columns (--state-columns a,b,c)")
        state = flat_state(((c, row[c]) for c in used), where, decimal_comma, counts)
    extra = [k for k in row if k not in roles and k not in used and scalar(row[k]) not in (None, "")]
    if extra:
        raise _unread(extra[0], where, questions, reading)
    if reading.id_column and reading.id_column not in row:
        raise DataError(f"{where}: field {reading.id_column!r} is missing; --id-column names the column of the ids")
    case_id = scalar(row.get(reading.id))
    case_id = None if case_id is None or str(case_id).strip() == "" else str(case_id).strip()
    split = scalar(row.get("split"))
    split = None if split is None or str(split).strip() == "" else str(split).strip()
    if split is not None and split not in splits:
        raise DataError(f"{where}: field 'split' is {split!r}; expected one of {', '.join(splits)} (or none: the "
                        "loader then holds out validation and test itself)")
    if nested:
        labels = json_field(scalar(row[nested]), nested, where)
        if not isinstance(labels, dict):
            raise DataError(f"{where}: field '{nested}' must be an object of question name -> label")
        unknown = sorted(set(labels) - set(questions))
        if unknown:
            raise DataError(f"{where}: field {nested + '.' + unknown[0]!r} is not a question of the schema (its "
                            f"questions: {', '.join(questions)})")
        found = {q: (labels.get(q), f"{nested}.{q}") for q in questions}
    else:
        found = {q: (row.get(q), q) for q in questions}
    return Row(where, case_id, wf, split, state, questions, found, tuple(used))
