"""The System One contract in process: the server's FastAPI app without LitServe (``app.contract_app``: the same
``install``ed routes, key, limits and errors, the same ``prepare`` / ``respond``), called through
``httpx.ASGITransport``. What needs no HTTP layer is checked here, once, in seconds: every refusal is a JSON 4xx
naming the field, the API key's 401s, the limits' 503s (``RequestLimits``), the course's refusal table, a bug
answered as a JSON 500 without its traceback; and ``decisionkit decide``, the same contract on standard input.
What only a socket or LitServe shows (malformed framing, slow headers, stalled uploads, batching, the official
client against a live server) stays in test_serve.py, which also checks that the live server refuses as this app
does."""

import io
import json
import math
from functools import partial

import anyio
import httpx
import pytest
from fastapi import FastAPI

from decisionkit.cli import main
from decisionkit.contract import systemone
from decisionkit.core import precision
from decisionkit.core.precision import ANSWER_TOLERANCE
from decisionkit.course import serve_lab
from decisionkit.data import questions
from decisionkit.serving.app import ENDPOINT, READINESS_PATH, contract_app
from decisionkit.serving.config import Limits
from decisionkit.serving.reading import RequestLimits, zstd

KEY = "test-key-7f3a"
READ_TIMEOUT = 0.5  # seconds; short, so the stalled body's 408 comes quickly


@pytest.fixture(scope="module")
def served(quick_model):
    """(name, model, app): the quick model in process, loaded once for the session."""
    path, model = quick_model
    return path.name, model, contract_app([path], Limits(read_timeout=READ_TIMEOUT), models={path.name: model})


@pytest.fixture(scope="module")
def case(splits, quick_model):
    """A validation case that fits in one window of the quick model (128 tokens), with a noul, a choice and a score
    question (its input_tokens are then the tokenizer's count of the state; windows are tested on the tiny
    backbone)."""
    _, model = quick_model
    return next(c for c in splits["validation"] if {x.type for x in c.questions.values()} == {"noul", "choice", "score"}
                and len(model.backbone.tokenizer(c.text)["input_ids"]) <= model.spec.max_length)


def call(app, method: str, path: str = ENDPOINT, raise_app_exceptions: bool = True, headers: dict | None = None,
         **request) -> httpx.Response:
    """One request to ``app`` in this process, sent as JSON unless ``headers`` say otherwise."""
    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.request(method, path, headers={"Content-Type": "application/json", **(headers or {})},
                                      **request)

    return anyio.run(go)


def good(name: str, case) -> dict:
    return {"model": name, "state": case.state, "questions": {q: x.to_json() for q, x in case.questions.items()}}


def assert_answers_as_decide(response: httpx.Response, model, case) -> None:
    assert response.status_code == 200, response.text
    body = response.json()
    local = model.decide(case.state, {q: x.to_json() for q, x in case.questions.items()})
    assert systemone.disagreements(body["answers"], local, ANSWER_TOLERANCE[precision.choose().dtype]) == []
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0


