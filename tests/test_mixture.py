"""The hybrid's mixture, p = w_heads * heads + w_trees * trees + w_lexical * lexical per question
(``StructuredPart.mix`` inside ``DecisionModel.forward``, and ``structured.mixed`` / ``blend`` / ``named_blend`` on
saved predictions): a weight of 1 answers as that part alone, weights in between their convex combination; the mixed
logits are log-probabilities; the loss's gradient reaches a head exactly as the mixture's formula says, and not at
all where the heads' weight is 0."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from decisionkit.data.cases import Split
from decisionkit.model.heads import head_key, targets
from decisionkit.model.structured import blend, mixed, named_blend


@pytest.fixture(scope="module")
def batch(quick_model, splits):
    """Six validation cases of two workflows, interleaved (each workflow's rows are gathered for its heads and
    trees), tokenized for the quick hybrid."""
    _, model = quick_model
    by_workflow = {}
    for case in splits["validation"]:
        by_workflow.setdefault(case.workflow, []).append(case)
    first, second = list(by_workflow)[:2]
    cases = [c for pair in zip(by_workflow[first][:3], by_workflow[second][:3]) for c in pair]
    return model, Split("mixture", cases, "validation"), model.tokenize([c.text for c in cases])


def forward(model, split, tokens, weight, monkeypatch, target=None):
    """``model.forward`` on the batch with its parts mixed at ``weight(workflow, question)`` (part -> weight)."""
    part = model.structured
    weights = {wf: {q: weight(wf, q) for q in qs} for wf, qs in part.weights.items()}
    monkeypatch.setattr(model, "structured", replace(part, weights=weights))
    return model(**tokens, workflows=[c.workflow for c in split], states=[c.state for c in split], target=target)


def parts(model, split, output) -> dict[tuple[str, str], dict[str, torch.Tensor]]:
    """(workflow, question) -> part -> its probabilities: the heads' on the output's features, the trees' and the
    lexical part's on the states."""
    heads = model.heads.read(output.features, output.rows)
    found = {}
    for workflow, rows in output.rows.items():
        others = model.structured.probabilities([split[i].state for i in rows], workflow, list(heads[workflow]))
        for qid, z in heads[workflow].items():
            found[workflow, qid] = {"heads": torch.softmax(z, dim=-1).detach(),
                                    **{part: torch.as_tensor(p[qid], dtype=z.dtype) for part, p in others.items()}}
    return found


@pytest.mark.parametrize("w", [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.3, 0.5, 0.2)])
def test_the_answers_are_each_part_at_weight_one_and_the_convex_combination_between(batch, w, monkeypatch):
    model, split, tokens = batch
    weights = dict(zip(("heads", "trees", "lexical"), w))
    with torch.no_grad():
        output = forward(model, split, tokens, lambda wf, q: weights, monkeypatch)
    apart = 0.0
    for (workflow, qid), found in parts(model, split, output).items():
        assert set(found) == {"heads", "trees", "lexical"}
        logits = output.logits[workflow][qid]
        expected = sum(weights[part] * p for part, p in found.items())
        torch.testing.assert_close(torch.softmax(logits, dim=-1), expected, atol=1e-6, rtol=1e-5,
                                   msg=f"{workflow}/{qid} at {weights}")
        if weights["heads"] < 1:  # mixed logits are the log of a distribution: no softmax is needed to read them
            torch.testing.assert_close(logits.exp().sum(dim=-1), torch.ones(len(logits)), atol=1e-6, rtol=0)
        apart = max(apart, *(float((found["heads"] - found[part]).abs().max()) for part in ("trees", "lexical")))
    assert apart > 0.05, "the parts agree on this batch: it cannot tell one from another"
    assert set(output.rows) == {c.workflow for c in split} and len(output.rows) == 2


def test_the_gradient_reaches_the_heads_through_the_mixture_and_not_where_w_is_zero(batch, monkeypatch):
    model, split, tokens = batch
    questions = {wf: sorted(qs) for wf, qs in model.structured.weights.items()}

    def heads_weight(workflow, qid):  # per workflow, the first question the other parts alone, the second mixed
        return {0: 0.0, 1: 0.3}.get(questions[workflow].index(qid), 1.0)

    def weight(workflow, qid):
        w = heads_weight(workflow, qid)
        return {"heads": w, "trees": (1 - w) * 0.6, "lexical": (1 - w) * 0.4}

    target = targets(split)
    try:
        output = forward(model, split, tokens, weight, monkeypatch, target)
        output.loss.backward()
        # the same loss written from the formula: soft cross-entropy of the weighted parts, the heads' from their
        # logits, averaged over every decision
        features = output.features.detach()
        expected = 0.0
        for (workflow, qid), found in parts(model, split, output).items():
            z = model.heads.read(features, {workflow: output.rows[workflow]})[workflow][qid]
            w = weight(workflow, qid)
            p = w["heads"] * torch.softmax(z, dim=-1) + w["trees"] * found["trees"] + w["lexical"] * found["lexical"]
            gold = target.gold[workflow][qid]
            expected = expected - (gold * torch.log(p.clamp_min(1e-12))).sum()
        expected = expected / target.decisions
        torch.testing.assert_close(output.loss, expected, atol=1e-5, rtol=1e-5)
        asked = [(wf, q) for wf in output.rows for q in questions[wf]]
        params = [model.heads.heads[head_key(wf, q)].weight for wf, q in asked]
        wanted = torch.autograd.grad(expected, params, allow_unused=True)
        for (workflow, qid), param, want in zip(asked, params, wanted):
            got = param.grad
            if heads_weight(workflow, qid) == 0:
                assert got is None or not got.any(), f"{workflow}/{qid}: w = 0, yet its head got a gradient"
                assert want is None or not want.any()
            else:
                assert got is not None and got.abs().sum() > 0, f"{workflow}/{qid}: w > 0 and no gradient"
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4, msg=f"{workflow}/{qid}")
    finally:
        model.zero_grad(set_to_none=True)  # the session's quick model keeps no gradient


def test_saved_predictions_mix_the_same_way(splits):
    cases = Split("mixture", list(splits["validation"])[:6], "validation")
    rng = np.random.default_rng(0)
    language = [{q: rng.dirichlet(np.ones(len(x.options))) for q, x in c.questions.items()} for c in cases]
    trees = [{q: rng.dirichlet(np.ones(len(x.options))) for q, x in c.questions.items()} for c in cases]
    for w in (1.0, 0.0, 0.25):
        weights = {c.workflow: dict.fromkeys(c.questions, w) for c in cases}
        for got, a, b in zip(mixed(cases, language, trees, weights), language, trees):
            for qid, p in got.items():
                np.testing.assert_allclose(p, w * a[qid] + (1 - w) * b[qid], atol=1e-12)
                assert p.sum() == pytest.approx(1.0, abs=1e-12)
    thirds = {c.workflow: {q: (0.5, 0.25, 0.25) for q in c.questions} for c in cases}  # three parts at once
    for got, a, b in zip(blend(cases, [language, trees, trees], thirds), language, trees):
        for qid, p in got.items():
            np.testing.assert_allclose(p, 0.5 * a[qid] + 0.5 * b[qid], atol=1e-12)
    named = {c.workflow: {q: {"heads": 0.5, "lexical": 0.5} for q in c.questions} for c in cases}  # by part name
    for got, a, b in zip(named_blend(cases, {"heads": language, "lexical": trees}, named), language, trees):
        for qid, p in got.items():
            np.testing.assert_allclose(p, 0.5 * a[qid] + 0.5 * b[qid], atol=1e-12)
