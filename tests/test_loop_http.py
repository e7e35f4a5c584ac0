"""The decision log and the review routes through the server's own app, in process (``contract_app`` with a log:
the routes, the API key, the middleware that records answers are ``install``'s, shared with LitServe and Ray Serve):
an answer carries its ids and is kept with them (a zstd body too); ``/health`` counts what was written;
``GET /v1/reviews`` lists the routed and audited cases; ``POST /v1/reviews/{id}`` records an answer, refuses a label
that is not an option with a 422 naming the field, an unknown id with a 404; the key guards the routes but not the
page; a log that cannot be opened stops ``decisionkit serve`` and ``decisionkit review`` before anything starts,
in one line."""

import json
import sqlite3

import pytest
from test_contract_inprocess import call, good

from decisionkit.cli import main
from decisionkit.loop.log import DecisionLog
from decisionkit.serving.app import contract_app
from decisionkit.serving.decision_logging import FOLDER, REQUEST_ID, VERSION, WORKFLOW
from decisionkit.serving.reading import zstd

KEY = "loop-key-3c1d"


@pytest.fixture(scope="module")
def served(quick_model, tmp_path_factory):
    path, model = quick_model
    db = tmp_path_factory.mktemp("log") / "decisions.db"
    log = DecisionLog(db, audit_share=1.0)  # every answer audited: each case shows up in the queue
    app = contract_app([path], api_key=KEY, models={path.name: model}, log=log)
    yield path.name, model, app, log, db
    log.close()


def keyed(**headers) -> dict:
    return {"Authorization": f"Bearer {KEY}", **headers}


def test_answers_are_kept_with_their_ids_and_reviewed_through_the_routes(served, splits):
    name, model, app, log, db = served
    cases = [c for c in splits["validation"] if len(model.backbone.tokenizer(c.text)["input_ids"])
             <= model.spec.max_length][:3]
    plain = call(app, "POST", json=good(name, cases[0]), headers=keyed(**{"X-Request-Id": "client-id-1"}))
    assert plain.status_code == 200, plain.text
    assert plain.headers[REQUEST_ID] == "client-id-1" and plain.headers[VERSION] == model.version
    assert plain.headers[WORKFLOW] == cases[0].workflow and FOLDER not in plain.headers  # the folder stays inside
    packed = call(app, "POST", content=zstd.compress(json.dumps(good(name, cases[1])).encode()),
                  headers=keyed(**{"Content-Encoding": "zstd", "X-Request-Id": "bad id with spaces"}))
    assert packed.status_code == 200 and packed.headers[REQUEST_ID] != "bad id with spaces"  # made here instead
    call(app, "POST", json=good(name, cases[0]), headers=keyed())  # the same case again: queued once
    assert call(app, "POST", json={**good(name, cases[2]), "model": "nope"}, headers=keyed()).status_code == 422
    assert log.flush()
    health = call(app, "GET", "/health", headers=keyed()).json()["log"]
    assert health["written"] == 3 and health["failures"] == 0 and health["pending"] == 0
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select request_id, version, workflow, state from decisionkit_decisions "
                            "order by id").fetchall()
    assert [r[0] for r in rows][:2] == ["client-id-1", packed.headers[REQUEST_ID]]
    assert json.loads(rows[1][3]) == cases[1].state and rows[0][1] == model.version  # the state as sent, decoded

    assert call(app, "GET", "/v1/reviews").status_code == 401  # the key guards the reviews
    assert call(app, "GET", "/review").status_code == 200  # the page holds no data: it opens, and asks for the key
    listed = call(app, "GET", "/v1/reviews", headers=keyed()).json()["reviews"]
    assert len(listed) == 2 and {i["why"] for i in listed} == {"audit"} and "folder" not in listed[0]
    assert [i["confidence"] for i in listed] == sorted(i["confidence"] for i in listed)  # least confident first
    item = listed[0]
    choice = next(q for q, x in item["questions"].items() if x["type"] == "choice")
    wrong = call(app, "POST", f"/v1/reviews/{item['id']}", json={"answers": {choice: "no-such-option"},
                                                                  "reviewer": "ann"}, headers=keyed())
    assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["body", "answers", choice]
    assert call(app, "POST", "/v1/reviews/0000", json={"answers": {choice: "x"}, "reviewer": "ann"},
                headers=keyed()).status_code == 404
    options = list(item["questions"][choice]["criteria"])
    done = call(app, "POST", f"/v1/reviews/{item['id']}", json={"answers": {choice: options[0]}, "reviewer": "ann"},
                headers=keyed())
    assert done.status_code == 200 and done.json()["status"] == "reviewed", done.text
    other = call(app, "POST", f"/v1/reviews/{listed[1]['id']}", json={"not_a_case": True, "reviewer": "bo"},
                 headers=keyed()).json()
    assert other["verb"] == "not-a-case"
    assert [i["id"] for i in call(app, "GET", "/v1/reviews?status=pending", headers=keyed()).json()["reviews"]] == []
    assert call(app, "GET", "/v1/reviews?status=maybe", headers=keyed()).status_code == 422


def test_a_log_that_cannot_be_opened_stops_serve_and_review_in_one_line(quick_model, tmp_path, capsys):
    path, _ = quick_model
    other = tmp_path / "notes.db"
    other.write_text("my own notes, not a database\n")
    for argv in (["serve", str(path), "--log", str(other)], ["serve", str(path), "--log", str(tmp_path / "no" / "x.db")],
                 ["review", str(tmp_path / "typo.db")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "decision log" in err, err
    assert other.read_text() == "my own notes, not a database\n" and not (tmp_path / "typo.db").exists()
