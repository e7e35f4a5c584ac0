import numpy as np
import pytest

from decisionkit.data.cases import Split, read_jsonl
from decisionkit.data.metrics import (
    Scores,
    accuracy_interval,
    expected_calibration_error,
    paired_difference,
    prior_predictions,
    reliability_bins,
    score,
    uniform_predictions,
    wilson_interval,
)


def test_uniform_row_of_the_benchmark(splits):
    """The dataset card's "Uniform" row on the test split: KL 0.444, Brier 0.238."""
    overall = score(splits["test"], uniform_predictions(splits["test"])).overall()
    assert overall["kl"] == pytest.approx(0.444, abs=5e-4)
    assert overall["brier"] == pytest.approx(0.238, abs=5e-4)
    assert overall["decisions"] == 2000


def test_prior_fitted_on_train_beats_uniform_on_test(splits):
    prior = score(splits["test"], prior_predictions(splits["train"], splits["test"])).overall()
    uniform = score(splits["test"], uniform_predictions(splits["test"])).overall()
    assert prior["kl"] < uniform["kl"] and prior["brier"] < uniform["brier"]
    # The prior's accuracy, counted again without metrics.py: sum each (workflow, question)'s gold over train, take
    # its top option (first listed on a tie) and count the test decisions whose gold top option is the same one.
    totals = {}
    for case in splits["train"]:
        for qid, gold in case.gold.items():
            key = (case.workflow, qid)
            totals[key] = totals.get(key, 0) + gold.probabilities
    right = sum(int(np.argmax(totals[(c.workflow, qid)]) == np.argmax(g.probabilities))
                for c in splits["test"] for qid, g in c.gold.items())
    assert right == 962  # of 2,000 decisions: 0.481 (the dataset card's 0.470 is not this prior's number)
    assert prior["accuracy"] == pytest.approx(right / 2000, abs=1e-12)


def test_per_decision_formulas_by_hand(tmp_path):
    line = ('{"id": "c", "workflow": "w", "state": {}, "questions": {"q": {"type": "choice", "instructions": "",'
            ' "criteria": {"a": "", "b": "", "c": ""}}}, "gold": {"q": {"probabilities": '
            '{"a": 0.5, "b": 0.5, "c": 0.0}, "label": "b"}}}')
    (tmp_path / "x.jsonl").write_text(line + "\n")
    cases = Split("x", read_jsonl(tmp_path / "x.jsonl"), "x")
    row = score(cases, [{"q": np.array([0.6, 0.4, 0.0])}]).decisions.iloc[0]
    assert row["correct"]  # tie in gold goes to the first-listed key, "a"
    assert not row["correct_label"]  # the stored label says "b"
    assert row["kl"] == pytest.approx(0.5 * np.log(0.5 / 0.6) + 0.5 * np.log(0.5 / 0.4))  # the c term is skipped
    assert row["brier"] == pytest.approx(0.01 + 0.01)
    assert row["confidence"] == pytest.approx(0.6)


def test_kl_floors_zero_predictions(splits):
    case = splits["test"][0]
    bad = {qid: np.eye(len(q.options))[-1] for qid, q in case.questions.items()}
    kl = score(Split("one", [case], "x"), [bad]).decisions["kl"]
    assert np.isfinite(kl).all() and kl.max() < 30  # ln(1e12) ~ 27.6 caps each term


def test_ece_small_table():
    # Two bins used: 0.9 confidence with 50% right (gap 0.4), 0.3 with 0% right (gap 0.3); equal weights.
    conf = np.array([0.9, 0.9, 0.3, 0.3])
    correct = np.array([1, 0, 0, 0])
    assert expected_calibration_error(conf, correct) == pytest.approx(0.35)
    assert expected_calibration_error(np.array([1.0]), np.array([1])) == 0.0  # 1.0 lands in the top bin


def test_shapes_are_checked(splits):
    case = splits["test"][0]
    with pytest.raises(ValueError, match="expected one per case"):
        score(splits["test"], [])
    qid = next(iter(case.questions))
    wrong = {q: np.array([1.0]) for q in case.questions}
    with pytest.raises(ValueError, match=f"question '{qid}': prediction has 1 probabilities"):
        score(Split("one", [case], "x"), [wrong])


