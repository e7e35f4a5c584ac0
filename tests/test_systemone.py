import json
import math

import numpy as np
import pytest
from pydantic import ValidationError
from typesafe_sdk._schemas import models as wire

from decisionkit.contract import systemone
from decisionkit.contract.systemone import (
    QuestionError,
    Refusal,
    SystemOneRequest,
    answer,
    answer_table,
    check,
    prepare,
    respond,
)
from decisionkit.data import questions
from decisionkit.data.questions import Question

# Our model -> the official SDK's generated model of the same wire object.
SAME_AS_SDK = {
    "SystemOneRequest": "SystemOneRequest", "NoulQuestion": "NoulQuestion", "ChoiceQuestion": "ChoiceQuestion",
    "ScoreQuestion": "ScoreQuestion", "BoxQuestion": "BoxQuestion", "NoulCriteria": "NoulCriteria", "Asset": "Asset",
    "NoulAnswer": "NoulAnswer", "ChoiceAnswer": "ChoiceAnswer", "ScoreAnswer": "ScoreAnswer", "Usage": "Usage",
    "SystemOneResponse": "SystemOneResponse", "ModelMetadata": "ModelMetadata",
    "ModelMetadataList": "ModelMetadataList", "ValidationErrorItem": "ValidationError",
    "HTTPValidationError": "HTTPValidationError",
}
EXTENSIONS = {"SystemOneRequest": {"workflow"}, "SystemOneResponse": {"routing"}}  # decisionkit's own, optional


@pytest.mark.parametrize("ours, theirs", SAME_AS_SDK.items())
def test_models_follow_the_sdk_field_for_field(ours, theirs):
    # the question models are the data's too (data/questions.py): one question model for files and requests
    mine = getattr(systemone, ours, None) or getattr(questions, ours)
    mine, sdk = mine.model_fields, getattr(wire, theirs).model_fields
    extension = EXTENSIONS.get(ours, set())
    assert set(mine) - extension == set(sdk)
    assert all(not mine[name].is_required() for name in extension)
    assert {k: f.is_required() for k, f in mine.items() if k in sdk} == {k: f.is_required() for k, f in sdk.items()}


def test_an_sdk_request_validates_in_the_contract():
    sent = wire.SystemOneRequest(model="m", state={"a": [1, 2.5]}, questions={
        "n": {"type": "noul", "instructions": "?", "criteria": {"true": "yes"}},
        "c": {"type": "choice", "criteria": {"x": None, "y": {"why": "structured"}}},
        "s": {"type": "score", "criteria": ["low", "high"]}}).model_dump(mode="json")
    request = SystemOneRequest.model_validate(sent)
    assert request.model == "m" and [q.type for q in request.questions.values()] == ["noul", "choice", "score"]


@pytest.mark.parametrize("state, message", [
    (None, "got null"), (42, "got a number"), (True, "got a boolean"), ("", "empty string"), ("  \n", "empty string"),
    ({}, "empty dict"), ([], "empty list"), ({"x": math.nan}, "not a JSON number"), ([math.inf], "not a JSON number"),
    ({"a": json.loads("[" * 70 + "]" * 70)}, "nested more than 64"),
])
def test_states_the_contract_refuses(state, message):
    with pytest.raises(ValidationError, match=message) as refused:
        SystemOneRequest(model="m", state=state, questions={"q": {"type": "noul"}})
    assert refused.value.errors()[0]["loc"][0] == "state"


@pytest.mark.parametrize("field, value", [
    ("model", 1), ("questions", {}), ("questions", []), ("questions", {"q": "noul"}), ("questions", {"q": {"type": "maybe"}}),
    ("questions", {"q": {"type": "choice"}}), ("questions", {"q": {"type": "score", "criteria": []}}),
    ("questions", {"q": {"type": "noul", "criteria": {"yes": "?"}}}), ("questions", {"q": {"type": "noul", "instructions": 5}}),
    ("assets", {}), ("workflow", ["a"]), ("extra", 1),
])
def test_wrong_types_name_the_field(field, value):
    request = {"model": "m", "state": "text", "questions": {"q": {"type": "noul"}}, field: value}
    with pytest.raises(ValidationError) as refused:
        SystemOneRequest.model_validate(request)
    assert refused.value.errors()[0]["loc"][0] == field


