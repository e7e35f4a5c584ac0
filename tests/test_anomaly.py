import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import decisionkit
from decisionkit.core.answer_fields import lowest_confidence
from decisionkit.data.cases import DataError
from decisionkit.data.metrics import gold_priors
from decisionkit.model.fitting import cross_fit
from decisionkit.model.heads import targets
from decisionkit.model.routing import shown
from decisionkit.training.anomaly import (
    HYBRID_CROSS_FIT_FOLDS,
    OFF_DOMAIN_DIR,
    SCORES,
    FeatureDensity,
    Inputs,
    _cross_fitted,
    answer_names,
    evaluate_scores,
    fit_router,
    in_domain_calibration,
    load_inputs,
)

POEM = "autumn wind through golden leaves under the moon"


def test_the_project_off_domain_sets_load(splits):
    workflows = set(splits["train"].workflows)
    off = load_inputs(OFF_DOMAIN_DIR / "off_domain.jsonl", workflows)
    near = load_inputs(OFF_DOMAIN_DIR / "near_domain.jsonl", workflows)
    assert len(off) >= 150 and len(near) >= 20
    assert set(off.workflows) == workflows and len(set(off.ids)) == len(off)
    assert {"poem", "code", "other_language", "random_chars", "empty_ish", "very_long"} <= set(off.kinds)
    assert any("\u4e00" <= ch <= "\u9fff" for text in off.texts for ch in text)  # some Chinese
    assert all(t.startswith(f"workflow: {w}\n") for t, w in zip(off.texts, off.workflows))


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"id": 1, "kind": "poem", "workflow": "customer_service", "state": "x"}), "field 'id'"),
    (json.dumps({"id": "a", "kind": "poem", "workflow": "customer_service"}), "field 'state'"),
    (json.dumps({"id": "a", "kind": "poem", "workflow": "payroll", "state": "x"}), "field 'workflow' is 'payroll'"),
])
def test_bad_input_lines_name_the_line_and_field(tmp_path, line, message):
    path = tmp_path / "inputs.jsonl"
    path.write_text(json.dumps({"id": "ok", "kind": "poem", "workflow": "customer_service", "state": "x"}) + "\n"
                    + line + "\n")
    with pytest.raises(DataError, match=f"inputs.jsonl:2: .*{message}"):
        load_inputs(path, {"customer_service"})


def test_mahalanobis_separates_far_points_and_survives_saving():
    rng = np.random.default_rng(0)
    features = np.r_[rng.normal(0, 1, (200, 20)), rng.normal(3, 1, (200, 20))]
    workflows = ["a"] * 200 + ["b"] * 200
    density = FeatureDensity.fit(features, workflows, components=10)
    near, far = rng.normal(0, 1, (50, 20)), rng.normal(0, 1, (50, 20)) + 8
    assert density.distance(far, ["a"] * 50).min() > density.distance(near, ["a"] * 50).max()
    assert density.distance(near, ["b"] * 50).mean() > density.distance(near, ["a"] * 50).mean()  # per workflow
    reloaded = FeatureDensity.from_tensors(density.tensors())
    assert np.allclose(reloaded.distance(near, ["a"] * 50), density.distance(near, ["a"] * 50), rtol=1e-4)


@pytest.fixture(scope="module")
def routed(quick_model, splits):
    path, _ = quick_model
    model = decisionkit.load(path)
    train, validation = splits["train"].head(10), splits["validation"].head(10)
    router = fit_router(model, train, validation, rejection=0.1)
    return model, router, validation


def test_threshold_rejects_the_target_share_of_held_out_inputs(quick_model, splits):
    model = decisionkit.load(quick_model[0])
    validation = splits["validation"].head(10)
    router = fit_router(model, splits["train"].head(10), validation, rejection=0.1, folds=1)  # validation only
    assert router.fitted_on == {"validation": 40, "cross-fitted train": 0, "folds": 0}
    # the lowest confidence field of each held-out case as the model answers it (readout, not Router.scores)
    lowest = np.array([min(c.values()) for c in model.outputs(validation)[1]])
    assert router.threshold == pytest.approx(np.quantile(lowest, 0.1), rel=1e-9)
    assert (lowest < router.threshold).sum() == 4  # 10% of the 40 go to a human, exactly


