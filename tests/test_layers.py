"""The package's layers, read from its source: subpackages import one way, lowest first, and never round in a cycle.

Every module of ``decisionkit`` lives in a subpackage of ``LAYERS`` (or is one of the package's own few top-level
modules). A module may import modules of lower layers, and of its own layer as long as no cycle forms; never a
module of a higher layer. Every import counts, a lazy one inside a function included (a cycle hidden in a function
is still a cycle). A new subpackage fails this test until it is given a layer here; ``README.md`` describes the
same layers. A second test imports the library's entry points in a fresh interpreter and reads ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "decisionkit"

LAYERS = [  # lowest first: (layer, the subpackages or top-level modules in it)
    ("foundations", {"_version", "core"}),
    ("data", {"data"}),
    ("the System One contract", {"contract"}),
    ("the model", {"model"}),
    ("training and measuring a model", {"training"}),
    ("closing the loop: the decision log, reviews, retraining", {"loop"}),
    ("serving", {"serving"}),
    ("the course's labs", {"course"}),
    ("entry points", {"cli", "__main__", "__init__"}),
]
LAYER = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}


def modules() -> list[str]:
    """Every module, dotted below ``decisionkit`` (``model.heads``; ``model`` for ``model/__init__.py``)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found.append(".".join(parts))
    return sorted(found)


def source(module: str) -> Path:
    """The file of a module dotted below ``decisionkit`` (a subpackage's ``__init__.py`` for the subpackage)."""
    path = PACKAGE / (module.replace(".", "/") + ".py")
    return path if path.exists() else PACKAGE / module.replace(".", "/") / "__init__.py"


def unit(module: str) -> str:
    """The layer unit a module belongs to: its subpackage, or itself at the top level."""
    return module.split(".")[0]


def imported(module: str) -> set[str]:
    """The decisionkit modules ``module`` imports, anywhere in its source (``__init__`` for the package itself)."""
    names = set(modules())
    path = source(module)
    is_package = path.name == "__init__.py" and module != "__init__"
    here = [] if module == "__init__" else module.split(".")[: None if is_package else -1]  # its package, dotted
    found = set()

    def resolve(dotted: list[str]) -> str:
        while dotted and ".".join(dotted) not in names:  # from x.y import name: the module is x.y, not x.y.name
            dotted = dotted[:-1]
        return ".".join(dotted) or "__init__"

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "decisionkit":
                    found.add(resolve(parts[1:]))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "decisionkit":
                    continue  # another package
                base = parts[1:]
            else:
                base = (here[: len(here) - node.level + 1]) + [p for p in (node.module or "").split(".") if p]
            for alias in node.names:  # from . import x, from .core import settings: x may be a submodule
                found.add(resolve(base + [alias.name]))
    return found - {module}


def graph() -> dict[str, set[str]]:
    return {module: imported(module) for module in modules()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it (the first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every module below it is
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_every_module_has_a_layer():
    unplaced = sorted({unit(m) for m in modules()} - set(LAYER))
    assert not unplaced, f"give these subpackages or modules a layer in tests/test_layers.py (and README.md): {unplaced}"
    assert not sorted(set(LAYER) - {unit(m) for m in modules()}), "LAYERS names units that do not exist"


def test_no_module_imports_a_higher_layer():
    upward = [f"{module} ({LAYERS[LAYER[unit(module)]][0]}) imports {target} ({LAYERS[LAYER[unit(target)]][0]})"
              for module, targets in graph().items() for target in sorted(targets)
              if LAYER[unit(target)] > LAYER[unit(module)]]
    assert not upward, "imports that reach up a layer:\n" + "\n".join(upward)


def test_no_import_cycle():
    found = cycle(graph())
    assert found is None, "an import cycle: " + " -> ".join(found)


def test_the_check_sees_lazy_imports_and_cycles():
    """The reader itself: a lazy import inside a function is an edge, relative imports resolve across subpackages,
    and a cycle among peers is found."""
    assert "core.plots" in imported("training.calibration")  # imported inside CalibrationReport's figure methods
    assert imported("__main__") == {"cli"}
    assert {"core.settings", "model.backbone"} <= imported("model.features")  # from ..core import settings
    assert "model.features" in imported("model.decision_model")  # from . import features
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _loaded_after(statement: str) -> list[str]:
    """The modules a fresh interpreter holds after ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_loading_and_serving_import_no_training_course_or_plotting():
    """A pipeline that imports decisionkit, loads a model or starts the server pays for no training code, no
    course lab and no plotly."""
    for statement in ("import decisionkit", "import decisionkit as dk; dk.load", "import decisionkit.serving.app"):
        loaded = _loaded_after(statement)
        heavy = [m for m in loaded if m.split(".")[0] == "plotly" or m == "decisionkit.core.plots"
                 or m.startswith(("decisionkit.training", "decisionkit.course"))]
        assert not heavy, f"`{statement}` imports {heavy}"
        if statement != "import decisionkit":
            assert "decisionkit.model.decision_model" in loaded  # the check ran on what it names
    own = {m for m in _loaded_after("import decisionkit") if m.split(".")[0] == "decisionkit"}
    assert own == {"decisionkit", "decisionkit._version"}  # the public names resolve on first use


def test_the_command_line_builds_its_parser_without_the_server_or_training():
    """`decisionkit --help` (or any command) builds every subcommand's options: from plain dataclasses, not by
    importing LitServe, FastAPI, the training loop or a course lab."""
    loaded = _loaded_after("from decisionkit.cli import build_parser; build_parser()")
    heavy = [m for m in loaded if m.split(".")[0] in ("litserve", "fastapi", "plotly")
             or m.startswith(("decisionkit.serving.app", "decisionkit.training.trainer", "decisionkit.course"))]
    assert not heavy, f"building the parser imports {heavy}"


MAX_LINES = 400  # a module past this holds more than one concern: split it by concern


def test_no_module_is_longer_than_one_concern_needs():
    long = {m: n for m in modules() if (n := len(source(m).read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
