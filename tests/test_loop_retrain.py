"""The loop closed in Python, end to end on the quick model: answers logged by ``decide(..., log=)``, the routed and
audited cases answered by a simulated reviewer (each case's own gold label: said so), ``train_with_reviews`` training
on the export plus those rows, its report setting the new model beside the served one on the frozen test rows, the
review test and the audit, and ``promote`` writing the pointer a server follows.

The served model is the quick hybrid with a router whose threshold is raised to the median confidence of the
validation cases, so that about half of the traffic is sent to a human (a strict router: enough routed cases for
every split of the reviews on 40 requests)."""

import json

import numpy as np
import pytest

from decisionkit import load
from decisionkit.core.errors import RunError
from decisionkit.loop import reviews
from decisionkit.loop.log import DecisionLog
from decisionkit.loop.promotion import PROMOTED_FILE, served_folder
from decisionkit.loop.retrain import REVIEW_TEST_SHARE, in_review_test, promote, train_with_reviews
from decisionkit.model.saving import model_version
from decisionkit.training.anomaly import fit_router


@pytest.fixture(scope="module")
def served(quick_model, splits, tmp_path_factory):
    """The quick model with a strict router, saved in a folder of its own (the run a server would serve)."""
    path, _ = quick_model
    model = load(path)
    train, validation = splits["train"].head(10), splits["validation"].head(10)
    fit_router(model, train, validation)
    confidence = [min(float(np.max(p)) for p in case.values()) for case in model.predict(validation)]
    model.router.threshold = float(np.median(confidence))
    folder = tmp_path_factory.mktemp("runs") / "served"
    model.save(folder)
    return load(folder)


@pytest.fixture(scope="module")
def reviewed_log(served, splits, tmp_path_factory):
    """40 requests (train cases past what cpu-quick trains on) answered through a log, every queued case answered by
    the simulated reviewer with the case's gold label; and 4 validation cases, routed or audited, whose answers
    must never reach training (the export's own held-out rows)."""
    db = tmp_path_factory.mktemp("log") / "decisions.db"
    cases = {c.id: c for c in splits["train"].cases[-40:] + splits["validation"].cases[10:14]}
    with DecisionLog(db, audit_share=0.2, seed=1) as log:
        routed = 0
        for case in cases.values():
            found = served.route(case.state, {q: x.to_json() for q, x in case.questions.items()}, log=log)
            routed += found["verdict"] == "human"
        assert log.flush()
        queued = reviews.queue(log)
        for item in queued:
            case = next(c for c in cases.values() if c.state == item["state"])
            reviews.answer(log, item["id"], {q: g.label for q, g in case.gold.items()}, reviewer="sim")
        assert log.status()["written"] == len(cases) and log.status()["failures"] == 0
    assert routed >= 10, f"the strict router sent {routed} of {len(cases)} to a human"
    return db, queued


def test_the_queue_holds_the_routed_cases_and_the_audit(reviewed_log):
    db, queued = reviewed_log
    whys = {item["why"] for item in queued}
    assert "routed" in whys
    assert all(item["status"] == "pending" for item in queued)  # as they were when read, before the answers
    frame = reviews.reviews(db)
    assert set(frame["status"]) == {"reviewed"} and set(frame["reviewers"].map(tuple)) == {("sim",)}
    assert set(frame["verb"]) <= {"accept", "correct"}


def test_training_with_reviews_sets_the_new_model_beside_the_served_one(served, reviewed_log, splits, tmp_path):
    db, queued = reviewed_log
    trained = train_with_reviews(None, db, tmp_path / "run2", preset="cpu-quick", progress=False)
    loop = trained.report.loop
    held = {json.dumps(c.state, sort_keys=True) for c in splits["validation"]}
    routed = [i for i in queued if i["why"] == "routed"]
    expected_test = sum(in_review_test(i["id"]) for i in routed)
    kept_out = sum(not in_review_test(i["id"]) and json.dumps(i["state"], sort_keys=True) in held for i in routed)
    assert loop["reviews"]["train"] == len(routed) - expected_test - kept_out
    assert loop["reviews"]["left out"].get("the export's own validation or test row", 0) == kept_out
    assert loop["reviews"]["review test"] == expected_test
    assert loop["reviews"]["audit"] == sum(i["why"] == "audit" for i in queued)
    assert loop["served"]["version"] == served.version == model_version(served.folder)
    assert set(loop["comparison"]) == {"test"} | ({"review test"} if expected_test else set()) | (
        {"audit"} if loop["reviews"]["audit"] else set())
    frozen = loop["comparison"]["test"]
    assert frozen["cases"] == len(trained.splits["test"])
    for row in loop["comparison"].values():
        assert set(row["difference"]) == {"accuracy", "sent to a human", "ece"}
        d, low, high = row["difference"]["accuracy"]
        assert np.isclose(d, row["new"]["accuracy"] - row["old"]["accuracy"]) and (low <= d <= high or row["cases"] < 2)
    saved = json.loads((tmp_path / "run2" / "report.json").read_text())
    assert saved["loop"]["reviews"] == json.loads(json.dumps(loop["reviews"]))
    assert saved["data"]["reviews"]["rows added to train"] == loop["reviews"]["train"]
    train_ids = set(trained.splits["train"].ids)
    # first in train: cpu-quick's cap on train rows keeps every reviewed case
    assert sum(i.startswith("review-") for i in train_ids) == loop["reviews"]["train"] > 0
    assert not any(f"review-{i['id']}" in train_ids for i in queued if i["why"] == "audit" or in_review_test(i["id"]))
    assert "vs served" in trained.report.card() and "Reviews, and the model that served them" in \
        (tmp_path / "run2" / "report.md").read_text()
    # promotion: allowed or refused by the comparison the report holds, never silently
    worse = {name: row["worse"] for name, row in loop["comparison"].items() if row["worse"]}
    if worse:
        with pytest.raises(RunError, match="not promoted"):
            promote(tmp_path / "run2", served.folder)
        assert not (served.folder / PROMOTED_FILE).exists()
    else:
        promote(tmp_path / "run2", served.folder)
        assert served_folder(served.folder) == (tmp_path / "run2").absolute()
        (served.folder / PROMOTED_FILE).unlink()  # the module's served model stays itself


def test_the_review_test_share_is_the_asked_share():
    drawn = np.mean([in_review_test(f"{i:016x}") for i in range(4000)])
    assert abs(drawn - REVIEW_TEST_SHARE) < 0.03