def test_a_router_on_the_mahalanobis_distance_sends_far_inputs_to_a_human(quick_model, splits):
    model = decisionkit.load(quick_model[0])
    router = fit_router(model, splits["train"].head(10), splits["validation"].head(10), score="mahalanobis", folds=1)
    far = model.route(POEM, workflow="customer_service")
    assert far["verdict"] == "human" and far["scores"]["mahalanobis"] > router.threshold  # higher is stranger
    assert far["reason"].startswith(f"mahalanobis {far['scores']['mahalanobis']:.3g} is above the threshold")
    case = splits["test"][0]  # a real case none of the fit saw
    real = model.route(case.state, workflow=case.workflow)
    assert real["verdict"] == "answer" and real["scores"]["mahalanobis"] <= router.threshold


def test_the_default_router_also_holds_out_every_train_case(routed):
    _, router, _ = routed
    # the quick model is a hybrid: its folds re-fit the trees too, on the folds its mixing weights were chosen on
    assert router.fitted_on == {"validation": 40, "cross-fitted train": 40, "folds": HYBRID_CROSS_FIT_FOLDS}
    assert router.score == "confidence" and np.isfinite(router.reference) and router.scale > 0


def test_cross_fitted_models_never_saw_the_cases_they_score(quick_model, splits):
    model = decisionkit.load(quick_model[0])
    model.head_recipe = replace(model.head_recipe, steps=60)  # enough steps to fit the other folds closely
    train = splits["train"].head(10)
    x = model.split_features(train)
    folds = list(cross_fit(model, train, x, folds=4, structured=True))  # the hybrid's trees are re-fitted too
    assert sorted(np.concatenate([f.held for f in folds]).tolist()) == list(range(len(train)))  # each held out once
    assert all(not set(f.held) & set(f.inside) for f in folds)

    def loss(fold, rows):
        return fold.read(x[rows], [train[i].workflow for i in rows], targets(train, list(rows)),
                         states=[train[i].state for i in rows]).loss.item()

    assert np.mean([loss(f, f.held) for f in folds]) > np.mean([loss(f, f.inside) for f in folds])
    for (output, density), fold in zip(_cross_fitted(model, train, x, folds=4), folds):
        assert torch_equal(output.features, x[fold.held])  # the router scores each fold with that fold's models
        assert set(density.centres) == set(train.workflows) >= set(output.workflows)
        assert len(density.mean) == x.shape[1]


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_answers_lose_weight_with_distance(routed, splits):
    model, router, _ = routed
    assert router.weight([router.reference - 1, router.reference, router.reference + router.scale]) == \
        pytest.approx([1.0, 1.0, np.exp(-1)])
    inside = [(c, r) for c in splits["validation"].head(2)
              if (r := model.route(c.state, workflow=c.workflow))["scores"]["in-domain"] == 1.0]
    assert inside, "real validation cases lie within the reference distance"
    for case, routed in inside:  # and keep the heads' answers there
        assert routed["answers"] == model.decide(case.state, workflow=case.workflow, raw=True)