def test_answer_shapes_and_a_separate_confidence():
    score_q = Question("s", "score", "", ("0", "1", "2"), ("low", "mid", "high"))
    out = answer(score_q, np.array([0.2, 0.3, 0.5]))
    assert out == {"type": "score", "score": pytest.approx(1.3), "confidence": pytest.approx(0.5),
                   "legend": {"0": "low", "1": "mid", "2": "high"}, "probabilities": pytest.approx(
                       {"0": 0.2, "1": 0.3, "2": 0.5})}
    assert answer(score_q, np.array([0.2, 0.3, 0.5]), confidence=0.9)["confidence"] == 0.9
    choice_q = Question("c", "choice", "", ("a", "b"), ("", ""))
    assert answer(choice_q, np.array([0.3, 0.7]))["choice"] == "b"
    assert answer(Question("n", "noul", "", ("false", "true"), ("", "")), np.array([0.1, 0.9])) == {
        "type": "noul", "noul": pytest.approx(0.9)}


SCHEMA = {"w1": {"n": Question("n", "noul", "", ("false", "true"), ("", "")),
                 "c": Question("c", "choice", "", ("a", "b"), ("", ""))},
          "w2": {"n": Question("n", "noul", "", ("false", "true"), ("", ""))}}


@pytest.mark.parametrize("questions, workflow, loc, message", [
    (None, None, ("workflow",), "pass workflow= one of"),
    ({"n": {"type": "noul"}}, None, ("workflow",), "several workflows"),
    ({"zz": {"type": "noul"}}, None, ("questions",), "no trained workflow asks all of"),
    (None, "w9", ("workflow",), "has no trained heads"),
    ({"zz": {"type": "noul"}}, "w1", ("questions", "zz"), "no trained head in workflow 'w1'"),
    ({"c": {"type": "noul"}}, "w1", ("questions", "c", "type"), "type 'noul' differs"),
    ({"c": {"type": "choice", "criteria": {"a": "", "x": ""}}}, "w1", ("questions", "c", "criteria"), "differ"),
    ({"c": {"type": "box"}}, "w1", ("questions", "c", "type"), "box questions"),
    ({"c": {"type": "choice", "criteria": {"a": ""}}}, "w1", ("questions", "c", "criteria"), "two or more"),
    ({"c": {"type": "choice", "criteria": {"a": "", "b": ""}, "typo": 1}}, "w1", ("questions", "c", "typo"), "Extra"),
    ({"c": "choice"}, "w1", ("questions", "c"), "must be an object, got str"),
])
def test_check_refuses_with_the_field(questions, workflow, loc, message):
    with pytest.raises(QuestionError, match=message) as refused:
        check(SCHEMA, questions, workflow)
    assert refused.value.loc == loc and refused.value.detail()["loc"] == ["body", *loc]


def test_check_infers_the_workflow_and_keeps_the_asked_criteria():
    workflow, asked = check(SCHEMA, {"c": {"type": "choice", "criteria": {"a": "first", "b": None}}}, None)
    assert workflow == "w1" and asked["c"].descriptions == ("first", "")
    assert check(SCHEMA, None, "w2") == ("w2", SCHEMA["w2"])


def test_prepare_and_respond_with_a_model(quick_model, splits):
    path, model = quick_model
    models = {path.name: model}
    case = splits["validation"][0]
    questions = {q: x.to_json() for q, x in case.questions.items()}
    request = SystemOneRequest(model=path.name, state=case.state, questions=questions, workflow=case.workflow)
    prepared = prepare(models, request)
    [response] = respond(models, [prepared])
    wire.SystemOneResponse.model_validate(response)  # the SDK's own model accepts it
    assert response["answers"] == model.decide(case.state, questions, case.workflow)
    assert response["usage"] == {"input_tokens": prepared.input_tokens, "output_tokens": 0} and prepared.input_tokens > 0
    for bad, loc in [({"model": "nope"}, "model"), ({"assets": {"a": {"type": "image", "part": "p"}}}, "assets"),
                     ({"state": "word " * 2000}, "state")]:
        refused = prepare(models, request.model_copy(update=bad))
        assert isinstance(refused, Refusal) and refused.detail[0]["loc"] == ["body", loc]
        assert respond(models, [refused]) == [refused]


