"""Alone vs batched, float32 vs bfloat16: how far answers and features move with the batch on this CPU.

    .venv/bin/python benchmarks/numerics.py --model runs/cpu-heads --out benchmarks/results/numerics_avx512_bf16.json

Answers test cases alone (``decide``) and in padded batches (``decide_many``) under both compute dtypes and writes
the largest probability gap, the largest move of the standardized features, how many top options changed, and how
many fields fell beyond ``precision.ANSWER_TOLERANCE``, with the CPU's kernels (capability, family, oneDNN's
bfloat16 support and instruction-set cap: run once more with ``ONEDNN_MAX_CPU_ISA=AVX2`` to see an AVX2-only CPU).
"""

import argparse
import json
from pathlib import Path

import decisionkit as dk
from decisionkit.core.atomic import write_text
from decisionkit.course.latency import hardware
from decisionkit.course.numerics import batch_agreement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a saved decision model folder")
    parser.add_argument("--per-workflow", type=int, default=25, help="test cases per workflow")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    model = dk.load(args.model)
    cases = dk.load_typed_decisions("test").head(args.per_workflow)
    requests = [{"state": c.state, "workflow": c.workflow} for c in cases]
    result = batch_agreement(model, requests, args.batch_size)
    print(result.table().to_string())
    write_text(Path(args.out), json.dumps({"model": Path(args.model).name, "hardware": hardware(),
                                           "kernels": result.kernels, "rows": result.rows}, indent=2))


if __name__ == "__main__":
    main()