def test_a_far_input_answers_the_training_prior_with_no_confidence(routed, splits):
    model, router, _ = routed
    far = model.route(POEM, workflow="customer_service")
    raw = model.decide(POEM, workflow="customer_service", raw=True)
    weight = far["scores"]["in-domain"]
    assert far["scores"]["mahalanobis"] > router.reference and weight < 1e-6
    assert far["verdict"] == "human" and lowest_confidence(far["answers"]) < router.threshold
    priors = gold_priors(splits["train"].head(10))
    for qid, a in far["answers"].items():
        options = model.schema["customer_service"][qid].options
        prior = dict(zip(options, priors[("customer_service", qid)]))
        heads = raw[qid].get("probabilities") or {"true": raw[qid]["noul"]}
        got = a.get("probabilities") or {"true": a["noul"]}
        assert got == pytest.approx({o: weight * heads[o] + (1 - weight) * prior[o] for o in got}, abs=1e-9)
        if "confidence" in a:  # the heads' confidence in the answer given (the blend's top option), times the weight;
            # the quick model is not calibrated, so the heads' confidence in an option is their probability of it
            top = max(got, key=got.get)
            assert a["confidence"] == pytest.approx(weight * heads[top], rel=1e-6, abs=1e-300)


def test_halfway_out_the_answer_is_half_heads_half_prior(routed):
    model, router, _ = routed
    far = model.route(POEM, workflow="customer_service")
    saved = router.reference, router.field_reference
    try:  # the distance alone (a poem has no fields: their surprise would take the rest of its weight)
        router.reference = far["scores"]["mahalanobis"] - router.scale * np.log(2)  # weight 1/2 for the poem
        router.field_reference = {}
        half = model.route(POEM, workflow="customer_service")
    finally:
        router.reference, router.field_reference = saved
    raw = model.decide(POEM, workflow="customer_service", raw=True)
    assert half["scores"]["in-domain"] == pytest.approx(0.5)
    a, r = half["answers"]["category"], raw["category"]
    prior = far["answers"]["category"]["probabilities"]  # the far answer is the prior
    for option, p in a["probabilities"].items():
        assert p == pytest.approx(0.5 * r["probabilities"][option] + 0.5 * prior[option], abs=1e-6)
    top = max(a["probabilities"], key=a["probabilities"].get)  # the blend's answer, not necessarily the heads'
    assert a["confidence"] == pytest.approx(0.5 * r["probabilities"][top], rel=1e-6)  # uncalibrated: confidence = p


def test_route_answers_and_scores_a_poem(routed, splits):
    model, router, _ = routed
    result = model.route(POEM, workflow="customer_service")
    scores = result["scores"]
    # the verdict is the threshold's: a confidence below it goes to a human, and the reason quotes both numbers
    assert result["verdict"] == ("human" if scores["confidence"] < router.threshold else "answer")
    assert result["reason"].startswith(f"confidence {shown(scores['confidence'])} is ")
    assert f"threshold {shown(router.threshold)}" in result["reason"]
    assert shown(2.8e-47) == "0.000" and shown(0.3886) == "0.389" and shown(66.34) == "66.3"
    questions = model.schema["customer_service"]
    assert set(scores) >= set(SCORES) | {f"msp:{q}" for q in questions}
    assert set(result["answers"]) == set(questions)
    # MSP and entropy from the heads' own distributions (the raw answers), recomputed here
    raw = model.decide(POEM, workflow="customer_service", raw=True)
    dists = {q: np.array(list(a["probabilities"].values())) if "probabilities" in a else np.array([1 - a["noul"],
                                                                                                    a["noul"]])
             for q, a in raw.items()}
    for q, p in dists.items():
        assert scores[f"msp:{q}"] == pytest.approx(p.max(), abs=1e-6)
    assert scores["msp"] == pytest.approx(1 - min(p.max() for p in dists.values()), abs=1e-6)
    assert scores["entropy"] == pytest.approx(np.mean([-(p * np.log(np.clip(p, 1e-12, None))).sum() / np.log(len(p))
                                                       for p in dists.values()]), abs=1e-5)
    case = splits["validation"][0]
    with pytest.raises(decisionkit.QuestionError, match="no trained head"):
        model.route(case.state, {"nope": {"type": "noul"}}, workflow=case.workflow)


