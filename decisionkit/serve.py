"""Serving saved decision models over HTTP with the System One API (the contract is in ``systemone.py``).

- ``POST /v1/systemone``  answers a System One request (``typesafe-sdk`` clients work with ``base_url=``)
- ``GET /v1/models``      the models served, by name (a run folder's name)
- ``GET /health``         status, and each model's workflows, questions and token limit
- ``GET /docs``           the OpenAPI page, with every request and response schema

The app is FastAPI on uvicorn, and LitServe batches it: requests that arrive within ``batch_timeout`` seconds
of each other share one padded forward pass (``DecisionModel.decide_many``), up to ``max_batch_size``. LitServe
runs the models in an inference worker process and the HTTP side (routes, request checks, limits) in another.

Every answer is JSON, errors included: 422 with ``{"detail": [{"loc", "msg", "type", "input"}]}`` for a request
the contract or the model refuses; 400 for malformed HTTP (a Content-Length of -5, say); 404, 405; 408 when a
body does not arrive within ``read_timeout`` seconds; 413 past ``max_body_bytes``; 415 for a Content-Encoding
other than zstd; 503 with ``Retry-After`` once ``max_in_flight`` requests are waiting for the model or
``max_reading`` are still sending their bodies; 504 when the model did not answer within ``request_timeout``; 500
for a bug. The server binds to 127.0.0.1 unless told otherwise.

``launch(runs)`` starts ``decisionkit serve`` in a child process and waits until it answers (notebooks, tests,
benchmarks); ``load_test`` measures it. ``serve_ray.py`` deploys the same app on Ray Serve.
"""

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Callable, Sequence

import anyio
import h11
import litserve as ls
import numpy as np
import pandas as pd
import pydantic_core
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import systemone
from .model import CONFIG_FILE, load
from .systemone import ModelMetadata, ModelMetadataList, Prepared, Refusal, SystemOneRequest, SystemOneResponse

try:  # the SDK compresses request bodies with zstd when it can (always on Python 3.14+)
    from compression import zstd
except ImportError:
    from backports import zstd

ENDPOINT = "/v1/systemone"


@dataclass(frozen=True)
class Limits:
    """What one request may cost the server."""

    max_body_bytes: int = 256 * 1024  # a typed-decisions state is a few KB; anything near this is a mistake
    read_timeout: float = 10.0  # seconds for a body to arrive: a slow or short body must not hold the server
    max_in_flight: int = 64  # requests to the model at once; more are told to retry (503 + Retry-After)
    max_reading: int = 512  # requests still sending their bodies (each holds a socket and its bytes); more: 503
    retry_after: int = 2  # seconds, in that 503's Retry-After header
    request_timeout: float = 120.0  # seconds a request may wait for the model (LitServe answers 504 past it)


@dataclass(frozen=True)
class Batching:
    """LitServe's dynamic batching: requests arriving within ``timeout`` seconds share one forward pass."""

    max_batch_size: int = 16  # 1 turns batching off: one request per forward pass
    timeout: float = 0.01


