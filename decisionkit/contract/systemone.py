"""The System One contract: the wire format of ``POST /v1/systemone`` and ``GET /v1/models``.

The pydantic models follow the official client's (``typesafe-sdk`` 0.7.5, ``typesafe_sdk/_schemas/models.py``)
field for field. A request is ``{"model", "state", "questions": {name: question}, "assets"?}``, each question a
noul, choice or score question (box questions, about images, are refused) in the one question model that the data
files share (``data/questions.py``), and a response ``{"model", "answers": {name: answer}, "usage": {"input_tokens", "output_tokens"}}``, an answer

- noul:   ``{"type": "noul", "noul": P(true)}``
- choice: ``{"type": "choice", "choice": top, "confidence", "probabilities": {option: p}}``
- score:  ``{"type": "score", "score": expected level, "confidence", "legend": {"0": criterion}, "probabilities"}``

Two optional fields are decisionkit's own: ``workflow`` in the request, for a model trained on several workflows
when the questions alone do not tell which (the SDK sends it with ``extra_body={"workflow": ...}``), and
``routing`` (``{"verdict", "reason", "scores"}``) in the response of a model that carries a router. Such a model's
answers are distance-aware already (``anomaly``): far from the training data, every ``confidence`` falls towards 0,
so a client that reads only the contract's fields routes on ``confidence`` alone; ``routing`` says why.
Unknown fields are refused, so a misspelt one is named instead of ignored. A refusal is status 422 with
``{"detail": [{"loc", "msg", "type", "input"}]}``, ``loc`` naming the field.

The rest of the module turns a request into model inputs and probabilities into answers: ``check`` (questions
against the trained heads, the workflow) and ``checked`` (a ``Checked`` request: that, with the state rendered),
``answer`` (one answer from a probability vector), ``prepare`` and ``respond`` (a wire request through the model and
back: checked and tokenized once, in ``prepare``), used alike by ``DecisionModel.decide``, the ``decisionkit decide``
command and the server.

A rendered state longer than the model's window (``FeatureSpec.max_length`` tokens) is read in windows of that
length, pooled across them, up to the model's cap of ``max_windows`` windows (``state_windows``); past the cap the
request is refused (422 ``too_long`` on field 'state', and the same ``QuestionError`` from ``decide``) rather than cut,
since a client cannot see a cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema

from ..core.answer_fields import answer_confidence
from ..core.errors import UserError
from ..data.cases import render_state
from ..data.questions import AnyQuestion, Contract, InvalidQuestion, JSONText, Question
from ..data.states import json_state

MAX_STATE_DEPTH = 64  # typed-decisions states nest about 5 deep; far deeper is a mistake or an attack


# ----- requests ---------------------------------------------------------------------------------------------------
class Asset(Contract):
    type: Literal["image"] | None = Field(None, description="Identifies an image asset.")
    format: Literal["png", "jpg", "jpeg"] | None = Field(None, description="The image format, with data_base64.")
    data_base64: str | None = Field(None, description="Base64-encoded image data.")
    part: str | None = Field(None, description="In a multipart request, the name of the image part.")


def checked_state(state: Any) -> Any:
    """The state as given, if it is a text, an object or an array that holds something, every number finite,
    nested at most MAX_STATE_DEPTH deep."""
    if not isinstance(state, (str, dict, list)):
        raise ValueError(f"state must be a string, an object or an array; got {json_type(state)}")
    if isinstance(state, str) and not state.strip():
        raise ValueError("state is an empty string; send the text or the JSON state the questions are about")
    if isinstance(state, (dict, list)) and not state:
        raise ValueError(f"state is an empty {type(state).__name__}; send the state the questions are about")
    stack = [(state, 1)]
    while stack:  # iterative: a deep state must not exhaust the interpreter's stack
        value, depth = stack.pop()
        if depth > MAX_STATE_DEPTH:
            raise ValueError(f"state is nested more than {MAX_STATE_DEPTH} levels deep")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"state holds {value}, which is not a JSON number")
        if isinstance(value, (dict, list)):
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return state


def json_type(value: Any) -> str:
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    return names.get(type(value), type(value).__name__)


STATE_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}], "title": "State"}


class SystemOneRequest(Contract):
    model: str = Field(description="Name of the model to use, as GET /v1/models lists it.")
    state: Annotated[Any, AfterValidator(checked_state), WithJsonSchema(STATE_SCHEMA)] = Field(
        description="The content all questions in this request refer to: a text, a JSON object or an array.")
    questions: dict[str, AnyQuestion] = Field(min_length=1, description="Questions about the content, each with a "
                                                                        "name you choose; answers use those names.")
    assets: dict[str, Asset] | None = Field(None, min_length=1, description="Media assets (refused: these models "
                                                                            "read text).")
    workflow: str | None = Field(None, description="decisionkit extension: the workflow the state comes from, for a "
                                                   "model trained on several when the questions do not tell.")


# ----- responses --------------------------------------------------------------------------------------------------
class NoulAnswer(Contract):
    type: Literal["noul"]
    noul: float = Field(description="Probability of a yes answer or a true statement, from 0 to 1.")


class ChoiceAnswer(Contract):
    type: Literal["choice"]
    choice: str = Field(description="The choice with the highest probability.")
    confidence: float = Field(description="Confidence in the selected choice, from 0 to 1.")
    probabilities: dict[str, float] = Field(description="Probability of each choice, keyed by choice name.")


class ScoreAnswer(Contract):
    type: Literal["score"]
    score: float = Field(description="Expected score: the probability-weighted average of the levels.")
    confidence: float = Field(description="Confidence in the score, from 0 to 1.")
    legend: dict[str, JSONText] = Field(description="The requested criteria keyed by their score levels.")
    probabilities: dict[str, float] = Field(description="Probability of each score level, keyed as legend.")


AnyAnswer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class Usage(Contract):
    input_tokens: int = Field(description="Tokens of the rendered state the model read.")
    output_tokens: int = Field(description="Tokens generated: always 0, a decision model generates none.")


class Routing(Contract):
    verdict: Literal["answer", "human"] = Field(description="The router's verdict: answer, or send to a human.")
    reason: str = Field(description="Which score decided, against which threshold.")
    scores: dict[str, float] = Field(description="Every anomaly score: confidence (the lowest of the answers), "
                                                 "raw confidence (the heads alone), msp, entropy, energy, "
                                                 "mahalanobis (the distance to the training features), "
                                                 "field surprise (a hybrid's: the share of the state's field "
                                                 "checks that fail) and in-domain (the weight the heads' "
                                                 "answers kept, 0 to 1).")


class SystemOneResponse(Contract):
    model: str = Field(description="Name of the model that answered.")
    answers: dict[str, AnyAnswer] = Field(min_length=1, description="Answers keyed by the question names.")
    usage: Usage
    routing: Routing | None = Field(None, description="decisionkit extension, from a model with a routing "
                                                      "threshold: answer, or send to a human, and why.")


class ModelMetadata(Contract):
    name: str = Field(description="Model name accepted by the request's model field.")
    description: str = Field(description="What the model answers.")
    release_date: str = Field(description="When the model was saved, YYYY-MM-DD.")


class ModelMetadataList(Contract):
    models: list[ModelMetadata]


class ValidationErrorItem(BaseModel):
    loc: list[str | int] = Field(description="Path to the invalid value: 'body', then field names and indices.")
    msg: str
    type: str
    input: Any | None = None
    ctx: dict[str, Any] | None = None


class HTTPValidationError(BaseModel):
    detail: list[ValidationErrorItem] | None = None


# ----- checking a request against a model ----------------------------------------------------------------------------
class QuestionError(UserError, ValueError):
    """A request the model cannot answer as asked; ``loc`` is the field's path in the request."""

    def __init__(self, message: str, loc: Sequence[str | int] = (), kind: str = "value_error", given: Any = None):
        super().__init__(message)
        self.loc, self.kind, self.given = tuple(loc), kind, given

    def detail(self) -> dict:
        """The error as one item of a 422 response's ``detail``."""
        return {"loc": ["body", *self.loc], "msg": str(self), "type": self.kind, "input": self.given}


