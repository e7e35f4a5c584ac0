"""The optional parts of the install, and the message a missing one gives.

``pip install decisionkit-course`` (the distribution's name; the import name is ``decisionkit``) installs the core: load a model, ``decide``, ``train`` on a CPU (torch, transformers,
safetensors, scikit-learn, pandas, pydantic). The rest are extras, each named for what it adds (``pyproject.toml``):

- ``serve``: the HTTP server (FastAPI, uvicorn, LitServe)
- ``course``: the notebooks (JupyterLab, plotly and kaleido for figures, ipywidgets, llguidance for the generative
  baseline, datasets and pyarrow for the benchmark from the hub and parquet files), and ``serve``
- ``gpu``: LoRA and 4-bit backbones (peft, bitsandbytes); ``unsloth``: those and Unsloth, on a CUDA machine
- ``ray``: the server on Ray Serve

``require(module, purpose)`` checks that an extra's module is installed before a library asks for it indirectly
(transformers' 4-bit loading, pandas' parquet reader), whose own messages name no extra; ``needs_extra(purpose)`` turns the ``ModuleNotFoundError`` of an extra's module into a ``MissingExtra`` that names
the extra to install; the command line, ``decisionkit.<name>`` and the lazy imports of LoRA, 4-bit and the hub go
through it.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from typing import Iterator

from .._version import DISTRIBUTION
from .errors import UserError

# an extra's top-level modules -> the extra
EXTRA_OF = {
    **dict.fromkeys(["fastapi", "uvicorn", "litserve", "starlette"], "serve"),
    **dict.fromkeys(["plotly", "kaleido", "ipywidgets", "llguidance", "datasets", "pyarrow", "nbformat"], "course"),
    **dict.fromkeys(["peft", "bitsandbytes"], "gpu"),
    "unsloth": "unsloth",
    "ray": "ray",
}


class MissingExtra(UserError, ImportError):
    """A module of an extra that is not installed; the message says which extra brings it."""


def missing(err: ModuleNotFoundError, purpose: str) -> ImportError:
    """A ``MissingExtra`` for ``err`` when the module it misses belongs to an extra, else ``err`` itself (a missing
    core module is a broken install, not a choice)."""
    module = (err.name or "").split(".")[0]
    if module not in EXTRA_OF:
        return err
    extra = EXTRA_OF[module]
    return MissingExtra(f"{purpose} needs {module}, which the [{extra}] extra installs: "
                        f"pip install '{DISTRIBUTION}[{extra}]'")


@contextmanager
def needs_extra(purpose: str) -> Iterator[None]:
    """Imports inside it that miss an extra's module raise ``MissingExtra`` naming the extra and ``purpose``."""
    try:
        yield
    except ModuleNotFoundError as err:
        raise missing(err, purpose) from err


def require(module: str, purpose: str) -> None:
    """A ``MissingExtra`` naming the extra when ``module`` (one of an extra's) is not installed; nothing is imported."""
    if importlib.util.find_spec(module) is None:
        raise missing(ModuleNotFoundError(f"No module named {module!r}", name=module), purpose)
