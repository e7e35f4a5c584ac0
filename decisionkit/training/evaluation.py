"""Scoring a saved model honestly: on rows it did not learn from, and saying which it left out.

``evaluate(run)`` scores a saved model on the test rows it kept (``saving.HELD_OUT_FILE``), or on another of its
recorded splits read again from its source (``saving.recorded_split``, refused when the source changed).
``evaluate(run, data=FILE)`` scores other data: any source ``load_decisions`` reads, read as ``reading`` says (a
one-workflow model reads rows that name no workflow as its own, whatever the file is called), or a scenario
(``scenario:NAME``); its ``split`` when its rows name splits, else every row. Rows whose state the model was trained
or calibrated on (its train and validation rows, by the digests it recorded: ``saving.seen_rows``) are left out and
counted, so scoring the training export again scores only the rows the model held out, not the ones it learned. An
``Evaluation`` is the ``Scores`` of the raw answers (as the run report scores its splits), with the model as it
answers them (``answered``: accuracy as answered, the share sent to a human, the accuracy of the cases it answers),
what was scored (``scored``), what was left out and why (``left_out``), and the
name of the file ``decisionkit evaluate`` writes it to (``output_name``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..data.cases import Split
from ..data.decisions import load_decisions
from ..data.metrics import Scores
from ..data.questions import DataError, schema_json
from ..data.scenarios import scenario_decisions, scenario_name
from ..data.states import state_digest
from ..model import saving
from ..model.decision_model import load
from ..model.predict import reading_for
from .answered import answered, shown

LEFT_OUT = {"train": "trained on (its train rows)", "validation": "calibrated and routed on (its validation rows)"}


@dataclass
class Evaluation(Scores):
    """``Scores`` of the rows scored, and how they were chosen."""

    scored: str = ""  # what was scored, in words
    rows: int = 0  # rows scored
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> rows left out
    recorded: bool = True  # False: the model keeps no record of its rows, so none could be left out
    output_name: str = "eval-test.json"  # what `decisionkit evaluate` names its output
    answered: dict = field(default_factory=dict)  # ``answered.Answered.summary``: as answered, routed share

    def note(self) -> str:
        """One line: how many rows were scored, and which were left out and why."""
        left = ", ".join(f"{n} {why}" for why, n in self.left_out.items() if n)
        unknown = "" if self.recorded else " (the model keeps no record of the rows it trained on: none left out)"
        return f"{self.rows} rows of {self.scored} scored" + (f"; left out {left}" if left else "") + unknown

    def answered_line(self) -> str:
        """The model as it answers these rows, in words (``answered.shown``)."""
        return shown(self.answered) if self.answered else ""


def _output_name(data, split: str) -> str:
    """``eval-NAME.json`` after what was scored: the data's file or folder name (and the split when its rows name
    splits), or the split the run recorded."""
    if data is None:
        return f"eval-{split}.json"
    name = scenario_name(data) or (Path(str(data)).name.split(".")[0] if isinstance(data, (str, Path)) else "data")
    return f"eval-{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}{'' if split == 'test' else '-' + split}.json"


def scored_split(data, split: str, schema, **reading) -> Split:
    """``split`` of ``data`` when its rows name their splits, or every row when none does (a file of new cases)."""
    name = scenario_name(data)
    if name is not None:
        return scenario_decisions(name, min_train=0)[split]
    decisions = load_decisions(data, schema, min_train=0, carve=False, **reading)
    return decisions[split] if any(decisions.splits.values()) else decisions.rows


def evaluate(path_or_model, split: str = "test", data=None, schema=None, **reading) -> Evaluation:
    """Scores of a saved (or in-memory) model (see the module docstring); ``metrics.Scores`` breaks them down."""
    saved = isinstance(path_or_model, (str, Path))
    folder = Path(path_or_model).expanduser() if saved else None
    model = load(folder) if saved else path_or_model
    if data is None:
        if not saved:
            raise ValueError("an in-memory model has no record of its data: pass data=...")
        cases = saving.held_out_rows(folder) if split == "test" else saving.recorded_split(folder, split)
        what = "the test rows it kept" if split == "test" else f"its recorded {split} split"
        return _evaluation(model, cases, scored=what, output_name=_output_name(None, split))
    cases = scored_split(data, split, schema or schema_json(model.schema), **reading_for(model, reading))
    seen = saving.seen_rows(folder) if saved else None
    left_out = {}
    if seen is not None:
        digests = [state_digest(c.state) for c in cases]
        for part, why in LEFT_OUT.items():
            left_out[why] = sum(d in seen[part] for d in digests)
        kept = [c for c, d in zip(cases, digests) if d not in seen["train"] | seen["validation"]]
        if not kept:
            raise DataError(f"{cases.source}: every one of its {len(cases)} rows was trained or calibrated on by "
                            f"{folder}; nothing is left to score (`decisionkit evaluate {folder}` scores the test rows "
                            "it held out)")
        cases = Split(cases.name, kept, cases.source)
    what = str(data) if isinstance(data, (str, Path)) else cases.source
    return _evaluation(model, cases, scored=what, left_out=left_out, recorded=seen is not None,
                       output_name=_output_name(data, split))


def _evaluation(model, cases: Split, **how) -> Evaluation:
    """The raw scores of ``cases`` (as the run report scores its splits), with the model as it answers them."""
    found = answered(model, cases)
    return Evaluation(found.raw.decisions, rows=len(cases), answered=found.summary(), **how)
