"""Answering a batch of new rows: a file or table of cases nobody has decided yet, in any shape training reads.

``predict(run, data, **reading)`` (``decisionkit.predict``; ``decisionkit predict RUN --data FILE --out ANSWERS``)
reads the rows as training reads an export (``load_decisions`` with ``labelled=False``: the same shapes, flags and
state typing; label columns, if any, are left out of the state), checks every row before any is answered (its
workflow and the length of its state against the model's cap of windows), and answers them in batches of similar
length (``DecisionModel.decide_checked``, one padded forward pass a batch) with a progress bar. It returns a
DataFrame, one row per row of the data in its order: ``id`` (the data's, or its state's digest when it has none),
``workflow``, ``answers`` (question -> the System One answer, as ``decide`` and the server give it),
``confidence`` (the lowest of the answers', the one number a routing threshold reads) and, for a model with a
router, ``verdict`` and ``routing`` (``{"verdict", "reason", "scores"}``). A bad row stops it before any answer,
naming the file, line and field; ``skip_bad=True`` leaves it out instead and lists it in ``frame.attrs["skipped"]``.

``write_predictions(frame, path)`` writes them where a pipeline reads them: ``.jsonl``, one
``{"id", "answers", "routing"}`` a line, as the server answers; or ``.csv``, a column per answer field
(``route.choice``, ``route.confidence``, ``route.probabilities.manager``, ``approve.noul``, ...), then
``confidence``, ``verdict`` and ``reason``. Written whole or not at all (``atomic.atomic_file``), as UTF-8, and never
over a file that is there already unless ``overwrite``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..contract import systemone
from ..core import settings
from ..core.answer_fields import lowest_confidence
from ..core.atomic import atomic_file
from ..core.errors import RunError
from ..data.decisions import load_decisions
from ..data.questions import DataError, schema_json
from ..data.scenarios import scenario_decisions, scenario_name
from .decision_model import DecisionModel, load

CHUNK = 256  # rows answered between two updates of the progress bar (each chunk in batches of similar length)
OUTPUT_KINDS = (".jsonl", ".csv")


def reading_for(model: DecisionModel, reading: dict) -> dict:
    """``reading`` (``rows.Reading``'s options) for rows ``model`` answers or is scored on: rows that name no
    workflow are a one-workflow model's own, whatever the file is called."""
    if len(model.schema) == 1 and not reading.get("workflow"):
        return {**reading, "workflow": next(iter(model.schema))}
    return reading


def _rows(model: DecisionModel, data, skip_bad: bool, reading: dict):
    """The data's rows to answer, each checked against the model, with the skipped ones (where, error)."""
    name = scenario_name(data)
    if name is not None:
        decisions = scenario_decisions(name, min_train=0)
    else:
        decisions = load_decisions(data, schema_json(model.schema), carve=False, min_train=0, labelled=False,
                                   skip_bad=skip_bad, **reading_for(model, reading))
    skipped = list(decisions.record.get("skipped", []))
    items, windows, kept = [], [], []
    checked = [systemone.checked(model.schema, c.state, None, c.workflow) for c in decisions.rows]
    for case, item, found in zip(decisions.rows, checked, model.windows_of([i.text for i in checked])):
        try:
            found = systemone.within_cap(model, found)
        except systemone.QuestionError as err:
            where = decisions.places.get(case.id, case.id)
            if not skip_bad:
                raise DataError(f"{where}: {err}; nothing was answered (--skip-bad answers the other rows)") from None
            skipped.append({"where": where, "error": str(err)})
            continue
        items.append(item)
        windows.append(found)
        kept.append(case)
    return kept, items, windows, skipped


def predict(run, data, *, skip_bad: bool = False, batch_size: int = 16, progress: bool = True,
            **reading) -> pd.DataFrame:
    """The model saved in ``run`` (a folder, or a ``DecisionModel``) on every row of ``data`` (see the module
    docstring); ``reading``: how the data's columns are read (``rows.Reading``: ``workflow``, ``state_columns``,
    ``text_column``, ``id_column``, ``ignore_columns``, ``delimiter``)."""
    model = load(Path(run).expanduser()) if isinstance(run, (str, Path)) else run
    cases, items, windows, skipped = _rows(model, data, skip_bad, reading)
    routed = model.router is not None
    order = np.argsort([sum(map(len, w)) for w in windows], kind="stable")  # similar lengths share a chunk
    results: list[Any] = [None] * len(items)
    with tqdm(total=len(items), desc="answering", unit="row",
              disable=not progress or settings.progress_hidden()) as bar:
        for start in range(0, len(order), CHUNK):
            rows = order[start:start + CHUNK]
            answered = model.decide_checked([items[i] for i in rows], batch_size, route=routed,
                                            input_ids=[windows[i] for i in rows])
            for i, result in zip(rows, answered):
                results[i] = result
            bar.update(len(rows))
    answers = [r["answers"] if routed else r for r in results]
    frame = pd.DataFrame({"id": [c.id for c in cases], "workflow": [c.workflow for c in cases], "answers": answers,
                          "confidence": [lowest_confidence(a) for a in answers]})
    if routed:
        frame["verdict"] = [r["verdict"] for r in results]
        frame["routing"] = [{k: r[k] for k in ("verdict", "reason", "scores")} for r in results]
    frame.attrs["skipped"] = skipped
    return frame


def _flat(prefix: str, value: Any, out: dict) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flat(f"{prefix}.{key}", item, out)
    else:
        out[prefix] = value


def answer_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``predict``'s answers as a flat table, a column per answer field (a score's legend, the same in every row,
    left out), then the confidence and the routing verdict and reason: the CSV ``write_predictions`` writes."""
    rows = []
    for _, row in frame.iterrows():
        flat = {"id": row["id"]}
        if frame["workflow"].nunique() > 1:
            flat["workflow"] = row["workflow"]
        for qid, answer in row["answers"].items():
            _flat(qid, {k: v for k, v in answer.items() if k not in ("type", "legend")}, flat)
        flat["confidence"] = row["confidence"]
        if "routing" in frame:
            flat.update(verdict=row["routing"]["verdict"], reason=row["routing"]["reason"])
        rows.append(flat)
    return pd.DataFrame(rows)


def check_output(path: str | Path, overwrite: bool = False) -> Path:
    """``path`` (``~`` expanded) if answers may be written there: a ``.jsonl`` or ``.csv`` name, and no file there
    unless ``overwrite``; else a RunError, before anything is answered."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in OUTPUT_KINDS:
        raise RunError(f"{path}: answers are written as {' or '.join(OUTPUT_KINDS)}; name the file so")
    if path.exists() and not overwrite:
        raise RunError(f"{path} exists; predictions never write over a file (give another --out, or --overwrite)")
    return path


def write_predictions(frame: pd.DataFrame, path: str | Path, overwrite: bool = False) -> Path:
    """Write ``predict``'s answers to ``path`` (``.jsonl`` or ``.csv``, see the module docstring), atomically."""
    path = check_output(path, overwrite)
    if path.suffix.lower() == ".jsonl":
        lines = [json.dumps({"id": row["id"], "answers": row["answers"],
                             **({"routing": row["routing"]} if "routing" in frame else {})}, ensure_ascii=False)
                 for _, row in frame.iterrows()]
        text = "".join(line + "\n" for line in lines)
    else:
        text = answer_columns(frame).to_csv(index=False)
    with atomic_file(path) as scratch:
        scratch.write_text(text, encoding="utf-8")
    return path
