import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from decisionkit.model.fitting import fit_heads, refit_heads
from decisionkit.model.heads import (
    HeadSet,
    calibrated,
    decision_loss,
    expected_distance,
    group_rows,
    targets,
    weight_norm,
)


def one_hot(level: int, levels: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor([level]), levels).float()


def test_expected_distance_grows_with_the_miss():
    sure = lambda level: torch.log(one_hot(level) * (1 - 4e-6) + 1e-6)  # noqa: E731  nearly one-hot logits
    gold = one_hot(0)
    misses = [expected_distance(sure(level), gold).item() for level in range(4)]
    assert misses == pytest.approx([0, 1 / 3, 2 / 3, 1], abs=1e-4)
    # cross-entropy cannot tell a miss by one level from a miss by three; the distance can
    assert F.cross_entropy(sure(1), gold).item() == pytest.approx(F.cross_entropy(sure(3), gold).item())


def test_the_ordinal_term_touches_score_questions_only(splits):
    cases = splits["validation"].head(2)
    heads = HeadSet(cases.schema(), 8)
    for head in heads.heads.values():
        torch.nn.init.normal_(head.weight)
    x = torch.randn(len(cases), 8)
    target = targets(cases)
    logits = heads.read(x, target.rows)
    plain = decision_loss(heads.schema, logits, target).item()
    ordinal = decision_loss(heads.schema, logits, target, ordinal=1.0).item()
    extra = 0.0
    for workflow, rows in target.rows.items():
        for qid, z in heads(x[rows], workflow).items():
            if cases.schema()[workflow][qid].type == "score":
                extra += expected_distance(z, target.gold[workflow][qid]).item() * len(rows)
    assert ordinal - plain == pytest.approx(extra / target.decisions, rel=1e-5)


def test_fit_picks_on_held_out_cases_and_refit_repeats_the_choice(splits):
    train, held = splits["train"].head(6), splits["validation"].head(3)
    torch.manual_seed(0)
    tx, hx = torch.randn(len(train), 16), torch.randn(len(held), 16)
    heads = HeadSet(train.schema(), 16)
    fit = fit_heads(heads, train, held, tx, hx, l2_grid=(1e-2,), steps=30, progress=False)
    uniform = sum(math.log(len(q.options)) for q in held[0].questions.values()) / 5
    assert fit.best_val_loss <= uniform + 1e-6 and fit.recipe.steps % 10 == 0
    chosen = {k: v.clone() for k, v in heads.state_dict().items()}
    refit_heads(heads, train, tx, fit.recipe)  # same cases, same L2 and steps: the same heads again
    assert all(torch.allclose(chosen[k], v, atol=1e-6) for k, v in heads.state_dict().items())


def test_rows_group_by_workflow_in_order_of_first_appearance(splits):
    assert group_rows(["b", "a", "b", "c", "a"]) == {"b": [0, 2], "a": [1, 4], "c": [3]}
    assert list(group_rows(["b", "a", "b"])) == ["b", "a"]
    cases = splits["validation"]
    picked = [5, 0, 21, 1]  # two workflows, interleaved
    target = targets(cases, picked)
    assert target.rows == group_rows([cases[i].workflow for i in picked])
    for workflow, positions in target.rows.items():  # gold row j is case picked[positions[j]]'s
        for qid, gold in target.gold[workflow].items():
            expected = [cases[picked[p]].gold[qid].probabilities for p in positions]
            assert torch.allclose(gold, torch.tensor(np.stack(expected), dtype=torch.float32))


def test_heads_start_uniform_and_answer_each_workflow_its_own_questions(splits):
    cases = splits["validation"].head(1)
    heads = HeadSet(cases.schema(), 6)
    x = torch.randn(3, 6)
    for workflow, questions in cases.schema().items():
        logits = heads(x, workflow)
        assert list(logits) == list(questions)
        for qid, z in logits.items():
            p = calibrated(z)
            assert p.shape == (3, len(questions[qid].options))
            assert torch.allclose(p, torch.full_like(p, 1 / len(questions[qid].options)))  # zero init: uniform


def test_temperature_divides_the_logits():
    z = torch.tensor([[2.0, 0.0, -1.0]])
    assert torch.allclose(calibrated(z, 2.0), torch.softmax(z / 2, -1))
    assert calibrated(z, 2.0)[0, 0] < calibrated(z)[0, 0]  # a temperature above 1 flattens
    e = [math.exp(v / 0.5) for v in (2.0, 0.0, -1.0)]
    assert calibrated(z, 0.5)[0].tolist() == pytest.approx([v / sum(e) for v in e])


def test_weight_norm_counts_weights_not_biases(splits):
    heads = HeadSet(splits["validation"].head(1).schema(), 4)
    assert weight_norm(heads).item() == 0.0
    first = next(iter(heads.heads.values()))
    with torch.no_grad():
        first.bias.fill_(5.0)
        assert weight_norm(heads).item() == 0.0  # biases are not penalised
        first.weight.fill_(0.5)
    assert weight_norm(heads).item() == pytest.approx(0.25 * first.weight.numel())
