"""The server, called as its users call it: the official typesafe-sdk clients (sync and async) and raw HTTP for what
no client would send: what needs the live HTTP layer and LitServe (batching, stalled uploads, framing, the load
test). The contract itself (every refusal, zstd and Unicode bodies, the API key's 401s, the limits' 503s) is tested
once, in process (tests/test_contract_inprocess.py); ``test_the_live_server_refuses_as_the_app_in_process`` ties the
two. One server (LitServe, batching on) serves the session's quick model for the whole module, a second the same
model with a router (routed answers, stalled uploads); no assertion depends on timing."""

import asyncio
import contextlib
import http.client
import json
import math
import resource
import selectors
import socket
import time

import anyio
import httpx
import numpy as np
import psutil
import pytest
import typesafe_sdk as sdk

import decisionkit
from decisionkit.cli import build_parser
from decisionkit.contract import systemone
from decisionkit.core import precision
from decisionkit.core.answer_fields import answer_confidence, answer_probabilities
from decisionkit.core.precision import ANSWER_TOLERANCE
from decisionkit.course import serve_lab
from decisionkit.course.serve_lab import launch, load_test
from decisionkit.serving.app import ENDPOINT, contract_app
from decisionkit.serving.config import Limits
from decisionkit.training.anomaly import fit_router

READ_TIMEOUT = 1.0  # seconds; short, so the slow-body cases end quickly
SDK_TIMEOUT = 300.0  # seconds; the SDK's default 10 s is too short for a busy 2-core CI machine
STALLED = min(300, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)  # uploads held at once (a descriptor each,
# in this process and in the server)


@pytest.fixture(scope="module")
def served(quick_model, tmp_path_factory):
    path, model = quick_model
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with launch([path], limits=Limits(read_timeout=READ_TIMEOUT), log=log) as server:
        yield server, path.name, model


@pytest.fixture(scope="module")
def routed(quick_model, splits, tmp_path_factory):
    """A second server: the quick model with a router, a read timeout that keeps stalled uploads waiting for as long
    as a test runs, and room for STALLED of them plus one request."""
    model = decisionkit.load(quick_model[0])
    router = fit_router(model, splits["train"].head(10), splits["validation"].head(10), folds=2)
    folder = tmp_path_factory.mktemp("routed")
    path = model.save(folder / "routed")
    with launch([path], limits=Limits(read_timeout=120.0, max_reading=STALLED + 1), log=folder / "serve.log") as server:
        yield server, path.name, model, router


@pytest.fixture(scope="module")
def cases(splits, quick_model):
    """Four validation cases that fit in one window of the quick model (128 tokens; it reads longer states in
    windows, up to 8, and refuses longer ones)."""
    _, model = quick_model
    fits = [c for c in splits["validation"] if len(model.backbone.tokenizer(c.text)["input_ids"]) <= model.spec.max_length]
    return fits[:4]


def questions(case) -> dict:
    return {q: x.to_json() for q, x in case.questions.items()}


def good_body(name, case) -> bytes:
    return json.dumps({"model": name, "state": case.state, "questions": questions(case)}).encode()


def client(server, name) -> sdk.TypeSafeClient:
    return sdk.TypeSafeClient(api_key="local", base_url=server.url, model=name, timeout=SDK_TIMEOUT,
                              retry=sdk.RetryPolicy(max_retries=0))


def assert_matches(result: sdk.SystemOneResponse, local: dict) -> None:
    """An SDK response (already validated by the SDK's own models) carries the answers decide() gives, within the
    tolerance the compute dtype guarantees (the server and this process answer in the dtype the session fixed)."""
    answers = {qid: answer.model_dump(exclude_none=True) for qid, answer in result.answers.items()}
    assert systemone.disagreements(answers, local, ANSWER_TOLERANCE[precision.choose().dtype]) == []


