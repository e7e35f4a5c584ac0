"""The state's fields and the trees that read them: columns learned on train, states of any shape encoded without
an error, trees kept as arrays that answer exactly as scikit-learn's, and the hybrid saved and reloaded."""

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier

import decisionkit
from decisionkit.model.fields import Fields, leaves
from decisionkit.model.structured import StructuredPart, mix_weight
from decisionkit.model.trees import TREE_ROUNDS, Trees, tree_settings

STATES = [
    {"invoice": {"total_usd": 100.0 + i, "lines": [{"qty": 2, "sku": "A"}, {"qty": i, "sku": "B"}], "paid": i % 2 == 0,
                 "note": "x" * (50 + i)},
     "order": {"total_usd": 100.0, "status": ["open", "closed", "open"][i % 3]}}
    for i in range(12)
]


def test_leaves_name_every_path_and_array_length():
    found = dict(leaves({"a": {"b": 1, "c": [{"d": 2}, {"d": 3}]}}))
    assert found["a.b"] == 1 and found["a.c#len"] == 2
    assert [v for k, v in leaves({"a": {"c": [{"d": 2}, {"d": 3}]}}) if k == "a.c[].d"] == [2, 3]
    assert leaves("a ticket as plain text") == [] and leaves(None) == []


def test_fields_learn_numbers_categories_texts_and_same_named_pairs():
    fields = Fields.fit(STATES)
    assert {"invoice.total_usd", "invoice.paid", "invoice.lines[].qty", "invoice.lines#len"} <= set(fields.numbers)
    assert fields.categories["order.status"] == ["closed", "open"]
    assert "invoice.lines[].sku" in fields.categories
    assert fields.texts == ["invoice.note"]
    assert ("invoice.total_usd", "order.total_usd") in fields.pairs
    x = fields.encode(STATES[:3])
    columns = fields.columns
    assert x.shape == (3, len(columns))
    assert x[2, columns.index("invoice.lines[].qty")] == 2 + 2  # summed over the items
    assert x[1, columns.index("order.status=closed")] == 1 and x[1, columns.index("order.status=open")] == 0
    assert x[1, columns.index("invoice.total_usd-order.total_usd")] == pytest.approx(1.0)
    assert x[1, columns.index("invoice.total_usd/order.total_usd")] == pytest.approx(1.01)
    assert x[0, columns.index("invoice.note#chars")] == 50
    assert Fields.from_json(fields.to_json()) == fields


@pytest.mark.parametrize("state", [
    {"invoice": {"total_usd": "a lot", "lines": "none", "paid": None}, "order": {"status": "lost"}},  # wrong types
    {"unexpected": {"field": 3}},  # unknown fields, every known one missing
    {},
    "the whole state as a string",
    [1, 2, 3],
    None,
])
def test_any_state_encodes_without_an_error(state):
    fields = Fields.fit(STATES)
    x = fields.encode([state])
    assert x.shape == (1, len(fields.columns))
    numbers = x[0, :len(fields.numbers)]
    assert np.isnan(numbers[[fields.numbers.index("invoice.total_usd"), fields.numbers.index("invoice.paid")]]).all()
    assert not np.isinf(x).any()


def test_field_surprise_is_zero_on_train_and_grows_with_what_train_never_had():
    fields = Fields.fit(STATES)
    assert (fields.surprise(STATES) == 0).all()
    contradictory = {**STATES[0], "invoice": {**STATES[0]["invoice"], "total_usd": 1e6}}  # 10,000x the order's
    blanked = {"invoice": {"total_usd": 0, "lines": [], "paid": None, "note": ""}, "order": {"total_usd": 0, "status": ""}}
    other_workflow = {"thread": [{"role": "customer", "text": "my card was charged twice"}], "account": {"tier": "pro"}}
    found = fields.surprise([contradictory, blanked, other_workflow, "a plain string", None, [1, 2]])
    # the invoice total, its difference and its ratio to the order's are out of range: 3 failed checks
    assert 0 < found[0] < found[1] < found[2]
    assert found[2:].tolist() == [1.0] * 4  # nothing of the workflow's fields is there
    # its checks: every path, 3 category values (2 SKUs, 1 status), every number, text length, difference and ratio
    checks = (len({p for p, _ in leaves(contradictory)}) + 3 + len(fields.numbers) + len(fields.texts)
              + 2 * len(fields.pairs))
    assert found[0] == pytest.approx(3 / checks)
    assert (Fields.from_json(fields.to_json()).surprise([contradictory, blanked, other_workflow]) == found[:3]).all()  # saved


