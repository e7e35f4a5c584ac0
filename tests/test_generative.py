import json

import numpy as np
import pandas as pd
import pytest
import torch

from decisionkit.core.precision import Precision
from decisionkit.course.ab import DECISION, RATIO_COLUMNS, ZERO_SHOT, ab_test, how_trained
from decisionkit.course.generative import (
    ComputeDtype,
    answer_schema,
    generate_json,
    generative_baseline,
    gold_reply,
    json_prompt,
    option_scoring,
    parse_answers,
    training_cost,
)
from decisionkit.data.cases import Split
from decisionkit.data.metrics import case_interval, case_rows, score
from decisionkit.model.heads import Temperatures


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


def test_case_interval_resamples_whole_cases():
    correct = np.array([1, 1, 1, 0, 0, 0, 1, 0, 1, 0])  # five cases of two decisions
    rows = case_rows(np.repeat(np.arange(5), 2))
    low, high = case_interval(rows, lambda k: correct[k].mean())
    assert low < correct.mean() < high and 0 <= low and high <= 1
    assert case_interval(rows, lambda k: 0.0) == (0.0, 0.0)  # the same on every draw: no warning, its own interval
    assert all(np.isnan(case_interval(rows[:1], lambda k: correct[k].mean())))  # one case: nothing to resample


def test_ab_test_sets_every_method_beside_the_decision_model(quick_model, splits):
    _, model = quick_model
    first = splits["validation"].head(1)
    cases = Split(first.name, first.cases[:2], first.source)  # two workflows, one case each
    ab = ab_test(model, cases, budgets=(8,), constrained_budget=80, progress=False, others={"again": model})
    methods = [DECISION, "again", "option scoring (log-prob)", "free JSON, 8 tokens", "constrained JSON"]
    latency, accuracy = ab.latency_table(), ab.accuracy_table()
    assert list(latency.index) == methods and list(accuracy.index) == methods
    # two timings per method: fewer than a p99 needs, so the tail shown is p90
    assert list(latency.columns) == ["timings", "p50 ms", "p90 ms", "first token ms", *RATIO_COLUMNS,
                                     "compute dtype"] and (latency["timings"] == 2).all()
    assert latency.loc[DECISION, list(RATIO_COLUMNS)].tolist() == [1.0, 1.0, 1.0]  # the same timings, every draw
    for method in methods:  # each p50 is the median of that method's own timings, the ratio inside its interval
        timed = ab.requests.loc[ab.requests["method"] == method, "latency_ms"]
        assert latency.loc[method, "p50 ms"] == pytest.approx(np.median(timed))
        ratio, low, high = latency.loc[method, list(RATIO_COLUMNS)]
        assert ratio == pytest.approx(np.median(timed) / latency.loc[DECISION, "p50 ms"]) and low <= ratio <= high
    # the quick model's heads and trees were fitted, not calibrated nor routed; temperatures make it "calibrated"
    assert accuracy.loc[DECISION, "trained"] == how_trained(model) == "yes: heads + trees on train"
    kept = model.temperatures
    model.temperatures = Temperatures(dict.fromkeys(kept.probabilities, 1.5))
    try:
        assert how_trained(model) == "yes: heads + trees on train, calibrated"
    finally:
        model.temperatures = kept
    for method in methods:  # each accuracy inside its interval over cases; ECE too, where a method has one
        low, high = accuracy.loc[method, ["accuracy low (95%)", "accuracy high (95%)"]]
        assert low <= accuracy.loc[method, "accuracy"] <= high
    low, high = accuracy.loc[DECISION, ["ece low (95%)", "ece high (95%)"]]
    assert 0 <= low <= high and np.isnan(accuracy.loc["constrained JSON", "ece low (95%)"])
    assert accuracy.loc["again", "trained"] == how_trained(model)  # another decision model: what of it was trained
    assert accuracy.loc["again", "accuracy"] == accuracy.loc[DECISION, "accuracy"]
    assert (accuracy["trained"].drop([DECISION, "again"]) == ZERO_SHOT).all()  # no generative baseline was trained
    assert accuracy.loc["constrained JSON", "valid"] == 1.0 and accuracy.loc["free JSON, 8 tokens", "valid"] == 0.0
    assert np.isnan(accuracy.loc["constrained JSON", "kl"])  # a generated answer has no distribution
    decided = score(cases, *model.outputs(cases)).overall()
    assert accuracy.loc[DECISION, "accuracy"] == pytest.approx(decided["accuracy"])
    assert accuracy.loc[DECISION, "kl"] == pytest.approx(decided["kl"])
    _, scored = option_scoring(model.backbone, cases, model.spec.max_length)  # the option-scoring row's answers
    for c, p in zip(cases, scored):  # a distribution over each question's options
        assert all(len(p[q]) == len(x.options) and (p[q] >= 0).all() and p[q].sum() == pytest.approx(1.0)
                   for q, x in c.questions.items())
    by_options = score(cases, scored).overall()
    assert accuracy.loc["option scoring (log-prob)", ["accuracy", "kl"]].tolist() == pytest.approx(
        [by_options["accuracy"], by_options["kl"]])
    by_workflow = ab.latency_table("workflow")
    assert len(by_workflow) == 5 * 2 and (by_workflow.xs(DECISION, level="method")[RATIO_COLUMNS[0]] == 1.0).all()
    assert len(ab.accuracy_table("workflow")) == 5 * 2
    seed = ab.against_seed("constrained JSON", decisions=(DECISION, "again"))  # quoted from data.seed, beside ours
    assert seed["seed (quoted)"].tolist() == ["191.4 ms", "3,679.8 ms", "19.2x"]
    ours = seed[f"this run: {DECISION} (same backbone)"]
    assert ours.iloc[0] == f"{latency.loc[DECISION, 'p50 ms']:,.1f} ms"
    assert ours.iloc[2].startswith(f"{latency.loc['constrained JSON', RATIO_COLUMNS[0]]:.1f}x (")
    assert list(seed.columns)[-1] == "this run: again (across backbones)"
    examples = ab.generative.examples(8, n=2, chars=40)
    assert examples["method"].tolist() == ["free, 8 tokens"] * 2 + ["constrained"] * 2  # two of each, failures first
    requests = ab.generative.requests
    assert examples["text"].tolist() == [t[:40] for t in pd.concat([
        requests[(requests["method"] == "free") & ~requests["valid"]]["text"].head(2),
        requests[requests["method"] == "constrained"]["text"].head(2)])]


