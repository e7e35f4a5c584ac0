"""Train and evaluate one preset on typed-decisions; write a JSON result.

    .venv/bin/python benchmarks/train_preset.py --preset cpu-heads --out runs/bench-cpu-heads

The JSON (``<out>/benchmark.json``) holds the test metrics after calibration on validation (accuracy, KL, Brier,
ECE of the top probability as the benchmark defines it, ECE of the answers' confidence field; by type and
workflow), the validation metrics, the calibration table (before and after), the routing threshold and the share
of test and off-domain inputs it sends to a human, training wall time, peak memory, the compute dtype and CPU,
the backbone and the commit. Targets are read from it, never asserted in unit tests.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from decisionkit.cli import run_training
from decisionkit.training.presets import PRESETS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", default=None)
    parser.add_argument("--zero-shot", type=int, default=0, metavar="N",
                        help="also score the zero-shot baseline on N validation cases per workflow")
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    report = run_training(args).to_json()
    result = {
        "preset": args.preset,
        "test": report["test"],
        "validation": report["validation"],
        "baselines": report["baselines"],
        "calibration": report["calibration"],
        "routing": report["routing"],
        "training": report["training"],
        "training_seconds": report["training"]["seconds"],
        "peak_memory_gb": report["training"]["peak_memory_gb"],
        "backbone": report["backbone"],
        "environment": report["environment"],
        "commit": report["commit"],
    }
    path = Path(args.out) / "benchmark.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    t = result["test"]
    print(f"{args.preset}: test accuracy {t['accuracy']:.4f}, KL {t['kl']:.4f}, Brier {t['brier']:.4f}, "
          f"ECE {t['ece']:.4f}, ECE of confidence {t['ece_confidence']:.4f}; training "
          f"{result['training_seconds']:.0f} s ({report['training']['compute_dtype']}), peak "
          f"{result['peak_memory_gb']:.2f} GB -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
