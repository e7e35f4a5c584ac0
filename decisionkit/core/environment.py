"""What this run is running on: versions, device and threads, for notebooks and JSON reports; the peak memory
this process has used; a clock that waits for the GPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import platform
import sys
import warnings

import pandas as pd
import torch

from .._version import __version__

GB = 1e9
PACKAGES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "datasets", "plotly")


def environment() -> dict[str, str]:
    """Versions of the packages the course uses, the device, and the CPU threads torch will use."""
    info = {"python": platform.python_version(), "platform": platform.platform(), "decisionkit": __version__}
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


def synchronize(device: str) -> None:
    """Wait for queued GPU work, so a clock read after it measures the work and not just its launch."""
    if device == "cuda":
        torch.cuda.synchronize()


def _windows_peak_bytes() -> tuple[int | None, str]:
    """PeakWorkingSetSize of this process: psutil when installed, else psapi's GetProcessMemoryInfo via ctypes."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        peak = getattr(psutil.Process().memory_info(), "peak_wset", None)  # only Windows builds of psutil have it
        if peak:
            return int(peak), ""
    import ctypes

    if not hasattr(ctypes, "WinDLL"):  # ctypes has no WinDLL off Windows (a faked platform, or a Windows-like one)
        return None, (f"sys.platform is {sys.platform!r} but neither psutil's peak_wset nor ctypes.WinDLL "
                      "(GetProcessMemoryInfo) is available")
    size_t, dword = ctypes.c_size_t, ctypes.c_ulong

    class ProcessMemoryCounters(ctypes.Structure):  # PROCESS_MEMORY_COUNTERS, psapi.h
        _fields_ = [("cb", dword), ("PageFaultCount", dword), ("PeakWorkingSetSize", size_t),
                    ("WorkingSetSize", size_t), ("QuotaPeakPagedPoolUsage", size_t), ("QuotaPagedPoolUsage", size_t),
                    ("QuotaPeakNonPagedPoolUsage", size_t), ("QuotaNonPagedPoolUsage", size_t),
                    ("PagefileUsage", size_t), ("PeakPagefileUsage", size_t)]

    counters = ProcessMemoryCounters()
    counters.cb = ctypes.sizeof(counters)
    try:
        kernel32, psapi = ctypes.WinDLL("kernel32"), ctypes.WinDLL("psapi", use_last_error=True)
        kernel32.GetCurrentProcess.restype = ctypes.c_void_p  # a pseudo-handle (-1): truncated to int it is wrong
        psapi.GetProcessMemoryInfo.argtypes = [ctypes.c_void_p, ctypes.POINTER(ProcessMemoryCounters), dword]
        ok = psapi.GetProcessMemoryInfo(kernel32.GetCurrentProcess(), ctypes.byref(counters), counters.cb)
    except (OSError, AttributeError) as err:
        return None, f"GetProcessMemoryInfo could not be called ({err})"
    if not ok:
        return None, f"GetProcessMemoryInfo failed (Windows error {ctypes.get_last_error()})"
    return int(counters.PeakWorkingSetSize), ""


def peak_rss_bytes() -> tuple[int | None, str]:
    """(peak resident bytes of this process, "") or (None, why it cannot be measured here)."""
    if sys.platform == "win32":
        return _windows_peak_bytes()
    try:
        import resource  # POSIX only: imported here so that importing decisionkit works on Windows
    except ImportError:
        return None, f"the resource module does not exist on platform {sys.platform!r}"
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in bytes on macOS, in KiB on Linux and the BSDs (getrusage(2) of each)
    return int(maxrss) * (1 if sys.platform == "darwin" else 1024), ""


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, in GB (1e9 bytes); NaN, with a RuntimeWarning that says why,
    where the platform offers no way to measure it (a report then shows nan rather than a wrong number)."""
    peak, reason = peak_rss_bytes()
    if peak is None:
        warnings.warn(f"peak resident memory is not measurable: {reason}; reported as NaN", RuntimeWarning,
                      stacklevel=2)
        return math.nan
    return peak / GB
