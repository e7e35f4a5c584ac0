"""The review page (``GET /review``) in a real browser, over a real review server: Debian's Chromium driven by
playwright, ``decisionkit review LOG`` as a subprocess, a SQLite decision log written by ``DecisionLog`` with three
cases routed to a person. The test answers them as a reviewer does (a click, a key, Skip, Not a case, a refused
answer) and reads what was recorded through ``decisionkit.loop.reviews``, not through the page.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from decisionkit.core.answer_fields import answer_probabilities
from decisionkit.course.serve_lab import free_port
from decisionkit.loop import reviews
from decisionkit.loop.log import DecisionLog, case_key
from decisionkit.serving.review_routes import page as review_page

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; playwright's own browser downloads are refused here
# as tests/test_browser.py: no phoning home at start (refused here), no sandbox and no GPU in a container
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_S = 60  # 2 shared cores: the import of FastAPI and decisionkit can take a while
UI_MS = 20_000  # any single page element or answer
SCREENSHOT = Path("/tmp/review_page.png")

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")

ROUTED = {"verdict": "human", "reason": "low confidence", "scores": {"confidence": 0.3}}

CLAIM_QUESTIONS = {
    "action": {"type": "choice", "instructions": "What should happen to this claim?",
               "criteria": {"pay": "Pay it as filed.", "review": "Send it to an adjuster.", "deny": "Deny it."}},
    "fraud": {"type": "noul", "instructions": "This claim looks fraudulent.",
              "criteria": {"false": "Nothing suspicious.", "true": "Signs of fraud."}},
    "severity": {"type": "score", "instructions": "How severe is the damage?", "criteria": ["None", "Minor", "Major"]},
}
CLAIM_ANSWERS = {
    "action": {"type": "choice", "choice": "review", "confidence": 0.41,
               "probabilities": {"pay": 0.35, "review": 0.41, "deny": 0.24}},
    "fraud": {"type": "noul", "noul": 0.62},
    "severity": {"type": "score", "score": 1.05, "confidence": 0.55, "legend": {"0": "None", "1": "Minor", "2": "Major"},
                 "probabilities": {"0": 0.2, "1": 0.55, "2": 0.25}},
}
# a JSON state with a nested field, markup that must show as text, and a line break inside a value
CLAIM_STATE = {"claim": {"amount": 184.5, "kind": "water damage <b>not bold</b>", "photos": 3},
               "customer": {"tier": "gold", "since": 2019}, "notes": ["called twice", "line one\nline two"]}

TICKET_QUESTIONS = {"urgent": {"type": "noul", "instructions": "The ticket is urgent."}}
TICKET_STATE = "Hello,\nmy printer is on fire.\n\n  Please help!"

TRIAGE_QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team takes it?",
             "criteria": {"billing": "Money matters.", "support": "Everything else."}},
    "priority": {"type": "score", "instructions": "How soon?", "criteria": ["Whenever", "Today", "Now"]},
}
TRIAGE_ANSWERS = {
    "team": {"type": "choice", "choice": "billing", "confidence": 0.8, "probabilities": {"billing": 0.8, "support": 0.2}},
    "priority": {"type": "score", "score": 1.0, "confidence": 0.9, "legend": {"0": "Whenever", "1": "Today", "2": "Now"},
                 "probabilities": {"0": 0.05, "1": 0.9, "2": 0.05}},
}
TRIAGE_STATE = {"subject": "refund", "amount": 12}

CASES = {  # name -> record() arguments; the lowest confidences: claim 0.41, ticket 0.7, triage 0.8
    "claim": {"model": "claims", "workflow": "claims", "state": CLAIM_STATE, "questions": CLAIM_QUESTIONS,
              "answers": CLAIM_ANSWERS},
    "ticket": {"model": "tickets", "workflow": "tickets", "state": TICKET_STATE, "questions": TICKET_QUESTIONS,
               "answers": {"urgent": {"type": "noul", "noul": 0.3}}},
    "triage": {"model": "tickets", "workflow": "triage", "state": TRIAGE_STATE, "questions": TRIAGE_QUESTIONS,
               "answers": TRIAGE_ANSWERS},
}
IDS = {name: case_key(case["workflow"], case["state"], case["questions"]) for name, case in CASES.items()}


def write_log(path: Path, cases: dict) -> Path:
    log = DecisionLog(path, audit_share=0.0)
    try:
        for case in cases.values():
            log.record(routing=ROUTED, version="abc123", **case)
        assert log.flush(), "the decision log did not write its cases"
    finally:
        log.close()
    return path


def started(command: list[str], env: dict, log_path: Path, url: str) -> subprocess.Popen:
    """``command`` started, once ``GET url`` answers (any HTTP status: a server that asks for a key answers 401)."""
    out = log_path.open("w")
    server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    deadline = time.monotonic() + SERVER_START_S
    while True:
        if server.poll() is not None:
            raise AssertionError(f"the server exited early:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return server
        except urllib.error.HTTPError:
            return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop(server)
            raise AssertionError(f"the server did not answer within {SERVER_START_S} s:\n{log_path.read_text()}")
        time.sleep(0.25)


def stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=10)


@pytest.fixture
def review_server(tmp_path):
    """``decisionkit review DB`` on 127.0.0.1 over a log with the three cases: (page URL, DB path)."""
    db = write_log(tmp_path / "decisions.db", CASES)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = started([sys.executable, "-m", "decisionkit", "review", str(db), "--port", str(port)],
                     os.environ.copy(), tmp_path / "review-server.log", f"{base}/v1/reviews")
    try:
        yield f"{base}/review", str(db)
    finally:
        stop(server)


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def opened(browser, url: str):
    """A fresh page (its own localStorage) at ``url``, with the page's script errors kept in ``page.errors`` and
    every URL it asked for in ``page.asked``."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(UI_MS)
    page.errors, page.asked = [], []
    page.on("pageerror", lambda err: page.errors.append(str(err)))
    page.on("request", lambda request: page.asked.append(request.url))
    page.goto(url)
    return page


