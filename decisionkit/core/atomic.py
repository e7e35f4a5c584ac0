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
- ``link_or_copy(source, target)``: a hard link where the filesystem makes one, else a copy (a save carrying a
  folder's other files over into the new one).

Durable: what is written is flushed to the disk (``fsync``: each file's data, each folder's entries) before it is
renamed into place, and the folder it is renamed into is flushed after, so after a power cut the new version is there
whole or the old one is: a rename alone can reach the disk before the data it names.

Modes: what a plain ``open`` or ``mkdir`` would make under the process's umask (0o666 & ~umask for files, 0o777 &
~umask for folders; 644 and 755 under the usual 022), all the way down: caches and saved models are shared, while
``tempfile`` makes its scratch files and folders private (600, 700) whatever the umask, and a user whose umask keeps
files from others (027) keeps them so here too.
"""

from __future__ import annotations

import errno
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
_READING_UMASK = threading.Lock()
NO_LINK = {errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK}  # a filesystem without links


def _umask() -> int:
    """This process's umask, read without changing it where Linux shows it (``/proc/self/status``); elsewhere set
    and put back at once, under a lock so that two readers cannot leave it changed (and set meanwhile to the usual
    022, never to 0, for a file another thread creates in that instant)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    with _READING_UMASK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _finish(path: Path) -> None:
    """Give every file and folder of ``path`` (a file: itself) the modes ``open`` and ``mkdir`` make under the umask
    (see above), and flush each to the disk."""
    mask = _umask()
    for item in [*path.rglob("*"), path] if path.is_dir() else [path]:
        item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)
        _fsync(item)


def _fsync(path: Path) -> None:
    """Flush ``path`` to the disk: a file's data, or a folder's entries (the names created or renamed in it).
    Windows opens no folder (its renames are journaled), and flushes only a file opened for writing."""
    if os.name == "nt" and path.is_dir():
        return
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_or_copy(source: str | Path, target: str | Path) -> None:
    """Hard-link ``source`` at ``target`` (no copy, and ``source`` stays whole); where the filesystem makes no link
    (EPERM, EXDEV, ENOTSUP, EMLINK: some network and FUSE mounts, another device, too many links), copy it with its
    times and mode. ``shutil.copytree``'s ``copy_function`` too."""
    try:
        os.link(source, target)
    except OSError as error:
        if error.errno not in NO_LINK:
            raise
        shutil.copy2(source, target)


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a scratch file beside ``path``; on a clean exit it is flushed and replaces ``path``, on an error it is
    removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    scratch = Path(name)
    try:
        yield scratch
        _finish(scratch)
        os.replace(scratch, path)
        _fsync(path.parent)
    finally:
        scratch.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_file(path) as scratch:
        scratch.write_text(text, encoding="utf-8")
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
    _finish(folder)
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
        _fsync(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    return path
