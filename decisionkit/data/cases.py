"""The typed-decisions benchmark as small typed objects.

A *case* is one workflow state plus five typed questions about it. Each question has a fixed option order
(its answer keys), and each gold answer is a soft teacher distribution aligned to that order:

- ``noul``   yes/no; options ``("false", "true")``
- ``choice`` one of two or more named options, in the order the question lists them
- ``score``  an ordinal level; options ``("0", "1", ...)``, lowest first

``load_typed_decisions(split)`` reads the upstream JSON Lines schema (``id, workflow, state, questions, gold``)
from a folder, or from the Hugging Face hub when a folder is not given and the hub is reachable.
The splits are train 1,120 / validation 80 (20 per workflow, chosen by a hash of the case id) / test 400.
Nothing downstream may fit on ``test``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

import numpy as np
import pandas as pd

from ..core import settings
from ..core.errors import MissingFile
from ..core.extras import needs_extra
from .questions import QUESTION_TYPES, DataError, Question

HUB_ID = "LocalLLaMA/typed-decisions"  # the public benchmark on the Hugging Face hub
HUB_CONFIG = "all"  # the config holding all four workflows
SPLITS = ("train", "validation", "test")
VALIDATION_PER_WORKFLOW = 20  # 4 workflows x 20 = the 80-case validation split
WORKFLOWS = ("agent_trace_observability", "customer_service", "invoice_processing", "security_incidents")
DEV_PER_WORKFLOW = 40  # 4 x 40 = a 160-case dev slice of train: 800 decisions rank close variants (80 cases cannot)
RENDER_VERSION = "compact-json-v1"  # bump when render_state changes: cached features depend on it
PROBABILITY_TOLERANCE = 1e-3  # gold maps are 6-decimal means of three samples; they sum to 1 within 2e-5


def probability_vector(question: Question, probs: dict, where: str, field: str) -> np.ndarray:
    """``probs`` (every option of ``question`` -> probability) as an array in option order; a DataError names
    ``field`` when a value is not a finite number >= 0 or the values do not sum to 1."""
    values = [probs[k] for k in question.options]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in values):
        raise DataError(f"{where}: field '{field}' must hold finite numbers >= 0; got {values}")
    array = np.asarray(values, dtype=np.float64)
    if abs(array.sum() - 1.0) > PROBABILITY_TOLERANCE:
        raise DataError(f"{where}: field '{field}' sums to {array.sum():.6f}; expected 1")
    return array


@dataclass(frozen=True)
class Gold:
    """A soft gold answer: probabilities aligned to the question's options, and the stored label."""

    probabilities: np.ndarray
    label: str

    @property
    def top(self) -> int:
        """The index of the gold's most likely option, ties to the first-listed (the benchmark's accuracy rule)."""
        return int(np.argmax(self.probabilities))

    @classmethod
    def from_json(cls, question: Question, obj: Any, where: str = "gold") -> "Gold":
        name = f"gold.{question.id}"
        if not isinstance(obj, dict) or not isinstance(obj.get("probabilities"), dict):
            raise DataError(f"{where}: field '{name}.probabilities' is missing; expected an object of answer -> probability")
        probs = obj["probabilities"]
        if set(probs) != set(question.options):
            raise DataError(
                f"{where}: field '{name}.probabilities' has keys {sorted(probs)}; "
                f"expected the question's options {list(question.options)}"
            )
        array = probability_vector(question, probs, where, f"{name}.probabilities")
        label = obj.get("label", question.options[int(np.argmax(array))])
        if label not in question.options:
            raise DataError(f"{where}: field '{name}.label' is {label!r}; expected one of {list(question.options)}")
        return cls(array, label)


@dataclass(frozen=True)
class Case:
    """One benchmark case: a workflow state, its questions (in order) and their gold answers."""

    id: str
    workflow: str
    state: Any
    questions: dict[str, Question]
    gold: dict[str, Gold]

    @classmethod
    def from_json(cls, obj: Any, where: str = "case") -> "Case":
        if not isinstance(obj, dict):
            raise DataError(f"{where}: a case must be a JSON object, got {type(obj).__name__}")
        for key in ("id", "workflow", "state", "questions", "gold"):
            if key not in obj:
                raise DataError(f"{where}: field '{key}' is missing; a case needs id, workflow, state, questions, gold")
        # The hub's parquet stores the nested columns as JSON strings.
        state, questions, gold = (obj["state"], *(json_field(obj[k], k, where) for k in ("questions", "gold")))
        if not isinstance(questions, dict) or not questions:
            raise DataError(f"{where}: field 'questions' must be a non-empty object of question id -> question")
        if not isinstance(gold, dict):
            raise DataError(f"{where}: field 'gold' must be an object of question id -> gold answer")
        parsed = {qid: Question.from_json(qid, q, where) for qid, q in questions.items()}
        for qid in parsed:
            if qid not in gold:
                raise DataError(f"{where}: field 'gold.{qid}' is missing; every question needs a gold answer")
        extra = sorted(set(gold) - set(parsed))
        if extra:
            raise DataError(f"{where}: field 'gold' has answers for unknown questions {extra}")
        golds = {qid: Gold.from_json(q, gold[qid], where) for qid, q in parsed.items()}
        return cls(str(obj["id"]), str(obj["workflow"]), state, parsed, golds)

    def to_json(self) -> dict:
        """The case in the benchmark's row shape (``Case.from_json`` reads it back as it was)."""
        return {"id": self.id, "workflow": self.workflow, "state": self.state,
                "questions": {q: v.to_json() for q, v in self.questions.items()},
                "gold": {q: {"probabilities": dict(zip(self.questions[q].options, g.probabilities.tolist())),
                             "label": g.label} for q, g in self.gold.items()}}

    @property
    def text(self) -> str:
        """The model input for this case (see ``render_state``)."""
        return render_state(self.state, self.workflow)


