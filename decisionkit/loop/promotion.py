"""Which folder answers for a served model: the run it was started with, or the run promoted over it.

``decisionkit promote RUN2 --over RUN1`` (``retrain.promote``) writes ``promoted.json`` into RUN1, atomically:
RUN2's folder, its version, when, and the comparison that allowed it. A server started with RUN1 answers with RUN2
under RUN1's name from its next start or SIGHUP on (``served_folder`` follows the chain: RUN2 may have been promoted
over in turn). Nothing else in RUN1 changes; deleting ``promoted.json`` (or promoting RUN1 back) undoes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.errors import ModelFolderError

PROMOTED_FILE = "promoted.json"
MAX_CHAIN = 64


def promoted(run: Path) -> dict | None:
    """What ``promoted.json`` in ``run`` says, or None."""
    file = Path(run) / PROMOTED_FILE
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelFolderError(f"{file}: not readable ({err}); it names the run promoted over {run}") from None


def served_folder(run: str | Path) -> Path:
    """The folder that answers for ``run``: ``run`` itself, or the end of the chain of promotions over it."""
    folder, seen = Path(run).expanduser(), []
    while (found := promoted(folder)) is not None:
        seen.append(folder)
        folder = Path(found["run"])
        if folder in seen or len(seen) > MAX_CHAIN:
            raise ModelFolderError(f"{run}: its promotions ({' -> '.join(map(str, seen + [folder]))}) run in a "
                                   "circle; delete one promoted.json")
    return folder
