"""The review queue read and answered: one store, three ways in (the server's ``/v1/reviews`` routes, the review page,
and Python: ``decisionkit.reviews(log)``, ``decisionkit.answer(log, id, ...)``).

A queued case is ``pending`` until someone answers it; then ``reviewed`` (its latest answer gives labels) or
``not-a-case`` (its latest answer says the input is not a case of the workflow: those feed the router's off-domain
set). Answers are appended, never changed: who, when, and the verb, ``accept`` (every label the model's own top
answer), ``correct`` (some label differs) or ``not-a-case``. A case answered by two people keeps both; ``agreement``
says how often they agree. Labels are read as the training loader reads them (``labels.gold_from_label``: an option
key; yes/no/true/false/1/0 for a yes/no question; a level for a score), so a reviewer's answer is a training row's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import sqlalchemy as sa

from ..core.answer_fields import answer_probabilities
from ..core.errors import UserError
from ..data.labels import gold_from_label
from ..data.questions import DataError, Question
from . import store
from .log import DecisionLog

STATUSES = ("pending", "reviewed", "not-a-case")
VERBS = ("accept", "correct", "not-a-case")
NOT_A_CASE = "not-a-case"


class ReviewNotFound(UserError, KeyError):
    """No queued case has this id (the server's 404)."""

    def __str__(self) -> str:
        return self.args[0]


class BadReview(UserError, ValueError):
    """An answer that cannot be recorded (the server's 422): ``loc`` names the field."""

    def __init__(self, message: str, loc: tuple = (), given: Any = None):
        super().__init__(message)
        self.loc, self.given = loc, given

    def detail(self) -> dict:
        return {"loc": ["body", *self.loc], "msg": str(self), "type": "value_error", "input": self.given}


def top_label(answer: Mapping) -> str:
    """The option a System One answer puts first (the first listed on a tie: a yes/no answer's "true" only when
    P(true) > 0.5, as ``numpy.argmax`` reads the probabilities in option order)."""
    probabilities = answer_probabilities(answer)
    return max(probabilities, key=probabilities.get)


@dataclass(frozen=True)
class Answer:
    """One person's answer to a queued case."""

    review_id: str
    reviewer: str
    verb: str
    labels: dict[str, str]
    at: float

    @property
    def status(self) -> str:
        """The status this answer gives its case, as the latest: ``not-a-case`` or ``reviewed``."""
        return NOT_A_CASE if self.verb == NOT_A_CASE else "reviewed"

    def to_json(self) -> dict:
        return {"reviewer": self.reviewer, "verb": self.verb, "labels": self.labels, "at": _iso(self.at)}


def _iso(at: float) -> str:
    return pd.Timestamp(at, unit="s", tz="UTC").isoformat(timespec="seconds")


_opened: dict[str, store.Store] = {}


def _engine(log: DecisionLog | str | Path) -> sa.Engine:
    """The engine of ``log`` (a DecisionLog), or of the log at that path or URL, opened once per process (it must
    exist: reading never creates one)."""
    if isinstance(log, DecisionLog):
        return log.store.engine
    key = store.url_of(log)[0]
    if key not in _opened:
        _opened[key] = store.open_store(log, create=False)
    return _opened[key].engine


def queue(log: DecisionLog | str | Path, status: str | None = None, limit: int | None = None) -> list[dict]:
    """The queued cases, each with its id, status, why it is queued, the state as it was sent, the questions, the
    model's answers and routing, and every answer so far: pending first (least confident first), then the rest,
    newest first. ``status``: only ``pending``, ``reviewed`` or ``not-a-case``."""
    if status is not None and status not in STATUSES:
        raise BadReview(f"status {status!r}: expected one of {', '.join(STATUSES)}", ("status",), status)
    engine = _engine(log)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(store.reviews))]
        answers = _answers(conn)
    items = [_item(row, answers.get(row["id"], [])) for row in rows]
    if status is not None:
        items = [i for i in items if i["status"] == status]
    pending = sorted((i for i in items if i["status"] == "pending"), key=lambda i: (i["confidence"], i["queued_at"]))
    done = sorted((i for i in items if i["status"] != "pending"), key=lambda i: i["queued_at"], reverse=True)
    return (pending + done)[:limit]


def _answers(conn, review_id: str | None = None) -> dict[str, list[Answer]]:
    query = sa.select(store.answers).order_by(store.answers.c.id)
    if review_id is not None:
        query = query.where(store.answers.c.review_id == review_id)
    found: dict[str, list[Answer]] = {}
    for r in conn.execute(query):
        found.setdefault(r.review_id, []).append(Answer(r.review_id, r.reviewer, r.verb, dict(r.labels), r.at))
    return found


def _status(answers: list[Answer]) -> str:
    return answers[-1].status if answers else "pending"


def _item(row: dict, answers: list[Answer]) -> dict:
    return {"id": row["id"], "status": _status(answers), "why": row["why"], "queued_at": row["at"],
            "model": row["model"], "version": row["version"], "workflow": row["workflow"], "state": row["state"],
            "questions": row["questions"], "answers": row["answers"], "confidence": row["confidence"],
            "routing": {"verdict": row["verdict"], "reason": row["reason"], "scores": row["scores"]},
            "reviews": [a.to_json() for a in answers], "folder": row["folder"], "request_id": row["request_id"]}