# ----- what is served -----------------------------------------------------------------------------------------------
def catalog(runs: Sequence[str | Path]) -> dict[str, Path]:
    """Model name (the run folder's name) -> folder, for the saved models to serve."""
    named: dict[str, Path] = {}
    for run in map(Path, runs):
        if not (run / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{run / CONFIG_FILE} not found: {run} is not a saved decision model")
        if run.name in named:
            raise ValueError(f"two models are named {run.name!r} ({named[run.name]} and {run}); rename one folder")
        named[run.name] = run
    return named


def _config(run: Path) -> dict:
    return json.loads((run / CONFIG_FILE).read_text())


def model_list(models: dict[str, Path]) -> ModelMetadataList:
    """``GET /v1/models``: name, what each model answers, and the day it was saved (read from the saved configs)."""
    entries = []
    for name, run in models.items():
        config = _config(run)
        schema = config["schema"]
        questions = sum(len(qs) for qs in schema.values())
        saved = datetime.date.fromtimestamp((run / CONFIG_FILE).stat().st_mtime).isoformat()
        entries.append(ModelMetadata(name=name, release_date=saved, description=(
            f"decision model on {config['backbone']['name']}: {questions} questions in {len(schema)} workflow(s) "
            f"({', '.join(schema)}); reads at most {config['features']['max_length']} tokens")))
    return ModelMetadataList(models=entries)


def health(models: dict[str, Path]) -> dict:
    """``GET /health``: status, and each model's backbone, workflows with their questions, token limit, routing."""
    described = {}
    for name, run in models.items():
        config = _config(run)
        described[name] = {"backbone": config["backbone"]["name"], "workflows": config["schema"],
                           "max_tokens": config["features"]["max_length"], "routing": config.get("router") is not None}
    return {"status": "ok", "models": described}


# ----- reading requests -------------------------------------------------------------------------------------------
class ContractRequest(Request):
    """A request whose body (already read within the limits by ``RequestLimits``) is decoded when zstd-compressed,
    and parsed as strict JSON: NaN and Infinity are refused, nesting is bounded (pydantic-core's parser stops at 200
    levels)."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            received = b"".join([chunk async for chunk in self.stream()])
            self._body = _decoded(received, self.headers.get("content-encoding", "identity"), self.app.state.limits)
        return self._body

    async def json(self):
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body, allow_inf_nan=False)
            except ValueError as err:  # FastAPI turns this exception into a 422 "json_invalid"
                raise json.JSONDecodeError(str(err), body.decode("utf-8", "replace"), 0) from None
        return self._json


def _too_large(size: int, limits: Limits) -> HTTPException:
    return HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"request body is {size} bytes; the limit is {limits.max_body_bytes}")


def _decoded(body: bytes, encoding: str, limits: Limits) -> bytes:
    if encoding == "identity":
        return body
    if encoding != "zstd":
        raise HTTPException(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                            f"Content-Encoding {encoding!r} is not supported; send the body as is or as zstd")
    decompressor = zstd.ZstdDecompressor()
    try:
        data = decompressor.decompress(body, max_length=limits.max_body_bytes + 1)
    except zstd.ZstdError as err:
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"the zstd body does not decode ({err})") from None
    if len(data) > limits.max_body_bytes:
        raise _too_large(len(data), limits)
    if not decompressor.eof:
        raise HTTPException(HTTPStatus.BAD_REQUEST, "the zstd body is truncated")
    return data


class ContractRoute(APIRoute):
    """FastAPI's custom route class: every route reads its request as a ContractRequest."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def contract_handler(request: Request):
            return await handler(ContractRequest(request.scope, request.receive))

        return contract_handler


class RequestLimits:
    """ASGI middleware on ``ENDPOINT``: a request's body is read in full before the request may wait for the model,
    so a slow upload holds a reader's place, never a model slot. While its body arrives a request holds one of
    ``max_reading`` places, and the body must come within ``read_timeout`` (408) and ``max_body_bytes`` (413); then
    it takes one of ``max_in_flight`` slots and the app reads the body as received. Past either bound, 503 with
    Retry-After instead of queueing without end (a client may retry; the SDK does by itself)."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits, self.reading, self.active = app, limits, 0, 0

    async def __call__(self, scope, receive, send):
        # the path the app routes on: Ray Serve mounts it under a route prefix, passed as root_path
        if scope["type"] != "http" or scope["path"].removeprefix(scope.get("root_path", "")) != ENDPOINT:
            return await self.app(scope, receive, send)
        try:
            body = await self._read(Request(scope, receive))
            if self.active >= self.limits.max_in_flight:
                raise self._busy(f"{self.active} requests are in flight, the most this server takes")
        except HTTPException as refused:
            answer = JSONResponse({"detail": refused.detail}, refused.status_code, headers=refused.headers)
            return await answer(scope, receive, send)
        except ClientDisconnect:
            return  # the client left: no one to answer
        replayed = False

        async def replay():  # the body as read, then what the connection says next (a disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        self.active += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.active -= 1

    async def _read(self, request: Request) -> bytes:
        limits = self.limits
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise _too_large(int(declared), limits)
        if self.reading >= limits.max_reading:
            raise self._busy(f"{self.reading} requests are still sending their bodies, the most this server waits for")
        self.reading += 1
        chunks, size = [], 0
        try:
            with anyio.fail_after(limits.read_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limits.max_body_bytes:
                        raise _too_large(size, limits)
                    chunks.append(chunk)
        except TimeoutError:
            raise HTTPException(HTTPStatus.REQUEST_TIMEOUT, f"the request body did not arrive within "
                                f"{limits.read_timeout:g} s ({size} of {declared or '?'} bytes came)") from None
        finally:
            self.reading -= 1
        return b"".join(chunks)

    def _busy(self, why: str) -> HTTPException:
        return HTTPException(HTTPStatus.SERVICE_UNAVAILABLE, f"{why}; retry in {self.limits.retry_after} s",
                             headers={"Retry-After": str(self.limits.retry_after)})


class JSONErrorsProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, whose 400 for a request it cannot parse is JSON like every other answer, and
    which gives a client ``header_timeout`` seconds to send its request line and headers (uvicorn itself waits
    for them without end): a connection that dribbles headers gets a JSON 408 and is closed."""

    header_timeout = Limits.read_timeout
    header_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()  # the next request on a kept-alive connection gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return  # the headers came; the body has its own timeout (RequestLimits)
        if self.conn.our_state is h11.IDLE:
            self._send_json_error(408, b"Request Timeout", f"the request headers did not arrive within "
                                                         f"{self.header_timeout:g} s")
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._send_json_error(400, b"Bad Request", f"{msg} Check the request line, the headers and Content-Length.")

    def _send_json_error(self, status: int, reason: bytes, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=status, headers=headers, reason=reason), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


async def _internal_error(request: Request, err: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"internal error ({type(err).__name__}); the server log has the traceback"},
                        HTTPStatus.INTERNAL_SERVER_ERROR)


