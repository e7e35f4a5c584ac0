"""The project's own scenarios: a schema of typed questions and labelled examples, read by the one loader.

A scenario is a folder with ``schema.json`` (questions in the System One shape: ``type``, ``instructions``,
``criteria``) and one examples file (``.jsonl``, ``.json``, ``.csv`` or ``.parquet``), read by
``decisions.load_decisions`` as any user's data is: a ``state`` (a JSON object, or text; ``text`` works too), an
optional ``id`` and ``split``, and one label per question (an option key or a distribution over options). The
workflow name is the folder's name.

``load_scenario("tickets", "train")`` returns a ``Split`` like ``load_typed_decisions``, so ``train``, ``metrics``
and ``decide`` work unchanged. The project ships three scenarios as package data in ``decisionkit/scenario_data/``:
``expenses`` (expense claims as JSON states with a free-text note, a CSV export with no split column), ``tickets``
(support tickets, text) and ``ngs-qc`` (sequencing quality-control reports, text).

A scenario may also hold a **scored-only** split in a file of its own (``SCORED_ONLY``): cases that nothing is
trained on or chosen with, only scored. ``load_scenario("tickets", "other-voice")`` reads the tickets' one:
40 tickets written by an author who wrote none of ``tickets.jsonl``, in other registers, to measure how far the
model's scores carry to text written by other people.

Where a path to data is expected (``decisionkit train --data``, ``evaluate --data``, ``decisionkit.train(data)``), a
scenario is named ``scenario:NAME`` (``scenario_name``): a bare ``tickets`` is always the path ``tickets``, a folder of
the user's own. A preset's ``dataset`` names its scenario by its name alone.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from ..core.errors import MissingFile
from .cases import Split
from .decisions import MIN_TRAIN_PER_WORKFLOW, SPLITS, Decisions, load_decisions
from .labels import load_schema
from .tables import FILE_KINDS, file_kind

__all__ = ["DATA_DIR", "SCENARIOS", "SCENARIO_PREFIX", "SCORED_ONLY", "load_scenario", "load_schema",
           "scenario_decisions", "scenario_folder", "scenario_name"]

# The project's own scenario folders, as package data (pyproject.toml lists them) so a wheel install finds them.
DATA_DIR = Path(str(files("decisionkit") / "scenario_data"))
SCENARIOS = ("expenses", "tickets", "ngs-qc")
SCENARIO_PREFIX = "scenario:"  # a scenario named where a path is expected: scenario:tickets
# Scored-only splits: split name -> the file beside the examples that holds it (every row's ``split`` is the name).
# Nothing is trained on them or chosen with them; the trainer reads train, validation and test only.
SCORED_ONLY = {"other-voice": "other_voice.jsonl"}


def scenario_name(data) -> str | None:
    """The scenario ``data`` names as ``scenario:NAME`` (where a path is expected: ``--data scenario:tickets``), or
    None when it is anything else; an unknown NAME is refused."""
    if not isinstance(data, str) or not data.startswith(SCENARIO_PREFIX):
        return None
    name = data[len(SCENARIO_PREFIX):]
    if name not in SCENARIOS:
        raise MissingFile(f"{data}: no such scenario; the project's are {', '.join(SCENARIO_PREFIX + s for s in SCENARIOS)}")
    return name


def scenario_folder(name_or_folder: str | Path) -> Path:
    folder = DATA_DIR / str(name_or_folder) if str(name_or_folder) in SCENARIOS else Path(name_or_folder)
    if not (folder / "schema.json").is_file():
        raise MissingFile(f"{folder} has no schema.json; a scenario is one of {', '.join(SCENARIOS)} or a "
                                f"folder with schema.json and one examples file ({', '.join(FILE_KINDS)})")
    return folder


def examples_file(folder: Path) -> Path:
    """The one examples file of a scenario folder, beside any scored-only split's file."""
    examples = sorted(p for p in folder.iterdir()
                      if file_kind(p) and p.name not in (*SCORED_ONLY.values(), "schema.json"))
    if len(examples) != 1:
        raise MissingFile(f"{folder} must hold exactly one examples file ({', '.join(FILE_KINDS)}) beside any "
                                f"scored-only split's ({', '.join(SCORED_ONLY.values())}); found "
                                f"{[p.name for p in examples]}")
    return examples[0]


def load_scenario(name_or_folder: str | Path, split: str = "train") -> Split:
    """One split of a scenario folder (``tickets``, ``ngs-qc`` or your own), read by ``decisions.load_decisions``
    (the workflow is the folder's name): train, validation or test from its examples file (held out by the loader
    when the rows name no split), or a scored-only split (``"other-voice"``) from that split's own file."""
    names = SPLITS + tuple(SCORED_ONLY)
    if split not in names:
        raise ValueError(f"split is {split!r}; expected one of {', '.join(names)}")
    folder = scenario_folder(name_or_folder)
    if split in SCORED_ONLY:
        path = folder / SCORED_ONLY[split]
        if not path.is_file():
            raise MissingFile(f"{folder} has no {SCORED_ONLY[split]}, the file of the scored-only split "
                                    f"{split!r} (the tickets scenario has one)")
        return load_decisions(path, folder / "schema.json", workflow=folder.name, splits=(split,))[split]
    return scenario_decisions(folder, min_train=0)[split]


def scenario_decisions(name_or_folder: str | Path, min_train: int = MIN_TRAIN_PER_WORKFLOW) -> Decisions:
    """Every split of a scenario folder at once (what a training run reads), with the loader's record."""
    folder = scenario_folder(name_or_folder)
    return load_decisions(examples_file(folder), folder / "schema.json", workflow=folder.name, min_train=min_train)
