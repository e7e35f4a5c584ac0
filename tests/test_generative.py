import pytest

from decisionkit.generative import generative_baseline, json_prompt, parse_answers


@pytest.fixture(scope="module")
def case(splits):
    return splits["validation"][0]


def test_parse_valid_answers(case):
    answer = {qid: (q.options[-1] if q.type != "noul" else True) for qid, q in case.questions.items()}
    text = "<think>let me see</think>```json\n" + str(answer).replace("'", '"').replace("True", "true") + "\n```"
    answers, problems = parse_answers(text, case.questions)
    assert problems == [] and len(answers) == 5


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


def test_generation_is_timed_and_scored(backbone, splits):
    result = generative_baseline(backbone, splits["validation"].head(1), budgets=(8,), progress=False)
    r = result.requests
    assert len(r) == 4 and (r["output_tokens"] <= 8).all()
    assert (r["first_token_ms"] <= r["latency_ms"]).all() and (r["correct"].between(0, 5)).all()
    table = result.table()
    assert table.loc[8, "requests"] == 4 and 0 <= table.loc[8, "valid"] <= 1