def install(app: FastAPI, models: dict[str, Path], limits: Limits) -> None:
    """The routes and behaviour every deployment shares: ``GET /v1/models`` and ``GET /health``, the limits on
    reading a request (``RequestLimits``), strict parsing, JSON for unexpected errors. ``POST /v1/systemone`` is
    added by the deployment (it owns the batching)."""
    app.state.limits = limits
    app.router.route_class = ContractRoute
    app.add_middleware(RequestLimits, limits=limits)
    app.add_exception_handler(Exception, _internal_error)

    @app.get("/v1/models", response_model=ModelMetadataList)
    def list_models() -> ModelMetadataList:
        return model_list(models)

    @app.get("/health")
    def status() -> dict:
        return health(models)


# ----- the model side -------------------------------------------------------------------------------------------------
class SystemOneAPI(ls.LitAPI):
    """LitServe's model side, in the inference worker: each request is checked against its model on its own, then
    every request of a batch is answered by one ``decide_many`` per model. (LitServe reads the request model from
    ``decode_request``'s annotation, so this module does not postpone annotations.)"""

    def __init__(self, models: dict[str, Path], batching: Batching = Batching()):
        super().__init__(max_batch_size=batching.max_batch_size, batch_timeout=batching.timeout, api_path=ENDPOINT)
        self.runs = models

    def setup(self, device: str) -> None:
        self.models = {name: load(run, device=device.split(":")[0]) for name, run in self.runs.items()}

    def decode_request(self, request: SystemOneRequest) -> Prepared | Refusal:
        return systemone.prepare(self.models, request)  # never raises: one refusal must not fail its batch

    def predict(self, prepared: list[Prepared | Refusal] | Prepared | Refusal):
        if isinstance(prepared, list):  # batching on
            return systemone.respond(self.models, prepared)
        return systemone.respond(self.models, [prepared])[0]

    def encode_response(self, output: dict | Refusal) -> SystemOneResponse:
        return refusal_response(output) if isinstance(output, Refusal) else output


def refusal_response(refusal: Refusal) -> JSONResponse:
    return JSONResponse({"detail": refusal.detail}, HTTPStatus.UNPROCESSABLE_ENTITY)


class SystemOneServer(ls.LitServer):
    """LitServe's server for ``SystemOneAPI``, with the shared routes and limits installed on its FastAPI app."""

    def __init__(self, models: dict[str, Path], batching: Batching = Batching(), limits: Limits = Limits()):
        self.served, self.limits = models, limits
        super().__init__(SystemOneAPI(models, batching), accelerator="auto", devices=1, timeout=limits.request_timeout,
                         healthcheck_path="/litserve/health")  # LitServe's readiness probe; /health is ours

    def register_endpoints(self) -> None:
        install(self.app, self.served, self.limits)  # before LitServe adds its routes, so they read strictly too
        super().register_endpoints()


def serve(runs: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8000, batching: Batching = Batching(),
          limits: Limits = Limits(), log_level: str = "warning") -> None:
    """Serve the saved models in ``runs`` until interrupted (``decisionkit serve`` calls this)."""
    server = SystemOneServer(catalog(runs), batching, limits)
    protocol = type("JSONErrorsProtocol", (JSONErrorsProtocol,), {"header_timeout": limits.read_timeout})
    server.run(host=host, port=port, log_level=log_level, generate_client_file=False, http=protocol,
               timeout_keep_alive=5)


