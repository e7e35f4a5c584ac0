"""The decision log on a SQLite file (decisionkit/loop): what open_store makes and refuses, what DecisionLog writes
and queues, and the review queue read and answered. No server, no model: System One shapes written by hand."""

import os
import sqlite3

import pytest
import sqlalchemy as sa

from decisionkit.loop import reviews, store
from decisionkit.loop.log import DecisionLog, audited, case_key

REFUND = {"q": {"type": "noul", "instructions": "Refund?"}}
TEAM = {"team": {"type": "choice", "instructions": "Which team handles it?",
                 "criteria": {"billing": "Payments and invoices", "tech": "Bugs and outages"}}}
RISK = {"risk": {"type": "score", "instructions": "How risky?", "criteria": ["low", "mid", "high"]}}


def noul(p):
    return {"type": "noul", "noul": p}


def choice(top, p):
    other = "tech" if top == "billing" else "billing"
    return {"type": "choice", "choice": top, "confidence": p, "probabilities": {top: p, other: round(1 - p, 6)}}


def score(probabilities):
    top = max(probabilities, key=probabilities.get)
    return {"type": "score", "score": sum(int(k) * v for k, v in probabilities.items()),
            "confidence": probabilities[top], "legend": {"0": "low", "1": "mid", "2": "high"},
            "probabilities": probabilities}


HUMAN = {"verdict": "human", "reason": "low confidence", "scores": {"confidence": 0.6}}


def rows(path, table):
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def one_line(err):
    text = str(err.value)
    assert "\n" not in text and text, text
    return text


@pytest.fixture
def log(tmp_path):
    with DecisionLog(tmp_path / "log.db", audit_share=0.0, flush_seconds=0.01) as opened:
        yield opened


def routed(log, state, questions=REFUND, answers=None, **kw):
    """Record one case the router sent to a human; its review id (the case key)."""
    log.record(model="tickets", state=state, questions=questions, answers=answers or {"q": noul(0.3)},
               routing=HUMAN, **kw)
    return case_key(kw.get("workflow"), state, questions)


# ----- the file --------------------------------------------------------------------------------------------------------
def test_new_file_is_private_and_in_wal_mode(tmp_path):
    path = tmp_path / "log.db"
    with DecisionLog(path, flush_seconds=0.01) as log:
        log.record(model="m", state="a ticket", questions=REFUND, answers={"q": noul(0.9)})
        assert log.flush()
        assert os.stat(path).st_mode & 0o777 == 0o600
        for beside in (tmp_path / "log.db-wal", tmp_path / "log.db-shm"):  # SQLite gives them the file's mode
            if beside.exists():
                assert os.stat(beside).st_mode & 0o777 == 0o600, beside
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("SELECT value FROM decisionkit_meta WHERE key = 'schema_version'").fetchone()[0]
    assert version == str(store.SCHEMA_VERSION)
    assert set(sa.inspect(sa.create_engine(f"sqlite:///{path}")).get_table_names()) == set(store.TABLES)


def test_a_file_that_is_not_sqlite_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"id,label\n1,yes\n" * 10)
    before = path.read_bytes()
    with pytest.raises(store.LogError) as err:
        DecisionLog(path)
    assert "is not a SQLite file" in one_line(err) and str(path) in str(err.value)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["notes.db"]


def test_a_sqlite_file_of_other_tables_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")
        conn.execute("INSERT INTO people VALUES ('ann')")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(store.LogError) as err:
        DecisionLog(path)
    assert "other tables (people)" in one_line(err)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["app.db"]  # not turned to WAL either
    with pytest.raises(store.LogError, match="other tables and no decisionkit log"):
        store.open_store(path, create=False)
    assert path.read_bytes() == before


def test_a_log_of_another_schema_version_is_refused_and_not_altered(tmp_path):
    path = tmp_path / "log.db"
    store.open_store(path).engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE decisionkit_meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(store.LogError) as err:
        DecisionLog(path)
    assert f"schema version 99; this decisionkit reads version {store.SCHEMA_VERSION}" in one_line(err)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM decisionkit_meta").fetchall() == [("99",)]
    conn.close()