def test_against_majority_puts_each_head_beside_the_most_common_label(splits):
    from decisionkit.data.metrics import against_majority

    train, test = splits["train"], splits["test"].head(5)

    class Prior:  # a "model" that answers the training prior: its accuracy is the majority baseline's
        def predict(self, cases):
            return prior_predictions(train, cases)

    table = against_majority(Prior(), train, test)
    assert list(table.columns) == ["test accuracy", "majority baseline", "KL", "ECE", "gain"]
    assert set(table.index) == {q for c in test for q in c.questions}
    assert (table["test accuracy"] == table["majority baseline"]).all() and (table["gain"] == 0).all()
    per_question = score(test, prior_predictions(train, test)).summary("question")
    assert table["KL"].to_dict() == pytest.approx(per_question["kl"].to_dict())


def test_paired_difference_resamples_cases_and_brackets_the_gain(splits):
    cases = splits["validation"]
    uniform = score(cases, uniform_predictions(cases))
    gold = score(cases, [{q: c.gold[q].probabilities for q in c.questions} for c in cases])
    gain, low, high = paired_difference(uniform, gold)
    assert gain == pytest.approx(gold.overall()["accuracy"] - uniform.overall()["accuracy"])
    assert low < gain < high and low > 0  # the gold beats uniform answers beyond noise
    assert paired_difference(gold, gold) == (0.0, 0.0, 0.0)
    assert paired_difference(uniform, gold, "kl")[0] < 0  # KL falls
    ece, low, high = paired_difference(uniform, gold, "ece", resamples=200)
    assert ece == pytest.approx(expected_calibration_error(gold.decisions["confidence"], gold.decisions["correct"])
                                - expected_calibration_error(uniform.decisions["confidence"], uniform.decisions["correct"]))
    assert low <= ece <= high
    carried = gold.decisions["answer_confidence"].notna()  # the confidence field: choice and score answers only
    assert (~carried).any() and carried.any()
    field, low, high = paired_difference(uniform, gold, "ece_confidence", resamples=200)
    assert field == pytest.approx(gold.overall()["ece_confidence"] - uniform.overall()["ece_confidence"])
    assert low <= field <= high
    with pytest.raises(ValueError, match="expected one of accuracy"):
        paired_difference(uniform, gold, "f1")
    with pytest.raises(ValueError, match="different decisions"):
        paired_difference(uniform, score(cases.head(2), uniform_predictions(cases.head(2))))


def test_unpaired_difference_resamples_each_split_on_its_own():
    from decisionkit.data.metrics import unpaired_difference
    from decisionkit.data.scenarios import load_scenario

    test, other = load_scenario("tickets", "test"), load_scenario("tickets", "other-voice")
    gold = score(other, [{q: c.gold[q].probabilities for q in c.questions} for c in other])
    uniform = score(test, uniform_predictions(test))
    gap, low, high = unpaired_difference(uniform, gold)
    assert gap == pytest.approx(gold.overall()["accuracy"] - uniform.overall()["accuracy"])
    assert 0 < low < gap < high  # answering the gold beats uniform answers beyond noise, on other cases
    same, low, high = unpaired_difference(uniform, uniform, "kl")
    assert same == 0 and low < 0 < high  # two independent draws of the same cases differ only by the draw
    assert unpaired_difference(gold, uniform, "ece", resamples=200)[0] == pytest.approx(
        uniform.overall()["ece"] - gold.overall()["ece"])
    one = score(test.head(1), uniform_predictions(test.head(1)))
    assert np.isnan(unpaired_difference(one, gold)[1:]).all()  # one case: nothing to resample
    with pytest.raises(ValueError, match="expected one of accuracy"):
        unpaired_difference(uniform, gold, "f1")


