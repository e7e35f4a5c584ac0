"""Backbones side by side: test accuracy and KL of the heads alone and of the hybrid, training time, and the
decision latency at batch 1, each model on the same test cases in turn.

    .venv/bin/python benchmarks/train_preset.py --preset cpu-fast --out runs/bench-cpu-fast
    .venv/bin/python benchmarks/train_preset.py --preset cpu-best --out runs/bench-cpu-best
    .venv/bin/python benchmarks/backbones.py --runs runs/bench-cpu-fast runs/bench-cpu-best --out benchmarks/results

``--runs``: saved hybrid runs, one per backbone (any preset with ``structured=True``; a local backbone folder
works too: ``decisionkit.preset("cpu-best", backbone="/path/to/all-mpnet-base-v2")``). Their reports give the
test scores (the hybrid calibrated and routed as saved; its heads alone uncalibrated, as the run report scores
them), the training time with its compute dtype, and the backbone. Latency is measured here, all models loaded
at once: ``decide`` on one test case at a time, each model on the same case in turn (the machine's drift touches
them alike), and the structured part (fields and trees) alone. With two runs or more, their **ensemble** too: the
runs' answers averaged in probability space (``ensemble.average``), scored on test, with its gain in accuracy over
the best single run and a bootstrap interval over cases. Writes ``backbones_<cpu family>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import decisionkit as dk
from decisionkit.core.precision import kernels
from decisionkit.course.ensemble import mean_answers
from decisionkit.data.metrics import paired_difference, score


def shown_name(backbone: str) -> str:
    """A hub id as it is; a local folder by its name alone (no path of this machine in a result file)."""
    return Path(backbone).name if Path(backbone).is_absolute() else backbone


def interleaved_ms(models: dict, cases, repeats: int) -> dict[str, dict]:
    """Per model: median and 90th percentile milliseconds of ``decide`` at batch 1, and the median of the
    structured part alone, over ``repeats`` passes of ``cases`` with the models taking turns on each case."""
    decide = {name: [] for name in models}
    fields = {name: [] for name in models}
    for model in models.values():  # warm: first calls allocate
        model.decide(cases[0].state, workflow=cases[0].workflow)
    for _ in range(repeats):
        for case in cases:
            for name, model in models.items():
                start = time.perf_counter()
                model.structured.probabilities([case.state], case.workflow, list(case.questions))
                fields[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                model.decide(case.state, workflow=case.workflow)
                decide[name].append(time.perf_counter() - start)
    return {name: {"decide p50": float(np.median(decide[name]) * 1e3),
                   "decide p90": float(np.quantile(decide[name], 0.9) * 1e3),
                   "fields and trees p50": float(np.median(fields[name]) * 1e3), "timings": len(decide[name])}
            for name in models}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="saved hybrid runs, one per backbone")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--latency-cases", type=int, default=10, help="test cases per workflow timed")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    models, reports = {}, {}
    for run in args.runs:
        model = dk.load(run)
        if model.structured is None:
            raise SystemExit(f"{run} is not a hybrid model (train it with a preset that has structured=True)")
        models[Path(run).name] = model
        reports[Path(run).name] = json.loads((Path(run) / "report.json").read_text())
    test = dk.load_typed_decisions("test")
    latency = interleaved_ms(models, test.head(args.latency_cases), args.repeats)
    rows = {}
    for name, report in reports.items():
        heads = next(v for k, v in report["baselines"].items() if k.startswith("heads alone"))
        trees = next(v for k, v in report["baselines"].items() if k.startswith("trees alone"))
        backbone = models[name].backbone
        rows[name] = {
            "backbone": shown_name(report["backbone"]["name"]), "parameters": backbone.parameter_counts()[1],
            "heads alone": {k: heads[k] for k in ("accuracy", "kl")},
            "trees alone": {k: trees[k] for k in ("accuracy", "kl")},
            "hybrid": {k: report["test"][k] for k in ("accuracy", "kl", "brier", "ece_confidence")},
            "training seconds": report["training"]["seconds"],
            "training compute dtype": report["training"].get("compute_dtype"),
            "routing": {k: v for k, v in report["routing"].items() if k.endswith("sent to a human")},
            "ms per decision, batch 1": latency[name], "compute dtype": backbone.precision.dtype,
        }
    result = {"runs": rows, "test cases": len(test), "latency cases": args.latency_cases * len(test.workflows),
              **kernels()}
    if len(models) > 1:
        best = max(models, key=lambda name: rows[name]["hybrid"]["accuracy"])
        answers = {name: model.predict(test) for name, model in models.items()}  # each model's answers, once
        together = score(test, mean_answers(list(answers.values())))
        gain = paired_difference(score(test, answers[best]), together)
        result["ensemble"] = {"runs": list(models), **{k: together.overall()[k] for k in ("accuracy", "kl", "brier")},
                              f"accuracy gain over {best} (95% interval)": gain}
    path = Path(args.out) / f"backbones_{result['cpu_family']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    for name, row in rows.items():
        ms = row["ms per decision, batch 1"]
        print(f"{name:<20} {row['backbone']:<42} heads {row['heads alone']['accuracy']:.4f} "
              f"hybrid {row['hybrid']['accuracy']:.4f} KL {row['hybrid']['kl']:.4f} "
              f"train {row['training seconds']:.0f} s  decide {ms['decide p50']:.1f} ms (p90 {ms['decide p90']:.1f}), "
              f"fields {ms['fields and trees p50']:.2f} ms, {row['compute dtype']}")
    if "ensemble" in result:
        e = result["ensemble"]
        print(f"ensemble of {len(e['runs'])} runs: accuracy {e['accuracy']:.4f} KL {e['kl']:.4f}")
    print("->", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