def refused(name: str, case) -> dict[str, tuple[dict, int, list | None]]:
    """label -> (httpx request arguments for POST /v1/systemone, the status, the start of the first error's loc
    (None: a message, not a list of field errors)). The labels are test_serve.py's ``bad_requests``; "options
    differ" names the workflow here, or a question name that several workflows ask is refused for that instead."""
    ok = good(name, case)

    def with_(**changes) -> dict:
        return {"content": json.dumps({**ok, **changes}).encode()}

    deep = b'{"model": "%s", "state": %s, "questions": %s}' % (
        name.encode(), b"[" * 100_000 + b"]" * 100_000, json.dumps(ok["questions"]).encode())
    noul, choice, score = (next(q for q, x in ok["questions"].items() if x["type"] == t)
                           for t in ("noul", "choice", "score"))
    return {
        "100k nested brackets": ({"content": deep}, 422, ["body"]),
        "workflow is a list": (with_(workflow=["a"]), 422, ["body", "workflow"]),
        "state null": (with_(state=None), 422, ["body", "state"]),
        "state 42": (with_(state=42), 422, ["body", "state"]),
        "state empty string": (with_(state=""), 422, ["body", "state"]),
        "state empty object": (with_(state={}), 422, ["body", "state"]),
        "state NaN": ({"content": json.dumps({**ok, "state": {"x": math.nan}}).encode()}, 422, ["body"]),
        "state Infinity": ({"content": json.dumps({**ok, "state": [math.inf]}).encode()}, 422, ["body"]),
        "state too long for the model": (with_(state="word " * 3000), 422, ["body", "state"]),
        "empty body": ({"content": b""}, 422, ["body"]),
        "not JSON": ({"content": b"{'state': 1"}, 422, ["body"]),
        "a JSON array": ({"content": b"[]"}, 422, ["body"]),
        "invalid UTF-8": ({"content": b'{"model": "\xff\xfe", "state": "x"}'}, 422, ["body"]),
        "text/plain": ({**with_(), "headers": {"Content-Type": "text/plain"}}, 422, ["body"]),
        "model missing": ({"json": {"state": ok["state"], "questions": ok["questions"]}}, 422, ["body", "model"]),
        "model is a number": (with_(model=1), 422, ["body", "model"]),
        "model unknown": (with_(model="jev-latest"), 422, ["body", "model"]),
        "questions missing": ({"json": {"model": name, "state": "x"}}, 422, ["body", "questions"]),
        "questions empty": (with_(questions={}), 422, ["body", "questions"]),
        "questions a list": (with_(questions=[noul]), 422, ["body", "questions"]),
        "question a string": (with_(questions={noul: "noul"}), 422, ["body", "questions", noul]),
        "question type unknown": (with_(questions={noul: {"type": "maybe"}}), 422, ["body", "questions", noul]),
        "noul criteria a list": (with_(questions={noul: {"type": "noul", "criteria": ["yes"]}}), 422,
                                 ["body", "questions", noul]),
        "choice without criteria": (with_(questions={choice: {"type": "choice"}}), 422, ["body", "questions", choice]),
        "score criteria a string": (with_(questions={score: {"type": "score", "criteria": "low"}}), 422,
                                    ["body", "questions", score]),
        "instructions a number": (with_(questions={noul: {"type": "noul", "instructions": 5}}), 422,
                                  ["body", "questions", noul]),
        "box question": (with_(questions={noul: {"type": "box", "instructions": "find it"}}), 422,
                         ["body", "questions", noul, "type"]),
        "assets": (with_(assets={"a1": {"type": "image", "format": "png", "data_base64": "AAAA"}}), 422,
                   ["body", "assets"]),
        "unknown field": (with_(temperature=0.2), 422, ["body", "temperature"]),
        "workflow unknown": (with_(workflow="poetry"), 422, ["body", "workflow"]),
        "question not trained": (with_(questions={"colour": {"type": "noul"}}, workflow=case.workflow), 422,
                                 ["body", "questions", "colour"]),
        "options differ": (with_(questions={choice: {"type": "choice", "criteria": {"yes": "", "no": ""}}},
                                 workflow=case.workflow), 422, ["body", "questions", choice, "criteria"]),
        "5,000 questions": (with_(questions={f"q{i}": {"type": "noul"} for i in range(5000)}), 422,
                            ["body", "questions"]),
        "body over the size limit": (with_(state="x" * 300_000), 413, None),
        "Content-Length of a gigabyte": ({"content": b"{}", "headers": {"Content-Length": str(10**9)}}, 413, None),
        "gzip body": ({"content": b"\x1f\x8b", "headers": {"Content-Encoding": "gzip"}}, 415, None),
        "zstd body that is not zstd": ({"content": b"not zstd", "headers": {"Content-Encoding": "zstd"}}, 400, None),
    }


def test_every_refusal_is_json_and_names_the_field(served, case):
    name, _, app = served
    outcomes = {}
    for label, (request, status, loc) in refused(name, case).items():
        response = call(app, "POST", **request)
        assert response.headers["content-type"] == "application/json", (label, response.text[:200])
        detail = response.json()["detail"]
        if loc is None:
            outcomes[label] = (response.status_code, isinstance(detail, str) and bool(detail))
        else:
            assert all({"loc", "msg", "type"} <= set(item) and item["msg"] for item in detail), (label, detail)
            outcomes[label] = (response.status_code, detail[0]["loc"][:len(loc)] == loc)
    assert outcomes == {label: (status, True) for label, (_, status, _) in refused(name, case).items()}


