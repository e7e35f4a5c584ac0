"""What this run is running on: versions, device and threads, for notebooks and JSON reports."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform

import pandas as pd
import torch

PACKAGES = ("decisionkit", "torch", "transformers", "peft", "accelerate", "bitsandbytes", "datasets", "plotly")


def environment() -> dict[str, str]:
    """Versions of the packages the course uses, the device, and the CPU threads torch will use."""
    info = {"python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    info["unsloth"] = "installed" if importlib.util.find_spec("unsloth") else "not installed (GPU only)"
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    info["torch threads"] = str(torch.get_num_threads())
    return info


def environment_table() -> pd.DataFrame:
    return pd.DataFrame({"value": environment()})
