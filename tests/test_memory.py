import json
import math
import subprocess
import sys
import types

import pytest

from decisionkit import LoraSettings, load_backbone
from decisionkit.core.environment import peak_rss_bytes, peak_rss_gb
from decisionkit.course.memory import (
    ASSUMED_SHAPES,
    ModelShape,
    TrainingSetup,
    compare,
    estimate,
    nf4_bits_per_weight,
    parameter_table,
)


@pytest.fixture(scope="module")
def qlora():
    return load_backbone(quantize="4bit", lora=LoraSettings())


def test_shape_from_config_counts_the_real_model(backbone):
    shape = ModelShape.from_config(backbone.config)
    assert shape.parameters == backbone.parameter_counts()[1]  # 134.5M, from shapes alone


def test_parameter_table_of_a_qlora_model(backbone, qlora):
    table = parameter_table(qlora)
    shape = ModelShape.from_config(backbone.config)
    assert table.total - table.trainable == shape.parameters  # 4-bit weights count what they stand for
    assert table.trainable == shape.lora_parameters(LoraSettings())  # only the adapters train
    assert set(table.rows.index[table.rows["trainable"] > 0]) == {"LoRA adapters"}
    # Bytes: the packed weights and constants measured on the model agree with the estimate's base term.
    adapters_mb = table.rows.loc["LoRA adapters", "bytes"] / 1e6
    setup = TrainingSetup(value_bytes=4)
    assert table.megabytes - adapters_mb == pytest.approx(estimate(shape, setup).terms["base weights"] * 1e3,
                                                          rel=0.02)
    assert abs(qlora.model.get_memory_footprint() / 1e6 - table.megabytes) / table.megabytes < 0.02


def test_first_layer_halves_adapters_and_activations(backbone):
    shape = ModelShape.from_config(backbone.config)
    full, half = LoraSettings(), LoraSettings(first_layer=0.5)
    assert shape.lora_parameters(half) * 2 == shape.lora_parameters(full)
    assert half.layers(30) == list(range(15, 30)) and full.layers(30) is None
    no_ckpt = TrainingSetup(lora=half, gradient_checkpointing=False)
    assert (estimate(shape, no_ckpt).terms["activations: every trained layer"] * 2
            == pytest.approx(estimate(shape, TrainingSetup(lora=full, gradient_checkpointing=False))
                             .terms["activations: every trained layer"]))


def test_estimates_grow_with_size_and_name_the_quoted_figure():
    assert nf4_bits_per_weight() == pytest.approx(4.127, abs=1e-3)
    comparison = compare(references={ASSUMED_SHAPES[1].name: (7.95, 7.95), ASSUMED_SHAPES[2].name: (14, 16)})
    totals = [e.total_gb for e in comparison.estimates]
    assert totals == sorted(totals)
    sizes = [round(s.parameters / 1e9, 1) for s in ASSUMED_SHAPES]
    assert sizes[0] == pytest.approx(0.8, abs=0.15) and sizes[1] == pytest.approx(4.0, abs=0.2)
    assert sizes[2] == pytest.approx(9.0, abs=0.3)
    table = comparison.table()
    assert table.loc[ASSUMED_SHAPES[1].name, "quoted (GB)"] == "7.95"
    assert table.loc[ASSUMED_SHAPES[2].name, "quoted (GB)"] == "14-16"
    assert len(comparison.figure().data) == len(comparison.estimates[0].terms) + 1


# --- peak_rss_gb: the measured peak a CPU training run reports ---------------------------------------------------

