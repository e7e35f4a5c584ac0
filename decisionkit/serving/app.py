"""Serving saved decision models over HTTP with the System One API (the contract is in ``systemone.py``).

- ``POST /v1/systemone``  answers a System One request (``typesafe-sdk`` clients work with ``base_url=``)
- ``GET /v1/models``      the models served, by name (a run folder's name)
- ``GET /health``         status, and each model's workflows, questions and token limit (``max_tokens``: the cap,
                           ``max_windows`` windows of ``max_length`` tokens; ``window_tokens``: the window)
- ``GET /docs``           the OpenAPI page, with every request and response schema
- with ``--log`` (a ``loop.log.DecisionLog``): every answer kept, ``GET /v1/reviews``, ``POST /v1/reviews/{id}``
  and the review page ``GET /review`` (``review_routes.py``); ``/health`` shows the log's counts

Every answer carries ``X-Request-Id``, ``X-Decisionkit-Model-Version`` and ``X-Decisionkit-Workflow``
(``decision_logging.py``). SIGHUP makes the server answer with a model promoted over one it serves
(``loop.promotion``), loaded beside the one answering and swapped in without dropping a request.

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

import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import asynccontextmanager
from http import HTTPStatus
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

import anyio
import litserve as ls
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from litserve.utils import WorkerSetupStatus

from ..contract import systemone
from ..contract.systemone import ModelMetadataList, Prepared, Refusal, SystemOneRequest, SystemOneResponse
from ..core.errors import one_line
from ..loop.log import DecisionLog
from ..loop.promotion import served_folder
from ..model.decision_model import load
from ..model.saving import model_version
from .catalog import Catalog, UnservableModel, catalog, health, model_list
from .config import Batching, Limits
from .decision_logging import AnswerHeaders, answer_headers
from .protocol import json_errors_protocol
from .reading import BearerKey, ContractRoute, RequestLimits, decoded
from .review_routes import PAGE_PATH, add_review_routes
from .shutdown import graceful_sigterm, tie, tied_managers

ENDPOINT = "/v1/systemone"
READINESS_PATH = "/litserve/health"  # LitServe's own probe; our /health describes the models


async def _internal_error(request: Request, err: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"internal error ({type(err).__name__}); the server log has the traceback"},
                        HTTPStatus.INTERNAL_SERVER_ERROR)


def install(app: FastAPI, models: Catalog, limits: Limits, api_key: str | None = None,
            log: DecisionLog | None = None) -> None:
    """The routes and behaviour every deployment shares: ``GET /v1/models`` and ``GET /health`` (answered from the
    configs ``catalog`` read at start; with a log, its counts too), the API key when one is given (``BearerKey``,
    checked before anything else), the limits on reading a request (``RequestLimits``), strict parsing, JSON for
    unexpected errors, each answer's ids (``AnswerHeaders``) and, with a ``log``, every answer kept and the review
    routes (``review_routes``). ``POST /v1/systemone`` is added by the deployment (it owns the batching)."""
    app.state.limits = limits
    app.router.route_class = ContractRoute
    app.add_middleware(AnswerHeaders, endpoint=ENDPOINT, log=log,
                       decode=lambda body, encoding: decoded(body, encoding, limits))
    app.add_middleware(RequestLimits, limits=limits, endpoint=ENDPOINT)
    if api_key:
        app.add_middleware(BearerKey, key=api_key, open_paths=(READINESS_PATH, PAGE_PATH))  # added last, so it runs first
    app.add_exception_handler(Exception, _internal_error)
    listed, described = model_list(models), health(models)

    @app.get("/v1/models", response_model=ModelMetadataList)
    def list_models() -> ModelMetadataList:
        return listed

    @app.get("/health")
    def status() -> dict:
        return described if log is None else {**described, "log": log.status()}

    if log is not None:
        add_review_routes(app, log)


# ----- the model side -------------------------------------------------------------------------------------------------
class SystemOneAPI(ls.LitAPI):
    """LitServe's model side, in the inference worker: each request is checked against its model on its own, then
    every request of a batch is answered by one ``decide_many`` per model. (LitServe reads the request model from
    ``decode_request``'s annotation, so this module does not postpone annotations.) Built in the server's main
    process; ``failures`` carries a model that did not load back to it."""

    def __init__(self, models: Catalog, batching: Batching, failures: Connection):
        super().__init__(max_batch_size=batching.max_batch_size, batch_timeout=batching.timeout, api_path=ENDPOINT)
        self.runs, self.server_pid, self.failures = dict(models.asked), os.getpid(), failures

    def setup(self, device: str) -> None:
        tie(self.server_pid)  # first: a worker whose server has died loads nothing
        self.device = device.split(":")[0]
        self.models = {}
        for name, run in self.runs.items():
            try:
                self.models[name] = load(served_folder(run), device=self.device)
            except Exception as err:
                self.failures.send(f"model {name!r} ({run}) did not load: {one_line(err)}")
                raise
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=self.reload, daemon=True).start())

    def reload(self) -> None:
        """On SIGHUP (the server forwards it here): each model's folder read again (a ``decisionkit promote``
        since start names a new one), a changed model loaded beside the one answering, then put in its place in one
        step. No request waits or fails for it; one that fails to load is named on stderr and the old one stays."""
        models = dict(self.models)
        for name, run in self.runs.items():
            try:
                folder = served_folder(run)
                if folder != models[name].folder or model_version(folder) != models[name].version:
                    models[name] = load(folder, device=self.device)
                    print(f"model {name!r}: now {folder} (version {models[name].version})", file=sys.stderr,
                          flush=True)
            except Exception as err:
                print(f"model {name!r}: not reloaded, the one loaded goes on answering ({one_line(err)})",
                      file=sys.stderr, flush=True)
        self.models = models

    def decode_request(self, request: SystemOneRequest) -> Prepared | Refusal:
        return systemone.prepare(self.models, request)  # never raises: one refusal must not fail its batch

    def predict(self, prepared: list[Prepared | Refusal] | Prepared | Refusal):
        models = self.models  # one set of models for the whole batch, even while a reload swaps them
        if isinstance(prepared, list):  # batching on
            return list(zip(systemone.respond(models, prepared), prepared))
        return systemone.respond(models, [prepared])[0], prepared

    def encode_response(self, output: tuple[dict | Refusal, Prepared | Refusal]) -> SystemOneResponse:
        return answered_response(self.models, *output)


def refusal_response(refusal: Refusal) -> JSONResponse:
    return JSONResponse({"detail": refusal.detail}, HTTPStatus.UNPROCESSABLE_ENTITY)


def answered_response(models: Mapping[str, Any], output: dict | Refusal, prepared: Prepared | Refusal) -> JSONResponse:
    """An answer as it is sent (the response model's JSON) with its ids (``decision_logging.answer_headers``), or a
    refusal's 422."""
    if isinstance(output, Refusal):
        return refusal_response(output)
    body = SystemOneResponse.model_validate(output).model_dump(mode="json")
    return JSONResponse(body, headers=answer_headers(models[prepared.model], prepared.checked.workflow))


class SystemOneServer(ls.LitServer):
    """LitServe's server for ``SystemOneAPI``, with the shared routes and limits installed on its FastAPI app. Every
    process it starts ends with the main process (``shutdown.tie``): the inference worker in its ``setup``, each
    API-server process in the app's ``lifespan``, the queue manager as it starts (``shutdown.tied_managers``);
    multiprocessing's resource tracker ends by itself once they all have."""

    def __init__(self, models: Catalog, batching: Batching = Batching(), limits: Limits = Limits(),
                 api_key: str | None = None, log: DecisionLog | None = None):
        self.served, self.limits, self.api_key, self.main_pid = models, limits, api_key, os.getpid()
        self.log = log
        self.failures, failed = multiprocessing.Pipe(duplex=False)
        super().__init__(SystemOneAPI(models, batching, failed), accelerator="auto", devices=1,
                         timeout=limits.request_timeout, healthcheck_path=READINESS_PATH)

    def register_endpoints(self) -> None:
        install(self.app, self.served, self.limits, self.api_key, self.log)  # before LitServe's: they read strictly too
        super().register_endpoints()

    @asynccontextmanager
    async def lifespan(self, app: FastAPI):
        tie(self.main_pid)
        async with super().lifespan(app):
            yield
        if self.log is not None:  # this API server's last answers written before it ends
            await anyio.to_thread.run_sync(self.log.close)

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
          limits: Limits = Limits(), log_level: str = "warning", api_key: str | None = None,
          log: DecisionLog | None = None) -> None:
    """Serve the saved models in ``runs`` until SIGTERM or SIGINT (``decisionkit serve`` calls this); with
    ``api_key``, every request must carry it as ``Authorization: Bearer``; with ``log``, every answer is kept there
    and the review routes open. A model that cannot be served is refused before anything is (``catalog``), or once
    the inference worker fails to load it: ``UnservableModel``. SIGHUP reloads a model whose folder changed (a
    promotion: ``loop.retrain.promote``) without dropping a request (``SystemOneAPI.reload``)."""
    server = SystemOneServer(catalog(runs), batching, limits, api_key, log)
    main = os.getpid()

    def forward(signum, frame):  # to the inference workers, which reload; the API servers inherit this and ignore it
        if os.getpid() == main:
            for worker in server.inference_workers:
                if worker.is_alive():
                    os.kill(worker.pid, signal.SIGHUP)

    signal.signal(signal.SIGHUP, forward)
    with graceful_sigterm():
        server.run(host=host, port=port, log_level=log_level, generate_client_file=False,
                   http=json_errors_protocol(limits.read_timeout), timeout_keep_alive=5)