def test_a_json_encoded_state_is_read_as_its_object_as_training_reads_it(splits):
    """A CSV export holds JSON states as strings, and the loader reads them as objects (their fields feed a hybrid's
    trees); a request that sends the same string must be read the same way, fields and rendered text alike."""
    from decisionkit.contract.systemone import checked

    case = splits["validation"][0]
    schema = splits["train"].schema()
    as_object = checked(schema, case.state, workflow=case.workflow)
    as_string = checked(schema, json.dumps(case.state, indent=1), workflow=case.workflow)
    assert as_string.state == case.state and as_string.text == as_object.text
    ticket = "{not json} my card was charged twice"  # text stays text, even starting with a brace
    assert checked(schema, ticket, workflow=case.workflow).state == ticket
    from decisionkit.data.states import read_state  # the loader's reading of a row's state

    assert read_state(json.dumps(case.state), "row 1") == (as_string.state, True)  # what training read, answering reads
    # numbers stored as strings, numpy scalars and NaN: read alike by the loader and when answering
    odd = {**case.state, "extra_amount": "184.50", "extra_count": np.int64(3), "extra_gap": math.nan}
    read, _ = read_state(odd, "row 1")
    assert checked(schema, odd, workflow=case.workflow).state == read
    assert read["extra_amount"] == 184.5 and type(read["extra_count"]) is int and "extra_gap" not in read


@pytest.fixture(scope="module")
def tiny_model(tiny_backbone, splits):
    """The tiny backbone read in windows of 64 tokens, at most 4, random heads: the mechanics of windows."""
    import torch

    from decisionkit.model.decision_model import DecisionModel, FeatureSpec

    torch.manual_seed(2)
    return DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec(max_length=64, max_windows=4))


def test_prepare_reads_a_long_state_in_windows_and_refuses_one_past_the_cap(tiny_model, splits):
    from decisionkit.model.windows import window_lengths

    models = {"tiny": tiny_model}
    _, needed = window_lengths(tiny_model.backbone, splits["validation"].texts, 64)
    case = next(c for c, n in zip(splits["validation"], needed) if 2 <= n <= 4)
    questions = {q: x.to_json() for q, x in case.questions.items()}
    request = SystemOneRequest(model="tiny", state=case.state, questions=questions)
    prepared = prepare(models, request)
    assert 2 <= len(prepared.input_ids) <= 4 and all(len(ids) <= 64 for ids in prepared.input_ids)
    # SmolLM2's tokenizer adds no special tokens: the windows hold the state's tokens, each once
    whole = tiny_model.backbone.tokenizer(case.text)["input_ids"]
    assert [i for ids in prepared.input_ids for i in ids] == whole and prepared.input_tokens == len(whole)
    [response] = respond(models, [prepared])
    assert response["answers"] == tiny_model.decide(case.state, questions)
    assert response["usage"] == {"input_tokens": len(whole), "output_tokens": 0}
    refused = prepare(models, request.model_copy(update={"state": "word " * 300}))
    assert isinstance(refused, Refusal) and respond(models, [refused]) == [refused]
    [detail] = refused.detail
    assert detail["loc"] == ["body", "state"] and detail["type"] == "too_long" and detail["input"] > 256
    assert detail["msg"] == (f"field 'state' is {detail['input']} tokens once rendered; the model reads at most 256 "
                             "(4 windows of 64)")