def test_sdk_sync_client_answers_as_decide(served, cases):
    server, name, model = served
    with client(server, name) as sdk_client:
        assert [m.name for m in sdk_client.models.list().models] == [name]
        for case in cases:
            asked = {q: getattr(sdk, x["type"].capitalize())(**x) for q, x in questions(case).items()}  # Noul(...)
            result = sdk_client.system_one(state=case.state, questions=asked)
            assert isinstance(result, sdk.SystemOneResponse) and result.model == name
            assert result.usage.input_tokens > 0 and result.usage.output_tokens == 0
            assert_matches(result, model.decide(case.state, questions(case)))
    assert {x.type for c in cases for x in c.questions.values()} == {"noul", "choice", "score"}


def test_sdk_async_client_concurrent_requests_share_batches_and_match(served, cases):
    server, name, model = served

    async def ask_all():
        async with sdk.AsyncTypeSafeClient(api_key="local", base_url=server.url, model=name, timeout=SDK_TIMEOUT,
                                           retry=sdk.RetryPolicy(max_retries=0)) as aclient:
            return await asyncio.gather(*[aclient.system_one(state=c.state, questions=questions(c))
                                          for c in cases * 2])

    for case, result in zip(cases * 2, asyncio.run(ask_all())):
        assert_matches(result, model.decide(case.state, questions(case)))


def test_sdk_error_classes(served, cases):
    server, name, _ = served
    case = cases[0]
    refused = {}  # what -> the first item of the 422's detail: the field it names and why
    with client(server, name) as sdk_client:
        with pytest.raises(sdk.TypeSafeUnprocessableEntityError, match="no trained head") as caught:
            sdk_client.system_one(state=case.state, questions={"colour": sdk.Noul(instructions="red?")},
                                  extra_body={"workflow": case.workflow})
        refused["untrained question"] = caught.value
        with pytest.raises(sdk.TypeSafeUnprocessableEntityError, match="is not served here") as caught:
            sdk_client.system_one(state=case.state, questions=questions(case), model="jev-latest")
        refused["unknown model"] = caught.value
        with pytest.raises(sdk.TypeSafeUnprocessableEntityError) as caught:
            sdk_client.system_one(state="", questions=questions(case))
        refused["empty state"] = caught.value
    assert {what: error.status for what, error in refused.items()} == dict.fromkeys(refused, 422)
    where = {what: error.body["detail"][0]["loc"][:3] for what, error in refused.items()}
    assert where == {"untrained question": ["body", "questions", "colour"], "unknown model": ["body", "model"],
                     "empty state": ["body", "state"]}
    assert "colour" in refused["untrained question"].body["detail"][0]["msg"]
    assert "jev-latest" in refused["unknown model"].body["detail"][0]["msg"]
    with sdk.TypeSafeClient(api_key="local", base_url=f"{server.url}/nope", retry=sdk.RetryPolicy(max_retries=0)) as c:
        with pytest.raises(sdk.TypeSafeNotFoundError):
            c.models.list()


# ----- raw HTTP: what no client library would send ----------------------------------------------------------------
def http_request(body: bytes | None = None, *, method="POST", path=ENDPOINT, length: str | None = None,
                 headers: dict | None = None) -> bytes:
    head = {"Host": "127.0.0.1", "Content-Type": "application/json", "Connection": "close", **(headers or {})}
    if body is not None or length is not None:
        head["Content-Length"] = length if length is not None else str(len(body))
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
    return "\r\n".join(lines).encode() + (body or b"")


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)


def exchange(server, data: bytes, drip: float | None = None) -> tuple[int, dict, dict]:
    """Send raw bytes (with ``drip``, a few bytes every ``drip`` seconds, for at most 3 s) and read the answer:
    (status, headers, JSON body)."""
    with connect(server) as sock:
        try:
            if drip is None:
                sock.sendall(data)
            else:
                end = data.index(b"\r\n\r\n") + 4
                sock.sendall(data[:end])
                for i in range(end, min(len(data), end + int(3 / drip) * 4), 4):
                    sock.sendall(data[i:i + 4])
                    time.sleep(drip)
        except OSError:  # the server answered and closed while we were still sending
            pass
        return answer(sock)


