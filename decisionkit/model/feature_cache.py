"""The on-disk cache of pooled features: its keys and its files (``features.extract_features`` reads and writes it).

An entry is a safetensors file of every pooling of a list of texts at some layers, named by a key that covers the
backbone's weights, its quantization, the compute dtype, the rendering, the texts, the window length, the cap on
windows and the layers; its metadata holds each text's hash, so a later list that shares texts with it reads their
rows (``cached_rows``) instead of running the backbone again. Written atomically, readable by everyone.

An extraction saves its rows as it goes (``Entry``): every ``PARTIAL_SECONDS`` (and when it is interrupted, by an
error or Ctrl-C), the rows made since are a partial entry in the same family (``KEY.part-DIGEST.safetensors``), which
``cached_rows`` reads like any other, so a run after an interruption extracts only the rest. Once the list's whole
entry is written its partial ones are removed; a list never finished keeps them, at most one row per text extracted
(a text found in the cache is not extracted again; an extraction of token states, which is, saves none).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from ..core.atomic import atomic_file
from ..data.cases import RENDER_VERSION
from .backbone import Backbone
from .windows import DEFAULT_MAX_WINDOWS

PARTIAL_SECONDS = 30.0  # how often an extraction saves the rows it made: a killed one loses at most this much work


def cache_key(backbone: Backbone, texts: Sequence[str], max_length: int, layers: Sequence[int],
               max_windows: int = DEFAULT_MAX_WINDOWS) -> str:
    texts_sha = hashlib.sha256("\x1e".join(texts).encode()).hexdigest()
    quant = None if backbone.quantize is None else repr(backbone.quantize)
    # "windows": texts read in windows up to the cap (entries cached before, of texts cut at max_length, have none)
    blob = json.dumps({"weights": backbone.checksum, "quantize": quant, "dtype": backbone.precision.dtype,
                       "render": RENDER_VERSION, "texts": texts_sha, "max_length": max_length,
                       "windows": max_windows, "layers": list(layers)})
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def text_hashes(texts: Sequence[str]) -> list[str]:
    return [hashlib.sha256(t.encode()).hexdigest()[:32] for t in texts]


def cached_rows(folder: Path, family: str, hashes: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[int, int],
                                                                            float | None]:
    """The rows of ``hashes`` (texts) cached before in ``family`` (same weights, dtype, rendering, window, cap and
    layers), from whole and partial entries alike: every pooling as an array of a row per hash (zeros where none was
    found), each found text's index -> the windows it needs, and the seconds per case of the last entry read (None:
    none). An entry removed meanwhile (a partial one, whose list was written whole) is passed over."""
    index: dict[str, list[int]] = {}
    for i, h in enumerate(hashes):
        index.setdefault(h, []).append(i)
    arrays: dict[str, np.ndarray] = {}
    windows: dict[int, int] = {}
    seconds = None
    for path in sorted(folder.glob(f"{family}-*.safetensors")):
        if len(windows) == len(hashes):
            break
        try:
            with safe_open(str(path), framework="np") as handle:  # open, the file stays readable if it is removed
                meta = handle.metadata()
                rows = [(i, row) for row, h in enumerate(json.loads(meta.get("texts", "[]")))
                        for i in index.get(h, ()) if i not in windows]
                if not rows:
                    continue
                for key in handle.keys():
                    array = handle.get_tensor(key)
                    arrays.setdefault(key, np.zeros((len(hashes), array.shape[1]), dtype=np.float32))[
                        [i for i, _ in rows]] = array[[row for _, row in rows]]
        except FileNotFoundError:
            continue
        saved_windows = json.loads(meta["windows"])
        windows.update({i: saved_windows[row] for i, row in rows})
        seconds = float(meta["seconds_per_case"])
    return arrays, windows, seconds


@dataclass
class Entry:
    """The cache entry ``path`` that an extraction of the texts ``hashes`` (cases ``ids``) writes, saved as it goes:
    ``add`` after each batch (every ``PARTIAL_SECONDS``, the rows made since the last partial entry become one more),
    ``save_partial`` on the way out of an interrupted extraction, ``finish`` once every row is there. An extraction
    that keeps token states (``partial=False``) runs every text again anyway, so it saves no partial entry."""

    path: Path
    ids: list[str]
    hashes: list[str]
    layers: tuple[int, ...]
    max_windows: int
    partial: bool = True
    start: float = field(default_factory=time.perf_counter)
    saved: float = field(default_factory=time.perf_counter)  # when the last partial entry was written
    pending: list[int] = field(default_factory=list)  # the rows made since
    made: int = 0

    def metadata(self, rows: Sequence[int], windows: np.ndarray, seconds: float) -> dict[str, str]:
        return {"ids": json.dumps([self.ids[i] for i in rows]), "layers": json.dumps(list(self.layers)),
                "texts": json.dumps([self.hashes[i] for i in rows]), "seconds_per_case": repr(seconds),
                "windows": json.dumps([int(windows[i]) for i in rows]), "max_windows": str(self.max_windows)}

    def add(self, rows: Sequence[int], pooled: dict[str, np.ndarray], windows: np.ndarray) -> None:
        self.pending += [int(i) for i in rows]
        self.made += len(rows)
        if time.perf_counter() - self.saved >= PARTIAL_SECONDS:
            self.save_partial(pooled, windows)

    def save_partial(self, pooled: dict[str, np.ndarray], windows: np.ndarray) -> None:
        """Save the rows made since the last partial entry as one more, named by their texts."""
        if not self.partial or not self.pending:
            return
        rows = sorted(self.pending)
        digest = hashlib.sha256("".join(self.hashes[i] for i in rows).encode()).hexdigest()[:16]
        seconds = (time.perf_counter() - self.start) / self.made
        save_atomic(self.path.with_name(f"{self.path.stem}.part-{digest}.safetensors"),
                    {key: array[rows] for key, array in pooled.items()}, self.metadata(rows, windows, seconds))
        self.pending, self.saved = [], time.perf_counter()

    def finish(self, pooled: dict[str, np.ndarray], windows: np.ndarray, seconds: float) -> None:
        """Write the whole entry, then remove its partial ones."""
        save_atomic(self.path, pooled, self.metadata(range(len(self.ids)), windows, seconds))
        for part in self.path.parent.glob(f"{self.path.stem}.part-*.safetensors"):
            part.unlink(missing_ok=True)


def save_atomic(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    with atomic_file(path) as scratch:
        save_file(arrays, scratch, metadata=metadata)


def metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="np") as handle:
        return handle.metadata()
