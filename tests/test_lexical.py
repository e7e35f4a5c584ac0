"""The hybrid's lexical part (``model/lexical.py``): kept as arrays that answer exactly as the scikit-learn models
they came from, saved and read back, and a hybrid never worse than its best part: on a problem the words decide
and on one a number decides, the weights chosen out of fold follow the part that knows (trains nothing heavy: no
backbone; the heads' place holds the training prior, a part that knows nothing)."""

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from decisionkit.data.cases import Case, Gold, Split
from decisionkit.data.metrics import paired_difference, score
from decisionkit.data.questions import Question
from decisionkit.model.fitting import parts_out_of_fold
from decisionkit.model.lexical import CHARS, LEXICAL_C, TOLERANCE, WORDS, Lexical, Linear, state_texts
from decisionkit.model.structured import StructuredPart, choose_weights, named_blend

YES_NO = Question.from_json("refund", {"type": "noul"}, "test")
WORDS_POOL = ("parcel late address order tracking invoice account login password delivery courier box label "
              "shipment weekend monday payment card store").split()


def cases(n: int, decided_by: str, seed: int, text_states: bool = False) -> Split:
    """``n`` cases of one yes/no question: decided by a word in the note ("refund" / "chargeback": yes) or by the
    amount (over 50: yes), the other clue noise; gold soft (0.9 on the answer)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = list(rng.choice(WORDS_POOL, size=8))
        amount = float(rng.uniform(0, 100))
        if decided_by == "words":
            yes = rng.random() < 0.5
            if yes:
                words.insert(int(rng.integers(0, 8)), str(rng.choice(["refund", "chargeback"])))
        else:
            yes = amount > 50
        note = " ".join(words)
        state = note if text_states else {"amount": round(amount, 2), "note": note, "channel": "web"}
        gold = Gold(np.array([0.1, 0.9]) if yes else np.array([0.9, 0.1]), "true" if yes else "false")
        out.append(Case(f"{decided_by}-{seed}-{i}", "claims", state, {"refund": YES_NO}, {"refund": gold}))
    return Split(decided_by, out, "test")


def test_the_arrays_answer_as_scikit_learn():
    train, test = cases(120, "words", 0), cases(40, "words", 1)
    lexical = Lexical.fit(train)
    texts = [state_texts(c.state, c.workflow) for c in train]
    words, chars = TfidfVectorizer(**WORDS, dtype=np.float32), TfidfVectorizer(**CHARS, dtype=np.float32)
    words.fit([t[0] for t in texts])
    chars.fit([t[1] for t in texts])
    assert lexical.vocabulary.words == list(words.get_feature_names_out())
    test_texts = [state_texts(c.state, c.workflow) for c in test]
    x = lexical.vocabulary.matrix(test_texts)
    assert lexical.vocabulary.chars == list(chars.get_feature_names_out())
    expected = np.hstack([words.transform([t[0] for t in test_texts]).toarray(),
                          chars.transform([t[1] for t in test_texts]).toarray()])
    np.testing.assert_allclose(x.toarray(), expected, atol=1e-6)  # TfidfVectorizer.transform's numbers
    gold = np.stack([c.gold["refund"].probabilities for c in train])
    rows, labels = np.nonzero(gold > 0)
    x_train = lexical.vocabulary.matrix(texts)
    reference = LogisticRegression(C=LEXICAL_C, max_iter=1000, tol=TOLERANCE).fit(
        x_train[rows], labels, sample_weight=gold[rows, labels])
    np.testing.assert_allclose(lexical.models["claims"]["refund"].probabilities(x), reference.predict_proba(x),
                               atol=1e-5)
    # saved as arrays and JSON, read back: the same answers
    again = Lexical.from_saved(lexical.config(), lexical.tensors("lexical"), "lexical")
    found, back = (part.probabilities([c.state for c in test], "claims", ["refund"])["refund"]
                   for part in (lexical, again))
    np.testing.assert_allclose(found, back, atol=1e-7)


def test_a_question_with_one_option_ever_weighed_answers_the_prior():
    gold = np.tile([0.0, 1.0], (5, 1))
    linear = Linear.fit(np.zeros((5, 3)), gold)
    np.testing.assert_allclose(linear.probabilities(np.zeros((2, 3))), [[0.0, 1.0]] * 2, atol=1e-9)


def test_text_states_get_the_lexical_part_and_no_trees():
    parts = StructuredPart.fit(cases(60, "words", 0, text_states=True), rounds=5)
    assert parts.parts("claims") == ["heads", "lexical"] and not parts.trees
    assert set(parts.answers(cases(5, "words", 1, text_states=True))) == {"lexical"}


def _hybrid_and_parts(decided_by: str, seed: int) -> dict:
    """Test scores of the hybrid (weights chosen out of fold on train, as ``training.fit_structured`` chooses them)
    and of each part alone."""
    train, test = cases(240, decided_by, seed), cases(200, decided_by, seed + 100)
    prior = np.mean([c.gold["refund"].probabilities for c in train], axis=0)
    heads = lambda split: [{"refund": prior} for _ in split]  # noqa: E731
    parts = StructuredPart.fit(train, rounds=30)
    weights = choose_weights(train, {"heads": heads(train), **parts_out_of_fold(parts, train)})
    answers = {"heads": heads(test), **parts.answers(test)}
    return {"hybrid": score(test, named_blend(test, answers, weights)),
            **{name: score(test, found) for name, found in answers.items()}}


@pytest.mark.parametrize("decided_by, strong", [("words", "lexical"), ("amount", "trees")])
def test_the_hybrid_is_never_worse_than_its_best_part(decided_by, strong):
    found = [_hybrid_and_parts(decided_by, seed) for seed in (0, 1, 2)]
    for scores in found:
        best = max(("trees", "lexical"), key=lambda name: scores[name].overall()["accuracy"])
        assert best == strong, f"{strong} should know this problem alone"
        difference, low, high = paired_difference(scores[best], scores["hybrid"])
        assert high >= 0, f"the hybrid is worse than {best} beyond the interval: {difference:+.3f} [{low}, {high}]"
    mean = {name: np.mean([s[name].overall()["accuracy"] for s in found]) for name in ("hybrid", "trees", "lexical")}
    assert mean["hybrid"] >= max(mean["trees"], mean["lexical"]), mean