def assert_clean(page, url: str) -> None:
    """No script error, and nothing asked of any other origin (no CDN, no font, no favicon elsewhere)."""
    origin = url.rsplit("/review", 1)[0] + "/"
    assert page.errors == []
    assert page.asked and all(asked.startswith(origin) for asked in page.asked), page.asked


def expect_empty(page) -> None:
    """The page says the queue is empty (once the last answer is in and the queue read again)."""
    from playwright.sync_api import expect

    expect(page.locator("#empty")).to_be_visible(timeout=UI_MS)
    expect(page.locator("#empty")).to_contain_text("No case is waiting for review")
    expect(page.locator("#case")).to_be_hidden()


def item(db: str, name: str) -> dict:
    return next(i for i in reviews.queue(db) if i["id"] == IDS[name])


def shown_percent(page, question: str, option: str) -> float:
    text = page.locator(f'.question[data-question="{question}"] .option[data-option="{option}"] .bar').inner_text()
    assert text.strip().endswith("%"), text
    return float(text.strip()[:-1]) / 100


def test_review_page_answers_cases(review_server, browser):
    from playwright.sync_api import expect

    url, db = review_server
    page = opened(browser, url)

    # the least confident pending case first, with its counter, why, workflow and the router's reason
    expect(page.locator("#case-id")).to_have_text(IDS["claim"], timeout=UI_MS)
    expect(page.locator("#counter")).to_have_text("case 1 of 3 pending")
    expect(page.locator("#why")).to_have_text("routed")
    expect(page.locator("#workflow")).to_have_text("claims")
    expect(page.locator("#reason")).to_contain_text("low confidence")

    # the JSON state as a nested table; markup in a value shows as text
    assert page.locator("#state").get_attribute("data-kind") == "json"
    claim = page.locator('#state tr[data-key="claim"]')
    expect(claim.locator('tr[data-key="amount"] > td')).to_have_text("184.5")
    expect(claim.locator('tr[data-key="kind"] > td')).to_have_text("water damage <b>not bold</b>")
    assert page.locator("#state b").count() == 0

    # every question's options, each bar showing the logged probability, the model's top option marked
    for question, answer in CLAIM_ANSWERS.items():
        probabilities = answer_probabilities(answer)
        box = page.locator(f'.question[data-question="{question}"]')
        expect(box).to_contain_text(CLAIM_QUESTIONS[question]["instructions"])
        assert box.locator(".option").evaluate_all("bs => bs.map(b => b.dataset.option)") == list(probabilities)
        for option, p in probabilities.items():
            assert abs(shown_percent(page, question, option) - p) <= 0.0005 + 1e-9, (question, option)
        assert box.locator(".option.top").get_attribute("data-option") == reviews.top_label(answer)

    # a refused answer (no reviewer name: reviews.answer's 422) shows in the status line; nothing recorded
    assert page.locator("#reviewer").input_value() == ""
    page.locator('.question[data-question="action"] .option[data-option="deny"]').click()
    expect(page.locator('.option[data-option="deny"]')).to_have_attribute("aria-pressed", "true")
    page.locator("#submit").click()
    expect(page.locator("#status")).to_contain_text("reviewer: give who answers", timeout=UI_MS)
    assert "error" in page.locator("#status").get_attribute("class")
    assert item(db, "claim")["reviews"] == []

    # a name, then Submit: the chosen label recorded (the unanswered questions left out), as a correction
    page.locator("#reviewer").fill("ann")
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.locator("#submit").click()
    expect(page.locator("#case-id")).to_have_text(IDS["ticket"], timeout=UI_MS)
    expect(page.locator("#status")).to_contain_text("Saved")
    expect(page.locator("#counter")).to_have_text("case 1 of 2 pending")
    recorded = item(db, "claim")
    assert recorded["status"] == "reviewed"
    assert [(r["reviewer"], r["verb"], r["labels"]) for r in recorded["reviews"]] == [("ann", "correct", {"action": "deny"})]

    # the text state as preformatted text, its line breaks kept; Skip (key s) moves on and sends nothing
    assert page.locator("#state").get_attribute("data-kind") == "text"
    assert page.locator("#state pre").evaluate("pre => pre.textContent") == TICKET_STATE
    page.keyboard.press("s")
    expect(page.locator("#case-id")).to_have_text(IDS["triage"], timeout=UI_MS)
    expect(page.locator("#counter")).to_contain_text("case 2 of 2 pending")
    assert item(db, "ticket")["status"] == "pending" and item(db, "ticket")["reviews"] == []

    # Not a case
    page.locator("#not-a-case").click()
    expect(page.locator("#start-over")).to_be_visible(timeout=UI_MS)  # the one left is the skipped one
    recorded = item(db, "triage")
    assert recorded["status"] == "not-a-case"
    assert [(r["reviewer"], r["verb"], r["labels"]) for r in recorded["reviews"]] == [("ann", "not-a-case", {})]

    # back to the skipped case: a key chooses (1: the first option, the model's own), Enter submits: accepted
    page.locator("#start-over").click()
    expect(page.locator("#case-id")).to_have_text(IDS["ticket"], timeout=UI_MS)
    page.keyboard.press("1")
    expect(page.locator('.question[data-question="urgent"] .option[data-option="false"]')).to_have_attribute(
        "aria-pressed", "true")
    page.keyboard.press("Enter")
    expect_empty(page)
    expect(page.locator("#counter")).to_have_text("0 pending")

    table = reviews.reviews(db).set_index("id")
    assert table.loc[IDS["ticket"], "verb"] == "accept" and table.loc[IDS["ticket"], "labels"] == {"urgent": "false"}
    assert table["reviewers"].tolist() == [["ann"]] * 3
    assert sorted(table["status"]) == ["not-a-case", "reviewed", "reviewed"]

    # the name is remembered (localStorage)
    page.reload()
    expect_empty(page)
    assert page.locator("#reviewer").input_value() == "ann"
    assert_clean(page, url)
    assert "innerHTML" not in review_page()  # every text from the API goes in as text


