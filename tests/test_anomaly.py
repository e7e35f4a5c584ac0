import json

import numpy as np
import pandas as pd
import pytest

import decisionkit
from decisionkit.anomaly import (OFF_DOMAIN_DIR, SCORES, FeatureDensity, Inputs, evaluate_scores, fit_router,
                                 load_inputs)
from decisionkit.data import DataError

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


def test_threshold_rejects_the_target_share_of_validation(routed):
    model, router, validation = routed
    values = router.scores(model, model.split_features(validation), validation.case_workflows)[router.score]
    assert (values > router.threshold).mean() <= 0.1
    assert (values >= router.threshold).mean() >= 0.1 - 1 / len(validation)


def test_route_answers_and_scores_a_poem(routed, splits):
    model, router, _ = routed
    result = model.route(POEM, workflow="customer_service")
    assert result["verdict"] in ("answer", "human") and router.score in result["reason"]
    assert set(result["scores"]) >= set(SCORES)
    assert set(result["answers"]) == set(model.schema["customer_service"])
    assert 0 <= result["scores"]["msp"] <= 1 and 0 <= result["scores"]["entropy"] <= 1
    case = splits["validation"][0]
    with pytest.raises(decisionkit.QuestionError, match="no trained head"):
        model.route(case.state, {"nope": {"type": "noul"}}, workflow=case.workflow)


def test_router_is_saved_with_the_model(routed, tmp_path):
    model, router, _ = routed
    reopened = decisionkit.load(model.save(tmp_path / "routed"))
    assert reopened.router.threshold == pytest.approx(router.threshold)
    assert reopened.route(POEM, workflow="customer_service")["scores"]["mahalanobis"] == pytest.approx(
        model.route(POEM, workflow="customer_service")["scores"]["mahalanobis"], rel=1e-4)


def test_a_model_without_router_says_how_to_get_one(quick_model):
    _, model = quick_model
    with pytest.raises(ValueError, match="fit_router"):
        model.route(POEM, workflow="customer_service")


def test_evaluation_reports_auroc_and_fpr(routed, splits):
    model, _, _ = routed
    off = Inputs("off", ["p", "q", "r"], [f"workflow: security_incidents\n{t}" for t in (POEM, "def f(): pass", "")],
                 ["security_incidents"] * 3, ["poem", "code", "empty"])
    report = evaluate_scores(model, splits["test"].head(2), off)
    table = report.separation("off")
    assert list(table.index) == list(SCORES)
    assert table["AUROC"].between(0, 1).all() and table["FPR at 95% TPR"].between(0, 1).all()
    routed_table = report.routed()
    assert isinstance(routed_table, pd.DataFrame) and routed_table["inputs"].sum() == 8 + 3
    assert len(report.figure().data) == 2


def test_per_kind_sample_keeps_every_kind():
    inputs = load_inputs(OFF_DOMAIN_DIR / "off_domain.jsonl")
    sample = inputs.per_kind(2)
    assert set(sample.kinds) == set(inputs.kinds)
    assert all(sample.kinds.count(k) == 2 for k in set(inputs.kinds))
    assert sample.ids == [i for i in inputs.ids if i in set(sample.ids)]  # file order kept