def test_a_folder_and_a_missing_folder_are_refused(tmp_path):
    with pytest.raises(store.LogError) as err:
        DecisionLog(tmp_path)
    assert "is a folder" in one_line(err)
    with pytest.raises(store.LogError) as err:
        DecisionLog(tmp_path / "nowhere" / "log.db")
    assert "does not exist" in one_line(err)
    with pytest.raises(store.LogError, match="not found"):
        store.open_store(tmp_path / "absent.db", create=False)


# ----- writing and queueing --------------------------------------------------------------------------------------------
def test_record_flush_and_status_count(log):
    ids = [log.record(model="tickets", version="3", state=f"ticket {i}", questions=REFUND,
                      answers={"q": noul(0.9)}, latency_ms=12.5) for i in range(25)]
    assert len(set(ids)) == 25
    assert log.flush()
    status = log.status()
    assert status == {"log": log.shown, "written": 25, "pending": 0, "failures": 0, "dropped": 0,
                      "last_error": None, "audit_share": 0.0}
    path = log.store.engine.url.database
    assert rows(path, "decisionkit_decisions") == 25 and rows(path, "decisionkit_reviews") == 0
    with log.store.engine.connect() as conn:
        first = conn.execute(sa.select(store.decisions).order_by(store.decisions.c.id)).first()
    assert (first.request_id, first.model, first.version, first.state, first.questions, first.answers,
            first.latency_ms) == (ids[0], "tickets", "3", "ticket 0", REFUND, {"q": noul(0.9)}, 12.5)


def test_the_same_case_twice_is_queued_once_with_why_routed(log):
    first = routed(log, {"subject": "refund", "amount": 40}, request_id="r1")
    again = routed(log, {"amount": 40.0, "subject": "refund"}, request_id="r2")  # the same state, read as training does
    other = routed(log, {"subject": "refund", "amount": 41}, request_id="r3")
    assert log.flush()
    assert first == again != other
    path = log.store.engine.url.database
    assert rows(path, "decisionkit_decisions") == 3
    items = reviews.queue(log)
    assert sorted(i["id"] for i in items) == sorted([first, other])
    assert {i["why"] for i in items} == {"routed"}
    kept = reviews.review(log, first)
    assert kept["request_id"] == "r1" and kept["routing"] == HUMAN and kept["status"] == "pending"
    routed(log, {"subject": "refund", "amount": 40}, request_id="r4")  # later, in another batch: still once
    assert log.flush() and len(reviews.queue(log)) == 2 and rows(path, "decisionkit_decisions") == 4


def test_the_audit_draw_is_seeded_and_about_the_share():
    ids = [f"req-{i}" for i in range(10_000)]
    drawn = [i for i in ids if audited(7, i, 0.02)]
    assert 150 <= len(drawn) <= 250, len(drawn)
    assert drawn == [i for i in ids if audited(7, i, 0.02)]  # the same seed, the same draw
    assert drawn != [i for i in ids if audited(8, i, 0.02)]
    assert not any(audited(7, i, 0.0) for i in ids) and all(audited(7, i, 1.0) for i in ids)


def test_the_log_queues_the_audit_draw_and_share_zero_none(tmp_path):
    with DecisionLog(tmp_path / "audit.db", audit_share=0.1, seed=3, flush_seconds=0.01) as log:
        for i in range(400):
            log.record(model="m", state=f"ticket {i}", questions=REFUND, answers={"q": noul(0.95)},
                       request_id=f"req-{i}", routing={"verdict": "answer"})
        assert log.flush()
        items = reviews.queue(log)
    expected = {case_key(None, f"ticket {i}", REFUND) for i in range(400) if audited(3, f"req-{i}", 0.1)}
    assert {i["id"] for i in items} == expected and 20 <= len(expected) <= 60
    assert {i["why"] for i in items} == {"audit"}
    with DecisionLog(tmp_path / "none.db", audit_share=0.0, flush_seconds=0.01) as log:
        for i in range(400):
            log.record(model="m", state=f"ticket {i}", questions=REFUND, answers={"q": noul(0.95)})
        assert log.flush() and reviews.queue(log) == [] and log.status()["written"] == 400