def test_other_methods_paths_and_a_stalled_body(served):
    name, _, app = served
    assert call(app, "PUT", json={"model": name}).status_code == 405
    assert call(app, "DELETE", "/v1/models").status_code == 405
    missing = call(app, "POST", "/v2/nope", json={"model": name})
    assert missing.status_code == 404 and missing.json()["detail"]

    async def stalling():  # a body's first byte, then nothing for longer than the read timeout
        yield b"{"
        await anyio.sleep(30)

    slow = call(app, "POST", content=stalling())
    assert slow.status_code == 408 and f"within {READ_TIMEOUT:g} s (1 of ? bytes came)" in slow.json()["detail"]


def test_a_good_request_plain_zstd_and_unicode_is_answered_as_decide(served, case):
    name, model, app = served
    body = json.dumps(good(name, case)).encode()
    assert_answers_as_decide(call(app, "POST", content=body), model, case)
    packed = zstd.compress(body)
    assert len(packed) < len(body)
    assert_answers_as_decide(call(app, "POST", content=packed, headers={"Content-Encoding": "zstd"}), model, case)
    truncated = call(app, "POST", content=packed[:len(packed) // 2], headers={"Content-Encoding": "zstd"})
    assert truncated.status_code == 400 and "truncated" in truncated.json()["detail"]
    bomb = zstd.compress(b'{"state": "' + b"x" * 10**7 + b'"}')  # 10 MB in a few hundred bytes
    exploded = call(app, "POST", content=bomb, headers={"Content-Encoding": "zstd"})
    assert len(bomb) < 1000 and exploded.status_code == 413
    assert f"the limit is {Limits().max_body_bytes}" in exploded.json()["detail"]
    unicode = {**good(name, case), "state": "Kunde: „Rückerstattung bitte“ — 返金してください 🙏 مرحبا"}
    answered = call(app, "POST", content=json.dumps(unicode, ensure_ascii=False).encode())
    assert answered.status_code == 200 and set(answered.json()["answers"]) == set(case.questions)


def test_models_health_and_docs(served):
    name, model, app = served
    assert call(app, "GET", "/docs").status_code == 200
    schemas = call(app, "GET", "/openapi.json").json()["components"]["schemas"]
    assert {"SystemOneRequest", "SystemOneResponse", "ModelMetadataList"} <= set(schemas)
    health = call(app, "GET", "/health").json()
    assert health["status"] == "ok" and health["models"][name]["max_tokens"] == model.spec.max_tokens
    assert health["models"][name]["window_tokens"] == model.spec.max_length
    assert [m["name"] for m in call(app, "GET", "/v1/models").json()["models"]] == [name]


def test_the_course_refusal_table_is_what_the_app_answers(served, case):
    name, _, app = served
    statuses, details = {}, {}
    for label, (method, body) in serve_lab.bad_requests(good(name, case)).items():
        response = call(app, method, content=body)
        assert response.headers["content-type"] == "application/json", label
        statuses[label], details[label] = response.status_code, serve_lab.readable(response.json()["detail"])
    expected = {"malformed JSON": 422, "unknown model": 422, "unknown question": 422, "state null": 422,
                "body over the limit": 413, "PUT": 405}
    assert {label: statuses[label] for label in expected} == expected
    assert all(400 <= status < 500 for status in statuses.values()), statuses
    assert "jev-latest" in details["unknown model"]["message"] and "colour" in details["unknown question"]["message"]
    assert details["state null"]["field"] == "body.state" and details["unknown question"]["field"] == "body.questions"
    assert details["malformed JSON"]["message"].startswith("JSON decode error (")  # the parser's own words follow
    assert details["PUT"] == {"field": "", "message": "Method Not Allowed"}


def test_a_refusal_reads_as_the_fields_it_names_and_their_messages():
    decode = {"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error",
              "ctx": {"error": "Expecting value"}}  # the parser's words: kept
    validator = {"type": "value_error", "loc": ["body", "state"], "msg": "Value error, state is an empty string",
                 "ctx": {"error": {}}}  # a ValueError, encoded as {}: its words are already in msg
    typed = {"type": "string_type", "loc": ["body", "workflow"], "msg": "Input should be a valid string"}
    assert serve_lab.readable([decode]) == {"field": "body.0", "message": "JSON decode error (Expecting value)"}
    assert serve_lab.readable([validator, typed]) == {
        "field": "body.state; body.workflow",
        "message": "Value error, state is an empty string; Input should be a valid string"}
    assert serve_lab.readable("Method Not Allowed") == {"field": "", "message": "Method Not Allowed"}


def test_with_a_key_every_route_asks_for_it_in_json(quick_model, case):
    path, model = quick_model
    app = contract_app([path], api_key=KEY, models={path.name: model})
    body = json.dumps(good(path.name, case)).encode()
    for method, route, content in (("POST", ENDPOINT, body), ("GET", "/v1/models", None), ("GET", "/health", None),
                                   ("GET", "/docs", None)):
        response = call(app, method, route, content=content)
        assert response.status_code == 401 and "Authorization" in response.json()["detail"], route
        assert response.headers["www-authenticate"] == "Bearer"
        response = call(app, method, route, content=content, headers={"Authorization": "Bearer another-key"})
        assert response.status_code == 401 and "does not carry" in response.json()["detail"], route
        response = call(app, method, route, content=content, headers={"Authorization": KEY})  # not as Bearer
        assert response.status_code == 401, route
    assert call(app, "GET", READINESS_PATH).status_code == 404  # past the key (LitServe adds the probe's route)
    keyed = {"Authorization": f"Bearer {KEY}"}
    assert [m["name"] for m in call(app, "GET", "/v1/models", headers=keyed).json()["models"]] == [path.name]
    assert_answers_as_decide(call(app, "POST", content=body, headers=keyed), model, case)


def test_request_limits_keep_stalled_uploads_off_the_model_and_answer_503_with_retry_after():
    release, unstall = anyio.Event(), anyio.Event()
    app = FastAPI()

    @app.post(ENDPOINT)
    async def slow() -> dict:
        await release.wait()
        return {}

    limited = RequestLimits(app, Limits(max_in_flight=2, max_reading=3, retry_after=3), ENDPOINT)

    async def stalling():  # a body's first byte, then nothing until unstalled
        yield b"{"
        await unstall.wait()

    async def until(condition) -> None:  # bounded: a broken middleware fails the test instead of hanging it
        with anyio.fail_after(30):
            while not condition():
                await anyio.sleep(0.01)

    async def run():
        served, refused = [], []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(limited), base_url="http://test") as http:
            async def post(answers: list, **request) -> None:
                answers.append(await http.post(ENDPOINT, **request))

            async with anyio.create_task_group() as group:
                for _ in range(2):
                    group.start_soon(partial(post, [], content=stalling()))
                await until(lambda: limited.reading == 2)
                assert limited.active == 0  # the stalled uploads hold no model slot...
                for _ in range(2):
                    group.start_soon(post, served)  # ...so both are there for these
                await until(lambda: limited.active == 2)
                await post(refused)  # every model slot taken
                group.start_soon(partial(post, [], content=stalling()))
                await until(lambda: limited.reading == 3)
                await post(refused, content=stalling())  # every reader's place taken
                other = await http.get("/elsewhere")  # only the model's endpoint is bounded
                release.set()
                unstall.set()
        return served, refused, other

    served, refused, other = anyio.run(run)
    assert [r.status_code for r in served] == [200, 200]
    for response, why in zip(refused, ["2 requests are in flight", "3 requests are still sending their bodies"]):
        assert response.status_code == 503 and response.headers["retry-after"] == "3", response.text
        assert response.json()["detail"].startswith(why) and response.json()["detail"].endswith("retry in 3 s")
    assert other.status_code == 404 and limited.active == limited.reading == 0


def test_decide_command_reads_standard_input(quick_model, case, monkeypatch, capsys):
    path, model = quick_model
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(json.dumps(good(path.name, case)).encode())))
    assert main(["decide", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["model"] == path.name
    assert printed["answers"] == model.decide(case.state, {q: x.to_json() for q, x in case.questions.items()})
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"model": "x", "state": 42}')))
    assert main(["decide", str(path)]) == 2
    refused = {tuple(item["loc"]) for item in json.loads(capsys.readouterr().out)["detail"]}
    assert refused == {("body", "state"), ("body", "questions")}


def test_a_request_is_checked_and_tokenized_once(served, case, monkeypatch):
    """The request's questions are validated when its body is parsed and read from there (the question model is not
    run again); ``prepare`` tokenizes the rendered state to measure it, and the model reads those tokens as they are.
    (Broken on purpose, respond through ``decide_many`` as before: the tokenizer ran twice and each question was
    validated again.)"""
    name, model, app = served
    tokenized, validated = [], []
    tokenizer = type(model.backbone.tokenizer)
    monkeypatch.setattr(tokenizer, "__call__", lambda self, *a, real=tokenizer.__call__, **k:
                        tokenized.append(a) or real(self, *a, **k))
    monkeypatch.setattr(questions, "QUESTION", type("Counted", (), {"validate_python": lambda self, obj, real=
                        questions.QUESTION: validated.append(obj) or real.validate_python(obj)})())
    response = call(app, "POST", json=good(name, case))
    assert response.status_code == 200, response.text
    assert len(tokenized) == 1 and validated == []
    assert response.json()["usage"]["input_tokens"] == len(model.backbone.tokenizer(case.text)["input_ids"])
    monkeypatch.undo()
    assert_answers_as_decide(response, model, case)


def test_a_bug_is_a_json_500_without_its_traceback(served, case, monkeypatch):
    name, model, app = served

    def broken(*args, **kwargs):
        raise RuntimeError("secret: the model's internals at /srv/private")

    monkeypatch.setattr(model, "decide_checked", broken)
    response = call(app, "POST", json=good(name, case), raise_app_exceptions=False)
    assert response.status_code == 500 and response.headers["content-type"] == "application/json"
    assert response.json() == {"detail": "internal error (RuntimeError); the server log has the traceback"}
    assert "secret" not in response.text and "Traceback" not in response.text


def test_a_state_of_several_windows_is_answered_and_one_past_the_cap_refused(tiny_backbone, splits, tmp_path):
    """A model reading windows of 64 tokens, at most 4 (the tiny backbone, random heads, saved): a state of a few
    windows is answered as ``decide`` answers it; a longer one is a 422 on field 'state' that names the cap."""
    import torch

    from decisionkit.model.decision_model import DecisionModel, FeatureSpec
    from decisionkit.model.windows import window_lengths

    torch.manual_seed(3)
    model = DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec(max_length=64, max_windows=4))
    path = model.save(tmp_path / "tiny-windows")
    app = contract_app([path], models={path.name: model})
    health = call(app, "GET", "/health").json()["models"][path.name]
    assert (health["max_tokens"], health["window_tokens"]) == (256, 64)
    assert "reads at most 256 tokens (4 windows of 64)" in call(app, "GET", "/v1/models").json()["models"][0][
        "description"]
    _, needed = window_lengths(model.backbone, splits["validation"].texts, 64)
    case = next(c for c, n in zip(splits["validation"], needed) if n == 3)
    response = call(app, "POST", json=good(path.name, case))
    assert response.status_code == 200, response.text
    local = model.decide(case.state, {q: x.to_json() for q, x in case.questions.items()})
    assert systemone.disagreements(response.json()["answers"], local, ANSWER_TOLERANCE[precision.choose().dtype]) == []
    assert response.json()["usage"]["input_tokens"] == len(model.backbone.tokenizer(case.text)["input_ids"]) > 128
    long = call(app, "POST", json={**good(path.name, case), "state": "word " * 300})
    assert long.status_code == 422
    [detail] = long.json()["detail"]
    assert detail["loc"] == ["body", "state"] and detail["type"] == "too_long"
    assert "the model reads at most 256 (4 windows of 64)" in detail["msg"]


def test_the_runs_and_the_models_given_must_match(quick_model):
    path, model = quick_model
    with pytest.raises(ValueError, match="pass one per run"):
        contract_app([path], models={"another-name": model})


def test_the_app_loads_its_runs_itself(quick_model):
    """Given runs alone, contract_app loads each model (what a pipeline embedding the contract in its own ASGI app
    does)."""
    path, _ = quick_model
    app = contract_app([path])
    assert [m["name"] for m in call(app, "GET", "/v1/models").json()["models"]] == [path.name]
