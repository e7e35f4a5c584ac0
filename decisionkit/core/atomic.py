"""Atomic writes: a file or a folder is written beside its place and renamed into it, so a reader (or a crash
mid-write) never meets half of one. Models, cache entries and reports are written through here (onnxruntime writes
an int8 graph itself, so ``onnx_runtime.quantize`` renames its scratch file into place the same way).

- ``atomic_file(path)``: a context manager yielding a scratch path next to ``path``; write to it, and on a clean
  exit it replaces ``path``.
- ``write_text(path, text)``: the same for a string.
- ``publish(folder, path)``: a folder written beside ``path`` (a training run's working folder) takes its place,
  as below.
- ``atomic_folder(path)``: a scratch folder next to ``path``; on a clean exit it takes ``path``'s place (the old
  folder, if any, is moved aside to ``.NAME.old`` and removed only after the swap). If the second rename fails, the
  old folder is moved back; a process killed between the two renames leaves it whole at ``.NAME.old``, and the
  next save of ``path`` puts it back first. Two saves of one folder at once take turns at the swap (a lock on the parent
  folder, across threads and processes): the last one wins, whole, and neither fails.

What is written is readable by everyone (mode 644 for files, 755 for folders): caches and saved models are shared,
while ``tempfile`` makes its files private.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: saves take turns within this process only
    fcntl = None

_SWAPPING = threading.Lock()


def _share(path: Path) -> None:
    """Files 644, folders 755, all the way down."""
    if path.is_dir():
        for item in path.rglob("*"):
            item.chmod(0o755 if item.is_dir() else 0o644)
        path.chmod(0o755)
    else:
        path.chmod(0o644)


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a scratch file beside ``path``; on a clean exit it replaces ``path``, on an error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    scratch = Path(name)
    try:
        yield scratch
        _share(scratch)
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_file(path) as scratch:
        scratch.write_text(text)
    return Path(path)


@contextmanager
def _swap_turn(folder: Path) -> Iterator[None]:
    """Held while a folder in ``folder`` is swapped: an exclusive ``flock`` on ``folder`` itself (no lock file is
    left behind), which threads with their own descriptor and other processes both wait for."""
    if fcntl is None:
        with _SWAPPING:
            yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield an empty scratch folder beside ``path``; on a clean exit it takes ``path``'s place (an existing folder
    there is moved aside first, moved back if the swap fails, and deleted after it), on an error it is removed and
    ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        yield scratch
        publish(scratch, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def publish(folder: str | Path, path: str | Path) -> Path:
    """Move the finished ``folder`` (beside ``path``, on the same filesystem) into ``path``'s place, as
    ``atomic_folder`` does on a clean exit: a whole run written in a working folder appears at once, and a run
    that fails before this leaves ``path`` as it was."""
    folder, path = Path(folder), Path(path)
    old = path.with_name(f".{path.name}.old")
    _share(folder)
    with _swap_turn(path.parent):
        if old.exists() and not path.exists():  # a save killed between the renames: the last whole folder
            os.replace(old, path)
        shutil.rmtree(old, ignore_errors=True)
        moved = path.exists()
        if moved:
            os.replace(path, old)
        try:
            os.replace(folder, path)
        except BaseException:
            if moved and not path.exists():
                os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    return path
