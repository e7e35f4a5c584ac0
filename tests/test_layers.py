"""The package's layers, read from its source: imports go one way, lowest layer first, and never round in a cycle.

Every module of ``decisionkit`` belongs to one layer of ``LAYERS``. A module may import modules of lower layers, and
of its own layer as long as no cycle forms; never a module of a higher layer. Every import counts, a lazy one inside
a function included (a cycle hidden in a function is still a cycle). A new module fails this test until it is given
a layer here; ``README.md`` describes the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "decisionkit"

LAYERS = [  # lowest first
    ("foundations", {"_version", "settings", "atomic", "precision", "environment", "answer_fields", "plots",
                     "pooling", "hood"}),
    ("data and the contract", {"data", "scenarios", "metrics", "systemone", "structured"}),
    ("backbone, features, heads", {"engines", "backbone", "features", "heads"}),
    ("what a model is made of", {"fitting", "token_head", "answers", "routing", "saving", "presets"}),
    ("the model", {"model"}),
    ("training and measuring a model", {"training", "finetune", "calibration", "anomaly", "probe", "zeroshot",
                                        "generative", "latency", "memory", "onnx_runtime", "numerics",
                                        "ensemble"}),
    ("runs and reports", {"report", "pipeline", "runs", "widgets"}),
    ("serving and the command line", {"serve_protocol", "serve", "serve_lab", "serve_ray", "cli", "__main__",
                                      "__init__"}),
]
LAYER = {module: rank for rank, (_, modules) in enumerate(LAYERS) for module in modules}


def modules() -> list[str]:
    return sorted(path.stem for path in PACKAGE.glob("*.py"))


def imported(module: str) -> set[str]:
    """The decisionkit modules ``module`` imports (``__init__`` for the package itself), anywhere in its source."""
    names = set(modules())
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text(), f"{module}.py")):
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names if alias.name.split(".")[0] == "decisionkit"]
            found |= {parts[1] if len(parts) > 1 else "__init__" for parts in targets}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] != "decisionkit":
                continue  # another package
            within = (node.module or "").split(".")[1:] if node.level == 0 else (node.module or "").split(".")
            within = [part for part in within if part]
            if within:
                found.add(within[0])
            else:  # from . import x: a submodule, or a name of the package itself
                found |= {alias.name if alias.name in names else "__init__" for alias in node.names}
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
    unplaced = sorted(set(modules()) - set(LAYER))
    assert not unplaced, f"give these modules a layer in tests/test_layers.py (and README.md): {unplaced}"
    assert not sorted(set(LAYER) - set(modules())), "LAYERS names modules that do not exist"
    nested = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE]
    assert not nested, f"the layers cover the package's top level only; found {nested}"


def test_no_module_imports_a_higher_layer():
    upward = [f"{module} ({LAYERS[LAYER[module]][0]}) imports {target} ({LAYERS[LAYER[target]][0]})"
              for module, targets in graph().items() for target in sorted(targets)
              if module in LAYER and target in LAYER and LAYER[target] > LAYER[module]]
    assert not upward, "imports that reach up a layer:\n" + "\n".join(upward)


def test_no_import_cycle():
    found = cycle(graph())
    assert found is None, "an import cycle: " + " -> ".join(found)


def test_the_check_sees_lazy_imports_and_cycles():
    """The reader itself: a lazy import inside a function is an edge, and a cycle among peers is found."""
    assert "plots" in imported("calibration")  # imported inside CalibrationReport's figure methods only
    assert imported("__main__") == {"cli"}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
