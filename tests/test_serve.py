import io
import json
import re
import threading
import urllib.error
import urllib.request

import pytest

from decisionkit.cli import main
from decisionkit.serve import MAX_BODY_BYTES, make_server, respond


@pytest.fixture(scope="module")
def case(splits):
    return splits["validation"][0]


def body(**request) -> bytes:
    return json.dumps(request).encode()


def test_a_system_one_request_is_answered(quick_model, case):
    _, model = quick_model
    questions = {q: question.to_json() for q, question in case.questions.items()}
    status, payload = respond(model, body(state=case.state, questions=questions))
    assert status == 200 and set(payload["answers"]) == set(case.questions)
    noul = next(q for q, question in case.questions.items() if question.type == "noul")
    assert set(payload["answers"][noul]) == {"type", "noul"}


@pytest.mark.parametrize("make, status, message", [
    (lambda c: b"{not json", 400, "not valid JSON"),
    (lambda c: body(questions={}), 400, "field 'state' is missing"),
    (lambda c: body(state=c.state, workflow=c.workflow, questions={"nope": {"type": "noul"}}), 422,
     "question 'nope': no trained head"),
    (lambda c: body(state=c.state, questions={"nope": {"type": "noul"}}), 422, "no trained workflow asks all of"),
    (lambda c: body(state=c.state, workflow=c.workflow, extra=1), 400, r"fields \['extra'\] are not part"),
    (lambda c: b" " * (MAX_BODY_BYTES + 1), 413, "the limit is"),
])
def test_refusals_name_the_field(quick_model, case, make, status, message):
    _, model = quick_model
    got, payload = respond(model, make(case))
    assert got == status and re.search(message, payload["error"])


def test_wrong_type_and_options_are_refused(quick_model, case):
    _, model = quick_model
    choice = next(q for q, question in case.questions.items() if question.type == "choice")
    asked = case.questions[choice].to_json()
    status, payload = respond(model, body(state=case.state, workflow=case.workflow,
                                          questions={choice: {"type": "noul", "instructions": "?"}}))
    assert status == 422 and "type 'noul' differs" in payload["error"]
    renamed = {**asked, "criteria": {f"x{k}": v for k, v in asked["criteria"].items()}}
    status, payload = respond(model, body(state=case.state, workflow=case.workflow, questions={choice: renamed}))
    assert status == 422 and "differ from the trained head" in payload["error"]


def test_an_oversized_state_states_the_limit(quick_model, case):
    _, model = quick_model
    status, payload = respond(model, body(state="word " * 2000, workflow=case.workflow))
    assert status == 400 and f"at most {model.spec.max_length}" in payload["error"]


def test_http_server_on_loopback(quick_model, case):
    _, model = quick_model
    server = make_server(model, port=0)
    assert server.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        health = json.load(urllib.request.urlopen(f"{base}/health", timeout=30))
        assert health["status"] == "ok" and case.workflow in health["workflows"]
        request = urllib.request.Request(f"{base}/v1/systemone", data=body(state=case.state, workflow=case.workflow),
                                         headers={"Content-Type": "application/json"})
        answers = json.load(urllib.request.urlopen(request, timeout=60))["answers"]
        assert set(answers) == set(case.questions)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{base}/v1/systemone", data=b"[]"), timeout=30)
        assert refused.value.code == 400 and "JSON object" in json.load(refused.value)["error"]
    finally:
        server.shutdown()
        server.server_close()


def test_decide_command_reads_standard_input(quick_model, case, monkeypatch, capsys):
    path, _ = quick_model
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(body(state=case.state, workflow=case.workflow))))
    assert main(["decide", str(path)]) == 0
    assert set(json.loads(capsys.readouterr().out)["answers"]) == set(case.questions)


def test_bounded_load_test_loses_nothing(quick_model, case):
    from decisionkit.serve import load_test

    _, model = quick_model
    server = make_server(model, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = load_test(f"http://127.0.0.1:{server.server_port}/v1/systemone",
                           body(state=case.state, workflow=case.workflow), concurrency=4, seconds=2)
    finally:
        server.shutdown()
        server.server_close()
    assert result["failed"] == 0 and result["requests"] >= 4 and result["p50 ms"] <= result["p99 ms"]