def public(item: dict) -> dict:
    """A queued case as ``GET /v1/reviews`` shows it: without the server's folder, times as ISO text."""
    shown = {k: v for k, v in item.items() if k != "folder"}
    shown["queued_at"] = _iso(item["queued_at"])
    return shown


def review(log: DecisionLog | str | Path, review_id: str) -> dict:
    """One queued case (``queue``'s item), or ReviewNotFound."""
    engine = _engine(log)
    with engine.connect() as conn:
        row = conn.execute(sa.select(store.reviews).where(store.reviews.c.id == review_id)).first()
        if row is None:
            raise ReviewNotFound(f"no queued case has id {review_id!r}; GET /v1/reviews lists them")
        return _item(dict(row._mapping), _answers(conn, review_id).get(review_id, []))


def checked_labels(item: dict, labels: Mapping[str, Any]) -> dict[str, str]:
    """The labels of an answer as option keys, each read as the loader reads a label, or BadReview naming the
    question (``answers.NAME``)."""
    out = {}
    for name, label in labels.items():
        if name not in item["questions"]:
            raise BadReview(f"answers.{name}: the case asks no question {name!r}; it asks {sorted(item['questions'])}",
                            ("answers", name), name)
        question = Question.parse(name, item["questions"][name])  # logged as the server checked it
        try:
            out[name] = gold_from_label(question, label, f"review {item['id']}", f"answers.{name}").label
        except DataError as err:
            raise BadReview(str(err), ("answers", name), label) from None
    return out


def answer(log: DecisionLog | str | Path, review_id: str, answers: Mapping[str, Any] | None = None,
           reviewer: str = "", not_a_case: bool = False, at: float | None = None) -> Answer:
    """Record ``reviewer``'s answer to the queued case ``review_id``: labels for some or all of its questions
    (``answers``: question -> label), or ``not_a_case``. Appended; an earlier answer stays."""
    if not isinstance(reviewer, str) or not reviewer.strip():
        raise BadReview("reviewer: give who answers (a name or an id)", ("reviewer",), reviewer)
    answers = dict(answers or {})
    if not_a_case and answers:
        raise BadReview("not_a_case: a case that is not one has no answers; send one or the other",
                        ("not_a_case",), True)
    if not not_a_case and not answers:
        raise BadReview("answers: give a label for at least one question, or not_a_case: true", ("answers",), {})
    item = review(log, review_id)
    labels = checked_labels(item, answers)
    if not_a_case:
        verb = NOT_A_CASE
    else:
        model_top = {q: top_label(a) for q, a in item["answers"].items()}
        verb = "accept" if all(model_top.get(q) == v for q, v in labels.items()) else "correct"
    recorded = Answer(review_id, reviewer.strip(), verb, labels, time.time() if at is None else at)
    with _engine(log).begin() as conn:
        conn.execute(store.answers.insert().values(review_id=review_id, at=recorded.at, reviewer=recorded.reviewer,
                                                   verb=verb, labels=labels))
    return recorded


def reviews(log: DecisionLog | str | Path) -> pd.DataFrame:
    """Every queued case as a row: id, status, why, workflow, model and version, the model's lowest confidence, its
    top answers, how many answered, the latest verb and labels, and when it was queued (UTC)."""
    rows = []
    for item in queue(log):
        latest = item["reviews"][-1] if item["reviews"] else {}
        rows.append({"id": item["id"], "status": item["status"], "why": item["why"], "workflow": item["workflow"],
                     "model": item["model"], "version": item["version"], "confidence": item["confidence"],
                     "model answers": {q: top_label(a) for q, a in item["answers"].items()},
                     "answered": len(item["reviews"]), "verb": latest.get("verb"), "labels": latest.get("labels"),
                     "reviewers": [r["reviewer"] for r in item["reviews"]],
                     "queued_at": pd.Timestamp(item["queued_at"], unit="s", tz="UTC")})
    return pd.DataFrame(rows, columns=["id", "status", "why", "workflow", "model", "version", "confidence",
                                       "model answers", "answered", "verb", "labels", "reviewers", "queued_at"])


def agreement(items: list[dict]) -> dict:
    """Between the people who answered the same case: the pairs of answers to one question (or to whether it is a
    case) and the share of them that agree. ``items``: ``queue``'s."""
    pairs = agreeing = cases = 0
    for item in items:
        latest = {}
        for a in item["reviews"]:  # each reviewer's latest answer
            latest[a["reviewer"]] = a
        people = list(latest.values())
        if len(people) < 2:
            continue
        cases += 1
        for i in range(len(people)):
            for j in range(i + 1, len(people)):
                a, b = people[i], people[j]
                if NOT_A_CASE in (a["verb"], b["verb"]):
                    pairs += 1
                    agreeing += a["verb"] == b["verb"]
                    continue
                for q in set(a["labels"]) & set(b["labels"]):
                    pairs += 1
                    agreeing += a["labels"][q] == b["labels"][q]
    return {"cases answered by two or more": cases, "pairs": pairs,
            "agreement": agreeing / pairs if pairs else None}