def _fitted(labels, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(labels), 4))
    x[rng.random(x.shape) < 0.1] = np.nan  # missing values go the way each split learned
    x[:, 0] += labels  # something to learn
    model = HistGradientBoostingClassifier(max_iter=30, max_leaf_nodes=7, random_state=0).fit(x, labels)
    return model, x


@pytest.mark.parametrize("labels, options", [
    (np.arange(120) % 3, 3),  # multiclass: one tree per option and iteration
    (np.arange(120) % 2, 2),  # yes/no: one logit
    (np.where(np.arange(120) % 2, 3, 1), 4),  # a choice whose gold only ever weighs two of its four options
    (np.arange(120) % 3 + 1, 4),  # three of four
])
def test_trees_as_arrays_answer_as_scikit_learn(labels, options):
    model, x = _fitted(labels)
    trees = Trees.from_sklearn(model, options)
    expected = np.zeros((len(x), options))
    expected[:, model.classes_] = model.predict_proba(x)
    np.testing.assert_allclose(trees.probabilities(x), expected, atol=1e-9)
    saved = trees.tensors("q")
    again = Trees.from_saved(trees.config(), saved, "q")
    np.testing.assert_allclose(again.probabilities(x), expected, atol=1e-9)


def test_trees_fit_the_soft_gold_a_constant_question_and_states_without_fields():
    x = np.linspace(0, 1, 40)[:, None]
    gold = np.stack([1 - x[:, 0], x[:, 0]], axis=1)  # the gold leans with x
    p = Trees.fit(x, gold).probabilities(np.array([[0.05], [0.95]]))
    assert p[0, 0] > 0.6 and p[1, 1] > 0.6
    always = Trees.fit(x, np.tile([0.0, 1.0, 0.0], (40, 1))).probabilities(x[:2])
    assert always.argmax(axis=1).tolist() == [1, 1] and np.allclose(always.sum(axis=1), 1)
    texts = Fields.fit(["a ticket", "another ticket"])  # plain-text states have no fields: the trees answer the prior
    assert texts.columns == []
    prior = Trees.fit(texts.encode(["a ticket", "x"]), np.array([[0.2, 0.8], [0.6, 0.4]])).probabilities(
        texts.encode(["new"]))
    np.testing.assert_allclose(prior, [[0.4, 0.6]])
    saved = Trees.prior(np.array([0.4, 0.6]))
    np.testing.assert_allclose(Trees.from_saved(saved.config(), saved.tensors("q"), "q").probabilities(
        np.zeros((1, 0))), [[0.4, 0.6]])


def test_fewer_boosting_rounds_take_proportionally_larger_steps():
    assert tree_settings(30)["learning_rate"] == pytest.approx(5 * tree_settings()["learning_rate"])
    with pytest.raises(ValueError, match="tree rounds is 0"):
        tree_settings(0)
    x = np.linspace(0, 1, 40)[:, None]
    gold = np.stack([1 - x[:, 0], x[:, 0]], axis=1)
    quick = Trees.fit(x, gold, rounds=30)
    assert quick.roots.shape[0] == 30  # one tree a round (two options: one logit)
    assert quick.probabilities(np.array([[0.05]]))[0, 0] > 0.6


def test_mix_weight_follows_the_better_part():
    gold = np.eye(2)[np.arange(50) % 2]
    good, bad = 0.9 * gold + 0.05, np.full((50, 2), 0.5)
    assert mix_weight(good, bad, gold) == 1.0 and mix_weight(bad, good, gold) == 0.0
    half = (np.arange(50) < 25)[:, None]  # each part knows the answer on its own half of the cases
    language, trees = np.where(half, 0.9 * gold + 0.05, 0.5), np.where(half, 0.5, 0.9 * gold + 0.05)
    assert mix_weight(language, trees, gold) == 0.5


