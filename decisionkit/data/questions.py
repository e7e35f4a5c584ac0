"""Typed questions, one model for the data and the wire.

A question in the System One shape (a dataset's, a scenario schema's or a request's) is validated once, by the
pydantic models below (field for field the official client's, ``typesafe-sdk`` 0.7.5), then read as a
``Question``: its answer keys in order, a description for each. ``Question.parse`` adds the one rule the contract
leaves out, since a head needs it: a choice or a score has two or more options. Every refusal is an
``InvalidQuestion`` naming the field (``loc``, from ``questions.<name>``); the data readers prefix the file and
line, the server answers it as a 422.

- noul:   ``{"type": "noul", "instructions"?, "criteria"?: {"true"?, "false"?}}``; options ``("false", "true")``
- choice: ``{"type": "choice", "instructions"?, "criteria": {option: description}}``; options in that order
- score:  ``{"type": "score", "instructions"?, "criteria": [level 0, level 1, ...]}``; options ``("0", "1", ...)``
- box:    an image question; part of the contract, refused here (these models read text)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..core.errors import UserError

QUESTION_TYPES = ("noul", "choice", "score")
NOUL_OPTIONS = ("false", "true")
JSONText = str | dict[str, Any] | list[Any]  # what the contract allows for instructions and descriptions


class DataError(UserError, ValueError):
    """Input that does not follow the typed-decisions schema; the message names the place and the field."""


class InvalidQuestion(DataError):
    """A question that is not a noul, choice or score question of the System One shape. ``loc`` is the field's
    path (``("questions", name, ...)``), ``kind`` the error's type, ``given`` the value refused."""

    def __init__(self, loc: tuple, detail: str, kind: str, given: Any):
        super().__init__(f"field '{'.'.join(map(str, loc))}'{detail}")
        self.loc, self.kind, self.given = loc, kind, given


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoulCriteria(Contract):
    true: JSONText | None = Field(None, description="What counts as a yes answer.")
    false: JSONText | None = Field(None, description="What counts as a no answer.")


class NoulQuestion(Contract):
    type: Literal["noul"] = Field(description="Identifies a yes/no question or statement.")
    instructions: JSONText | None = Field(None, description="The yes/no question or statement to evaluate.")
    criteria: NoulCriteria | None = Field(None, description="Criteria clarifying what counts as a yes or no answer.")


class ChoiceQuestion(Contract):
    type: Literal["choice"] = Field(description="Identifies a question that selects one of the choices in criteria.")
    instructions: JSONText | None = Field(None, description="What the model should decide when choosing an option.")
    criteria: dict[str, JSONText | None] = Field(description="Choice names and descriptions of when each applies.")


class ScoreQuestion(Contract):
    type: Literal["score"] = Field(description="Identifies a question that rates the content using the levels in "
                                               "criteria.")
    instructions: JSONText | None = Field(None, description="What the model should rate.")
    criteria: list[JSONText] = Field(min_length=1, description="Ordered descriptions of the score levels, from 0.")


class BoxQuestion(Contract):
    type: Literal["box"] = Field(description="Identifies a box question (images; not answered by text models).")
    instructions: JSONText | None = Field(None, description="What to locate in the image.")


AnyQuestion = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion | BoxQuestion, Field(discriminator="type")]
QUESTION = TypeAdapter(AnyQuestion)
# What a question's criteria must be, said whenever they are not (pydantic's message names a type, not the rule).
CRITERIA_RULES = {"noul": " of a noul question may only have the keys false, true",
                  "choice": " of a choice question must map two or more option names to descriptions",
                  "score": " of a score question must list its levels, lowest first (two or more)"}


def _text(description: Any) -> str:
    """A criterion's description as text; a choice named without one has an empty description."""
    return "" if description is None else str(description)


@dataclass(frozen=True)
class Question:
    """One typed question: its answer keys (``options``) in order, with a description for each."""

    id: str
    type: str
    instructions: str
    options: tuple[str, ...]
    descriptions: tuple[str, ...]

    @classmethod
    def parse(cls, qid: str, obj: Any) -> "Question":
        """A question in the System One shape (JSON) read, or an ``InvalidQuestion`` naming its field."""
        where = ("questions", qid)
        if not isinstance(obj, (dict, BaseModel)):
            raise InvalidQuestion(where, f" must be an object, got {type(obj).__name__}", "model_type", obj)
        qtype = obj.type if isinstance(obj, BaseModel) else obj.get("type")  # a parsed request's: no dump
        if qtype not in QUESTION_TYPES:
            detail = (": box questions locate things in images; this model reads text and answers noul, choice and "
                      "score questions" if qtype == "box" else
                      f" is {qtype!r}; expected one of {', '.join(QUESTION_TYPES)}")
            raise InvalidQuestion((*where, "type"), detail, "unsupported" if qtype == "box" else "union_tag_invalid",
                                  qtype)
        try:
            parsed = obj if isinstance(obj, BaseModel) else QUESTION.validate_python(obj)
        except ValidationError as err:
            first = err.errors(include_url=False)[0]
            inner = first["loc"][1:]  # without the union's tag
            if inner[:1] == ("criteria",):
                raise InvalidQuestion((*where, "criteria"), f"{CRITERIA_RULES[qtype]}; got {obj.get('criteria')!r}",
                                      first["type"], obj.get("criteria")) from None
            raise InvalidQuestion((*where, *inner), f": {first['msg']}", first["type"], first.get("input")) from None
        return cls._of(qid, parsed)

    @classmethod
    def _of(cls, qid: str, parsed: NoulQuestion | ChoiceQuestion | ScoreQuestion) -> "Question":
        if isinstance(parsed, NoulQuestion):
            options = NOUL_OPTIONS
            criteria = parsed.criteria or NoulCriteria()
            descriptions = (_text(criteria.false), _text(criteria.true))
        elif isinstance(parsed, ChoiceQuestion):
            options, descriptions = tuple(parsed.criteria), tuple(_text(v) for v in parsed.criteria.values())
        else:
            options = tuple(str(i) for i in range(len(parsed.criteria)))
            descriptions = tuple(_text(v) for v in parsed.criteria)
        if len(options) < 2:
            raise InvalidQuestion(("questions", qid, "criteria"), f"{CRITERIA_RULES[parsed.type]}; got "
                                  f"{parsed.model_dump()['criteria']!r}", "too_short", parsed.criteria)
        return cls(qid, parsed.type, _text(parsed.instructions), options, descriptions)

    @classmethod
    def from_json(cls, qid: str, obj: Any, where: str = "question") -> "Question":
        """``parse`` for a data file or schema: the error names ``where`` (file and line) first."""
        try:
            return cls.parse(qid, obj)
        except InvalidQuestion as err:
            raise DataError(f"{where}: {err}") from None

    def to_json(self) -> dict:
        """The question in the System One request shape."""
        if self.type == "choice":
            criteria: Any = dict(zip(self.options, self.descriptions))
        elif self.type == "score":
            criteria = list(self.descriptions)
        else:
            criteria = dict(zip(self.options, self.descriptions)) if any(self.descriptions) else None
        out = {"type": self.type, "instructions": self.instructions}
        if criteria is not None:
            out["criteria"] = criteria
        return out


def schema_json(schema: dict[str, dict[str, Question]]) -> dict:
    """workflow -> question -> Question as the JSON a schema file, a model's config and a data record hold."""
    return {wf: {qid: q.to_json() for qid, q in questions.items()} for wf, questions in schema.items()}