# ----- running it from Python -------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Launched:
    """A ``decisionkit serve`` child process; ``stop()`` ends it and the processes LitServe started."""

    process: subprocess.Popen
    url: str

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __enter__(self) -> "Launched":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch(runs: Sequence[str | Path], port: int | None = None, batching: Batching = Batching(),
           limits: Limits = Limits(), startup_timeout: float = 300.0, log: str | Path | None = None) -> Launched:
    """Start ``decisionkit serve`` on 127.0.0.1 in a child process (its own process group) and return once
    ``GET /health`` answers; ``log`` receives its output (default: discarded)."""
    port = port or free_port()
    command = [sys.executable, "-m", "decisionkit", "serve", *map(str, runs), "--port", str(port),
               "--max-batch-size", str(batching.max_batch_size), "--batch-timeout", str(batching.timeout),
               *(arg for name, value in asdict(limits).items() for arg in (f"--{name.replace('_', '-')}", str(value)))]
    output = open(log, "ab") if log else subprocess.DEVNULL
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    launched = Launched(process, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"decisionkit serve exited with status {process.returncode} before answering"
                               + (f"; see {log}" if log else "; pass log= to see why"))
        try:
            with urllib.request.urlopen(f"{launched.url}/health", timeout=5) as response:
                if response.status == HTTPStatus.OK:
                    return launched
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    launched.stop()
    raise TimeoutError(f"decisionkit serve did not answer on {launched.url} within {startup_timeout:g} s")


def load_test(url: str, bodies: Sequence[bytes], concurrency: int, seconds: float,
              max_requests: int | None = None) -> dict[str, float]:
    """``concurrency`` clients posting ``bodies`` (in turn) to ``url`` back to back, for at most ``seconds`` and
    ``max_requests`` requests in all: requests per second, latency percentiles, and how many were lost (an answer
    other than 200, or a broken connection)."""
    latencies: list[float] = []
    lost = [0]
    sent = iter(range(max_requests or sys.maxsize))
    guard = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < deadline:
            with guard:
                n = next(sent, None)
            if n is None:
                return
            request = urllib.request.Request(url, data=bodies[n % len(bodies)],
                                             headers={"Content-Type": "application/json"})
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    ok = response.status == HTTPStatus.OK
                    response.read()
            except (urllib.error.URLError, OSError):
                ok = False
            with guard:
                if ok:
                    latencies.append((time.perf_counter() - start) * 1e3)
                else:
                    lost[0] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    ms = np.asarray(latencies) if latencies else np.asarray([float("nan")])
    return {"clients": concurrency, "requests": len(latencies), "lost": lost[0],
            "requests/s": len(latencies) / elapsed,
            **{f"p{q} ms": float(np.percentile(ms, q)) for q in (50, 95, 99)}}