def test_a_hybrid_sends_another_workflows_state_to_a_human(routed, splits):
    """An invoice passed as a security incident reads like a state to the pooled features; its fields do not."""
    model, router, _ = routed
    assert set(router.field_reference) == set(model.schema) and router.field_scale > 0
    case = next(c for c in splits["validation"] if c.workflow == "invoice_processing")
    wrong = model.route(case.state, workflow="security_incidents")
    assert wrong["scores"]["field surprise"] == 1.0  # none of its paths is a security incident's
    fall = np.exp(-(1.0 - router.field_reference["security_incidents"]) / router.field_scale)
    assert wrong["scores"]["in-domain"] <= fall * (1 + 1e-9)
    assert wrong["verdict"] == "human" and wrong["scores"]["confidence"] < router.threshold
    own = model.route(case.state, workflow=case.workflow)
    assert own["scores"]["field surprise"] < wrong["scores"]["field surprise"]


def test_states_past_one_window_empty_plain_or_of_another_workflow_are_answered(routed, splits):
    """Every such state gets an answer to every question; a real state longer than one window is read as training
    read it (in windows of the same length, pooled across them) and stays in domain, while an empty state, a plain
    string and another workflow's state go to a human. A state past the cap on windows is refused."""
    from decisionkit.contract.systemone import QuestionError

    model, _, validation = routed
    case = next(c for c in validation if len(model.tokenize([c.text])["owner"]) > 1)  # two windows or more
    other = next(c for c in validation if c.workflow != case.workflow)
    long = model.route(case.state, workflow=case.workflow)
    assert long["scores"]["in-domain"] == 1.0
    for state in (case.state, {}, "my invoice was charged twice, please refund it", other.state):
        routed_state = model.route(state, workflow=case.workflow)
        assert set(routed_state["answers"]) == set(case.questions)
        for answer in routed_state["answers"].values():
            if "probabilities" in answer:
                assert sum(answer["probabilities"].values()) == pytest.approx(1, abs=1e-6)
        if state is not case.state:
            assert routed_state["verdict"] == "human", state
    with pytest.raises(QuestionError, match=f"reads at most {model.spec.max_tokens}"):
        model.route("word " * (model.spec.max_tokens + 1), workflow=case.workflow)


def test_router_is_saved_with_the_model(routed, tmp_path):
    model, router, _ = routed
    reopened = decisionkit.load(model.save(tmp_path / "routed"))
    assert reopened.router.config() == router.config()  # threshold, tail, priors, what it was fitted on
    again, first = (m.route(POEM, workflow="customer_service") for m in (reopened, model))
    assert again["scores"]["mahalanobis"] == pytest.approx(first["scores"]["mahalanobis"], rel=1e-4)
    assert again["answers"]["category"]["probabilities"] == pytest.approx(
        first["answers"]["category"]["probabilities"], abs=1e-6)


def test_a_model_without_router_says_how_to_get_one(quick_model):
    _, model = quick_model
    with pytest.raises(ValueError, match="fit_router"):
        model.route(POEM, workflow="customer_service")


