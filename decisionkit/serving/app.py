"""Serving saved decision models over HTTP with the System One API (the contract is in ``systemone.py``).

- ``POST /v1/systemone``  answers a System One request (``typesafe-sdk`` clients work with ``base_url=``)
- ``GET /v1/models``      the models served, by name (a run folder's name)
- ``GET /health``         status, and each model's workflows, questions and token limit (``max_tokens``: the cap,
                           ``max_windows`` windows of ``max_length`` tokens; ``window_tokens``: the window)
- ``GET /docs``           the OpenAPI page, with every request and response schema

The app is FastAPI on uvicorn, and LitServe batches it: requests that arrive within ``batch_timeout`` seconds
of each other share one padded forward pass (``DecisionModel.decide_many``), up to ``max_batch_size``. LitServe
runs the models in an inference worker process and the HTTP side (routes, request checks, limits) in another.

Every answer is JSON, errors included: 422 with ``{"detail": [{"loc", "msg", "type", "input"}]}`` for a request
the contract or the model refuses; 400 for malformed HTTP (a Content-Length of -5, say); 404, 405; 408 when a
body does not arrive within ``read_timeout`` seconds; 413 past ``max_body_bytes``; 415 for a Content-Encoding
other than zstd; 503 with ``Retry-After`` once ``max_in_flight`` requests are waiting for the model or
``max_reading`` are still sending their bodies; 504 when a request has waited ``request_timeout`` for the model (LitServe's queue: a forward pass already
running is not cut off); 500
for a bug. The server binds to 127.0.0.1 unless told otherwise.

With an API key (``DECISIONKIT_API_KEY`` or ``decisionkit serve --api-key-file``), every route asks for
``Authorization: Bearer <key>`` (what the official client sends) and answers 401 in JSON without it; LitServe's
readiness probe (``/litserve/health``, which says nothing but "ok") stays open. Without a key, anyone who can
reach the port may call it: keep it on loopback.

The models are checked before anything starts (``catalog.py``); one that fails then, or fails to load in the
inference worker, ends the server with one line that names it and why. SIGTERM and SIGINT (Ctrl-C) shut the server
down the same way, by LitServe's graceful shutdown: the requests in flight are answered, then every process LitServe
started is stopped and joined; should the main process die otherwise (SIGKILL, out of memory), those processes end
with it (``shutdown.py``; ``tests/test_serve_lifecycle.py`` signals live servers).

Malformed HTTP and slow headers are answered by ``protocol.JSONErrorsProtocol``, uvicorn's protocol with JSON
errors. ``serve_lab.py`` starts this server in a child process and measures it (notebook 09, the tests,
``benchmarks/load_serve.py``); ``serving/ray_app.py`` deploys the same app on Ray Serve; ``contract_app`` builds
it without LitServe, answering in the calling process (tests of the contract through ``httpx.ASGITransport``).
"""

import hmac
import json
import multiprocessing
import os
import time
from contextlib import asynccontextmanager
from http import HTTPStatus
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

import anyio
import litserve as ls
import pydantic_core
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from litserve.utils import WorkerSetupStatus
from starlette.requests import ClientDisconnect

from ..contract import systemone
from ..contract.systemone import ModelMetadataList, Prepared, Refusal, SystemOneRequest, SystemOneResponse
from ..model.decision_model import load
from .catalog import Catalog, UnservableModel, catalog, health, model_list, one_line
from .config import Batching, Limits
from .protocol import json_errors_protocol
from .shutdown import graceful_sigterm, tie, tied_managers

try:  # the SDK compresses request bodies with zstd when it can (always on Python 3.14+)
    from compression import zstd
except ImportError:
    from backports import zstd

ENDPOINT = "/v1/systemone"
READINESS_PATH = "/litserve/health"  # LitServe's own probe; our /health describes the models


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