def test_the_queue_puts_pending_first_least_confident_first(log):
    a = routed(log, "ticket a", answers={"q": noul(0.3)}, at=100.0)  # confidence 0.7
    b = routed(log, "ticket b", questions=TEAM, answers={"team": choice("billing", 0.55)}, at=101.0)
    c = routed(log, "ticket c", answers={"q": noul(0.95)}, at=102.0)  # 0.95
    d = routed(log, "ticket d", questions={**REFUND, **TEAM},
               answers={"q": noul(0.9), "team": choice("tech", 0.6)}, at=103.0)  # its lowest: 0.6
    e = routed(log, "ticket e", answers={"q": noul(0.5)}, at=104.0)  # 0.5
    assert log.flush()
    assert [i["id"] for i in reviews.queue(log)] == [e, b, d, a, c]
    assert [i["confidence"] for i in reviews.queue(log)] == pytest.approx([0.5, 0.55, 0.6, 0.7, 0.95])
    reviews.answer(log, e, {"q": "no"}, reviewer="ann", at=200.0)
    reviews.answer(log, a, not_a_case=True, reviewer="ann", at=201.0)
    items = reviews.queue(log)
    assert [i["id"] for i in items] == [b, d, c, e, a]  # then the answered, newest queued first
    assert [i["status"] for i in items] == ["pending"] * 3 + ["reviewed", "not-a-case"]
    assert [i["id"] for i in reviews.queue(log, status="pending", limit=2)] == [b, d]
    assert [i["id"] for i in reviews.queue(log, status="not-a-case")] == [a]
    with pytest.raises(reviews.BadReview) as err:
        reviews.queue(log, status="done")
    assert err.value.loc == ("status",)


# ----- answering ------------------------------------------------------------------------------------------------------
def test_answer_verbs(log):
    case = routed(log, "ticket", questions={**REFUND, **TEAM},
                  answers={"q": noul(0.3), "team": choice("billing", 0.6)})
    assert log.flush()
    assert reviews.answer(log, case, {"q": "no", "team": "billing"}, reviewer="ann").verb == "accept"
    assert reviews.answer(log, case, {"q": "no"}, reviewer="ann").verb == "accept"  # some questions only
    assert reviews.answer(log, case, {"q": "no", "team": "tech"}, reviewer="bob").verb == "correct"
    assert reviews.answer(log, case, {"q": "yes"}, reviewer="cy").verb == "correct"
    assert reviews.review(log, case)["status"] == "reviewed"
    done = reviews.answer(log, case, not_a_case=True, reviewer=" dee ")
    assert (done.verb, done.labels, done.reviewer) == ("not-a-case", {}, "dee")
    item = reviews.review(log, case)
    assert item["status"] == "not-a-case"
    assert [r["verb"] for r in item["reviews"]] == ["accept", "accept", "correct", "correct", "not-a-case"]


@pytest.mark.parametrize("label, key", [("yes", "true"), ("no", "false"), ("1", "true"), ("0", "false"),
                                        (True, "true"), (False, "false"), ("Y", "true"), (1, "true"),
                                        ("true", "true")])
def test_noul_labels_are_read_as_the_loader_reads_them(log, label, key):
    case = routed(log, "ticket")
    assert log.flush()
    assert reviews.answer(log, case, {"q": label}, reviewer="ann").labels == {"q": key}
    with log.store.engine.connect() as conn:
        assert conn.execute(sa.select(store.answers.c.labels)).scalar() == {"q": key}


@pytest.mark.parametrize("label, key", [(2, "2"), ("2", "2"), ("0", "0"), (1.0, "1"), ("mid", "1")])
def test_score_levels_are_stored_as_option_keys(log, label, key):
    case = routed(log, "ticket", questions=RISK, answers={"risk": score({"0": 0.2, "1": 0.7, "2": 0.1})})
    assert log.flush()
    recorded = reviews.answer(log, case, {"risk": label}, reviewer="ann")
    assert recorded.labels == {"risk": key}
    assert recorded.verb == ("accept" if key == "1" else "correct")


