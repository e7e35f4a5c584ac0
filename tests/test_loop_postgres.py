"""The decision log on PostgreSQL, as several server replicas share one: a throwaway server (tests/postgres.py,
127.0.0.1 only; skipped where none can start), a fresh database per test. Two logs writing the same cases at once,
the review queue answered through the URL, a log of another schema version and a database that cannot be reached
refused in one line, and a server stopped mid-run and started again: nothing recorded is lost."""

import itertools
import threading
import time

import pandas as pd
import pytest
import sqlalchemy as sa
from postgres import Server, Unavailable, free_port

from decisionkit.loop import reviews, store
from decisionkit.loop.log import DecisionLog, case_key

REFUND = {"q": {"type": "noul", "instructions": "Refund?"}}
TEAM = {"team": {"type": "choice", "instructions": "Which team handles it?",
                 "criteria": {"a": "Billing: payments and invoices", "b": "Tech: bugs and outages"}}}
BOTH = {**REFUND, **TEAM}
HUMAN = {"verdict": "human", "reason": "low confidence", "scores": {"confidence": 0.6}}
ANSWERED = {"verdict": "answer", "reason": None, "scores": {"confidence": 0.9}}
_names = itertools.count()


def answers(p_true=0.3, choice="a", confidence=0.6):
    other = "b" if choice == "a" else "a"
    return {"q": {"type": "noul", "noul": p_true},
            "team": {"type": "choice", "choice": choice, "confidence": confidence,
                     "probabilities": {choice: confidence, other: round(1 - confidence, 6)}}}


