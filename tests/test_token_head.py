import numpy as np
import pytest
import torch

from decisionkit.data.metrics import score, uniform_predictions
from decisionkit.model.features import encode, extract_features
from decisionkit.model.fitting import mix_out_of_fold
from decisionkit.model.heads import decision_loss, targets
from decisionkit.model.token_head import (
    TokenHead,
    TokenHeadSpec,
    fit_token_head,
    token_answers,
    token_head_probabilities,
)


@pytest.fixture(scope="module")
def small(splits):
    return splits["train"].head(6)


def test_token_states_are_the_real_tokens_of_one_pass_cached_per_layer(tiny_backbone, small, tmp_path):
    """The same pass that pools also keeps a layer's states at every real token; the cache is keyed by the layer and
    the cut (and, as the pooled features, by the weights, dtype and rendered texts), so nothing stale is read."""
    first = extract_features(tiny_backbone, small, layers=(4,), max_length=48, token_layers=(2, 4), cache_dir=tmp_path)
    assert not first.from_cache and set(first.tokens) == {2, 4}
    one = encode(tiny_backbone, [small[0].text], 48)
    real = one.attention_mask[0].bool()
    states = first.tokens[2].get(small.ids[0])
    assert states.dtype == np.float16 and len(states) == int(real.sum()) <= 48
    np.testing.assert_allclose(states, one.hidden[2][0][real].numpy(), atol=2e-3, rtol=2e-3)  # float16
    again = extract_features(tiny_backbone, small, layers=(4,), max_length=48, token_layers=(2, 4), cache_dir=tmp_path)
    assert again.from_cache and np.array_equal(again.tokens[4].states, first.tokens[4].states)
    # another layer, another cut: extracted anew, never read from the files above
    for token_layers, max_length in (((3,), 48), ((2,), 24)):
        other = extract_features(tiny_backbone, small, layers=(4,), max_length=max_length, token_layers=token_layers,
                                 cache_dir=tmp_path)
        assert not other.from_cache
    assert other.tokens[2].length(small.ids[0]) <= 24 < first.tokens[2].length(small.ids[0])
    with pytest.raises(ValueError, match="out of range"):
        extract_features(tiny_backbone, small, token_layers=(9,), cache=False)


def test_a_token_head_answers_every_question_and_learns_its_cases(tiny_backbone, small):
    states = extract_features(tiny_backbone, small, layers=(4,), max_length=48, token_layers=(4,), cache=False,
                              progress=False).tokens[4]
    schema = small.schema()
    spec = TokenHeadSpec(width=32, epochs=40, batch_size=4, lr=3e-3, dropout=0.0)
    untrained = TokenHead(schema, states.dim, spec)
    x, mask = states.batch(small.ids)
    with torch.no_grad():  # zero output layers: every answer uniform before training, as the linear heads start
        start = decision_loss(schema, untrained(x, mask, small.case_workflows), targets(small)).item()
    head = fit_token_head(schema, states, small, spec, progress=False)
    with torch.no_grad():
        fitted = decision_loss(schema, head(x, mask, small.case_workflows), targets(small)).item()
    assert fitted < start - 0.05  # six cases are learned, on random states
    answers = token_head_probabilities(head, states, small)
    for case, answer in zip(small, answers):
        assert set(answer) == set(case.questions)
        for qid, p in answer.items():
            assert p.shape == (len(case.questions[qid].options),) and p.sum() == pytest.approx(1)
    trained = score(small, answers).overall()["accuracy"]
    assert trained > score(small, uniform_predictions(small)).overall()["accuracy"]
    # padding never changes an answer: each case alone gives what the length-sorted batches gave
    alone = [token_head_probabilities(head, states, small.head(1))[0]]
    for qid, p in alone[0].items():
        np.testing.assert_allclose(p, answers[0][qid], atol=1e-5)