def test_every_benchmark_test_state_is_served_by_the_demo_encoder_none_refused_for_length(splits):
    """The demo's encoder (MiniLM-L6, windows of 512 tokens, the default cap): all 400 test states pass ``prepare``
    (7 of them are longer than 512 tokens: the server used to refuse them), and those longer ones are answered
    through ``respond`` as ``decide`` answers them, within the compute dtype's tolerance (random heads: the
    mechanics, not what a model learned)."""
    import torch

    from decisionkit.core.precision import ANSWER_TOLERANCE
    from decisionkit.model.backbone import ENCODER_BACKBONE, load_backbone
    from decisionkit.model.decision_model import DecisionModel, FeatureSpec

    torch.manual_seed(3)
    model = DecisionModel(load_backbone(ENCODER_BACKBONE), splits["train"].schema(), FeatureSpec()).eval()
    models = {"demo": model}
    requests = [SystemOneRequest(model="demo", state=c.state, workflow=c.workflow,
                                 questions={q: x.to_json() for q, x in c.questions.items()}) for c in splits["test"]]
    prepared = [prepare(models, r) for r in requests]
    assert not [p for p in prepared if isinstance(p, Refusal)]
    long = [i for i, p in enumerate(prepared) if len(p.input_ids) > 1]
    assert len(long) >= 7 and all(len(prepared[i].input_ids) <= 8 for i in long)
    tolerance = ANSWER_TOLERANCE[model.backbone.precision.dtype]
    for i, response in zip(long, respond(models, [prepared[i] for i in long])):
        local = model.decide(requests[i].state, requests[i].model_dump()["questions"], requests[i].workflow)
        assert systemone.disagreements(response["answers"], local, tolerance) == []


def test_answer_table_shows_each_answer_and_its_confidence():
    answers = {"urgent": {"type": "noul", "noul": 0.2},
               "team": {"type": "choice", "choice": "billing", "confidence": 0.7, "probabilities": {"billing": 0.6}},
               "risk": {"type": "score", "score": 1.4, "confidence": 0.5, "legend": {}, "probabilities": {}}}
    table = answer_table(answers)
    assert list(table.index) == ["urgent", "team", "risk"]
    assert table.loc["urgent"].tolist() == ["noul", 0.2, pytest.approx(0.8)]  # P(false) is the surer side
    assert table.loc["team"].tolist() == ["choice", "billing", 0.7]  # the confidence field, not the probability
    assert table.loc["risk"].tolist() == ["score", 1.4, 0.5]


def test_disagreements_hold_answers_to_the_tolerance():
    choice = Question("team", "choice", "", ("a", "b", "c"), ("", "", ""))
    score = Question("level", "score", "", ("0", "1", "2"), ("low", "mid", "high"))
    noul = Question("n", "noul", "", ("false", "true"), ("", ""))

    def answers(p_choice, p_score, p_true):
        return {"team": answer(choice, np.array(p_choice)), "level": answer(score, np.array(p_score)),
                "n": answer(noul, np.array([1 - p_true, p_true]))}

    base = answers([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 0.7)
    assert systemone.disagreements(base, base, 1e-5) == []
    assert systemone.disagreements(answers([0.5 + 4e-6, 0.3 - 4e-6, 0.2], [0.2, 0.3, 0.5], 0.7), base, 1e-5) == []
    moved = systemone.disagreements(answers([0.52, 0.28, 0.2], [0.2, 0.3, 0.5], 0.7 + 2e-5), base, 1e-2)
    assert moved == ["team.confidence: 0.52 != 0.5 (beyond 0.01)", "team.probabilities.a: 0.52 != 0.5 (beyond 0.01)",
                     "team.probabilities.b: 0.28 != 0.3 (beyond 0.01)"]
    # a near-tie may swap within twice the tolerance, not beyond
    tie = answers([0.41, 0.39, 0.2], [0.2, 0.3, 0.5], 0.7)
    swapped = answers([0.39, 0.41, 0.2], [0.2, 0.3, 0.5], 0.7)
    assert systemone.disagreements(swapped, tie, 0.025) == []
    assert "team.choice: 'b' != 'a'" in systemone.disagreements(swapped, tie, 0.005)
    # a score's expected level is bounded by the tolerance times the sum of its levels (0 + 1 + 2)
    level = answers([0.5, 0.3, 0.2], [0.2, 0.3 - 0.009, 0.5 + 0.009], 0.7)
    assert systemone.disagreements(level, base, 1e-2) == []
    assert systemone.disagreements({"team": base["team"]}, base, 1e-2) == [
        "questions ['team'] != ['level', 'n', 'team']"]
