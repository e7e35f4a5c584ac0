"""How a server ends: SIGTERM and SIGINT take LitServe's graceful shutdown (the requests in flight are answered, then
every process it started is stopped and joined), watched so that a shutdown that hangs still ends them.

Without ``graceful_sigterm``, SIGTERM ended the main process alone and its workers kept serving on the port
(``tests/test_serve_lifecycle.py`` signals live servers).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

SHUTDOWN_GRACE = 30.0  # seconds a graceful shutdown may take before the processes it started are killed


def _interrupted(signum, frame):
    """SIGTERM or SIGINT: LitServe's graceful shutdown (KeyboardInterrupt), watched. Interrupted inside its wait on
    the queue manager, that shutdown sometimes never ends (seen once in a full test run: the request in flight was
    answered, then the server was still running 60 s later); past ``SHUTDOWN_GRACE`` the watchdog kills the
    processes it started and ends this one."""
    threading.Thread(target=_end_after, args=(SHUTDOWN_GRACE,), daemon=True).start()
    raise KeyboardInterrupt


def _end_after(seconds: float) -> None:
    time.sleep(seconds)
    print(f"decisionkit: the graceful shutdown did not end within {seconds:g} s; stopping its processes",
          file=sys.stderr, flush=True)
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:  # reaped before this process ends: none outlives it, not even for a moment
        child.join(timeout=5)
    os._exit(1)


@contextmanager
def graceful_sigterm():
    """SIGTERM handled as Ctrl-C is (KeyboardInterrupt, watched: ``_interrupted``), so that a supervisor's stop runs
    the same shutdown, which stops every child process, instead of ending this process alone and leaving its
    children serving."""
    previous = {s: signal.signal(s, _interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