PEAK_SCRIPT = r"""
import json, sys
import numpy as np
from decisionkit.core.environment import peak_rss_gb


def status_gb(field):  # the kernel's own figures, in kB
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field)) * 1024 / 1e9


rss_before = status_gb("VmRSS:")
block = np.ones(int(sys.argv[1]) // 8)  # ones, not zeros: every page is written, so it is resident
print(json.dumps({"rss_before": rss_before, "after": peak_rss_gb(), "hwm": status_gb("VmHWM:")}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with Linux's /proc/self/status")
def test_peak_rss_grows_by_what_is_allocated():
    """In a fresh process (this one's peak may already lie above anything a test allocates): with 300 MB written on
    top of what is resident, the peak is at least that sum, and it matches the kernel's own high-water mark (a unit
    slip, KiB taken for bytes, would be off by 1024)."""
    size = 300_000_000
    # Through a shell that forks (a command follows, so it cannot exec): Linux keeps ru_maxrss across exec, so a child
    # exec'd straight from this large pytest process would report this process's peak, not its own.
    command = ["/bin/sh", "-c", '"$0" -c "$1" "$2"; exit $?', sys.executable, PEAK_SCRIPT, str(size)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] >= got["rss_before"] + size / 1e9 * 0.98
    assert got["after"] == pytest.approx(got["hwm"], rel=0.05)


class _Usage:
    def __init__(self, maxrss):
        self.ru_maxrss = maxrss


def test_peak_rss_units_linux_kib_macos_bytes(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrusage", lambda who: _Usage(2_000_000))
    monkeypatch.setattr(sys, "platform", "linux")
    assert peak_rss_gb() == pytest.approx(2_000_000 * 1024 / 1e9)  # Linux: KiB
    monkeypatch.setattr(sys, "platform", "darwin")
    assert peak_rss_gb() == pytest.approx(2_000_000 / 1e9)  # macOS: bytes


def test_peak_rss_windows_reads_psutil_peak_working_set(monkeypatch):
    """On Windows psutil's memory_info() carries peak_wset (bytes); a stand-in module gives it a known value."""
    info = types.SimpleNamespace(peak_wset=3_500_000_000)
    fake = types.ModuleType("psutil")
    fake.Process = lambda: types.SimpleNamespace(memory_info=lambda: info)
    monkeypatch.setitem(sys.modules, "psutil", fake)
    monkeypatch.setattr(sys, "platform", "win32")
    assert peak_rss_gb() == pytest.approx(3.5)


@pytest.mark.skipif(sys.platform == "win32", reason="off Windows ctypes has no WinDLL: the NaN path")
def test_peak_rss_is_nan_with_a_reason_when_nothing_can_measure_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # None in sys.modules: `import psutil` raises ImportError
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.warns(RuntimeWarning, match="GetProcessMemoryInfo"):
        assert math.isnan(peak_rss_gb())
    assert peak_rss_bytes() == (None, "sys.platform is 'win32' but neither psutil's peak_wset nor ctypes.WinDLL "
                                      "(GetProcessMemoryInfo) is available")


def test_training_reports_the_portable_peak():
    from decisionkit.training.trainer import peak_memory_gb

    assert peak_memory_gb("cpu") == pytest.approx(peak_rss_gb(), rel=0.01)
    assert peak_rss_gb() > 0.05  # this process has torch loaded: well over 50 MB resident


def test_one_step_measured_in_a_fresh_process_beside_the_estimate_of_its_setup(tiny_backbone_path):
    from decisionkit.course.memory import measure_step, step_preset, step_setup

    overrides = dict(backbone=str(tiny_backbone_path), train_per_workflow=4, max_length=32)
    step = measure_step("cpu-lora-quick", **overrides)
    p = step_preset("cpu-lora-quick", **overrides)
    assert step.device in ("cpu", "cuda") and step.seconds > 0 and 0 < step.tokens <= p.batch_size * 32
    assert step.trainable == ModelShape.from_config(load_backbone(tiny_backbone_path).config).lora_parameters(p.lora)
    assert 0 < step.before_gb <= step.peak_gb <= step.lifetime_peak_gb + 1e-3 and step.step_gb >= 0
    setup = step_setup(p, step.device)
    assert (setup.batch_size, setup.seq_len, setup.quant) == (p.micro_batch, 32, None)
    assert step_setup(step_preset("cpu-lora-quick", mode="qlora", max_length=32)).quant is not None
