"""How a server ends. SIGTERM and SIGINT take LitServe's graceful shutdown (the requests in flight are answered, then
every process it started is stopped and joined), watched so that a shutdown that hangs still ends them. Any other
death of the main process (SIGKILL, the out-of-memory killer), which no handler sees, ends every process it started
too: each ties itself to the main process as it starts (``tie``).

Without ``graceful_sigterm``, SIGTERM ended the main process alone and its workers kept serving on the port; without
``tie``, so did SIGKILL (``tests/test_serve_lifecycle.py`` signals live servers).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from multiprocessing.managers import SyncManager

SHUTDOWN_GRACE = 30.0  # seconds a graceful shutdown may take before the processes it started are killed
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when its parent dies
WATCH_EVERY = 0.5  # seconds between a watchdog's looks at its parent, where the kernel does not signal


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


def tie(parent: int, kernel: bool = sys.platform == "linux") -> None:
    """End this process, a child of the server's main process ``parent``, when that one dies, by whatever signal.
    Called in the child as it starts. With ``kernel`` (Linux), the kernel kills it with its parent
    (``PR_SET_PDEATHSIG``; it follows the parent *thread* that started the child: LitServe starts every process from
    its main thread, which lives as long as the process); elsewhere a watchdog thread ends it once it has been
    reparented. A parent that died before is seen at once."""
    if os.getpid() == parent:
        return  # LitServe's API server runs in a thread of the main process on Windows
    if kernel and ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # died before the kernel was asked: no signal will come
        os._exit(1)
    if not kernel:
        threading.Thread(target=_watch, args=(parent,), daemon=True, name="decisionkit-tie").start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_EVERY)
    os._exit(1)


@contextmanager
def tied_managers():
    """``multiprocessing.Manager()``, which LitServe calls with no way to pass an initializer, starting a queue
    manager that ties itself to this process (``tie``), forked where the platform forks: this process is then its
    parent (a forkserver's child it would not be)."""
    default = multiprocessing.Manager

    def tied() -> SyncManager:
        manager = SyncManager(ctx=multiprocessing.get_context("spawn" if sys.platform == "win32" else "fork"))
        manager.start(tie, (os.getpid(),))
        return manager

    multiprocessing.Manager = tied
    try:
        yield
    finally:
        multiprocessing.Manager = default