def test_a_part_mixed_out_of_fold_leans_on_what_answers_best(splits):
    """``mix_out_of_fold``: a part that knows the gold gets the weight; a uniform one leaves it to the trees."""
    train, scored = splits["train"].head(20), splits["validation"].head(3)

    def oracle(fitted_on, asked):
        assert not set(fitted_on.ids) & set(asked.ids) or asked is scored  # a fold never answers its own cases
        return [{q: g.probabilities for q, g in c.gold.items()} for c in asked]

    def uniform(fitted_on, asked):
        return uniform_predictions(asked)

    mix = mix_out_of_fold({"oracle": oracle, "uniform": uniform}, train, scored, rounds=5)
    oracle_weights = [w[0] for qs in mix.weights["oracle"].values() for w in qs.values()]
    uniform_weights = [w[0] for qs in mix.weights["uniform"].values() for w in qs.values()]
    assert min(oracle_weights) >= 0.9 and np.mean(uniform_weights) < 0.5  # the trees answer better than chance
    together = [w for qs in mix.weights["together"].values() for w in qs.values()]  # oracle, uniform, trees
    assert min(w[0] for w in together) >= 0.9
    for case, alone, hybrid in zip(scored, mix.alone["oracle"], mix.hybrid["oracle"]):
        for qid in case.questions:
            assert hybrid[qid].sum() == pytest.approx(1, abs=1e-5)  # the gold itself sums to 1 within 1e-6
            assert np.abs(hybrid[qid] - alone[qid]).max() <= 0.1 + 1e-9  # weight >= 0.9 on the part
    # the same rows on the training cases, out of fold: each fold's answers, mixed at the weights chosen on them
    held = mix.out_of_fold(train)
    assert set(held) == {"oracle", "uniform", "oracle + trees", "uniform + trees", "together"}
    assert all(len(answers) == len(train) for answers in held.values())
    for case, alone, hybrid, trees in zip(train, held["oracle"], held["oracle + trees"], mix.held_out["trees"]):
        for qid, gold in case.gold.items():
            assert np.array_equal(alone[qid], gold.probabilities)
            w = mix.weights["oracle"][case.workflow][qid][0]
            assert hybrid[qid] == pytest.approx(w * gold.probabilities + (1 - w) * trees[qid])


def test_token_answers_fit_on_one_split_and_answer_another(tiny_backbone, splits):
    train, asked = splits["train"].head(3), splits["validation"].head(1)
    both = type(train)("both", list(train) + list(asked), train.source)
    states = extract_features(tiny_backbone, both, layers=(2,), max_length=32, token_layers=(2,), cache=False,
                              progress=False).tokens[2]
    answers = token_answers(states, TokenHeadSpec(width=16, epochs=1))(train, asked)
    assert len(answers) == len(asked) and set(answers[0]) == set(asked[0].questions)


def test_token_hybrid_sets_the_token_head_beside_the_pooled_heads_from_one_pass(tiny_backbone, splits, tmp_path,
                                                                                 monkeypatch):
    from decisionkit import settings
    from decisionkit.model.fitting import HeadRecipe
    from decisionkit.model.token_head import token_hybrid

    monkeypatch.setenv(settings.CACHE_ENV, str(tmp_path))
    train, scored = splits["train"].head(10), splits["validation"].head(2)
    mix = token_hybrid(tiny_backbone, train, scored, TokenHeadSpec(width=16, epochs=2), max_length=32, rounds=5,
                       heads=HeadRecipe(l2=1.0, steps=20, lr=3e-4), pooled_layers=(2, 4))
    assert len(list(tmp_path.glob("features/*.safetensors"))) == 2  # pooled and token states, one pass
    assert set(mix.alone) == set(mix.hybrid) == {"token head", "pooled heads"}
    assert set(mix.weights) == {"token head", "pooled heads", "together"}
    for answers in (*mix.alone.values(), *mix.hybrid.values(), mix.together):
        assert len(answers) == len(scored)
        for case, answer in zip(scored, answers):
            assert set(answer) == set(case.questions)
            assert all(p.sum() == pytest.approx(1, abs=1e-6) for p in answer.values())
    for per_question in mix.weights["together"].values():  # the token head, the pooled heads, the trees
        assert all(len(w) == 3 and w.sum() == pytest.approx(1) for w in per_question.values())