# the review routes behind the API key as `decisionkit serve --log` puts them (BearerKey, the page left open);
# `decisionkit review` itself takes no key
KEYED_SERVER = """
import os, sys, uvicorn
from decisionkit.serving.reading import BearerKey
from decisionkit.serving.review_routes import PAGE_PATH, review_app
app = review_app(sys.argv[1])
app.add_middleware(BearerKey, key=os.environ["REVIEW_TEST_KEY"], open_paths=(PAGE_PATH,))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def test_review_page_asks_for_the_api_key(tmp_path, browser):
    from playwright.sync_api import expect

    db = write_log(tmp_path / "decisions.db", {"triage": CASES["triage"]})
    port, key = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    server = started([sys.executable, "-c", KEYED_SERVER, str(db), str(port)],
                     {**os.environ, "REVIEW_TEST_KEY": key}, tmp_path / "keyed-server.log", f"{base}/v1/reviews")
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:  # the routes need the key; the page does not
            urllib.request.urlopen(f"{base}/v1/reviews", timeout=5)
        assert refused.value.code == 401
        page = opened(browser, f"{base}/review")
        expect(page.locator("#api-key")).to_be_visible(timeout=UI_MS)
        expect(page.locator("#status")).to_contain_text("API key")
        page.locator("#api-key").fill("not-the-key")
        page.keyboard.press("Enter")
        expect(page.locator("#status")).to_contain_text("does not carry this server's API key", timeout=UI_MS)
        page.locator("#api-key").fill(key)
        page.keyboard.press("Enter")
        expect(page.locator("#case-id")).to_have_text(IDS["triage"], timeout=UI_MS)
        expect(page.locator("#auth")).to_be_hidden()
        assert page.evaluate("() => sessionStorage.getItem('decisionkit.review.apiKey')") == key

        page.locator("#reviewer").fill("bo")
        page.locator('.question[data-question="team"] .option[data-option="support"]').click()
        page.locator('.question[data-question="priority"] .option[data-option="1"]').click()
        page.keyboard.press("Enter")  # the key goes with the POST too
        expect_empty(page)
        recorded = item(str(db), "triage")["reviews"]
        assert [(r["reviewer"], r["verb"], r["labels"]) for r in recorded] == [
            ("bo", "correct", {"team": "support", "priority": "1"})]
        assert_clean(page, f"{base}/review")
    finally:
        stop(server)