def test_the_hybrid_model_saves_reloads_and_answers_any_state(quick_model, splits, tmp_path):
    import decisionkit as dk

    _, model = quick_model
    assert model.structured is not None, "the quick preset trains the hybrid"
    assert isinstance(model.structured, StructuredPart)
    for workflow, per_question in model.structured.weights.items():
        assert model.structured.parts(workflow) == ["heads", "trees", "lexical"]  # JSON states: every part
        for per_part in per_question.values():
            assert set(per_part) == set(model.structured.parts(workflow))
            assert all(0 <= w <= 1 for w in per_part.values()) and sum(per_part.values()) == pytest.approx(1)
    cases = splits["test"].head(2)
    path = model.save(tmp_path / "hybrid")
    again = dk.load(path)
    # the quick preset's boosting rounds, kept through saving: the router's refits on folds use them
    assert model.structured.rounds == again.structured.rounds == dk.preset("cpu-quick").tree_rounds < TREE_ROUNDS
    for a, b in zip(model.predict(cases), again.predict(cases)):
        for qid in a:
            np.testing.assert_allclose(a[qid], b[qid], atol=1e-6)
    case = cases[0]
    state = {**case.state} if isinstance(case.state, dict) else {}
    broken = {key: "a string where a number was" for key in list(state)[:1]} | {"surprise": {"nested": [1, None]}}
    for odd in (broken, {}, "a state that is only text", [1, 2]):
        answers = again.decide(odd, workflow=case.workflow)
        assert set(answers) == set(case.questions)
        for a in answers.values():
            if "probabilities" in a:
                assert sum(a["probabilities"].values()) == pytest.approx(1, abs=1e-6)


def test_the_mixture_table_shows_the_weights_the_model_mixes_with(quick_model):
    _, model = quick_model
    table = model.structured.table()
    assert len(table) == sum(len(q) for q in model.structured.weights.values())
    for part in ("heads", "trees", "lexical"):
        for (workflow, question), weight in table[f"weight of the {part}"].items():
            assert weight == model.structured.weights[workflow][question][part]
    weights = table[[f"weight of the {part}" for part in ("heads", "trees", "lexical")]]
    assert weights.sum(axis=1).round(9).eq(1).all() and (table["fields read"] > 0).all()


def test_fit_structured_fits_a_hybrid_again(quick_model, splits):
    """The quick model is a hybrid already: fitting its trees again replaces them (here at other boosting rounds),
    with the mixing weights chosen again out of fold."""
    from decisionkit.training.trainer import fit_structured

    model = decisionkit.load(quick_model[0])
    cases = splits["train"].head(8)
    features = model.normalize(model.split_pooled(cases))
    fit = fit_structured(model, cases, features, folds=2, rounds=7)
    assert model.structured.rounds == 7 and model.structured.weights == fit.weights
    assert set(fit.scores.index.get_level_values("part")) == {"heads", "trees", "lexical", "hybrid"}
    case = splits["validation"][0]
    assert set(model.decide(case.state, workflow=case.workflow)) == set(case.questions)


def test_with_trees_mixes_any_part_at_the_hybrids_own_weights(quick_model, splits):
    """``with_trees`` puts a part where the heads sit in the hybrid, the other parts at the model's weights per
    question: the heads put back give w_heads * heads + w_trees * trees + w_lexical * lexical."""
    from decisionkit.training.trainer import part_answers, with_trees

    _, model = quick_model
    cases = splits["test"].head(2)
    parts = part_answers(model, cases)
    assert set(parts) == {"heads alone", "trees alone", "lexical alone"}
    mixes = with_trees(model, cases, {name: parts[name] for name in ("heads alone", "lexical alone")})
    assert set(mixes) == {"heads alone + trees", "lexical alone + trees"}
    case = cases[0]
    qid = next(iter(case.questions))
    w = model.structured.weights[case.workflow][qid]
    expected = sum(w[part] * parts[f"{part} alone"][0][qid] for part in ("heads", "trees", "lexical"))
    row = mixes["heads alone + trees"].decisions.iloc[0]
    assert row["question"] == qid and row["confidence"] == pytest.approx(expected.max())
