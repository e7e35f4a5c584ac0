"""Serving a trained model with the System One API: ``POST /v1/systemone`` and ``GET /health``.

The request body is ``{"state": ..., "questions": {name: {"type", "instructions", "criteria"}}}`` (``questions``
may be left out: every trained question is answered; ``workflow`` may name the workflow when the questions do
not). The response is ``{"answers": {name: answer}}`` in the System One shape (see ``model.py``), plus the
routing verdict and anomaly scores when the model carries a threshold.

``respond(model, body)`` does the work for both the HTTP server and ``decisionkit decide RUN < request.json``;
every refusal is a 4xx with a message naming the field. The server binds to 127.0.0.1 unless told otherwise,
reads at most ``MAX_BODY_BYTES`` per request, and answers one request at a time per model (two CPU cores gain
nothing from more).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from contextlib import nullcontext
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from .data import DataError, render_state
from .model import QuestionError

MAX_BODY_BYTES = 256 * 1024  # a typed-decisions state is a few KB; anything near this is a mistake or an attack
ENDPOINT = "/v1/systemone"


class RequestError(ValueError):
    """A request the model cannot answer; ``status`` is the HTTP status to send."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes) -> dict:
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}",
                           HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError(f"request body is not valid JSON ({err})") from None
    if not isinstance(request, dict):
        raise RequestError("request body must be a JSON object with 'state' and 'questions'")
    if "state" not in request:
        raise RequestError("field 'state' is missing")
    questions = request.get("questions")
    if questions is not None and (not isinstance(questions, dict) or not questions):
        raise RequestError("field 'questions' must be a non-empty object of question name -> question")
    unknown = sorted(set(request) - {"state", "questions", "workflow"})
    if unknown:
        raise RequestError(f"fields {unknown} are not part of the request; expected state, questions, workflow")
    return request


def respond(model, body: bytes, lock: threading.Lock | None = None) -> tuple[int, dict]:
    """(HTTP status, JSON payload) for one System One request body."""
    try:
        request = parse_request(body)
        state, questions, workflow = request["state"], request.get("questions"), request.get("workflow")
        workflow = model.workflow_for(questions, workflow)
        tokens = len(model.backbone.tokenizer(render_state(state, workflow))["input_ids"])
        if tokens > model.spec.max_length:
            raise RequestError(f"field 'state' is {tokens} tokens once rendered; the model reads at most "
                               f"{model.spec.max_length}")
        with lock or nullcontext():
            if model.router is not None:
                routed = model.route(state, questions, workflow)
                return HTTPStatus.OK, {"answers": routed["answers"], "routing": {
                    k: routed[k] for k in ("verdict", "reason", "scores")}}
            return HTTPStatus.OK, {"answers": model.decide(state, questions, workflow)}
    except RequestError as err:
        return err.status, {"error": str(err)}
    except (QuestionError, DataError) as err:
        return HTTPStatus.UNPROCESSABLE_ENTITY, {"error": str(err)}


def health(model) -> dict:
    return {"status": "ok", "backbone": model.backbone.name, "workflows": {
        w: {q: question.to_json() for q, question in qs.items()} for w, qs in model.schema.items()},
        "max_tokens": model.spec.max_length, "routing": model.router is not None}


class Server(ThreadingHTTPServer):
    request_queue_size = 64  # the default 5 refuses connections as soon as a few clients wait on the model
    daemon_threads = True


def make_server(model, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server for ``model`` (not started: call ``serve_forever()``, or run it in a thread)."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
            if self.path == "/health":
                self._send(HTTPStatus.OK, health(model))
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}; try POST {ENDPOINT} or GET /health"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != ENDPOINT:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}; POST to {ENDPOINT}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           {"error": f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}"})
                return
            self._send(*respond(model, self.rfile.read(length), lock))

        def log_message(self, format: str, *args: Any) -> None:  # quiet: notebooks and tests read the payloads
            pass

    return Server((host, port), Handler)


def load_test(url: str, body: bytes, concurrency: int, seconds: float) -> dict[str, float]:
    """``concurrency`` clients posting ``body`` to ``url`` back to back for ``seconds``: requests per second,
    latency percentiles and how many requests failed (a non-200 answer or a broken connection)."""
    latencies: list[float] = []
    failures = [0]
    guard = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < deadline:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    ok = response.status == HTTPStatus.OK
                    response.read()
            except (urllib.error.URLError, OSError):
                ok = False
            with guard:
                if ok:
                    latencies.append((time.perf_counter() - start) * 1e3)
                else:
                    failures[0] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    ms = np.asarray(latencies) if latencies else np.asarray([float("nan")])
    return {"clients": concurrency, "requests": len(latencies), "failed": failures[0],
            "requests/s": len(latencies) / elapsed, "p50 ms": float(np.percentile(ms, 50)),
            "p99 ms": float(np.percentile(ms, 99))}
