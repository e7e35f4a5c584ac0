"""The server in the lab: started from Python, loaded, probed and measured (notebook 09, the tests,
``benchmarks/load_serve.py``). ``serving/app.py`` is the server itself.

- ``launch(runs)`` starts ``decisionkit serve`` in a child process, returns once it answers (port: ``free_port``).
- ``load_test`` posts request bodies from several clients at once: requests per second, latency percentiles, what
  was lost; ``compare_batching`` does it with batching on and off; ``batch_sweep`` times ``decide_many`` by batch
  size without HTTP.
- The contract probes: ``requests_for`` builds requests a model can answer (``fitting``: the cases short enough for
  it), ``bad_requests`` and ``refusals`` send the server what it must refuse, ``served_vs_decided`` compares its
  answers with ``decide()``'s field by field.
- What a client does with the answers, through the official client (``typesafe_sdk``) asked for decisionkit's
  response model, which keeps the ``routing`` field (``ask``): ``client_routing`` shows the router's verdict and
  scores per request; ``client_answers`` scores a client's answers to cases against their gold, and ``ClientAnswers.rule`` a
  client-side rule on ``confidence`` (accept an answer at a threshold or above, send the rest to a human).
"""

import atexit
import http.client
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
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from ..contract.systemone import SystemOneResponse
from ..core import settings
from ..core.answer_fields import answer_confidence, answer_probabilities
from ..core.plots import load_curves
from ..data.cases import Split
from ..data.metrics import score
from ..serving.app import ENDPOINT
from ..serving.config import Batching, Limits
from .latency import hardware, percentiles, time_calls

ROUTING_SCORES = ("confidence", "raw confidence", "in-domain", "mahalanobis", "field surprise")  # shown first


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the system picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Launched:
    """A ``decisionkit serve`` child process; ``stop()`` sends it SIGTERM, which stops the processes LitServe
    started too (its process group is killed only if it has not exited within ``timeout`` seconds)."""

    process: subprocess.Popen
    url: str

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __enter__(self) -> "Launched":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch(runs: Sequence[str | Path], port: int | None = None, batching: Batching = Batching(),
           limits: Limits = Limits(), startup_timeout: float = 300.0, log: str | Path | None = None,
           api_key: str | None = None, decision_log: str | Path | None = None,
           audit_share: float | None = None) -> Launched:
    """Start ``decisionkit serve`` on 127.0.0.1 in a child process (its own process group), stopped when this
    process exits if not before, and return once ``GET /health`` answers; ``log`` receives its output (default:
    discarded). ``api_key`` reaches it through its environment (never its command line, which every user reads).
    ``decision_log``: ``--log`` (a SQLite path or a database URL), with ``audit_share``."""
    port = port or free_port()
    command = [sys.executable, "-m", "decisionkit", "serve", *map(str, runs), "--port", str(port),
               "--max-batch-size", str(batching.max_batch_size), "--batch-timeout", str(batching.timeout),
               *(arg for name, value in asdict(limits).items() for arg in (f"--{name.replace('_', '-')}", str(value))),
               *(["--log", str(decision_log)] if decision_log is not None else []),
               *(["--audit-share", str(audit_share)] if audit_share is not None else [])]
    output = open(log, "ab") if log else subprocess.DEVNULL
    environment = {**os.environ, settings.API_KEY_ENV: api_key or ""}
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                               env=environment)
    launched = Launched(process, f"http://127.0.0.1:{port}")
    # and it ends with this process at the latest: a notebook that fails before its stop cell left a server answering
    # (and using the CPU) for half an hour after its kernel had shut down
    atexit.register(launched.stop)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"decisionkit serve exited with status {process.returncode} before answering"
                               + (f"; see {log}" if log else "; pass log= to see why"))
        try:
            probe = urllib.request.Request(f"{launched.url}/health",
                                           headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
            with urllib.request.urlopen(probe, timeout=5) as response:
                if response.status == HTTPStatus.OK:
                    return launched
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    launched.stop()
    raise TimeoutError(f"decisionkit serve did not answer on {launched.url} within {startup_timeout:g} s")


def load_test(url: str, bodies: Sequence[bytes], concurrency: int, seconds: float,
              max_requests: int | None = None, headers: Callable[[int], dict[str, str]] | None = None,
              answered: list[tuple[str, float]] | None = None) -> dict[str, float]:
    """``concurrency`` clients posting ``bodies`` (in turn) to ``url`` back to back, for at most ``seconds`` and
    ``max_requests`` requests in all: requests per second, latency percentiles, and how many were lost (an answer
    other than 200, or a broken connection). The p99 is NaN below ``latency.P99_MIN_TIMINGS`` answered requests.
    ``headers(n)``: extra headers of the n-th request (its ``X-Request-Id``); ``answered`` receives, per 200 answer,
    its ``X-Request-Id`` and the time (``time.time()``) its body was read."""
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
                                             headers={"Content-Type": "application/json",
                                                      **(headers(n) if headers else {})})
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    ok = response.status == HTTPStatus.OK
                    response.read()
                    seen = (response.headers.get("X-Request-Id", ""), time.time())
            except (urllib.error.URLError, OSError, http.client.HTTPException):  # refused, reset, cut short
                ok = False
            with guard:
                if ok:
                    latencies.append((time.perf_counter() - start) * 1e3)
                    if answered is not None:
                        answered.append(seen)
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
            **{f"{name} ms": value for name, value in percentiles(ms).items()}}


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
    the answer is JSON, and its ``detail`` whole, read as the fields it names (``body.state``, ...) and its message
    for each."""
    rows = {}
    for name, (method, body) in bad_requests(good).items():
        request = urllib.request.Request(f"{url}{ENDPOINT}", data=body, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                status, kind, payload = response.status, response.headers["content-type"], response.read()
        except urllib.error.HTTPError as refused:
            status, kind, payload = refused.code, refused.headers["content-type"], refused.read()
        detail = json.loads(payload).get("detail") if kind == "application/json" else payload.decode(errors="replace")
        rows[name] = {"status": status, "JSON": kind == "application/json", **readable(detail)}
    return pd.DataFrame.from_dict(rows, orient="index")


def readable(detail) -> dict[str, str]:
    """A refusal's ``detail`` for reading: a validation error's list (each item a ``loc`` and a ``msg``) as the
    fields it names and their messages, one per item; any other detail as its message alone. A message gains the
    parser's own words (``ctx.error``) where they are text it does not already hold: a JSON decode error's position;
    a validator's exception arrives as ``{}`` once encoded, its words already in ``msg``."""
    if not isinstance(detail, list):
        return {"field": "", "message": str(detail)}
    fields = [".".join(map(str, item.get("loc", ()))) for item in detail]
    messages = []
    for item in detail:
        message, words = item.get("msg", ""), (item.get("ctx") or {}).get("error")
        messages.append(f"{message} ({words})" if isinstance(words, str) and words and words not in message
                        else message)
    return {"field": "; ".join(fields), "message": "; ".join(messages)}


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