def question(name: str, asked: Any) -> Question:
    """A System One question (a request's JSON, or the pydantic model it was parsed into) as a typed ``Question``;
    a QuestionError names the field."""
    try:
        return Question.parse(name, asked)
    except InvalidQuestion as err:
        raise QuestionError(str(err), err.loc, err.kind, err.given) from None


def workflow_for(schema: Mapping[str, Mapping[str, Question]], questions: Mapping | None, workflow: str | None) -> str:
    """The workflow a request is about: the one named, the only one trained, or the only one asking all of
    ``questions``; otherwise a QuestionError says which to name."""
    if workflow is not None:
        if workflow not in schema:
            raise QuestionError(f"workflow {workflow!r} has no trained heads; expected one of {sorted(schema)}",
                                ("workflow",), "unknown_workflow", workflow)
        return workflow
    if len(schema) == 1:
        return next(iter(schema))
    if questions:
        fits = [wf for wf, qs in schema.items() if set(questions) <= set(qs)]
        if len(fits) == 1:
            return fits[0]
        if not fits:
            raise QuestionError(f"no trained workflow asks all of {sorted(questions)}; pass workflow= one of "
                                f"{sorted(schema)} (the request field 'workflow')", ("questions",), "unknown_questions",
                                sorted(questions))
    raise QuestionError(f"this model answers several workflows; pass workflow= one of {sorted(schema)} (the request "
                        "field 'workflow')", ("workflow",), "missing")


