"""The on-disk cache of pooled features: its keys and its files (``features.extract_features`` reads and writes it).

An entry is a safetensors file of every pooling of a list of texts at some layers, named by a key that covers the
backbone's weights, its quantization, the compute dtype, the rendering, the texts, the window length, the cap on
windows and the layers; its metadata holds each text's hash, so a later list that shares texts with it reads their
rows (``cached_rows``) instead of running the backbone again. Written atomically, readable by everyone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors.numpy import save_file

from ..core.atomic import atomic_file
from ..data.cases import RENDER_VERSION
from .backbone import Backbone
from .windows import DEFAULT_MAX_WINDOWS


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


def cached_rows(folder: Path, family: str, hashes: Sequence[str]) -> dict[str, tuple[Path, int]]:
    """Where each of ``hashes`` (texts) was cached before in ``family`` (same weights, dtype, rendering, window,
    cap and layers): text hash -> (file, row)."""
    wanted, found = set(hashes), {}
    for path in sorted(folder.glob(f"{family}-*.safetensors")):
        for row, h in enumerate(json.loads(metadata(path).get("texts", "[]"))):
            if h in wanted and h not in found:
                found[h] = (path, row)
        if len(found) == len(wanted):
            break
    return found


def save_atomic(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    with atomic_file(path) as scratch:
        save_file(arrays, scratch, metadata=metadata)


def metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as handle:
        return handle.metadata()