def fitting(model, cases, count: int | None = None) -> list:
    """The first ``count`` (None: all) of ``cases`` short enough for ``model`` (within its cap of
    ``spec.max_windows`` windows of ``spec.max_length`` tokens): the server refuses a longer state rather than cut
    it, as a client could not see the cut."""
    from ..model.windows import window_lengths

    _, needed = window_lengths(model.backbone, [c.text for c in cases], model.spec.max_length, model.spec.max_windows)
    fits = [c for c, n in zip(cases, needed) if n <= model.spec.max_windows]
    return fits[:count]


def requests_for(model, name: str, cases, count: int) -> tuple[list[dict], list[bytes]]:
    """The first ``count`` of ``cases`` short enough for ``model`` (``fitting``), as ``decide_many`` requests and as
    System One request bodies for the model served as ``name``."""
    asked = [{"state": c.state, "questions": {q: x.to_json() for q, x in c.questions.items()}}
             for c in fitting(model, cases, count)]
    return asked, [json.dumps({"model": name, **a}).encode() for a in asked]


def ask(client, request: dict) -> SystemOneResponse:
    """One request (``{"state", "questions", "workflow"?}``) through the official client ``client`` (a
    ``typesafe_sdk.TypeSafeClient``), read with decisionkit's response model: the SDK's own ignores fields it does
    not know, ``routing`` among them."""
    workflow = request.get("workflow")
    return client.system_one(state=request["state"], questions=request["questions"],
                             extra_body={"workflow": workflow} if workflow else None, response_model=SystemOneResponse)


def client_routing(client, requests: dict[str, dict]) -> pd.DataFrame:
    """Each named request (``{"state", "questions", "workflow"?}``) through ``client`` (``ask``): the ``routing``
    field's verdict, its first scores (``ROUTING_SCORES``) and its reason. The served model must carry a router."""
    rows = {}
    for name, request in requests.items():
        routing = ask(client, request).routing
        if routing is None:
            raise ValueError(f"request {name!r}: the answer has no 'routing' field; serve a model with a router "
                             "(anomaly.fit_router, or a run of pipeline.run_report)")
        rows[name] = {"verdict": routing.verdict, **{k: routing.scores[k] for k in ROUTING_SCORES if k in routing.scores},
                      "reason": routing.reason}
    return pd.DataFrame.from_dict(rows, orient="index")


