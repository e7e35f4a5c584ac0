"""Where decisionkit reads data and keeps its caches, and whether it runs in quick mode.

Every setting comes from an environment variable so that notebooks, tests and CI share one switch:

- ``DECISIONKIT_DATA``  folder holding ``train.jsonl`` / ``test.jsonl`` of typed-decisions.
- ``DECISIONKIT_CACHE`` folder for converted backbones and cached features
  (default: ``~/.cache/decisionkit``).
- ``DECISIONKIT_QUICK`` ``1`` shrinks notebook and demo sizes (same code path, smaller subsets).
- ``TQDM_DISABLE``      ``1`` hides progress bars (tests and CI: nbval compares what cells write).
- ``DECISIONKIT_DEBUG`` ``1``: the command line shows the traceback of every error, a user's mistake too.
- ``DECISIONKIT_API_KEY`` the key ``decisionkit serve`` asks of every request (``Authorization: Bearer``), unless
  ``--api-key-file`` names a file holding it; unset, it asks none. Never on the command line: any local user reads
  the process list.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import SettingError

DATA_ENV = "DECISIONKIT_DATA"
CACHE_ENV = "DECISIONKIT_CACHE"
QUICK_ENV = "DECISIONKIT_QUICK"
API_KEY_ENV = "DECISIONKIT_API_KEY"
DEBUG_ENV = "DECISIONKIT_DEBUG"


def cache_dir() -> Path:
    """The cache root, created on first use."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "decisionkit").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def data_dir() -> Path | None:
    """The typed-decisions folder named by ``DECISIONKIT_DATA``, or None when unset."""
    value = os.environ.get(DATA_ENV)
    return Path(value).expanduser() if value else None


def flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to a true value (1, true, yes; any case)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes"}


def debug() -> bool:
    """True when ``DECISIONKIT_DEBUG`` asks the command line for the traceback of every error, a user's too."""
    return flag(DEBUG_ENV)


def quick_mode() -> bool:
    """True when ``DECISIONKIT_QUICK`` is set to a true value."""
    return flag(QUICK_ENV)


def progress_hidden() -> bool:
    """True when ``TQDM_DISABLE`` is set to a true value: every decisionkit progress bar stays hidden."""
    return flag("TQDM_DISABLE")


def api_key(file: str | Path | None = None) -> str | None:
    """The server's API key: the first line of ``file``, stripped (a file without one is refused: a key file that
    came out empty must not serve without a key), else ``DECISIONKIT_API_KEY``; None when that is unset or blank."""
    if file is None:
        return os.environ.get(API_KEY_ENV, "").strip() or None
    lines = Path(file).expanduser().read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].strip():
        raise SettingError(f"{file} holds no API key: its first line is empty")
    return lines[0].strip()