def answer(sock: socket.socket) -> tuple[int, dict, dict]:
    """The response on ``sock``: (status, headers, JSON body)."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    payload = response.read()
    assert response.getheader("content-type", "").startswith("application/json"), payload[:200]
    return response.status, dict(response.getheaders()), json.loads(payload)


def stalled(server, count: int, held: contextlib.ExitStack) -> list[socket.socket]:
    """``count`` connections that each send their headers and the first byte of a 100-byte body, then stall (until
    ``held`` closes them)."""
    start = http_request(b"{" + b" " * 99)[:-99]
    sockets = []
    for _ in range(count):
        sockets.append(held.enter_context(connect(server)))
        sockets[-1].sendall(start)
    return sockets


def answered(sockets: list[socket.socket], timeout: float) -> list[socket.socket]:
    """Those of ``sockets`` with an answer to read, once one has one or after ``timeout`` seconds."""
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)
        return [key.fileobj for key, _ in selector.select(timeout)]


def bad_requests(name, case) -> dict[str, tuple[bytes, int, float | None]]:
    """name -> (raw request, expected status, drip): what only a socket sends, malformed framing and bodies or
    headers that come too slowly. (What the contract refuses is tested in process, test_contract_inprocess.py.)"""
    good = good_body(name, case)
    return {
        "Content-Length -5": (http_request(b"{}", length="-5"), 400, None),
        "Content-Length abc": (http_request(b"{}", length="abc"), 400, None),
        "body shorter than Content-Length": (http_request(b'{"model": ', length="100"), 408, None),
        "slow client": (http_request(good), 408, 0.5),
        "headers that never end": (http_request(good).split(b"\r\n\r\n")[0] + b"\r\n", 408, None),
    }


def test_a_poem_reaches_an_sdk_client_with_confidence_below_the_routing_threshold(routed):
    server, name, model, router = routed
    poem = "autumn wind through golden leaves under the moon"
    asked = {q: x.to_json() for q, x in model.schema["customer_service"].items()}
    with client(server, name) as sdk_client:  # what every System One client reads: the answers alone
        result = sdk_client.system_one(state=poem, questions={
            q: getattr(sdk, x["type"].capitalize())(**x) for q, x in asked.items()})
    raw = httpx.post(server.url + ENDPOINT, json={"model": name, "state": poem, "questions": asked},
                     timeout=SDK_TIMEOUT).json()
    confidences = [a.confidence for a in result.answers.values() if a.type != "noul"]
    assert len(confidences) == 4 and max(confidences) < router.threshold
    assert_matches(result, model.decide(poem, asked))
    assert raw["routing"]["verdict"] == "human" and raw["routing"]["scores"]["in-domain"] < 1e-6  # the extra field


def test_malformed_or_slow_requests_get_a_json_4xx_and_the_server_keeps_answering(served, cases):
    server, name, _ = served
    good = http_request(good_body(name, cases[0]))
    outcomes = {}
    for label, (data, expected, drip) in bad_requests(name, cases[0]).items():
        status, _, payload = exchange(server, data, drip)
        outcomes[label] = (status, expected)
        assert isinstance(payload["detail"], str) and payload["detail"], label
        assert exchange(server, good)[0] == 200, f"the server stopped answering after: {label}"
    assert {label: got for label, (got, _) in outcomes.items()} == {label: want for label, (_, want) in outcomes.items()}


def test_the_live_docs_carry_the_contract_and_the_server_listens_on_loopback_alone(served):
    """The request and response schemas LitServe's own route publishes (read from ``decode_request``'s annotation);
    the rest of /docs, /health and /v1/models is the app's, tested in process."""
    server, _, _ = served
    schemas = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["components"]["schemas"]
    assert {"SystemOneRequest", "SystemOneResponse", "ModelMetadataList"} <= set(schemas)
    port = int(server.url.rsplit(":", 1)[1])
    listening = {c.laddr.ip for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}
    assert build_parser().parse_args(["serve", "runs/x"]).host == "127.0.0.1"