def test_evaluation_reports_auroc_and_fpr(routed, splits):
    model, _, _ = routed
    off = Inputs("off", ["p", "q", "r"], [POEM, "def f(): pass", ""], ["security_incidents"] * 3,
                 ["poem", "code", "empty"])
    in_domain = splits["test"].head(2)
    report = evaluate_scores(model, in_domain, off)
    inside, outside = report.frames[report.real], report.frames["off"]
    assert inside["id"].tolist() == in_domain.ids and outside["id"].tolist() == ["p", "q", "r"]
    table = report.separation("off")
    assert list(table.index) == [*SCORES, "field surprise"]  # a hybrid's router reads the fields too
    for s in table.index:  # AUROC as the share of (in-domain, off-domain) pairs ordered right, ties half; FPR by count
        sign = -1.0 if s in ("confidence", "raw confidence") else 1.0  # oriented so that higher is stranger
        a, b = sign * inside[s].to_numpy(), sign * outside[s].to_numpy()
        pairs = (b[None, :] > a[:, None]).mean() + 0.5 * (b[None, :] == a[:, None]).mean()
        assert table.loc[s, "AUROC"] == pytest.approx(pairs), s
        assert table.loc[s, "FPR at 95% TPR"] == pytest.approx((b <= np.quantile(a, 0.95)).mean()), s
    routed_table = report.routed()
    assert routed_table["inputs"].to_dict() == {("off", "code"): 1, ("off", "empty"): 1, ("off", "poem"): 1,
                                                (report.real, "in-domain"): 8}
    human = lambda frame: (frame["confidence"] < report.router.threshold).mean()  # noqa: E731
    assert routed_table.loc[(report.real, "in-domain"), "sent to a human"] == pytest.approx(human(inside))
    assert routed_table.loc[("off", "poem"), "sent to a human"] == human(outside[outside["kind"] == "poem"])
    figure = report.figure()
    assert len(figure.data) == 2 and [t.name for t in figure.data] == [report.real, "off"]
    # one name per thing: a hybrid's answers are "the hybrid", with or without its distance weight
    assert report.names == answer_names(model) == ("the hybrid", "the hybrid, distance-aware")
    assert list(report.confidence_table("off").index) == ["the hybrid (raw confidence)",
                                                           "the hybrid, distance-aware (confidence)"]
    assert list(in_domain_calibration(model, in_domain).index) == list(report.names)
    assert answer_names(SimpleNamespace(structured=None)) == ("heads alone", "heads alone, distance-aware")


def test_lowest_confidence_reads_the_confidence_fields():
    answers = {"a": {"type": "noul", "noul": 0.5}, "b": {"type": "choice", "confidence": 0.7},
               "c": {"type": "score", "confidence": 0.4}}
    assert lowest_confidence(answers) == 0.4  # a noul answer has no confidence field: P(true) = 0.5 is not one
    assert lowest_confidence({"a": {"type": "noul", "noul": 0.2}, "b": {"type": "noul", "noul": 0.7}}) == 0.7


def test_per_kind_sample_keeps_every_kind():
    inputs = load_inputs(OFF_DOMAIN_DIR / "off_domain.jsonl")
    sample = inputs.per_kind(2)
    assert set(sample.kinds) == set(inputs.kinds)
    assert all(sample.kinds.count(k) == 2 for k in set(inputs.kinds))
    assert sample.ids == [i for i in inputs.ids if i in set(sample.ids)]  # file order kept


def test_answered_keeps_the_raw_scores_apart_from_the_routed_answers(routed, splits):
    """``answered``: the raw scores are the model's before the router (what every ladder row scores), the answers as
    served are distance-aware, and the cases sent to a human are the router's verdicts, case by case; the accuracy
    of the answered cases is that of the served answers on the others."""
    from decisionkit.data.metrics import score
    from decisionkit.training.answered import answered

    model, _, validation = routed
    cases = splits["test"].head(10)
    found = answered(model, cases)
    pd.testing.assert_frame_equal(found.raw.decisions, score(cases, *model.outputs(cases, raw=True)).decisions)
    pd.testing.assert_frame_equal(found.as_answered.decisions, score(cases, *model.outputs(cases)).decisions)
    verdicts = [model.route(c.state, workflow=c.workflow)["verdict"] for c in cases]
    assert found.human == [c.id for c, v in zip(cases, verdicts) if v == "human"]
    summary = found.summary()
    kept = found.as_answered.decisions[~found.as_answered.decisions["case"].isin(found.human)]
    assert summary["answered cases"] == len(cases) - len(found.human) == kept["case"].nunique()
    assert summary["sent to a human"] == pytest.approx(len(found.human) / len(cases))
    if len(kept):
        assert summary["accuracy of the answered cases"] == pytest.approx(kept["correct"].mean())
    assert summary["accuracy (raw)"] == pytest.approx(found.raw.overall()["accuracy"])