# ----- without LitServe -----------------------------------------------------------------------------------------------
async def answer_request(models: Mapping[str, Any], request: SystemOneRequest,
                         answer: Callable[[Prepared], Awaitable[dict]]) -> JSONResponse:
    """``POST /v1/systemone`` where LitServe does not run it (Ray Serve's deployment, ``contract_app``): the request
    checked against the model it names (``systemone.prepare``; a refusal is answered 422), then ``answer``ed."""
    prepared = systemone.prepare(models, request)
    if isinstance(prepared, Refusal):
        return refusal_response(prepared)
    return answered_response(models, await answer(prepared), prepared)


def contract_app(runs: Sequence[str | Path], limits: Limits = Limits(), api_key: str | None = None,
                 models: Mapping[str, Any] | None = None, log: DecisionLog | None = None) -> FastAPI:
    """The server's app without LitServe, for in-process tests (``httpx.ASGITransport``): ``install``'s routes, API
    key, limits and errors, and ``POST /v1/systemone`` answered in this process, one request per forward pass
    (``answer_request``). ``models``: the runs already loaded, by name (default: loaded here)."""
    served = catalog(runs)
    if models is None:
        models = {name: load(run) for name, run in served.items()}
    elif models.keys() != served.keys():
        raise ValueError(f"the models are named {sorted(models)} and the runs {sorted(served)}; pass one per run")
    app = FastAPI(title="decisionkit System One (in process)")
    install(app, served, limits, api_key, log)

    async def answer(prepared: Prepared) -> dict:
        [body] = await anyio.to_thread.run_sync(systemone.respond, models, [prepared])
        return body

    @app.post(ENDPOINT, response_model=SystemOneResponse)
    async def system_one(request: SystemOneRequest):
        return await answer_request(models, request, answer)

    return app
