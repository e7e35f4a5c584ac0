"""The A/B latency lab in one run: decision forward pass vs generated JSON, head scaling, speed-ups; JSON out.

    .venv/bin/python benchmarks/latency_lab.py --model runs/bench-cpu-heads --out runs/latency --per-workflow 5

Writes ``<out>/latency.json``: per-request medians and percentiles of both sides on the same test cases, the
speed ratio (generative median at the largest budget / decision median), JSON validity and accuracy, the fitted
cost per extra question (shared-encoding heads vs one prompt per question), cold start, a state-length sweep,
and the CPU speed-up variants (int8, torch.compile) with their accuracy on the validation split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import decisionkit as dk
from decisionkit.generative import generative_baseline
from decisionkit.latency import (SPEED_VARIANTS, cold_start, decision_timings, head_scaling, length_sweep,
                                 naive_scaling, speed_variants)
from decisionkit.report import git_commit


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="folder of a trained decision model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", default=None)
    parser.add_argument("--per-workflow", type=int, default=5, help="test cases per workflow for the A/B")
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 256], help="generation token budgets")
    parser.add_argument("--variants", nargs="+", default=list(SPEED_VARIANTS), choices=list(SPEED_VARIANTS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    test = dk.load_typed_decisions("test", args.data)
    cold = cold_start(args.model, test[0])
    model = dk.load(args.model)
    cases = test.head(args.per_workflow)
    decision = decision_timings(model, cases)
    generative = generative_baseline(model.backbone, cases, budgets=tuple(args.budgets), progress=False)
    decision_ms = decision["tokenize + forward + heads"].median
    gen_table = generative.table()
    heads, encode_ms = head_scaling(model, cases[0].text)
    naive = naive_scaling(model.backbone, cases[0], max_length=model.spec.max_length)
    validation = dk.load_typed_decisions("validation", args.data)
    variants = speed_variants(model, validation, args.variants)
    result = {
        "model": args.model, "cases": len(cases), "hardware": decision.hardware, "commit": git_commit(),
        "decision": decision.table().to_dict(orient="index"),
        "generative": gen_table.to_dict(orient="index"),
        "ratio_median": {str(b): float(gen_table.loc[b, "median_ms"] / decision_ms) for b in args.budgets},
        "decision_accuracy": dk.metrics.score(cases, model.predict(cases)).overall()["accuracy"],
        "cold_start": cold,
        "head_scaling": {"counts": heads.counts, "ms": heads.ms, "slope_ms": heads.slope_ms, "encode_ms": encode_ms},
        "naive_scaling": {"counts": naive.counts, "ms": naive.ms, "slope_ms": naive.slope_ms},
        "length_sweep": length_sweep(model, cases.texts[:8]).to_dict(orient="index"),
        "speed_variants": variants.to_dict(orient="index"),
        "generated_failures": generative.failures(args.budgets[-1], 3).to_dict(orient="records"),
    }
    (out / "latency.json").write_text(json.dumps(result, indent=2, default=float))
    big = args.budgets[-1]
    print(f"decision median {decision_ms:.0f} ms; generated JSON ({big} tokens) median "
          f"{gen_table.loc[big, 'median_ms']:.0f} ms, valid {gen_table.loc[big, 'valid']:.0%}: "
          f"{result['ratio_median'][str(big)]:.1f}x; one more head {heads.slope_ms * 1000:.1f} µs "
          f"({heads.slope_ms / encode_ms:.3%} of a forward pass), one more naive question {naive.slope_ms:.0f} ms")
    print(variants.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