class BearerKey:
    """ASGI middleware: every request but the readiness probe must carry ``Authorization: Bearer <key>``; without
    it, or with another key, a JSON 401 that says which (compared in constant time)."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].removeprefix(scope.get("root_path", "")) == READINESS_PATH:
            return await self.app(scope, receive, send)
        sent = dict(scope["headers"]).get(b"authorization")
        if sent is not None and hmac.compare_digest(sent, self.expected):
            return await self.app(scope, receive, send)
        why = ("no Authorization header; this server needs Authorization: Bearer <API key>" if sent is None else
               "the Authorization header does not carry this server's API key (expected Bearer <API key>)")
        answer = JSONResponse({"detail": why}, HTTPStatus.UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
        await answer(scope, receive, send)


async def _internal_error(request: Request, err: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"internal error ({type(err).__name__}); the server log has the traceback"},
                        HTTPStatus.INTERNAL_SERVER_ERROR)


def install(app: FastAPI, models: Catalog, limits: Limits, api_key: str | None = None) -> None:
    """The routes and behaviour every deployment shares: ``GET /v1/models`` and ``GET /health`` (answered from the
    configs ``catalog`` read at start), the API key when one is given (``BearerKey``, checked before anything else),
    the limits on reading a request (``RequestLimits``), strict parsing, JSON for unexpected errors.
    ``POST /v1/systemone`` is added by the deployment (it owns the batching)."""
    app.state.limits = limits
    app.router.route_class = ContractRoute
    app.add_middleware(RequestLimits, limits=limits)
    if api_key:
        app.add_middleware(BearerKey, key=api_key)  # added last, so it runs first
    app.add_exception_handler(Exception, _internal_error)
    listed, described = model_list(models), health(models)

    @app.get("/v1/models", response_model=ModelMetadataList)
    def list_models() -> ModelMetadataList:
        return listed

    @app.get("/health")
    def status() -> dict:
        return described


# ----- the model side -------------------------------------------------------------------------------------------------
class SystemOneAPI(ls.LitAPI):
    """LitServe's model side, in the inference worker: each request is checked against its model on its own, then
    every request of a batch is answered by one ``decide_many`` per model. (LitServe reads the request model from
    ``decode_request``'s annotation, so this module does not postpone annotations.) Built in the server's main
    process; ``failures`` carries a model that did not load back to it."""

    def __init__(self, models: Catalog, batching: Batching, failures: Connection):
        super().__init__(max_batch_size=batching.max_batch_size, batch_timeout=batching.timeout, api_path=ENDPOINT)
        self.runs, self.server_pid, self.failures = dict(models), os.getpid(), failures

    def setup(self, device: str) -> None:
        tie(self.server_pid)  # first: a worker whose server has died loads nothing
        self.models = {}
        for name, run in self.runs.items():
            try:
                self.models[name] = load(run, device=device.split(":")[0])
            except Exception as err:
                self.failures.send(f"model {name!r} ({run}) did not load: {one_line(err)}")
                raise

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
    """LitServe's server for ``SystemOneAPI``, with the shared routes and limits installed on its FastAPI app. Every
    process it starts ends with the main process (``shutdown.tie``): the inference worker in its ``setup``, each
    API-server process in the app's ``lifespan``, the queue manager as it starts (``shutdown.tied_managers``);
    multiprocessing's resource tracker ends by itself once they all have."""

    def __init__(self, models: Catalog, batching: Batching = Batching(), limits: Limits = Limits(),
                 api_key: str | None = None):
        self.served, self.limits, self.api_key, self.main_pid = models, limits, api_key, os.getpid()
        self.failures, failed = multiprocessing.Pipe(duplex=False)
        super().__init__(SystemOneAPI(models, batching, failed), accelerator="auto", devices=1,
                         timeout=limits.request_timeout, healthcheck_path=READINESS_PATH)

    def register_endpoints(self) -> None:
        install(self.app, self.served, self.limits, self.api_key)  # before LitServe's routes: they read strictly too
        super().register_endpoints()

    @asynccontextmanager
    async def lifespan(self, app: FastAPI):
        tie(self.main_pid)
        async with super().lifespan(app):
            yield

    def _init_manager(self, num_api_servers: int):
        with tied_managers():
            self.manager = super()._init_manager(num_api_servers)
        return self.manager

    def verify_worker_status(self) -> None:
        """LitServe's wait for the inference worker to load the models, ended by a worker that failed (a model did
        not load: ``SystemOneAPI.setup`` sent which and why) or died (killed for memory, say), where LitServe's
        would wait for ever: the worker and the queue manager are stopped and ``UnservableModel`` says why."""
        statuses = self.workers_setup_status
        while WorkerSetupStatus.READY not in statuses.values():
            ended = [w.exitcode for w in self.inference_workers if not w.is_alive()]
            if ended or WorkerSetupStatus.ERROR in statuses.values():
                for worker in self.inference_workers:
                    worker.kill()
                    worker.join()
                self.manager.shutdown()
                raise UnservableModel(self._failure(ended))
            time.sleep(0.05)

    def _failure(self, ended: list[int]) -> str:
        """Why the inference worker did not start: what ``SystemOneAPI.setup`` sent, else how the worker ended."""
        if self.failures.poll(1):
            return self.failures.recv()
        how = (f"exit code {ended[0]}{', killed by that signal' if ended[0] < 0 else ''}" if ended else
               "its log says why")
        return f"the inference worker stopped while loading {', '.join(map(repr, self.served))} ({how})"


def serve(runs: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8000, batching: Batching = Batching(),
          limits: Limits = Limits(), log_level: str = "warning", api_key: str | None = None) -> None:
    """Serve the saved models in ``runs`` until SIGTERM or SIGINT (``decisionkit serve`` calls this); with
    ``api_key``, every request must carry it as ``Authorization: Bearer``. A model that cannot be served is refused
    before anything is (``catalog``), or once the inference worker fails to load it: ``UnservableModel``."""
    server = SystemOneServer(catalog(runs), batching, limits, api_key)
    with graceful_sigterm():
        server.run(host=host, port=port, log_level=log_level, generate_client_file=False,
                   http=json_errors_protocol(limits.read_timeout), timeout_keep_alive=5)


# ----- without LitServe -----------------------------------------------------------------------------------------------
async def answer_request(models: Mapping[str, Any], request: SystemOneRequest,
                         answer: Callable[[Prepared], Awaitable[dict]]) -> dict | JSONResponse:
    """``POST /v1/systemone`` where LitServe does not run it (Ray Serve's deployment, ``contract_app``): the request
    checked against the model it names (``systemone.prepare``; a refusal is answered 422), then ``answer``ed."""
    prepared = systemone.prepare(models, request)
    return refusal_response(prepared) if isinstance(prepared, Refusal) else await answer(prepared)


def contract_app(runs: Sequence[str | Path], limits: Limits = Limits(), api_key: str | None = None,
                 models: Mapping[str, Any] | None = None) -> FastAPI:
    """The server's app without LitServe, for in-process tests (``httpx.ASGITransport``): ``install``'s routes, API
    key, limits and errors, and ``POST /v1/systemone`` answered in this process, one request per forward pass
    (``answer_request``). ``models``: the runs already loaded, by name (default: loaded here)."""
    served = catalog(runs)
    if models is None:
        models = {name: load(run) for name, run in served.items()}
    elif models.keys() != served.keys():
        raise ValueError(f"the models are named {sorted(models)} and the runs {sorted(served)}; pass one per run")
    app = FastAPI(title="decisionkit System One (in process)")
    install(app, served, limits, api_key)

    async def answer(prepared: Prepared) -> dict:
        [body] = await anyio.to_thread.run_sync(systemone.respond, models, [prepared])
        return body

    @app.post(ENDPOINT, response_model=SystemOneResponse)
    async def system_one(request: SystemOneRequest):
        return await answer_request(models, request, answer)

    return app
