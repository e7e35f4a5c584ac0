"""The folder a training run writes into, and nothing of the user's lost on the way.

A run into ``out`` (``pipeline.train``; ``decisionkit train --out``):

- ``check_out(out)``: refused before anything trains when ``out`` is a file, or a folder that holds files and is not
  a decisionkit model (``saving.CONFIG_FILE``): the user's export, notes, other models. An empty folder, a new path
  or an earlier model are written.
- ``claimed(out)``: one run at a time into ``out``. A lock (``filelock``, the hidden ``.NAME.lock`` beside it) is
  held for the run; a second run into the same ``out`` is refused at once with who holds it (process, host, since
  when, the command), read from the working folder that run wrote.
- ``working_folder(out)``, ``.NAME.training`` beside it: where the run is written until it is whole; an interrupted
  fine-tuning run resumes from it. ``prepare_work`` resumes it only for the run that made it: the folder records what
  made it (``RUN_FILE``: the preset, the schema and the rows' hash); a run of anything else starts over and says why
  (a ``StartedOver`` warning), so a relabelled export never resumes a checkpoint of the old labels.
- ``publish_run(work, out)``: the finished run takes ``out``'s place. Into an earlier model, only the run's own
  files (``saving.RUN_ITEMS``: the model, its report, data record and evaluations) are replaced: anything else in
  ``out`` is carried into the new folder first (hard links, ``atomic.link_or_copy``), and the earlier model stays
  whole until the new one is (``atomic.publish``: two renames, a crash between them leaves the last whole folder).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from ..core.atomic import link_or_copy, publish, write_text
from ..core.errors import RunError
from ..model.saving import CONFIG_FILE, is_run_item

RUN_FILE = "run.json"  # in the working folder: what made it, and who is writing it


class StartedOver(UserWarning):
    """A working folder left by another run (other data, schema or preset) was set aside: this run starts afresh."""


def working_folder(out: str | Path) -> Path:
    """Where a run into ``out`` is written until it is whole: a hidden folder beside it."""
    out = Path(out)
    return out.with_name(f".{out.name}.training")


def _listing(folder: Path, most: int = 5) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_out(out: str | Path) -> Path:
    """``out`` as a run may write it (``~`` expanded), or a RunError naming what is there."""
    out = Path(out).expanduser()
    if out.is_file() or (out.exists() and not out.is_dir()):
        raise RunError(f"{out} is a file; --out names the folder the model is written into")
    if out.is_dir() and any(out.iterdir()) and not (out / CONFIG_FILE).is_file():
        raise RunError(f"{out} exists and is not a decisionkit model (it holds {_listing(out)}); nothing was trained. "
                       "Give --out a new folder (a run never writes over files it did not make), or an earlier "
                       "model's folder to replace that model")
    return out


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv) or sys.executable}


@contextmanager
def claimed(out: Path) -> Iterator[None]:
    """Hold ``out`` for one run; a RunError saying who holds it when another run does."""
    lock = FileLock(str(out.with_name(f".{out.name}.lock")), timeout=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock.acquire()
    except Timeout:
        who = _read(working_folder(out) / RUN_FILE).get("holder", {})
        by = (f"process {who['pid']} on {who['host']} since {who['started']} ({who['command']})" if who
              else "another process")
        raise RunError(f"{out} is being trained by {by}; wait for that run to end, or give another --out") from None
    try:
        yield
    finally:
        lock.release()


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _why_not(saved: dict, identity: dict) -> str:
    """What differs between the run that made a working folder and this one."""
    made = saved.get("made from")
    if not made:
        return "it does not say which run made it"
    return ", ".join(f"another {name}" for name in identity if made.get(name) != identity[name]) or ""


def prepare_work(out: Path, identity: dict, resume: bool = True) -> Path:
    """The working folder of a run into ``out`` made from ``identity`` (preset, schema, rows' hash): kept for this run
    to resume when it made it, else set aside (``StartedOver``) and begun afresh. A folder of that name holding
    anything a run does not write is refused, not removed."""
    work = working_folder(out)
    identity = json.loads(json.dumps(identity, default=str))  # as the folder keeps it
    if work.exists():
        why = _why_not(_read(work / RUN_FILE), identity) if resume else "asked to restart"
        if why:
            strange = [p.name for p in work.iterdir() if p.name != RUN_FILE and not is_run_item(p.name)]
            if strange:
                raise RunError(f"{work} holds {', '.join(sorted(strange)[:5])}, which no decisionkit run writes; move "
                               "them elsewhere, or give another --out")
            if resume:
                warnings.warn(f"{work} was left by an interrupted run of {why}; starting over", StartedOver,
                              stacklevel=3)
            shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    write_text(work / RUN_FILE, json.dumps({"made from": identity, "holder": _holder()}, indent=2, default=str))
    return work


def publish_run(work: Path, out: Path) -> Path:
    """Move the finished run in ``work`` into ``out``, carrying over whatever of ``out`` is not the run's own."""
    (work / RUN_FILE).unlink(missing_ok=True)
    if out.is_dir():
        for item in out.iterdir():
            if is_run_item(item.name) or (work / item.name).exists():
                continue
            if item.is_symlink():
                os.symlink(os.readlink(item), work / item.name)
            elif item.is_dir():
                shutil.copytree(item, work / item.name, copy_function=link_or_copy, symlinks=True)
            else:
                link_or_copy(item, work / item.name)
    return publish(work, out)