def one_case(splits) -> Split:
    """The validation case with the shortest state: every method reads it, under both dtypes."""
    validation = splits["validation"]
    return Split(validation.name, [min(validation, key=lambda c: len(c.text))], validation.source)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_method_of_the_ab_test_computes_in_the_backbone_dtype(quick_model, splits, dtype):
    """Each method's dtype is what the backbone's first linear layer produced while it ran, so a method that ran
    outside the compute dtype (generation without the autocast, say) shows float32 where bfloat16 was chosen."""
    _, model = quick_model
    kept = model.backbone.precision
    model.backbone.precision = Precision(kept.device, dtype, "set by the test")
    try:
        ab = ab_test(model, one_case(splits), budgets=(4,), constrained_budget=0, progress=False)
    finally:
        model.backbone.precision = kept
    assert ab.precision.dtype == dtype
    assert ab.dtypes == {DECISION: dtype, "option scoring (log-prob)": dtype, "free JSON, 4 tokens": dtype}
    assert (ab.latency_table()["compute dtype"] == dtype).all()


def test_compute_dtype_sees_what_the_backbone_ran_in(tiny_backbone):
    batch = tiny_backbone.tokenizer(["a state"], return_tensors="pt")
    with ComputeDtype(tiny_backbone) as plain:
        tiny_backbone.model(**batch)
    with ComputeDtype(tiny_backbone) as autocast, Precision("cpu", "bfloat16", "test").autocast():
        tiny_backbone.model(**batch)
    with ComputeDtype(tiny_backbone) as idle:
        pass
    assert (plain.dtype, autocast.dtype, idle.dtype) == ("float32", "bfloat16", "none")
    tiny_backbone.model(**batch)  # the hook is gone once the block ends
    assert plain.seen == {"float32"}


def test_gold_reply_is_the_schema_reply_of_the_gold(case):
    reply = gold_reply(case)
    answers, problems = parse_answers(reply, case.questions)
    assert problems == [] and answers == {qid: q.options[int(np.argmax(case.gold[qid].probabilities))]
                                          for qid, q in case.questions.items()}
    assert list(json.loads(reply)) == list(case.questions) and ", " in reply and ": " in reply


def test_training_cost_times_a_forward_and_backward_per_case(tiny_backbone, splits):
    cases = splits["validation"].head(1)
    weights = [p.detach().clone() for p in tiny_backbone.model.parameters()]
    cost = training_cost(tiny_backbone, cases, train_cases=1200)
    def count(text: str) -> int:
        return len(tiny_backbone.tokenizer(text, add_special_tokens=False)["input_ids"])

    tokens = [count(json_prompt(tiny_backbone, c)) + count(gold_reply(c)) + 1 for c in cases]  # + end of sequence
    assert cost.tokens_per_case == np.median(tokens) and cost.cases_timed == 4 and cost.seconds_per_case > 0
    assert cost.compute_dtype == tiny_backbone.precision.dtype
    assert cost.epoch_minutes == pytest.approx(cost.seconds_per_case * 1200 / 60)
    assert all(torch.equal(a, b) for a, b in zip(weights, tiny_backbone.model.parameters()))  # nothing trained
    assert all(p.grad is None for p in tiny_backbone.model.parameters())
