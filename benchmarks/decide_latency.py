"""``decide`` at batch 1 on two saved models side by side, in float32 and in bfloat16, the models and settings taking
turns case by case.

    .venv/bin/python benchmarks/decide_latency.py --model before=runs/demo-before --model now=runs/demo \
        --out benchmarks/results/decide_latency_avx512_bf16.json

Each setting answers the same test cases (``--cases``, spread over the workflows) ``--rounds`` times, after a warm-up:
every model in float32; where this CPU has bfloat16 instructions, every model under bfloat16 with the frozen
weights' copies cast once per process (``Precision.frozen_weights_cast``, what ``decide`` does) and, for the first
model, with autocast alone casting them at every call (how ``decide`` ran before the copies were kept). It writes
the median and 90th percentile per setting, the tokens per case, the backbone's layers that run, and the CPU's
kernels (the dtype chosen here is in ``chosen dtype``).
"""

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import numpy as np
import torch

import decisionkit as dk
from decisionkit.core.atomic import write_text
from decisionkit.core.precision import Precision
from decisionkit.course.latency import hardware


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=FOLDER",
                        help="a saved model and the name its rows get; the first is also timed with autocast alone")
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    models = {name: dk.load(folder) for name, folder in (m.split("=", 1) for m in args.model)}
    chosen = next(iter(models.values())).backbone.precision
    test = dk.load_typed_decisions("test")
    cases = [test[i] for i in np.linspace(0, len(test) - 1, args.cases).round().astype(int)]
    settings = [(name, "float32", True) for name in models]
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        settings += [(name, "bfloat16", True) for name in models] + [(next(iter(models)), "bfloat16", False)]
    samples: dict[tuple, list[float]] = {s: [] for s in settings}
    for round_ in range(args.rounds + 1):  # round 0 warms every setting up and is not kept
        for case in cases:
            for name, dtype, kept in settings:
                model = models[name]
                model.backbone.precision = Precision(chosen.device, dtype, "set by decide_latency.py")
                patch = nullcontext() if kept else mock.patch.object(
                    Precision, "frozen_weights_cast", lambda self, module: nullcontext())
                with patch:
                    started = time.perf_counter()
                    model.decide(case.state, workflow=case.workflow)
                    if round_:
                        samples[(name, dtype, kept)].append((time.perf_counter() - started) * 1e3)
    for model in models.values():
        model.backbone.precision = chosen
    rows = {}
    for (name, dtype, kept), ms in samples.items():
        label = f"{name}, {dtype}" + ("" if dtype == "float32" else
                                      (", weights cast once per process" if kept else ", autocast alone"))
        rows[label] = {"p50 ms": float(np.median(ms)), "p90 ms": float(np.quantile(ms, 0.9)), "calls": len(ms)}
        print(f"{label:55s} p50 {rows[label]['p50 ms']:6.1f} ms, p90 {rows[label]['p90 ms']:6.1f} ms")
    first = next(iter(models.values()))
    tokens = [int(first.tokenize([case.text])["attention_mask"].sum()) for case in cases]  # every window's
    write_text(Path(args.out), json.dumps({
        "models": {name: {"folder": Path(folder).name, "backbone": models[name].backbone.resolved.name,
                          "layers run": models[name].backbone.num_layers,
                          "feature layers": list(models[name].spec.layers)}
                   for name, folder in (m.split("=", 1) for m in args.model)},
        "cases": len(cases), "rounds": args.rounds, "tokens per case (median)": float(np.median(tokens)),
        "hardware": hardware(), "chosen dtype": chosen.describe(), "settings": rows}, indent=2))


if __name__ == "__main__":
    main()