def test_split_gap_puts_two_splits_side_by_side_per_question():
    from decisionkit.data.metrics import split_gap
    from decisionkit.data.scenarios import load_scenario

    train, test, other = (load_scenario("tickets", s) for s in ("train", "test", "other-voice"))

    class Prior:  # a "model" that answers the training prior: the majority baseline on each split
        def predict(self, cases):
            return prior_predictions(train, cases)

    table = split_gap(Prior(), test, other, resamples=500)
    assert list(table.columns) == ["test", "other-voice", "gap", "95% interval, low", "95% interval, high"]
    assert list(table.index) == ["contains_pii", "language", "priority", "sentiment", "team", "all questions"]
    for split in (test, other):
        per_question = score(split, prior_predictions(train, split)).summary("question")["accuracy"]
        assert table[split.name].drop("all questions").to_dict() == pytest.approx(per_question.to_dict())
    assert table["gap"].to_numpy() == pytest.approx((table["other-voice"] - table["test"]).to_numpy())
    assert (table["95% interval, low"] <= table["gap"]).all() and (table["gap"] <= table["95% interval, high"]).all()
    with pytest.raises(ValueError, match="both splits are named 'test'"):
        split_gap(Prior(), test, test)


def test_wrong_answers_lists_the_misses_most_confident_first():
    from decisionkit.data.metrics import wrong_answers
    from decisionkit.data.scenarios import load_scenario

    train, other = load_scenario("tickets", "train"), load_scenario("tickets", "other-voice")

    class Prior:  # answers every ticket with the training prior: `low` priority, whatever it says
        def predict(self, cases):
            return prior_predictions(train, cases)

    table = wrong_answers(Prior(), other, "priority", width=40)
    assert list(table.columns) == ["text", "characters", "gold", "answer", "probability"]
    assert (table["answer"] == "low").all() and set(table["gold"]) == {"medium", "high"}
    not_low = [c.id for c in other if c.questions["priority"].options[c.gold["priority"].top] != "low"]
    assert sorted(table.index) == sorted(not_low)
    assert table["text"].str.len().max() <= 40 and not table["text"].str.contains("\n").any()
    assert table.loc["ov-001", "characters"] == len(other[0].state)
    class Gold:  # answers the gold itself: nothing to list
        def predict(self, cases):
            return [{q: c.gold[q].probabilities for q in c.questions} for c in cases]

    assert wrong_answers(Gold(), other, "team").empty
    with pytest.raises(ValueError, match="has no question 'urgency'"):
        wrong_answers(Prior(), other, "urgency")


def test_reliability_bins_give_each_bins_accuracy_its_wilson_interval():
    confidence = np.array([0.95, 0.92, 0.91, 0.35, 0.32] + [0.75] * 10)
    correct = np.array([1, 1, 1, 0, 0] + [1] * 5 + [0] * 5)
    table = reliability_bins(confidence, correct)
    assert table["decisions"].tolist() == [2, 10, 3]
    # 5 of 10 right: the Wilson interval 0.237 to 0.763 (the textbook value)
    assert (table.loc[7, "accuracy low"], table.loc[7, "accuracy high"]) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert table.loc[3, "accuracy low"] == pytest.approx(0, abs=1e-12) and 0 < table.loc[3, "accuracy high"] < 1  # 0 of 2
    assert table.loc[9, "accuracy low"] > 0 and table.loc[9, "accuracy high"] == pytest.approx(1)  # 3 of 3
    wider = reliability_bins(confidence, correct, level=0.99)
    assert (wider["accuracy low"] <= table["accuracy low"] + 1e-12).all()  # a higher level, a wider interval


def test_wilson_interval_matches_the_textbook():
    low, high = wilson_interval([0.5, 1.0], [10, 5])
    assert (low[0], high[0]) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # 5 of 10
    assert (low[1], high[1]) == pytest.approx((5 / (5 + 1.959964**2), 1.0), abs=1e-4)  # 5 of 5: n / (n + z^2)


def test_accuracy_interval_resamples_whole_cases(splits):
    cases = splits["test"].head(10)
    scores = score(cases, uniform_predictions(cases))
    accuracy, low, high = accuracy_interval(scores)
    assert accuracy == pytest.approx(scores.overall()["accuracy"]) and low <= accuracy <= high and low < high
    one = Scores(scores.decisions[scores.decisions["case"] == cases[0].id])
    assert np.isnan(accuracy_interval(one)[1])  # one case: nothing to resample