def bad_requests(good: dict) -> dict[str, tuple[str, bytes]]:
    """Requests the server must refuse with a JSON 4xx, built from one good request body: name -> (method, body).
    What each breaks: the JSON itself, a field's type or value, the model or question asked, the nesting depth,
    the size limit, the HTTP method."""
    def body(**changes) -> bytes:
        return json.dumps({**good, **changes}).encode()

    return {
        "malformed JSON": ("POST", b"{'state': 1"),
        "state null": ("POST", body(state=None)),
        "state empty": ("POST", body(state="")),
        "state 42": ("POST", body(state=42)),
        "NaN in the state": ("POST", body(state={"x": float("nan")})),
        "workflow a list": ("POST", body(workflow=["a"])),
        "unknown model": ("POST", body(model="jev-latest")),
        "unknown question": ("POST", body(questions={"colour": {"type": "noul"}})),
        "100k nested brackets": ("POST", b'{"model": "m", "state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "body over the limit": ("POST", body(state="x" * 300_000)),
        "PUT": ("PUT", json.dumps(good).encode()),
    }


def refusals(url: str, good: dict) -> pd.DataFrame:
    """Send each of ``bad_requests(good)`` to the server at ``url`` (127.0.0.1): per request the status, whether
    the answer is JSON, and its ``detail`` (cut to 110 characters)."""
    rows = {}
    for name, (method, body) in bad_requests(good).items():
        request = urllib.request.Request(f"{url}{ENDPOINT}", data=body, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                status, kind, payload = response.status, response.headers["content-type"], response.read()
        except urllib.error.HTTPError as refused:
            status, kind, payload = refused.code, refused.headers["content-type"], refused.read()
        detail = json.loads(payload).get("detail") if kind == "application/json" else payload[:110].decode()
        rows[name] = {"status": status, "JSON": kind == "application/json", "detail": str(detail)[:110]}
    return pd.DataFrame.from_dict(rows, orient="index")


def served_vs_decided(served: dict, decided: dict, atol: float = 1e-4) -> pd.DataFrame:
    """The answers a server sent beside ``decide()``'s for the same request, one row per field (``team.choice``,
    ``team.probabilities.billing``, ...), and whether they agree: strings exactly, numbers within ``atol``."""
    a, b = pd.json_normalize(served).T[0], pd.json_normalize(decided).T[0]
    table = pd.DataFrame({"served": a, "decide()": b})
    numbers = pd.to_numeric(table["decide()"], errors="coerce").notna() & pd.to_numeric(
        table["served"], errors="coerce").notna()
    same = table["served"] == table["decide()"]
    close = (pd.to_numeric(table["served"], errors="coerce") - pd.to_numeric(table["decide()"], errors="coerce")
             ).abs() <= atol
    table["agree"] = np.where(numbers, close, same)
    return table


def requests_for(model, name: str, cases, count: int) -> tuple[list[dict], list[bytes]]:
    """The first ``count`` of ``cases`` short enough for ``model`` (a longer state is refused, not answered), as
    ``decide_many`` requests and as System One request bodies for the model served as ``name``."""
    fits = [c for c in cases if len(model.backbone.tokenizer(c.text)["input_ids"]) <= model.spec.max_length][:count]
    asked = [{"state": c.state, "questions": {q: x.to_json() for q, x in c.questions.items()}} for c in fits]
    return asked, [json.dumps({"model": name, **a}).encode() for a in asked]


@dataclass
class LoadComparison:
    """Load tests of one server setting per row: batching (max batch size) x concurrent clients."""

    rows: list[dict]
    hardware: dict

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows).set_index(["max batch", "clients"])

    def speedup(self, clients: int) -> float:
        """Requests per second with batching over one request per forward, at ``clients`` clients."""
        rate = self.table()["requests/s"].xs(clients, level="clients")
        return float(rate[rate.index > 1].max() / rate[1])

    def figure(self):
        from .plots import load_curves

        return load_curves(self.table())


def compare_batching(runs: Sequence[str | Path], bodies: Sequence[bytes], clients: Sequence[int] = (1, 4, 16, 64),
                     batch_sizes: Sequence[int] = (16, 1), rounds: int = 2, min_requests: int = 24,
                     seconds: float = 300.0, limits: Limits = Limits(), log: str | Path | None = None
                     ) -> LoadComparison:
    """For each max batch size (1: no batching), launch the server and load-test it at each number of clients n:
    ``max(min_requests, rounds * n)`` requests per level, in at most ``seconds``. Each row records the load
    average, since other work on the machine slows the model too."""
    from .latency import hardware

    rows = []
    for size in batch_sizes:
        with launch(runs, batching=Batching(size), limits=limits, log=log) as server:
            url = f"{server.url}{ENDPOINT}"
            load_test(url, bodies, concurrency=2, seconds=seconds, max_requests=4)  # warm-up, not counted
            for n in clients:
                result = load_test(url, bodies, n, seconds, max_requests=max(min_requests, rounds * n))
                rows.append({"max batch": size, **result, "load average": round(os.getloadavg()[0], 2)})
    return LoadComparison(rows, hardware())


def compute_facts(model) -> dict:
    """The model's compute dtype (chosen at load, ``precision.py``), device, and the CPU's capability: timings
    depend on all three."""
    import torch

    return {**model.backbone.precision.describe(),
            "cpu bf16 instructions": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}


def batch_sweep(model, requests: Sequence[dict], sizes: Sequence[int] = (1, 2, 4, 8, 16, 32)) -> pd.DataFrame:
    """Milliseconds per request of ``model.decide_many`` by batch size, on the same requests (what a server's
    batching can gain on this device, without HTTP)."""
    from .latency import time_calls

    model.decide_many(requests, batch_size=max(sizes))  # the first forward passes page the weights in
    rows = []
    for size in sizes:
        chunks = [list(requests[i:i + size]) for i in range(0, len(requests) - size + 1, size)]
        timing = time_calls(f"batch {size}", lambda chunk: model.decide_many(chunk, batch_size=size), chunks, warmup=1)
        per_request = timing.median / size
        rows.append({"batch size": size, "batches": len(chunks), "ms per request": per_request,
                     "requests/s": 1e3 / per_request})
    table = pd.DataFrame(rows).set_index("batch size")
    table["speed-up"] = table["requests/s"] / table["requests/s"].iloc[0]
    return table
