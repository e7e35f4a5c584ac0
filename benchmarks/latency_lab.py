"""The A/B latency lab in one run: the decision model against constrained, scored and free generation on the same
backbone, head scaling, and every way to run the decision pass faster; JSON out.

    .venv/bin/python benchmarks/latency_lab.py --model runs/bench-cpu-heads-15 --out runs/latency --per-workflow 3

Writes ``<out>/latency.json``:
- ``ab_latency`` and ``ab_accuracy``, and both ``_by_workflow``: per method (decision model, option scoring by
  log-probability, JSON constrained to the answers' schema with llguidance, free JSON at each budget) p50 and tail
  latency, time to first token, each p50 over the decision model's with a 95% bootstrap interval over cases;
  validity, accuracy, KL and ECE where a method gives probabilities; on the same test cases, in one run;
- ``speed``: float32 and bfloat16 at batch 1, bfloat16 at batch 4 and 16, dynamic int8 (torch) and ONNX Runtime
  int8 with heads re-fitted on their own train features, ONNX Runtime float32, and the MiniLM encoder with its own
  heads (trained here, heads only): median and p95 ms per case, cases/s, accuracy and KL on ``--speed-cases`` test
  cases per workflow, the speed-up over float32 batch 1, and the arithmetic floor from the backbone's shapes and
  this CPU's measured matmul rate;
- the fitted cost per extra question (shared-encoding heads vs one prompt per question), cold start, a length sweep.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import decisionkit as dk
from decisionkit.core.precision import choose
from decisionkit.course.ab import ab_test
from decisionkit.course.latency import cold_start, hardware, head_scaling, length_sweep, naive_scaling
from decisionkit.course.speed import SPEED_VARIANTS, speed_table
from decisionkit.model.backbone import ENCODER_BACKBONE
from decisionkit.training.report import git_commit
from decisionkit.training.trainer import fit_model


def frame_json(frame) -> dict:
    """A table as JSON, one object per row; a row of a two-level index is keyed "first / second"."""
    rows = json.loads(frame.reset_index(drop=True).to_json(orient="index"))
    return {" / ".join(map(str, key)) if isinstance(key, tuple) else str(key): rows[str(i)]
            for i, key in enumerate(frame.index)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="folder of a trained decision model (heads on SmolLM2)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", default=None)
    parser.add_argument("--per-workflow", type=int, default=3, help="test cases per workflow for the A/B")
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 256], help="free generation token budgets")
    parser.add_argument("--constrained-budget", type=int, default=96, help="token budget of constrained decoding")
    parser.add_argument("--speed-cases", type=int, default=50, help="test cases per workflow for the speed table")
    parser.add_argument("--variants", nargs="+", default=list(SPEED_VARIANTS), choices=list(SPEED_VARIANTS))
    parser.add_argument("--no-encoder", action="store_true", help="leave the MiniLM row out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    test = dk.load_typed_decisions("test", args.data)
    train = dk.load_typed_decisions("train", args.data)
    cold = cold_start(args.model, test[0])
    model = dk.load(args.model)
    cases = test.head(args.per_workflow)
    ab = ab_test(model, cases, tuple(args.budgets), args.constrained_budget, progress=False)
    heads, encode_ms = head_scaling(model, cases[0].text)
    naive = naive_scaling(model.backbone, cases[0], max_length=model.spec.max_length)
    encoder = None
    if not args.no_encoder:
        fit_model(dk.preset("cpu-heads", backbone=ENCODER_BACKBONE), out / "encoder-heads", args.data, progress=False)
        encoder = dk.load(out / "encoder-heads")
    encoder_heads = head_scaling(encoder, cases[0].text) if encoder is not None else None
    speed = speed_table(model, test.head(args.speed_cases), train, args.variants, encoder_model=encoder)
    latency, accuracy = ab.latency_table(), ab.accuracy_table()
    result = {
        "model": args.model, "cases": len(cases), "hardware": hardware(), "precision": choose().describe(),
        "commit": git_commit(),
        "ab_latency": frame_json(latency), "ab_accuracy": frame_json(accuracy),
        "ab_latency_by_workflow": frame_json(ab.latency_table("workflow")),
        "ab_accuracy_by_workflow": frame_json(ab.accuracy_table("workflow")),
        "generative": frame_json(ab.generative.table()),
        "generated_failures": ab.generative.failures(args.budgets[-1], 3).to_dict(orient="records"),
        "cold_start": cold,
        "head_scaling": {"counts": heads.counts, "ms": heads.ms, "slope_ms": heads.slope_ms, "encode_ms": encode_ms},
        "encoder_head_scaling": None if encoder_heads is None else {
            "counts": encoder_heads[0].counts, "ms": encoder_heads[0].ms, "slope_ms": encoder_heads[0].slope_ms,
            "encode_ms": encoder_heads[1]},
        "naive_scaling": {"counts": naive.counts, "ms": naive.ms, "slope_ms": naive.slope_ms},
        "length_sweep": frame_json(length_sweep(model, cases.texts[:8])),
        "speed": frame_json(speed), "speed_context": speed.attrs, "speed_cases": len(test.head(args.speed_cases)),
        "seconds": time.perf_counter() - started,
    }
    (out / "latency.json").write_text(json.dumps(result, indent=2, default=float))
    print(latency.round(3).to_string())
    print(accuracy.round(3).to_string())
    print(speed.round(3).to_string())
    print(f"-> {out / 'latency.json'} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
