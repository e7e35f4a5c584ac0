import math

import pytest
import torch

from decisionkit.heads import (HeadSet, batch_loss, expected_distance, fit_heads, refit_heads, soft_cross_entropy,
                               targets)


def one_hot(level: int, levels: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor([level]), levels).float()


def test_expected_distance_grows_with_the_miss():
    sure = lambda level: torch.log(one_hot(level) * (1 - 4e-6) + 1e-6)  # noqa: E731  nearly one-hot logits
    gold = one_hot(0)
    misses = [expected_distance(sure(level), gold).item() for level in range(4)]
    assert misses == pytest.approx([0, 1 / 3, 2 / 3, 1], abs=1e-4)
    # cross-entropy cannot tell a miss by one level from a miss by three; the distance can
    assert soft_cross_entropy(sure(1), gold).item() == pytest.approx(soft_cross_entropy(sure(3), gold).item())


def test_the_ordinal_term_touches_score_questions_only(splits):
    cases = splits["validation"].head(2)
    heads = HeadSet(cases.schema(), 8)
    for head in heads.heads.values():
        torch.nn.init.normal_(head.weight)
    x = torch.randn(len(cases), 8)
    target = targets(cases)
    plain, ordinal = batch_loss(heads, x, target).item(), batch_loss(heads, x, target, ordinal=1.0).item()
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
    assert fit.best_val_loss <= uniform + 1e-6 and fit.step % 10 == 0
    chosen = {k: v.clone() for k, v in heads.state_dict().items()}
    refit_heads(heads, train, tx, fit)  # same cases, same L2 and steps: the same heads again
    assert all(torch.allclose(chosen[k], v, atol=1e-6) for k, v in heads.state_dict().items())