def check(schema: Mapping[str, Mapping[str, Question]], questions: Mapping | None,
          workflow: str | None) -> tuple[str, dict[str, Question]]:
    """(workflow, question name -> Question) for a request; without ``questions``, every trained question.
    Each asked question must match its trained head's type and options."""
    asked = None if questions is None else {name: question(name, q) for name, q in questions.items()}
    workflow = workflow_for(schema, asked, workflow)
    trained = schema[workflow]
    if asked is None:
        return workflow, dict(trained)
    for name, got in asked.items():
        if name not in trained:
            raise QuestionError(f"question {name!r}: no trained head in workflow {workflow!r}; trained questions are "
                                f"{list(trained)}", ("questions", name), "unknown_question", name)
        expected = trained[name]
        if got.type != expected.type:
            raise QuestionError(f"question {name!r}: type {got.type!r} differs from the trained head's "
                                f"{expected.type!r}", ("questions", name, "type"), "type_mismatch", got.type)
        if got.options != expected.options:
            raise QuestionError(f"question {name!r}: options {list(got.options)} differ from the trained head's "
                                f"{list(expected.options)}", ("questions", name, "criteria"), "options_mismatch",
                                list(got.options))
    return workflow, asked


# ----- answers ------------------------------------------------------------------------------------------------------
def answer(question: Question, probs: np.ndarray, confidence: float | None = None) -> dict:
    """One System One answer from a probability vector in option order. ``confidence`` defaults to the top
    probability (pass a separately calibrated one to override it)."""
    probs = np.asarray(probs, dtype=float)
    top = int(np.argmax(probs))
    confidence = float(probs[top]) if confidence is None else float(confidence)
    table = {option: float(p) for option, p in zip(question.options, probs)}
    if question.type == "noul":
        return {"type": "noul", "noul": table["true"]}
    if question.type == "choice":
        return {"type": "choice", "choice": question.options[top], "confidence": confidence, "probabilities": table}
    return {"type": "score", "score": float(np.dot(np.arange(len(probs)), probs)), "confidence": confidence,
            "legend": dict(zip(question.options, question.descriptions)), "probabilities": table}


def disagreements(got: Mapping[str, dict], expected: Mapping[str, dict], tolerance: float) -> list[str]:
    """Where two sets of answers to the same request differ beyond ``tolerance`` (``precision.ANSWER_TOLERANCE``
    of the compute dtype), one line per field; empty when they agree. Every probability, ``confidence`` and ``noul``
    within ``tolerance``; a score's expected level within ``tolerance`` times the sum of its levels (it is their
    probability-weighted sum); the same choice, unless the expected top two lie within ``2 * tolerance``."""
    if got.keys() != expected.keys():
        return [f"questions {sorted(got)} != {sorted(expected)}"]
    found = []
    for qid, want in expected.items():
        have = got[qid]
        if have.keys() != want.keys() or have["type"] != want["type"]:
            found.append(f"{qid}: {have.get('type')} {sorted(have)} != {want['type']} {sorted(want)}")
            continue
        probs = {str(k): v for k, v in want.get("probabilities", {}).items()}
        have_probs = {str(k): v for k, v in have.get("probabilities", {}).items()}
        if have_probs.keys() != probs.keys():
            found.append(f"{qid}.probabilities: options {sorted(have_probs)} != {sorted(probs)}")
            continue
        bounds = {"noul": tolerance, "confidence": tolerance, "score": tolerance * sum(range(len(probs)))}
        pairs = [(key, have[key], want[key], bounds[key]) for key in bounds if key in want]
        pairs += [(f"probabilities.{o}", have_probs[o], p, tolerance) for o, p in probs.items()]
        found += [f"{qid}.{key}: {a!r} != {b!r} (beyond {bound:g})" for key, a, b, bound in pairs if abs(a - b) > bound]
        if want.get("legend") is not None and {str(k): v for k, v in have["legend"].items()} != want["legend"]:
            found.append(f"{qid}.legend differs")
        if "choice" in want and have["choice"] != want["choice"] and \
                probs.get(have["choice"], -1.0) < probs[want["choice"]] - 2 * tolerance:
            found.append(f"{qid}.choice: {have['choice']!r} != {want['choice']!r}")
    return found


