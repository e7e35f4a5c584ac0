"""The weights' checksums: a backbone is identified by the SHA-256 of its safetensors files, and a saved model
refuses weights whose digest differs from the one it was trained on (``saving.check_backbone``).

``cached_weights_sha256`` keeps each folder's digest in ``$DECISIONKIT_CACHE/weights-sha256.json`` with its files'
identities, so a load hashes a folder again only when a weight file changed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..core import settings
from ..core.atomic import write_text


def _hashed(digest, path: Path):
    """``digest`` updated with the bytes of the file at ``path``, read a megabyte at a time."""
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest


def weights_sha256(folder: str | Path) -> str:
    """SHA-256 over the folder's safetensors files, in name order: the identity of the weights."""
    digest = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors weights (only safetensors are loaded)")
    for path in files:
        digest.update(path.name.encode())
        _hashed(digest, path)
    return digest.hexdigest()


CHECKSUM_CACHE = "weights-sha256.json"  # under settings.cache_dir(): folder -> its files' identities and digest


def _identity(path: Path) -> list:
    """What tells one version of a file from another without reading it. stat() follows a symlink, so a hub cache
    entry is identified by its blob; a rewrite changes the mtime (and usually size or inode)."""
    st = path.stat()
    return [str(path.absolute()), st.st_size, st.st_mtime_ns, st.st_ino]


def _read_checksums(cache: Path) -> dict:
    try:
        entries = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing or damaged: the cache only ever saves work, so start it afresh
        return {}
    return entries if isinstance(entries, dict) else {}


def cached_weights_sha256(folder: str | Path) -> str:
    """``weights_sha256(folder)``, hashed only when a weight file changed: the digest is kept in
    ``$DECISIONKIT_CACHE/weights-sha256.json`` with each file's identity (absolute path, size, st_mtime_ns, inode)
    and reused while every identity still matches (re-hashing a 500 MB checkpoint on each load takes seconds)."""
    folder = Path(folder).absolute()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return weights_sha256(folder)  # raises, naming the folder
    before = [_identity(f) for f in files]
    cache = settings.cache_dir() / CHECKSUM_CACHE
    hit = _read_checksums(cache).get(str(folder))
    if isinstance(hit, dict) and hit.get("files") == before and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    digest = weights_sha256(folder)
    if [_identity(f) for f in sorted(folder.glob("*.safetensors"))] == before:  # not rewritten while we read it
        entries = _read_checksums(cache)  # read again: another process may have added its folder meanwhile
        entries[str(folder)] = {"files": before, "sha256": digest}
        write_text(cache, json.dumps(entries, indent=1, sort_keys=True))
    return digest


def file_sha256(path: Path) -> str:
    """SHA-256 of one file."""
    return _hashed(hashlib.sha256(), path).hexdigest()