@dataclass
class ClientAnswers:
    """What a client received for cases with a known gold, one row per answer: ``case``, ``question``, ``type``,
    ``confidence`` as a client reads it (the field; a yes/no answer's top probability, ``answer_fields``), whether
    its top option is the gold's (``correct``, ``metrics.score``) and the router's ``verdict`` on its case."""

    answers: pd.DataFrame

    def rule(self, thresholds: Sequence[float]) -> pd.DataFrame:
        """A client's rule at each threshold t: accept an answer whose confidence is t or more, send the rest to a
        human. Per t: the share of answers accepted, the accuracy of those and of the rest (NaN where none), and
        the share of cases whose every answer was accepted."""
        a = self.answers
        rows = {}
        for t in thresholds:
            kept = a["confidence"] >= t
            rows[t] = {"answers accepted": kept.mean(), "accuracy accepted": a.loc[kept, "correct"].mean(),
                       "accuracy sent to a human": a.loc[~kept, "correct"].mean(),
                       "cases answered in full": kept.groupby(a["case"]).all().mean()}
        return pd.DataFrame.from_dict(rows, orient="index").rename_axis("threshold")

    def router_share(self) -> float:
        """The share of the cases whose ``routing`` verdict was "human"."""
        return float((self.answers.groupby("case")["verdict"].first() == "human").mean())


def client_answers(client, cases) -> ClientAnswers:
    """Ask each of ``cases`` (typed-decisions cases short enough for the served model, ``fitting``) its questions
    through ``client`` (``ask``), and score what came back against the gold."""
    cases = list(cases)
    predictions, confidences, verdicts = [], [], []
    for case in cases:
        response = ask(client, {"state": case.state, "questions": {q: x.to_json() for q, x in case.questions.items()},
                                "workflow": case.workflow})
        answers = {q: a.model_dump() for q, a in response.answers.items()}
        predictions.append({q: np.array([answer_probabilities(answers[q])[o] for o in x.options])
                            for q, x in case.questions.items()})
        confidences.extend(answer_confidence(answers[q]) for q in case.questions)
        verdicts.extend([response.routing.verdict if response.routing else "answer"] * len(case.questions))
    decisions = score(Split("asked", cases, "through the client"), predictions).decisions
    table = decisions[["case", "question", "type", "correct"]].assign(confidence=confidences, verdict=verdicts)
    return ClientAnswers(table)


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
        return load_curves(self.table())


def compare_batching(runs: Sequence[str | Path], bodies: Sequence[bytes], clients: Sequence[int] = (1, 4, 16, 64),
                     batch_sizes: Sequence[int] = (16, 1), rounds: int = 2, min_requests: int = 24,
                     seconds: float = 300.0, limits: Limits = Limits(), log: str | Path | None = None
                     ) -> LoadComparison:
    """For each max batch size (1: no batching), launch the server and load-test it at each number of clients n:
    ``max(min_requests, rounds * n)`` requests per level, in at most ``seconds``. Each row records the load
    average, since other work on the machine slows the model too."""
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
    return {**model.backbone.precision.describe(),
            "cpu bf16 instructions": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}


def batch_sweep(model, requests: Sequence[dict], sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
                rounds: int = 5) -> pd.DataFrame:
    """Milliseconds per request of ``model.decide_many`` by batch size, on the same requests (what a server's
    batching can gain on this device, without HTTP): ``rounds`` passes over the requests at every size, the sizes
    taking turns so that a drift in the machine's speed falls on each alike; per size, the median batch's time over
    its size."""
    model.decide_many(requests, batch_size=max(sizes))  # the first forward passes page the weights in
    chunks = {size: [list(requests[i:i + size]) for i in range(0, len(requests) - size + 1, size)] for size in sizes}
    for size in sizes:
        model.decide_many(chunks[size][0], batch_size=size)  # one warm-up batch of each shape
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(rounds):
        for size in sizes:
            timing = time_calls(f"batch {size}", partial(_decide_batch, model, size), chunks[size], warmup=0)
            samples[size].extend(timing.samples_ms)
    rows = []
    for size in sizes:
        per_request = float(np.median(samples[size])) / size
        rows.append({"batch size": size, "batches": len(samples[size]), "ms per request": per_request,
                     "requests/s": 1e3 / per_request})
    table = pd.DataFrame(rows).set_index("batch size")
    table["speed-up"] = table["requests/s"] / table["requests/s"].iloc[0]
    return table


def _decide_batch(model, size: int, chunk: list[dict]) -> list[dict]:
    return model.decide_many(chunk, batch_size=size)