def test_bounded_load_test_loses_nothing(served, cases):
    server, name, _ = served
    result = load_test(f"{server.url}{ENDPOINT}", [good_body(name, c) for c in cases], concurrency=4, seconds=120,
                       max_requests=8)
    assert result["requests"] == 8 and result["lost"] == 0 and result["p50 ms"] <= result["p95 ms"]
    assert math.isnan(result["p99 ms"])  # 8 timings give no p99 (latency.P99_MIN_TIMINGS)


def test_stalled_uploads_do_not_starve_the_model(routed, cases):
    server, name, model, _ = routed
    case = cases[0]
    with contextlib.ExitStack() as held:
        waiting = stalled(server, STALLED, held)  # far more than max_in_flight (64)
        status, _, payload = exchange(server, http_request(good_body(name, case)))
        assert status == 200, payload
        assert_matches(sdk.SystemOneResponse.model_validate_json(json.dumps(payload)),
                       model.decide(case.state, questions(case)))
        assert not answered(waiting, 0)  # every stalled upload is still waiting: none was answered


def test_past_the_readers_bound_a_stalled_upload_gets_a_json_503(routed):
    server = routed[0]
    with contextlib.ExitStack() as held:
        waiting = stalled(server, STALLED + 2, held)  # one more than max_reading
        refused = answered(waiting, 60)  # the others wait for their bodies for 120 s
        assert refused
        for sock in refused:  # one, or a few more if the last test's connections were not all let go yet
            status, headers, payload = answer(sock)
            assert status == 503 and headers["retry-after"] == "2", payload
            assert payload["detail"].startswith(f"{STALLED + 1} requests are still sending their bodies")


def test_the_live_server_refuses_as_the_app_in_process(quick_model, served, cases):
    """What lets the contract be tested in process: the course's refusal table, read from the live server over HTTP
    (``serve_lab.refusals``: LitServe's route, the inference worker's refusals), is what ``contract_app`` answers in
    this process, status, field and message alike."""
    server, name, model = served
    good = json.loads(good_body(name, cases[0]))
    table = serve_lab.refusals(server.url, good)
    app = contract_app([quick_model[0]], models={name: model})

    async def ask(method: str, body: bytes) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return await http.request(method, ENDPOINT, content=body, headers={"Content-Type": "application/json"})

    for label, (method, body) in serve_lab.bad_requests(good).items():
        response = anyio.run(ask, method, body)
        in_process = {"status": response.status_code, "JSON": True, **serve_lab.readable(response.json()["detail"])}
        assert table.loc[label].to_dict() == in_process, label
    assert list(table.index) == list(serve_lab.bad_requests(good)) and table["status"].between(400, 499).all()


def test_served_answers_are_compared_field_by_field(served, cases):
    server, name, model = served
    case = cases[0]
    with client(server, name) as sdk_client:
        asked = {q: getattr(sdk, x["type"].capitalize())(**x) for q, x in questions(case).items()}
        result = sdk_client.system_one(state=case.state, questions=asked)
    local = model.decide(case.state, questions(case))
    table = serve_lab.served_vs_decided(result.raw_http_response.json()["answers"], local)
    assert table["agree"].all() and len(table) > len(local)  # one row per field, not per question
    qid, answer = next((q, a) for q, a in local.items() if a["type"] == "choice")
    changed = {**local, qid: {**answer, "confidence": answer["confidence"] + 1e-3}}
    other = serve_lab.served_vs_decided(result.raw_http_response.json()["answers"], changed)
    assert other.loc[~other["agree"]].index.tolist() == [f"{qid}.confidence"]  # past atol: the one field flagged