def test_bad_answers_are_refused_naming_the_field(log):
    case = routed(log, "ticket", questions={**REFUND, **RISK},
                  answers={"q": noul(0.3), "risk": score({"0": 0.5, "1": 0.3, "2": 0.2})})
    assert log.flush()
    for kwargs, loc in [(dict(answers={"q": "no"}, reviewer=""), ("reviewer",)),
                        (dict(answers={"q": "no"}, reviewer="   "), ("reviewer",)),
                        (dict(answers={"q": "no"}, reviewer=None), ("reviewer",)),
                        (dict(answers={"q": "no"}, reviewer="ann", not_a_case=True), ("not_a_case",)),
                        (dict(answers={}, reviewer="ann"), ("answers",)),
                        (dict(reviewer="ann"), ("answers",)),
                        (dict(answers={"q": "maybe"}, reviewer="ann"), ("answers", "q")),
                        (dict(answers={"risk": 3}, reviewer="ann"), ("answers", "risk")),
                        (dict(answers={"risk": "extreme"}, reviewer="ann"), ("answers", "risk")),
                        (dict(answers={"team": "billing"}, reviewer="ann"), ("answers", "team"))]:
        with pytest.raises(reviews.BadReview) as err:
            reviews.answer(log, case, **kwargs)
        assert err.value.loc == loc, (kwargs, err.value.loc)
        assert "\n" not in str(err.value) and err.value.detail()["loc"] == ["body", *loc]
    assert reviews.review(log, case)["reviews"] == []  # nothing recorded
    with pytest.raises(reviews.ReviewNotFound) as err:
        reviews.answer(log, "0123456789abcdef", {"q": "no"}, reviewer="ann")
    assert "no queued case has id '0123456789abcdef'" in str(err.value)
    with pytest.raises(reviews.ReviewNotFound):
        reviews.review(log, "nope")


def test_the_reviews_frame_and_agreement(tmp_path):
    path = tmp_path / "log.db"
    with DecisionLog(path, audit_share=0.0, flush_seconds=0.01) as log:
        both = {**REFUND, **TEAM}
        one = routed(log, "ticket 1", questions=both, answers={"q": noul(0.3), "team": choice("billing", 0.6)},
                     workflow="tickets", version="3", at=10.0)
        two = routed(log, "ticket 2", questions=both, answers={"q": noul(0.8), "team": choice("tech", 0.7)},
                     workflow="tickets", at=11.0)
        three = routed(log, "ticket 3", at=12.0)
        routed(log, "ticket 4", at=13.0)
        assert log.flush()
        reviews.answer(log, one, {"q": "no", "team": "billing"}, reviewer="ann")
        reviews.answer(log, one, {"q": "yes", "team": "billing"}, reviewer="bob")  # agree on team, not on q
        reviews.answer(log, two, {"q": "yes"}, reviewer="ann")
        reviews.answer(log, two, {"q": "no"}, reviewer="ann")  # ann changes her mind: her latest counts
        reviews.answer(log, two, {"q": "no"}, reviewer="bob")
        reviews.answer(log, three, not_a_case=True, reviewer="ann")
        reviews.answer(log, three, {"q": "no"}, reviewer="bob")
    frame = reviews.reviews(path)  # a path: the log opened for reading
    assert list(frame.columns) == ["id", "status", "why", "workflow", "model", "version", "confidence",
                                   "model answers", "answered", "verb", "labels", "reviewers", "queued_at"]
    assert len(frame) == 4
    by_id = frame.set_index("id")
    assert by_id.loc[one, "model answers"] == {"q": "false", "team": "billing"}
    assert (by_id.loc[one, "status"], by_id.loc[one, "verb"], by_id.loc[one, "answered"]) == ("reviewed", "correct", 2)
    assert by_id.loc[one, "reviewers"] == ["ann", "bob"] and by_id.loc[one, "version"] == "3"
    assert by_id.loc[two, "labels"] == {"q": "false"} and by_id.loc[two, "verb"] == "correct"
    assert (by_id.loc[three, "status"], by_id.loc[three, "verb"]) == ("reviewed", "accept")
    assert by_id.loc[one, "queued_at"].tz is not None and by_id.loc[one, "workflow"] == "tickets"
    assert frame["status"].value_counts().to_dict() == {"reviewed": 3, "pending": 1}
    assert frame.iloc[0]["status"] == "pending"
    # pairs: ticket 1 q (no/yes), team (agree); ticket 2 q (ann's latest no / bob no); ticket 3 not-a-case vs labels
    assert reviews.agreement(reviews.queue(path)) == {"cases answered by two or more": 3, "pairs": 4,
                                                       "agreement": 0.5}
    assert reviews.agreement([]) == {"cases answered by two or more": 0, "pairs": 0, "agreement": None}
    with DecisionLog(tmp_path / "empty.db") as log:
        empty = reviews.reviews(log)
    assert empty.empty and list(empty.columns) == list(frame.columns)