def answer_table(answers: Mapping[str, dict]):
    """System One answers as a pandas table: per question its type, the answer (the option, the expected level, or
    P(true)) and the confidence (a yes/no answer carries none: its top probability stands in)."""
    import pandas as pd

    rows = {qid: {"type": a["type"], "answer": a.get("choice", a.get("score", a.get("noul"))),
                  "confidence": answer_confidence(a)} for qid, a in answers.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


# ----- a wire request through a model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checked:
    """A request checked against a model's heads (``checked``): the state, its workflow, the questions asked, and
    the state rendered for that workflow (what the backbone reads)."""

    state: Any
    workflow: str
    questions: dict[str, Question]
    text: str


def checked(schema: Mapping[str, Mapping[str, Question]], state: Any, questions: Mapping | None = None,
            workflow: str | None = None) -> Checked:
    """``check`` a request's questions and workflow, and render its state: what ``DecisionModel.decide_checked``
    answers."""
    workflow, asked = check(schema, questions, workflow)
    state = json_state(state)  # read as training read it: a JSON-encoded state as its object, numbers as numbers
    return Checked(state, workflow, asked, render_state(state, workflow))


def state_windows(model, text: str) -> tuple[tuple[int, ...], ...]:
    """The rendered state ``text`` tokenized in the windows ``model`` reads (``model.windows_of``: windows of
    ``spec.max_length`` tokens, special tokens in each); a QuestionError on field 'state' (``too_long``) when it
    needs more than ``spec.max_windows`` of them."""
    return within_cap(model, model.windows_of([text])[0])


def within_cap(model, found: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """A rendered state's windows (``model.windows_of``) as they are, if ``model`` reads that many (at most
    ``spec.max_windows``); else the QuestionError on field 'state' that ``state_windows`` raises."""
    spec = model.spec
    if len(found) > spec.max_windows:
        tokens = sum(len(ids) for ids in found)
        raise QuestionError(f"field 'state' is {tokens} tokens once rendered; the model reads at most "
                            f"{spec.max_tokens} ({spec.max_windows} windows of {spec.max_length})", ("state",),
                            "too_long", tokens)
    return found


@dataclass(frozen=True)
class Prepared:
    """A request that passed every check: which model, the request checked, and the tokens of its rendered state in
    the windows the model reads (``state_windows``; the model reads them as they are: no second tokenization)."""

    model: str
    checked: Checked
    input_ids: tuple[tuple[int, ...], ...]  # one tuple of token ids per window

    @property
    def input_tokens(self) -> int:
        """The tokens the model reads of the state: every window's, special tokens included."""
        return sum(len(ids) for ids in self.input_ids)


@dataclass(frozen=True)
class Refusal:
    """A request refused after the shape checks (by the model's own): the 422 payload to send."""

    detail: list[dict]


def prepare(models: Mapping[str, Any], request: SystemOneRequest) -> Prepared | Refusal:
    """Check ``request`` against the model it names (one of ``models``: name -> DecisionModel): the questions (as
    the request parsed them: validated once), the workflow, the rendered state's length in windows (at most the
    model's cap: ``state_windows``). Returns a Refusal rather than raising, so that a batch of requests never fails
    for one bad one."""
    try:
        if request.model not in models:
            raise QuestionError(f"model {request.model!r} is not served here; GET /v1/models lists {sorted(models)}",
                                ("model",), "unknown_model", request.model)
        if request.assets:
            raise QuestionError("this model reads text only; image assets need a vision-language model",
                                ("assets",), "unsupported", sorted(request.assets))
        model = models[request.model]
        item = checked(model.schema, request.state, request.questions, request.workflow)
        ids = state_windows(model, item.text)
    except QuestionError as err:
        return Refusal([err.detail()])
    return Prepared(request.model, item, ids)


def respond(models: Mapping[str, Any], items: Sequence[Prepared | Refusal]) -> list[dict | Refusal]:
    """System One responses (JSON-ready dicts) for prepared requests, one batched ``decide_many`` per model;
    refusals pass through in place."""
    out: list[dict | Refusal] = list(items)
    for name, model in models.items():
        rows = [i for i, item in enumerate(items) if isinstance(item, Prepared) and item.model == name]
        if not rows:
            continue
        results = model.decide_checked([items[i].checked for i in rows], route=model.router is not None,
                                       input_ids=[items[i].input_ids for i in rows])
        for i, result in zip(rows, results):
            body = {"model": name, "answers": result["answers"] if model.router is not None else result,
                    "usage": {"input_tokens": items[i].input_tokens, "output_tokens": 0}}
            if model.router is not None:
                body["routing"] = {k: result[k] for k in ("verdict", "reason", "scores")}
            out[i] = body
    return out