@pytest.fixture
def db_url(postgres_url):
    """A new empty database on the session's server."""
    import psycopg

    url = sa.make_url(postgres_url)
    name = f"loop_{next(_names)}"
    with psycopg.connect(host=url.host, port=url.port, user=url.username, dbname=url.database,
                         autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


def count(url, table, where=""):
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql(f"SELECT count(*) FROM {table} {where}").scalar()
    finally:
        engine.dispose()


def one_line(err):
    text = str(err.value)
    assert text and "\n" not in text, text
    return text


def ticket(i):
    return {"subject": f"refund for order {i % 20}", "amount": 10 + i % 20, "channel": "email"}


def test_two_replicas_write_one_log(db_url):
    """Two logs on one database (two server replicas), recording the same 20 cases at once, 8 of them routed to a
    human: every decision kept, each routed case queued once."""
    replicas = [DecisionLog(db_url, audit_share=0.0, flush_seconds=0.01) for _ in range(2)]
    try:
        def serve(log, replica):
            for i in range(60):
                log.record(model="tickets", version="3", workflow="support", state=ticket(i), questions=BOTH,
                           answers=answers(0.3, confidence=0.5 + (i % 20) / 100),
                           routing=HUMAN if i % 20 < 8 else ANSWERED,
                           latency_ms=4.0, request_id=f"{replica}-{i}")
                if i % 15 == 14:
                    time.sleep(0.02)  # batches from both replicas interleave

        threads = [threading.Thread(target=serve, args=(log, n)) for n, log in enumerate(replicas)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(log.flush() for log in replicas)
        for log in replicas:
            status = log.status()
            assert (status["written"], status["pending"], status["failures"], status["dropped"]) == (60, 0, 0, 0)
            assert status["log"] == db_url  # no password to hide
    finally:
        for log in replicas:
            log.close()
    assert count(db_url, "decisionkit_decisions") == 120
    assert count(db_url, "decisionkit_decisions", "WHERE verdict = 'human'") == 48
    routed = {case_key("support", ticket(i), BOTH) for i in range(8)}
    assert count(db_url, "decisionkit_reviews") == 8
    items = reviews.queue(db_url)
    assert {i["id"] for i in items} == routed and {i["why"] for i in items} == {"routed"}
    assert [i["confidence"] for i in items] == sorted(i["confidence"] for i in items)
    assert items[0]["state"] == ticket(0) and items[0]["questions"] == BOTH and items[0]["routing"] == HUMAN


def test_answers_through_the_url(db_url):
    with DecisionLog(db_url, audit_share=0.0, flush_seconds=0.01) as log:
        log.record(model="tickets", state=ticket(1), questions=BOTH, answers=answers(0.3, "a", 0.6), routing=HUMAN)
        log.record(model="tickets", state=ticket(2), questions=REFUND, answers={"q": answers(0.8)["q"]},
                   routing=HUMAN)
        assert log.flush()
    first, second = case_key(None, ticket(1), BOTH), case_key(None, ticket(2), REFUND)
    ann = reviews.answer(db_url, first, {"q": "no", "team": "a"}, reviewer="ann")
    bob = reviews.answer(db_url, first, {"q": "yes", "team": "a"}, reviewer="bob")
    assert (ann.verb, ann.labels) == ("accept", {"q": "false", "team": "a"})
    assert (bob.verb, bob.labels) == ("correct", {"q": "true", "team": "a"})
    assert count(db_url, "decisionkit_answers") == 2  # appended: both kept
    assert [r["reviewer"] for r in reviews.review(db_url, first)["reviews"]] == ["ann", "bob"]

    frame = reviews.reviews(db_url).set_index("id")
    assert (frame.loc[first, "status"], frame.loc[first, "verb"], frame.loc[first, "answered"]) == \
        ("reviewed", "correct", 2)
    assert frame.loc[first, "reviewers"] == ["ann", "bob"]
    assert frame.loc[second, "status"] == "pending" and pd.isna(frame.loc[second, "verb"])
    assert reviews.agreement(reviews.queue(db_url)) == {"cases answered by two or more": 1, "pairs": 2,
                                                         "agreement": 0.5}  # team agreed, q did not

    with pytest.raises(reviews.BadReview) as err:
        reviews.answer(db_url, second, {"q": "perhaps"}, reviewer="ann")
    assert err.value.loc == ("answers", "q") and "\n" not in str(err.value)
    with pytest.raises(reviews.BadReview) as err:
        reviews.answer(db_url, first, {"team": "c"}, reviewer="ann")
    assert err.value.loc == ("answers", "team")
    with pytest.raises(reviews.ReviewNotFound):
        reviews.answer(db_url, "0000000000000000", {"q": "no"}, reviewer="ann")
    assert count(db_url, "decisionkit_answers") == 2  # nothing recorded for those


def test_a_log_of_another_schema_version_is_refused(db_url):
    DecisionLog(db_url).close()
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(store.meta.update().where(store.meta.c.key == "schema_version").values(value="7"))
    engine.dispose()
    with pytest.raises(store.LogError) as err:
        DecisionLog(db_url)
    assert f"schema version 7; this decisionkit reads version {store.SCHEMA_VERSION}" in one_line(err)
    assert count(db_url, "decisionkit_meta", "WHERE value = '7'") == 1  # not altered


def test_a_database_that_cannot_be_reached_is_refused_at_once():
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://decisionkit:secret@127.0.0.1:{port}/nowhere"
    started = time.perf_counter()
    with pytest.raises(store.LogError) as err:
        DecisionLog(url)
    took = time.perf_counter() - started
    text = one_line(err)
    assert took < 5, f"{took:.1f} s to refuse an unreachable database"
    assert "cannot be opened" in text and str(port) in text and "secret" not in text, text


def test_a_server_stopped_mid_run_loses_nothing(postgres_url):
    """Its own server (stopping the session's would cut the other tests' connections): answers recorded while it is
    down are kept, the failures counted; once it is back, all of them are written."""
    try:
        server = Server("outage").start()
    except Unavailable as err:
        pytest.skip(f"no second PostgreSQL server here: {err}")
    log = None
    try:
        log = DecisionLog(server.url, audit_share=0.0, flush_seconds=0.02)

        def record(i):
            return log.record(model="tickets", state=ticket(i), questions=BOTH, answers=answers(0.4),
                              routing=HUMAN if i % 3 == 0 else ANSWERED, request_id=f"r{i}")

        for i in range(10):
            record(i)
        assert log.flush()
        server.stop()
        for i in range(10, 40):
            assert record(i) == f"r{i}"  # never raises
        deadline = time.monotonic() + 30
        while log.status()["failures"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        status = log.status()
        assert status["failures"] >= 2, status
        assert (status["written"], status["pending"], status["dropped"]) == (10, 30, 0), status
        assert status["last_error"] and "\n" not in status["last_error"]
        assert not log.flush(timeout=0.2)

        server.start()  # the same data, the same port
        assert log.flush(timeout=30), log.status()
        after = log.status()
        assert (after["written"], after["pending"], after["dropped"]) == (40, 0, 0), after
        assert after["failures"] >= status["failures"]
        assert count(server.url, "decisionkit_decisions") == 40
        assert count(server.url, "decisionkit_decisions", "WHERE request_id IN ('r10', 'r39')") == 2
        assert count(server.url, "decisionkit_reviews") == len({i % 20 for i in range(0, 40, 3)})
    finally:
        if log is not None:
            log.close(timeout=5)
        server.close()
