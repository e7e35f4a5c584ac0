import json

import numpy as np
import pandas as pd
import pytest

from decisionkit.generative import (
    DECISION,
    ab_test,
    answer_schema,
    generate_json,
    generative_baseline,
    json_prompt,
    option_scoring,
    parse_answers,
)
from decisionkit.metrics import score


@pytest.fixture(scope="module")
def case(splits):
    return splits["validation"][0]


def test_parse_valid_answers(case):
    # as a model writes them: noul a JSON boolean, score an integer level, choice an option; each a different one
    said = {qid: {"noul": k % 2 == 0, "score": k % len(q.options), "choice": q.options[k % len(q.options)]}[q.type]
            for k, (qid, q) in enumerate(case.questions.items())}
    text = "<think>let me see {not this}</think>```json\n" + json.dumps(said) + "\n```"
    answers, problems = parse_answers(text, case.questions)
    assert problems == [] and answers == {qid: json.dumps(v) if isinstance(v, bool) else str(v)
                                          for qid, v in said.items()}
    assert {q.type for q in case.questions.values()} == {"noul", "choice", "score"}


@pytest.mark.parametrize("text, problem", [
    ("I think the answer is billing.", "no JSON object"),
    ('{"action": ', "does not parse"),
    ("[1, 2]", "no JSON object"),
])
def test_parse_failures_are_named(case, text, problem):
    answers, problems = parse_answers(text, case.questions)
    assert answers == {} and any(problem in p for p in problems)


def test_invalid_and_missing_answers(case):
    first = next(iter(case.questions))
    answers, problems = parse_answers('{"%s": "banana"}' % first, case.questions)
    assert answers == {} and any("banana" in p for p in problems) and sum("missing" in p for p in problems) == 4


def test_prompt_lists_every_question(backbone, case):
    prompt = json_prompt(backbone, case)
    assert all(qid in prompt for qid in case.questions) and "JSON" in prompt


def test_answer_schema_allows_exactly_the_valid_answers(case):
    schema = answer_schema(case)
    assert schema["required"] == list(case.questions) and schema["additionalProperties"] is False
    for qid, q in case.questions.items():
        allowed = schema["properties"][qid]
        if q.type == "noul":
            expected = {"type": "boolean"}
        elif q.type == "choice":
            expected = {"type": "string", "enum": list(q.options)}
        else:
            expected = {"type": "integer", "enum": list(range(len(q.options)))}  # levels 0..K-1
        assert allowed == expected, qid
    assert {q.type for q in case.questions.values()} == {"noul", "choice", "score"}  # every branch was checked


def test_free_generation_is_timed_and_scored(backbone, splits):
    result = generative_baseline(backbone, splits["validation"].head(1), budgets=(8,), constrained_budget=0,
                                 progress=False)
    r = result.requests
    assert len(r) == 4 and (r["output_tokens"] <= 8).all() and set(r["method"]) == {"free"}
    assert (r["first_token_ms"] <= r["latency_ms"]).all()
    assert not r["valid"].any()  # eight tokens cannot hold five answers
    # "correct" is the count of parsed answers equal to the gold's top option, counted again here from each text
    cases = splits["validation"].head(1)
    assert r["case"].tolist() == cases.ids and (r["questions"] == 5).all()
    for case, (_, request) in zip(cases, r.iterrows()):
        answers, problems = parse_answers(request["text"], case.questions)
        gold = {qid: q.options[int(np.argmax(case.gold[qid].probabilities))] for qid, q in case.questions.items()}
        assert request["correct"] == sum(answers.get(qid) == option for qid, option in gold.items())
        assert request["problems"] == "; ".join(problems) and problems  # every invalid reply says why
    table = result.table()
    assert table.loc[("free", 8), "requests"] == 4 and table.loc[("free", 8), "valid"] == 0.0
    assert table.loc[("free", 8), "accuracy"] == pytest.approx(r["correct"].sum() / 20)


def test_constrained_decoding_is_valid_json_of_the_schema(backbone, splits):
    case = splits["validation"][0]
    g = generate_json(backbone, case, 80, constrained=True)
    reply = json.loads(g.text)  # nothing around it: the grammar ends the reply when the object closes
    answers, problems = parse_answers(g.text, case.questions)
    assert list(reply) == list(case.questions) and problems == []
    for qid, q in case.questions.items():  # each value of the schema's type, parsed to the option it names
        value = reply[qid]
        assert type(value) is {"noul": bool, "choice": str, "score": int}[q.type], qid
        assert answers[qid] == (json.dumps(value) if q.type == "noul" else str(value)) and answers[qid] in q.options
    assert g.output_tokens < 80 and 0 < g.first_token_ms <= g.latency_ms


def test_ab_test_sets_every_method_beside_the_decision_model(quick_model, splits):
    _, model = quick_model
    cases = splits["validation"].head(1)
    ab = ab_test(model, cases, budgets=(8,), constrained_budget=80, progress=False)
    table = ab.table()
    assert list(table.index) == [DECISION, "option scoring (log-prob)", "free JSON, 8 tokens", "constrained JSON"]
    assert table.loc[DECISION, "x decision p50"] == 1.0
    assert table.loc["constrained JSON", "valid"] == 1.0 and table.loc["free JSON, 8 tokens", "valid"] == 0.0
    assert np.isnan(table.loc["constrained JSON", "kl"])  # a generated answer has no distribution
    decided = score(cases, *model.outputs(cases)).overall()
    assert table.loc[DECISION, "accuracy"] == pytest.approx(decided["accuracy"])
    assert table.loc[DECISION, "kl"] == pytest.approx(decided["kl"])
    _, scored = option_scoring(model.backbone, cases, model.spec.max_length)  # the option-scoring row's answers
    for c, p in zip(cases, scored):  # a distribution over each question's options
        assert all(len(p[q]) == len(x.options) and (p[q] >= 0).all() and p[q].sum() == pytest.approx(1.0)
                   for q, x in c.questions.items())
    by_options = score(cases, scored).overall()
    assert table.loc["option scoring (log-prob)", ["accuracy", "kl"]].tolist() == pytest.approx(
        [by_options["accuracy"], by_options["kl"]])
    by_workflow = ab.table("workflow")
    assert len(by_workflow) == 4 * 4 and (by_workflow.xs(DECISION, level="method")["x decision p50"] == 1.0).all()
    examples = ab.generative.examples(8, n=2, chars=40)
    assert examples["method"].tolist() == ["free, 8 tokens"] * 2 + ["constrained"] * 2  # two of each, failures first
    requests = ab.generative.requests
    assert examples["text"].tolist() == [t[:40] for t in pd.concat([
        requests[(requests["method"] == "free") & ~requests["valid"]]["text"].head(2),
        requests[requests["method"] == "constrained"]["text"].head(2)])]
