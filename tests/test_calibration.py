import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import decisionkit
from decisionkit.data.metrics import expected_calibration_error, reliability_bins, score
from decisionkit.data.scenarios import load_scenario
from decisionkit.training.calibration import (
    STAGES,
    calibrate,
    calibrate_out_of_fold,
    fitted_where,
    risk_coverage,
    uncalibrated,
)
from decisionkit.training.runs import shared_run
from decisionkit.training.temperature import (
    BOUNDS,
    DecisionLogits,
    LogitGroup,
    decision_logits,
    fit_temperature,
    out_of_fold_logits,
    temperature_rule,
)

ONES = dict.fromkeys(("noul", "choice", "score"), 1.0)


def synthetic(temperature: float, n: int = 400, k: int = 4, seed: int = 0) -> DecisionLogits:
    """Logits whose gold is softmax(logits / temperature): the best temperature is known."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=gen) * 3
    gold = torch.softmax(z / temperature, -1)
    label = torch.nn.functional.one_hot(torch.multinomial(gold, 1, generator=gen)[:, 0], k).float()  # answers drawn
    return DecisionLogits(None, [LogitGroup("w", "q", "choice", list(range(n)), z, gold, label)])


@pytest.mark.parametrize("temperature", [0.5, 2.0, 4.0])
def test_fit_recovers_a_known_temperature(temperature):
    fit = fit_temperature(synthetic(temperature), target="distribution")
    assert fit.temperature == pytest.approx(temperature, rel=1e-2)
    assert not fit.at_bound and fit.nll_after < fit.nll_before
    drawn = fit_temperature(synthetic(temperature, n=4000), target="label")  # answers sampled from the same model
    assert drawn.temperature == pytest.approx(temperature, rel=0.1)


def test_unknown_target_is_refused():
    with pytest.raises(ValueError, match="expected one of label, distribution"):
        fit_temperature(synthetic(1.0), target="hard")


def test_a_fit_on_the_bound_says_so():
    logits = synthetic(1.0)
    hard = logits.groups[0]
    logits.groups[0] = replace(hard, label=torch.nn.functional.one_hot(hard.logits.argmax(-1), 4).float())  # always
    # right: T -> 0
    fit = fit_temperature(logits, target="label")
    assert fit.at_bound and fit.temperature == pytest.approx(BOUNDS[0], rel=0.02)


def test_reliability_bins_and_ece_agree():
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.2, 1.0, 1000)
    correct = rng.uniform(size=1000) < confidence  # calibrated by construction
    table = reliability_bins(confidence, correct, 10)
    assert table["decisions"].sum() == 1000 and (table["high"] - table["low"]).round(9).eq(0.1).all()
    assert expected_calibration_error(confidence, correct) < 0.05
    assert expected_calibration_error(np.ones(10), np.zeros(10)) == 1.0
    assert reliability_bins(np.array([1.0]), np.array([True]), 10).index.tolist() == [9]  # 1.0 is in the last bin


def test_calibration_is_fitted_on_validation_only(quick_model, splits):
    path, _ = quick_model
    validation = splits["validation"].head(10)
    test = splits["test"].head(5)
    alone = calibrate(decisionkit.load(path), validation)
    with_test = calibrate(decisionkit.load(path), validation, test)
    assert with_test.temperatures == alone.temperatures  # scoring test changes nothing
    assert {name for name, _ in with_test.scores} == {"validation", "test"}
    table = with_test.table()
    for split in ("validation", "test"):  # temperature never changes which option is on top
        assert table.loc[(split, "before"), "accuracy"] == table.loc[(split, "after"), "accuracy"]
    fits = with_test.temperature_table()
    assert set(fits.index) >= {(t, s) for t in ("label", "distribution") for s in ("global", "noul", "choice", "score")}
    assert (fits["nll_after"] <= fits["nll_before"] + 1e-9).all()
    assert {"ece (10 bins)", "ece (15 bins)", "ece of confidence (10 bins)"} <= set(table.columns)
    assert len(with_test.reliability_figure("test").data) == 3
    assert len(with_test.risk_coverage_figure("validation").data) == 2
    assert len(with_test.confidence_figure("test").data) == 2


def test_temperatures_travel_with_the_saved_model(quick_model, splits, tmp_path):
    path, _ = quick_model
    model = decisionkit.load(path)
    calibrate(model, splits["validation"].head(10))
    case = splits["test"][0]
    before = model.decide(case.state, workflow=case.workflow)
    reopened = decisionkit.load(model.save(tmp_path / "calibrated"))
    assert reopened.temperatures.probabilities == pytest.approx(model.temperatures.probabilities)
    assert reopened.temperatures.confidence == pytest.approx(model.temperatures.confidence)
    after = reopened.decide(case.state, workflow=case.workflow)
    for qid, a in before.items():
        for key in ("noul", "confidence"):
            if key in a:
                assert after[qid][key] == pytest.approx(a[key], abs=1e-5)


def test_risk_coverage_ends_at_the_overall_accuracy(quick_model, splits):
    _, model = quick_model
    cases = splits["validation"].head(5)
    scores = score(cases, decision_logits(model, cases).predictions(model.temperatures.probabilities))
    curve = risk_coverage(scores)
    assert curve["coverage"].iloc[-1] == 1.0
    assert math.isclose(curve["accuracy"].iloc[-1], scores.overall()["accuracy"])
    assert curve["threshold"].is_monotonic_decreasing


def test_both_targets_fit_probabilities_and_confidence_apart(quick_model, splits):
    path, _ = quick_model
    validation = splits["validation"].head(10)
    model = decisionkit.load(path)
    report = calibrate(model, validation)  # target="both"
    fits = report.temperature_table()["temperature"]
    assert model.temperatures.probabilities == pytest.approx(  # the table is rounded to 3 decimals
        {t: fits[("distribution", t)] for t in ("noul", "choice", "score")}, abs=1e-3)
    assert model.temperatures.confidence == pytest.approx({t: fits[("label", t)] for t in ("noul", "choice", "score")},
                                                          abs=1e-3)
    case = validation[0]
    probs = model.predict(validation.head(1))[0]
    answers = model.decide(case.state, workflow=case.workflow)
    for qid, question in case.questions.items():
        if question.type == "noul":
            assert "confidence" not in answers[qid]
            continue
        # the confidence is the top option re-tempered at the label's temperature, the probabilities are not
        z = np.log(probs[qid]) * model.temperatures.of(question.type)
        expected = torch.softmax(torch.as_tensor(z) / model.temperatures.of(question.type, confidence=True),
                                 -1).max().item()
        assert answers[qid]["confidence"] == pytest.approx(expected, abs=1e-5)
        assert max(answers[qid]["probabilities"].values()) == pytest.approx(probs[qid].max(), abs=1e-5)
    after = report.scores[("validation", "after")]
    assert after.confidence_ece() == pytest.approx(score(validation, *model.outputs(validation)).confidence_ece(),
                                                   abs=1e-6)
    with pytest.raises(ValueError, match="expected one of both, label, distribution"):
        calibrate(model, validation, target="answer")


def test_coverage_at_reads_the_risk_coverage_curve(quick_model, splits):
    model = decisionkit.load(quick_model[0])
    report = calibrate(model, splits["validation"].head(5), splits["test"].head(5))
    table = report.coverage_at("test", thresholds=(0.0, 0.5, 2.0))
    decisions = report.scores[("test", "after")].decisions
    assert list(table.index) == ["confidence >= 0.0", "confidence >= 0.5"]  # nothing is 2.0 sure: left out
    assert table.loc["confidence >= 0.0", "answered"] == 1.0
    assert table.loc["confidence >= 0.0", "accuracy when answered"] == pytest.approx(decisions["correct"].mean())
    sure = decisions[decisions["confidence"] >= 0.5]
    assert table.loc["confidence >= 0.5", "answered"] == pytest.approx(len(sure) / len(decisions))
    assert table.loc["confidence >= 0.5", "accuracy when answered"] == pytest.approx(sure["correct"].mean())


def test_fitted_where_fits_each_split_and_scores_the_same_test(quick_model, splits):
    model = decisionkit.load(quick_model[0])
    validation, test, train = splits["validation"].head(5), splits["test"].head(5), splits["train"].head(5)
    table = fitted_where(model, {"train": train, "validation": validation}, test)
    for name, cases in (("train", train), ("validation", validation)):
        t = fit_temperature(decision_logits(model, cases)).temperature
        ece = score(test, decision_logits(model, test).predictions(dict.fromkeys(("noul", "choice", "score"), t)))
        assert table.loc[f"fitted on {name}", "temperature"] == pytest.approx(t)
        assert table.loc[f"fitted on {name}", "test ECE"] == pytest.approx(ece.overall()["ece"])


# Small data: the ngs-qc scenario (196 train, 28 validation, 56 test reports), heads trained by its preset (a dev slice
# of train picks L2 and steps), once into the cache.


@pytest.fixture(scope="module")
def ngs_qc_run():
    return shared_run("ngs-qc"), {s: load_scenario("ngs-qc", s) for s in ("train", "validation", "test")}


@pytest.fixture(scope="module")
def qc_pool(ngs_qc_run):
    """Held-out logits of every train report (out of fold) and of every validation report."""
    path, splits = ngs_qc_run
    model = decisionkit.load(path)
    return DecisionLogits.joined([out_of_fold_logits(model, splits["train"]), decision_logits(model, splits["validation"])],
                                 "pool")


def test_out_of_fold_logits_score_each_train_case_once_with_heads_that_never_saw_it(ngs_qc_run, qc_pool):
    path, splits = ngs_qc_run
    model = decisionkit.load(path)
    train = splits["train"]
    oof = out_of_fold_logits(model, train)
    assert sorted(oof.cases.ids) == sorted(train.ids) and len(set(oof.cases.ids)) == len(train)
    assert sum(len(g.rows) for g in oof.groups) == 2 * len(train)  # action and risk, once each
    # The model's own heads saw these reports: in sample they look far surer than held out (measured: answer log
    # loss 0.11 in sample, 0.71 out of fold).
    assert oof.nll(ONES) > decision_logits(model, train).nll(ONES) + 0.3
    again = out_of_fold_logits(model, train)  # the same folds every time
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(oof.groups, again.groups))
    model.head_recipe = None  # as for a fine-tuned model: no recipe to fit the heads again by
    with pytest.raises(ValueError, match="head_recipe"):
        out_of_fold_logits(model, train)


@pytest.mark.parametrize("sharper", [3.0, 1 / 3])
def test_the_rule_keeps_a_temperature_that_helps_held_out_data(qc_pool, sharper):
    """The real held-out logits made over-confident (x3) or under-confident (/3): the fitted temperatures undo it
    on data they were not fitted on, so the rule keeps them."""
    base = temperature_rule(qc_pool)
    rule = temperature_rule(qc_pool.tempered(dict.fromkeys(ONES, 1 / sharper)))
    table = rule.decisions
    assert table["kept"].all() and (table["why"].str.startswith("lowers")).all()
    assert (table["loss at fitted T"] < table["loss at T = 1"]).all() and (table["ECE at fitted T"] <= table["ECE at T = 1"]).all()
    assert rule.temperatures["choice"] == pytest.approx(sharper * base.fitted["choice"], rel=0.01)
    assert rule.confidence_temperatures["choice"] == rule.fitted_confidence["choice"]


def test_the_rule_returns_one_when_the_fitted_temperature_does_not_help_held_out_data(qc_pool):
    """Logits already at their best temperature: refitted, T comes out within noise of 1, and that noise makes the
    held-out predictions worse, not better, so T = 1."""
    base = temperature_rule(qc_pool)
    for of, temperatures in (("probabilities", base.fitted), ("confidence", base.fitted_confidence)):
        rule = temperature_rule(qc_pool.tempered(temperatures))
        row = rule.decisions.loc[(of, "choice")]
        assert row["fitted T"] == pytest.approx(1.0, abs=0.01) and row["fitted T"] != 1.0
        assert not row["kept"] and row["T after the rule"] == 1.0 and row["why"].endswith("not lower")
        assert row["loss at fitted T"] >= row["loss at T = 1"]
    assert rule.confidence_temperatures["choice"] == 1.0


def test_the_rule_refuses_a_temperature_that_lowers_kl_but_raises_ece(qc_pool):
    """Every answer right and sure, the gold sometimes spread (annotators disagree): softening the probabilities
    toward the spread lowers KL, but makes right answers look unsure (ECE rises), so they keep T = 1; the confidence,
    fitted to the answer, sharpens and is kept (calibration's two meanings)."""
    sure = DecisionLogits(qc_pool.cases, [replace(g, logits=4 * torch.log(g.gold.clamp_min(1e-3)))
                                          for g in qc_pool.groups])
    assert any(0 < g.gold.max(-1).values.min() < 1 for g in sure.groups)  # some gold is spread
    rule = temperature_rule(sure)
    probabilities, confidence = rule.decisions.loc[("probabilities", "choice")], rule.decisions.loc[("confidence", "choice")]
    assert probabilities["fitted T"] > 1 and probabilities["loss at fitted T"] < probabilities["loss at T = 1"]
    assert probabilities["ECE at fitted T"] > probabilities["ECE at T = 1"]
    assert not probabilities["kept"] and probabilities["why"] == "raises ECE" and rule.temperatures["choice"] == 1.0
    assert confidence["kept"] and confidence["fitted T"] < 1


def test_calibrate_out_of_fold_sets_the_kept_temperatures_and_only_scores_test(ngs_qc_run):
    path, splits = ngs_qc_run
    train, validation, test = splits["train"], splits["validation"], splits["test"]
    model = decisionkit.load(path)
    report = calibrate_out_of_fold(model, train, validation, test)
    assert report.fitted_on == {"train (out of fold)": len(train), "validation": len(validation), "folds": 5}
    assert model.temperatures.probabilities == report.rule.temperatures
    assert model.temperatures.confidence == report.rule.confidence_temperatures
    rule = report.rule_table()
    assert (rule["T after the rule"] == rule["fitted T"].where(rule["kept"], 1.0)).all()
    table = report.table()
    assert [stage for split, stage in table.index if split == "test"] == list(STAGES)
    assert table["accuracy"].nunique() == 2  # held-out pool and test: a temperature never changes the top answer
    assert table.loc[("test", "before"), "decisions"] == 2 * len(test)
    assert table.loc[(report.rule.name, "before"), "decisions"] == 2 * (len(train) + len(validation))
    after = score(test, *model.outputs(test))  # what the calibrated model now answers is the table's "after"
    assert after.overall()["kl"] == pytest.approx(table.loc[("test", "after"), "kl"], abs=1e-6)
    line = report.summary("test")
    assert f"{table.loc[('test', 'after'), 'kl']:.3f} after" in line
    change = report.change("test", before="before", after="as fitted")
    assert list(change.index) == ["ece", "kl", "brier"]
    for metric in ("kl", "brier"):  # a mean's change, inside its interval (ECE's bootstrap is skewed)
        low, point, high = change.loc[metric, ["95% interval, low", "change", "95% interval, high"]]
        assert point == pytest.approx(table.loc[("test", "as fitted"), metric] - table.loc[("test", "before"), metric])
        assert low <= point <= high
    assert line.endswith("none (T = 1)") == (not rule["kept"].any())
    alone = calibrate_out_of_fold(decisionkit.load(path), train, validation)
    assert alone.temperatures == report.temperatures  # scoring test changed nothing
    with pytest.raises(ValueError, match="also in a split before it"):
        calibrate_out_of_fold(decisionkit.load(path), train, validation, validation)


def test_calibrating_a_routed_model_is_refused_with_the_order_to_follow(quick_model, splits):
    """Temperatures, then the router: calibrating under a router would move answers across its threshold."""
    from decisionkit.training.anomaly import fit_router

    model = decisionkit.load(quick_model[0])
    fit_router(model, splits["train"].head(10), splits["validation"].head(10), folds=2)
    for call in (lambda: calibrate(model, splits["validation"].head(10)),
                 lambda: calibrate_out_of_fold(model, splits["train"].head(10), splits["validation"].head(10))):
        with pytest.raises(ValueError, match="calibrate before fit_router"):
            call()
    model.router = None
    calibrate(model, splits["validation"].head(10))  # in order again


def test_uncalibrated_resets_a_routed_hybrid_to_what_calibrate_starts_from(quick_model, splits):
    """A saved, calibrated and routed hybrid back to temperatures 1 without its router; the heads alone on request."""
    from decisionkit.training.anomaly import fit_router

    model = decisionkit.load(quick_model[0])
    calibrate(model, splits["validation"].head(10))
    fit_router(model, splits["train"].head(10), splits["validation"].head(10), folds=2)
    assert model.temperatures.fitted and model.router is not None
    assert uncalibrated(model) is model
    assert not model.temperatures.fitted and model.router is None and model.structured is not None
    calibrate(model, splits["validation"].head(10))  # allowed again
    heads = uncalibrated(decisionkit.load(quick_model[0]), heads_alone=True)
    assert heads.structured is None and not heads.temperatures.fitted
