"""Atomic writes: a file or a folder is written beside its place and renamed into it, so a reader (or a crash
mid-write) never meets half of one. Models, cache entries and reports are written through here (onnxruntime writes
an int8 graph itself, so ``onnx_runtime.quantize`` renames its scratch file into place the same way).

- ``atomic_file(path)``: a context manager yielding a scratch path next to ``path``; write to it, and on a clean
  exit it replaces ``path``.
- ``write_text(path, text)``: the same for a string.
- ``atomic_folder(path)``: a scratch folder next to ``path``; on a clean exit it takes ``path``'s place (the old
  folder, if any, is removed only after the swap).

What is written is readable by everyone (mode 644 for files, 755 for folders): caches and saved models are shared,
while ``tempfile`` makes its files private.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield an empty scratch folder beside ``path``; on a clean exit it takes ``path``'s place (an existing folder
    there is moved aside first and deleted after the swap), on an error it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    old = path.with_name(f".{path.name}.old")
    try:
        yield scratch
        _share(scratch)
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(scratch, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
