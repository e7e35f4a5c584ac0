"""``DecisionLog``: every answered request kept, off the request's path, and the cases a person should see queued.

``log.record(...)`` only appends to a queue in memory; a writer thread writes what has gathered every
``flush_seconds`` (default 0.2 s), in one transaction per batch. So an answer never waits for the database, and a
database that fails never loses an answer: the batch stays queued and is tried again (up to ``max_pending`` entries;
past that the oldest are dropped, and counted), every failure is counted, and ``status()`` (the server's
``/health``) shows the counts and the last error. What a killed process loses is what it had not written yet: at
most the last ``flush_seconds`` of answers (``tests/test_loop_serve.py`` kills a server under load and counts).

Queued for review, once per case (``case_key``: a hash of the workflow, the state and the questions, so a case seen
twice is queued once): every request the router sent to a human (``routed``), and a seeded random share of the
others (``audit``, default 2%), drawn from a hash of the seed and the request id, so that how often the confident
answers were wrong is measured, not only the router's catches.

A log opened in one process and used in a forked one (LitServe's API servers) starts its own connections and writer
there.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Mapping

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from ..core.answer_fields import lowest_confidence
from ..core.errors import SettingError
from ..data.states import canonical, json_state
from . import AUDIT_SHARE, store
from .store import open_store

FLUSH_SECONDS = 0.2  # the writer's batch window: what a killed server may lose


def case_key(workflow: str | None, state: Any, questions: Mapping) -> str:
    """A case's identity in the queue: the first 16 hex digits of a SHA-256 of its workflow, its state (read as
    training reads it) and its questions."""
    text = canonical([workflow, json_state(state), questions])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def audited(seed: int, request_id: str, share: float) -> bool:
    """Whether the request ``request_id`` is in the random audit: a hash of the seed and the id, read as a number in
    [0, 1), below ``share``."""
    draw = int.from_bytes(hashlib.sha256(f"{seed}:{request_id}".encode()).digest()[:8], "big") / 2 ** 64
    return draw < share


class DecisionLog:
    """The decision log at ``where`` (a SQLite path or a database URL: ``store.open_store``), opened and checked
    now: a log that cannot be used raises ``store.LogError`` here, before anything is answered.

    ``audit_share``: the share of answered requests queued for review at random; ``seed``: the audit's draw.
    ``flush_seconds``: the writer's batch window. ``max_pending``: entries kept while the database fails.
    ``create=False``: the log must exist already (a reader's: a mistyped path is not made into a new log)."""

    def __init__(self, where: str | Path, audit_share: float = AUDIT_SHARE, seed: int = 0,
                 flush_seconds: float = FLUSH_SECONDS, max_pending: int = 100_000, create: bool = True):
        if not 0.0 <= audit_share <= 1.0:
            raise SettingError(f"audit share {audit_share}: expected a share from 0 to 1 (0.02: 2% of the answered "
                               "requests are reviewed at random)")
        self.where, self.audit_share, self.seed = where, audit_share, seed
        self.flush_seconds, self.max_pending = flush_seconds, max_pending
        self.store = open_store(where, create)
        self.shown = self.store.shown
        self._pid = None
        self._start()

    def _here(self) -> None:
        if os.getpid() != self._pid:
            self._start()

    def _start(self) -> None:
        """This process's queue, counters and writer (again after a fork: the parent's thread did not come)."""
        if self._pid is not None:
            self.store.engine.dispose(close=False)  # the parent's connections stay the parent's
        self._pid = os.getpid()
        self._pending: deque[dict] = deque()
        self._wake = threading.Condition()
        self._writing, self._in_flight = False, 0  # a batch being written, and its size
        self._stopped = False
        self.written = self.failures = self.dropped = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="decision-log-writer", daemon=True)
        self._thread.start()

    # ----- keeping answers -----------------------------------------------------------------------------------------
    def record(self, *, model: str, state: Any, questions: Mapping, answers: Mapping[str, dict],
               version: str | None = None, folder: str | Path | None = None, workflow: str | None = None,
               routing: Mapping | None = None, latency_ms: float | None = None, request_id: str | None = None,
               at: float | None = None) -> str:
        """Queue one answered request for the writer; returns its request id (made here when not given). Never
        blocks on the database, never raises for it."""
        self._here()
        request_id = request_id or uuid.uuid4().hex
        routing = routing or {}
        entry = {"at": time.time() if at is None else at, "request_id": request_id, "model": model,
                 "version": version, "folder": None if folder is None else str(folder), "workflow": workflow,
                 "case_key": case_key(workflow, state, questions), "state": state, "questions": dict(questions),
                 "answers": dict(answers), "verdict": routing.get("verdict"), "reason": routing.get("reason"),
                 "scores": routing.get("scores"), "latency_ms": latency_ms}
        with self._wake:
            self._pending.append(entry)
            if len(self._pending) > self.max_pending:
                self._pending.popleft()
                self.dropped += 1
            self._wake.notify()
        return request_id

    def failed(self, err: BaseException) -> None:
        """Count an answer that could not be recorded (``status()`` shows it), without raising."""
        self._here()
        with self._wake:
            self.failures += 1
            self.dropped += 1
            self.last_error = store.one_line(err)

    def why_queued(self, entry: Mapping) -> str | None:
        """``routed`` for a request the router sent to a human, ``audit`` for one in the random audit, else None."""
        if entry["verdict"] == "human":
            return "routed"
        return "audit" if audited(self.seed, entry["request_id"], self.audit_share) else None

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._stopped or self._pending, timeout=None)
                if not self._pending and self._stopped:
                    return
            if not self._stopped:
                time.sleep(self.flush_seconds)  # the batch window: answers arriving meanwhile share the write
            with self._wake:
                batch = list(self._pending)
                self._pending.clear()
                self._writing, self._in_flight = True, len(batch)
            try:
                self._write(batch)
            except Exception as err:  # the database failed: keep the batch for the next try, count it, go on
                with self._wake:
                    self.failures += 1
                    self.last_error = store.one_line(err)
                    room = self.max_pending - len(self._pending)
                    kept = batch[-room:] if room > 0 else []
                    self.dropped += len(batch) - len(kept)
                    self._pending.extendleft(reversed(kept))
                    self._writing, self._in_flight = False, 0
                    self._wake.notify_all()
                    stop = self._stopped
                if stop:
                    return
                time.sleep(min(5.0, self.flush_seconds * 2 ** min(self.failures, 5)))
                continue
            with self._wake:
                self.written += len(batch)
                self._writing, self._in_flight = False, 0
                self._wake.notify_all()

    def _write(self, batch: list[dict]) -> None:
        queued = {}
        for entry in batch:
            why = self.why_queued(entry)
            if why is not None and entry["case_key"] not in queued:
                queued[entry["case_key"]] = {
                    "id": entry["case_key"], "why": why, "confidence": lowest_confidence(entry["answers"]),
                    **{k: entry[k] for k in ("at", "request_id", "model", "version", "folder", "workflow", "state",
                                             "questions", "answers", "verdict", "reason", "scores")}}
        with self.store.engine.begin() as conn:
            conn.execute(store.decisions.insert(), batch)
            if queued:
                _insert_new(conn, list(queued.values()))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything recorded so far is written (or ``timeout`` seconds); True when it is."""
        with self._wake:
            self._wake.notify()
            return self._wake.wait_for(lambda: not self._pending and not self._writing, timeout=timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds), stop the writer, close the connections."""
        if os.getpid() == self._pid:
            with self._wake:
                self._stopped = True
                self._wake.notify_all()
            self._thread.join(timeout)
        self.store.engine.dispose()

    def status(self) -> dict:
        """What ``/health`` shows of the log: where, how many entries were written, are waiting, failed, dropped."""
        self._here()
        with self._wake:
            return {"log": self.shown, "written": self.written, "pending": len(self._pending) + self._in_flight,
                    "failures": self.failures, "dropped": self.dropped, "last_error": self.last_error,
                    "audit_share": self.audit_share}

    def __getstate__(self) -> dict:  # sent to another process (a Ray replica): it opens the log again there
        return {"where": self.where, "audit_share": self.audit_share, "seed": self.seed,
                "flush_seconds": self.flush_seconds, "max_pending": self.max_pending}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _insert_new(conn, rows: list[dict]) -> None:
    """Insert the review rows whose case is not queued yet (a case seen twice is queued once), in one statement on
    SQLite and PostgreSQL (ON CONFLICT DO NOTHING), else after reading which are there."""
    table = store.reviews
    if conn.dialect.name in ("sqlite", "postgresql"):
        module = sqlite if conn.dialect.name == "sqlite" else postgresql
        conn.execute(module.insert(table).on_conflict_do_nothing(index_elements=["id"]), rows)
        return
    there = set(conn.execute(select(table.c.id).where(table.c.id.in_([r["id"] for r in rows]))).scalars())
    fresh = [r for r in rows if r["id"] not in there]
    if fresh:
        conn.execute(table.insert(), fresh)