def json_field(value: Any, name: str, where: str) -> Any:
    """A nested field (``questions``, ``labels``, ``gold``) as its JSON when a CSV or parquet holds it as a string."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: field '{name}' is a string that is not valid JSON ({err.msg})") from None
    return value


def render_state(state: Any, workflow: str | None = None) -> str:
    """Turn a workflow state into model input text: a workflow line, then the state as compact JSON.

    Compact JSON keeps every field the teacher saw at about 80% of the indented length (latency grows with
    tokens). A plain string state (a ticket, a report) is used as it is.
    """
    body = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return f"workflow: {workflow}\n{body}" if workflow else body


@dataclass
class Split:
    """A list of cases with the facts a notebook shows about it."""

    name: str
    cases: list[Case]
    source: str

    def __len__(self) -> int:
        return len(self.cases)

    def __iter__(self) -> Iterator[Case]:
        return iter(self.cases)

    def __getitem__(self, index: int) -> Case:
        return self.cases[index]

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.cases]

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.cases]

    @property
    def states(self) -> list[Any]:
        """The state of each case, as the data holds it (a hybrid model reads its fields)."""
        return [c.state for c in self.cases]

    @property
    def workflows(self) -> list[str]:
        """The distinct workflows, sorted."""
        return sorted({c.workflow for c in self.cases})

    @property
    def case_workflows(self) -> list[str]:
        """The workflow of each case, in order."""
        return [c.workflow for c in self.cases]

    def schema(self) -> dict[str, dict[str, Question]]:
        """workflow -> question id -> Question, as the cases ask them."""
        out: dict[str, dict[str, Question]] = {}
        for case in self.cases:
            out.setdefault(case.workflow, case.questions)
        return out

    def head(self, per_workflow: int) -> "Split":
        """The first ``per_workflow`` cases of each workflow (quick mode uses this)."""
        taken: Counter = Counter()
        kept = []
        for case in self.cases:
            if taken[case.workflow] < per_workflow:
                taken[case.workflow] += 1
                kept.append(case)
        return Split(self.name, kept, self.source)

    def questions_table(self) -> pd.DataFrame:
        """The typed questions of each workflow with their options, in the order the heads answer them."""
        rows = [{"workflow": workflow, "question": qid, "type": q.type, "options": ", ".join(q.options),
                 "instructions": q.instructions}
                for workflow, questions in self.schema().items() for qid, q in questions.items()]
        return pd.DataFrame(rows).set_index(["workflow", "question"])

    def table(self) -> pd.DataFrame:
        """Cases and decisions per workflow, with the question types asked."""
        rows = []
        for workflow in self.workflows:
            cases = [c for c in self.cases if c.workflow == workflow]
            types = Counter(q.type for c in cases for q in c.questions.values())
            rows.append({"workflow": workflow, "cases": len(cases), **{t: types.get(t, 0) for t in QUESTION_TYPES}})
        return pd.DataFrame(rows).set_index("workflow")


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """``path`` opened as UTF-8 text, a byte-order mark skipped (Excel and Windows tools write one), decompressed
    when its name ends in ``.gz`` (any case)."""
    path = Path(path)
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline=newline)
    return path.open(encoding="utf-8-sig", newline=newline)


def jsonl_rows(path: str | Path) -> Iterator[tuple[str, Any]]:
    """``(file:line, parsed object)`` for every non-blank line of a JSON Lines file (``open_text``: UTF-8, a BOM
    skipped, ``.gz`` read); a line that is not JSON, or not UTF-8, raises a DataError naming the file and the line."""
    path = Path(path)
    try:
        with open_text(path) as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def not_utf8(path: Path, hint: str = "") -> DataError:
    """The refusal of a file that is not UTF-8, naming the line and the first byte that is not (found again in the
    whole file: a text reader decodes ahead of the line it gives)."""
    with (gzip.open(path) if path.suffix.lower() == ".gz" else path.open("rb")) as handle:
        data = handle.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        return DataError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}); save the file as UTF-8 "
                         f"{hint}".rstrip())
    return DataError(f"{path}: not UTF-8 text")


def read_jsonl(path: str | Path) -> list[Case]:
    """Parse a typed-decisions JSON Lines file; errors name the file, the line and the field."""
    return [Case.from_json(obj, where) for where, obj in jsonl_rows(path)]


def _hashed_ids(cases: Iterable[Case], per_workflow: int | dict[str, int], salt: str = "") -> set[str]:
    """``per_workflow`` cases of each workflow (one count for all, or workflow -> count), chosen by the SHA-256 of
    ``salt + id``: deterministic whatever the file order."""
    by_workflow: dict[str, list[str]] = {}
    for case in cases:
        by_workflow.setdefault(case.workflow, []).append(case.id)
    chosen = set()
    for workflow, ids in by_workflow.items():
        ids.sort(key=lambda i: hashlib.sha256(f"{salt}{i}".encode()).hexdigest())
        chosen.update(ids[:per_workflow if isinstance(per_workflow, int) else per_workflow.get(workflow, 0)])
    return chosen


def dev_slice(train: Split, per_workflow: int | dict[str, int] = DEV_PER_WORKFLOW) -> tuple[Split, Split]:
    """``(fit, dev)``: ``per_workflow`` cases of each workflow of ``train`` (one count, or workflow -> count) held
    out (by a hash of the id) for
    picking a configuration or a training step, and the rest to fit on. The validation split stays free for
    calibration and thresholds, the test split for the final score."""
    held = _hashed_ids(train, per_workflow, salt="dev:")
    return (Split(f"{train.name} - dev", [c for c in train if c.id not in held], train.source),
            Split("dev", [c for c in train if c.id in held], train.source))


def _read_hub(upstream_split: str) -> tuple[list[Case], str]:
    with needs_extra("typed-decisions from the hub"):  # imported here: only the online path needs it
        from datasets import load_dataset

    rows = load_dataset(HUB_ID, HUB_CONFIG, split=upstream_split)
    where = f"hub:{HUB_ID}/{upstream_split}"
    return [Case.from_json(row, f"{where} row {i}") for i, row in enumerate(rows)], where


def load_typed_decisions(split: str = "train", data_dir: str | Path | None = None) -> Split:
    """Load one split of typed-decisions.

    The folder is ``data_dir``, else ``$DECISIONKIT_DATA``; with neither, the hub is tried (needs internet).
    """
    if split not in SPLITS:
        raise ValueError(f"split is {split!r}; expected one of {', '.join(SPLITS)}")
    upstream = "test" if split == "test" else "train"
    folder = Path(data_dir).expanduser() if data_dir is not None else settings.data_dir()
    if folder is not None:
        path = folder / f"{upstream}.jsonl"
        if not path.is_file():
            raise MissingFile(f"{path} not found: the typed-decisions folder needs train.jsonl and test.jsonl")
        cases, source = read_jsonl(path), str(path)
    else:
        try:
            cases, source = _read_hub(upstream)
        except Exception as err:  # offline, or the hub refused: say how to point at a local copy
            raise MissingFile(
                f"typed-decisions not found: pass data_dir=..., or set {settings.DATA_ENV} to a folder with "
                f"train.jsonl and test.jsonl, or go online to read {HUB_ID} from the hub ({err})"
            ) from err
    if split != "test":
        held_out = _hashed_ids(cases, VALIDATION_PER_WORKFLOW)
        cases = [c for c in cases if (c.id in held_out) == (split == "validation")]
    return Split(split, cases, source)


@dataclass
class LengthStats:
    """Token lengths of a split's rendered states (latency and memory grow with them); with a ``window`` (the
    tokens a backbone reads at once), how many states are longer and so read in more than one window."""

    split: str
    lengths: np.ndarray
    workflows: list[str] = field(repr=False)
    window: int | None = None

    def table(self) -> pd.DataFrame:
        frame = pd.DataFrame({"workflow": self.workflows, "tokens": self.lengths})
        rows = {"all": frame["tokens"], **{w: g["tokens"] for w, g in frame.groupby("workflow")}}
        over = {} if self.window is None else {"over window": lambda s: int((s > self.window).sum())}
        return pd.DataFrame(
            {
                name: {
                    "cases": len(s),
                    "mean": round(float(s.mean()), 1),
                    "median": float(s.median()),
                    "p95": float(np.percentile(s, 95)),
                    "max": int(s.max()),
                    **{column: count(s) for column, count in over.items()},
                }
                for name, s in rows.items()
            }
        ).T

    def figure(self):
        from ..core.plots import length_histogram

        return length_histogram(self)


def token_lengths(split: Split, tokenizer, window: int | None = None) -> LengthStats:
    """Count the tokens of every rendered case in ``split``, past the backbone's maximum too (``verbose=False``: the
    tokenizer's warning about a sequence longer than that is for inputs fed to the model, and this one is not);
    ``window``: the tokens the backbone reads at once, counted against."""
    lengths = np.array([len(ids) for ids in tokenizer(split.texts, verbose=False)["input_ids"]])
    return LengthStats(split.name, lengths, [c.workflow for c in split], window)