def test_the_client_reads_routing_with_decisionkits_response_model(routed, served, cases):
    server, name, model, router = routed
    poem = "autumn wind through golden leaves under the moon"
    asked = {"case": {"state": cases[0].state, "questions": questions(cases[0])},
             "poem": {"state": poem, "questions": questions(cases[0]), "workflow": cases[0].workflow}}
    with client(server, name) as sdk_client:
        plain = sdk_client.system_one(**asked["case"])
        table = serve_lab.client_routing(sdk_client, asked)
    assert "routing" in plain.raw_http_response.json() and "routing" not in plain.model_dump()  # the SDK's model drops it
    assert list(table.index) == ["case", "poem"] and list(table.columns) == ["verdict", *serve_lab.ROUTING_SCORES,
                                                                              "reason"]
    for what, request in asked.items():  # the routing field is the router's, as model.route() gives it here
        local = model.route(request["state"], request["questions"], workflow=request.get("workflow"))
        assert table.loc[what, "verdict"] == local["verdict"] and table.loc[what, "reason"] == local["reason"]
        assert table.loc[what, "confidence"] == pytest.approx(local["scores"]["confidence"], abs=ANSWER_TOLERANCE[
            precision.choose().dtype])
    with client(served[0], served[1]) as sdk_client, pytest.raises(ValueError, match="no 'routing' field"):
        serve_lab.client_routing(sdk_client, {"case": asked["case"]})  # a model without a router


def test_client_answers_are_scored_against_the_gold_and_thresholded(routed, cases):
    server, name, model, _ = routed
    with client(server, name) as sdk_client:
        answered = serve_lab.client_answers(sdk_client, cases)
    rows = answered.answers
    assert len(rows) == sum(len(c.questions) for c in cases) and set(rows["verdict"]) <= {"answer", "human"}
    tolerance = ANSWER_TOLERANCE[precision.choose().dtype]
    for case in cases:  # each row: decide()'s answer, read as a client reads it, against the gold
        local = model.decide(case.state, questions(case))
        mine = rows[rows["case"] == case.id].set_index("question")
        for qid, answer in local.items():
            p = np.array([answer_probabilities(answer)[o] for o in case.questions[qid].options])
            assert mine.loc[qid, "confidence"] == pytest.approx(answer_confidence(answer), abs=tolerance)
            if np.sort(p)[-1] - np.sort(p)[-2] > 2 * tolerance:  # a top option the compute dtype cannot flip
                assert mine.loc[qid, "correct"] == (int(np.argmax(p)) == int(np.argmax(case.gold[qid].probabilities)))
    rule = answered.rule([0.0, 1.01])
    assert rule.loc[0.0, "answers accepted"] == 1.0 and rule.loc[0.0, "cases answered in full"] == 1.0
    assert rule.loc[0.0, "accuracy accepted"] == pytest.approx(rows["correct"].mean())
    assert math.isnan(rule.loc[0.0, "accuracy sent to a human"]) and rule.loc[1.01, "answers accepted"] == 0.0
    verdicts = [model.route(c.state, questions(c))["verdict"] for c in cases]
    assert answered.router_share() == pytest.approx(verdicts.count("human") / len(cases))


def test_batch_sweep_times_every_size_in_turns(quick_model, cases, monkeypatch):
    _, model = quick_model
    requests = [{"state": c.state, "questions": questions(c)} for c in cases]
    sizes_seen = []
    real = model.decide_many
    monkeypatch.setattr(model, "decide_many", lambda chunk, batch_size=16: sizes_seen.append((len(chunk), batch_size))
                        or real(chunk, batch_size=batch_size))
    sweep = serve_lab.batch_sweep(model, requests, sizes=(1, 2), rounds=2)
    # all at once (paging the weights in), a warm-up batch per size, then per round every batch of 1, every batch of 2
    assert sizes_seen == [(4, 2), (1, 1), (2, 2)] + ([(1, 1)] * 4 + [(2, 2)] * 2) * 2
    assert sweep["batches"].tolist() == [8, 4] and sweep.loc[1, "speed-up"] == 1.0
    assert sweep["requests/s"].tolist() == pytest.approx((1e3 / sweep["ms per request"]).tolist())
