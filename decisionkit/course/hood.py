"""Open the hood: the few lines of decisionkit that do a mechanism, shown in a notebook as the code itself.

``source(fn, ...)`` reads the functions' code with ``inspect.getsource`` when the cell runs, so what a learner reads
is what the package runs, never a copy that can drift from it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass


@dataclass
class Source:
    """The code of some functions, each named by module and qualified name (no path of this machine)."""

    parts: dict[str, str]

    def _repr_markdown_(self) -> str:
        return "\n\n".join(f"`{name}`\n```python\n{code.rstrip()}\n```" for name, code in self.parts.items())

    def __str__(self) -> str:
        return "\n\n".join(f"# {name}\n{code.rstrip()}" for name, code in self.parts.items())


def source(*objects) -> Source:
    """The code of ``objects`` (functions, methods or classes of decisionkit or any library), in order."""
    if not objects:
        raise ValueError("source() needs at least one function, method or class to show")
    return Source({f"{obj.__module__}.{obj.__qualname__}": inspect.getsource(obj) for obj in objects})
