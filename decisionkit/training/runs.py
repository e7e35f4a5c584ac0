"""Runs trained once and shared: the tests, the notebooks and the benchmarks ask for a preset's saved model, and the
first process to ask trains it into the cache while the others wait on a file lock.

``shared_run("cpu-quick")`` is the folder of a trained model (``decisionkit.load`` opens it); ``routed=True`` is the
folder of a whole ``run_report`` (calibrated, router fitted, scored), as ``make demo`` trains it. The cache key covers
the preset with its overrides, decisionkit's source code and the data files, so a change to any of them trains anew.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from filelock import FileLock

from ..core import settings
from ..model.saving import HISTORY_FILE, REPORT_FILE
from .pipeline import run_report
from .presets import preset
from .trainer import fit_model

PACKAGE = Path(__file__).resolve().parents[1]  # the decisionkit folder


def _identity(files) -> list:
    return [(str(f.name), f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(files) if f.is_file()]


def run_key(preset_json: dict, routed: bool) -> str:
    """What a shared run depends on: the preset, routing, the package's source (every module of every subpackage) and the data files' identities (the
    typed-decisions folder and the scenarios)."""
    code = hashlib.sha256(b"".join(f.relative_to(PACKAGE).as_posix().encode() + f.read_bytes()
                                   for f in sorted(PACKAGE.rglob("*.py")))).hexdigest()  # every module, where it is
    data = settings.data_dir()
    blob = json.dumps({"preset": preset_json, "routed": routed, "code": code,
                       "data": _identity(data.glob("*.jsonl")) if data else None,
                       "scenarios": _identity(PACKAGE.glob("scenario_data/**/*"))}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def shared_run(preset_name: str, routed: bool = False, **overrides) -> Path:
    """The folder of preset ``preset_name`` (with ``overrides``) trained once under ``$DECISIONKIT_CACHE/runs``:
    trained by the first process that asks, reused by the rest. ``routed``: calibrated, router fitted and scored by
    ``pipeline.run_report`` (its ``report.json`` is there too)."""
    p = preset(preset_name, **overrides)
    out = settings.cache_dir() / "runs" / f"{p.name}-{'routed-' if routed else ''}{run_key(p.to_json(), routed)}"
    done = out / (REPORT_FILE if routed else HISTORY_FILE)  # written last, once the run is complete
    if not done.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out) + ".lock"):
            if not done.is_file():  # another process may have trained it while this one waited
                if routed:
                    run_report(p, out, progress=False)
                else:
                    fit_model(p, out, progress=False)
    return out
