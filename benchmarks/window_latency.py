"""``decide`` at batch 1 on states of 1, 2, 4 and 8 windows: milliseconds per decision and per window.

    .venv/bin/python benchmarks/window_latency.py --out benchmarks/results/window_latency_avx2.json
    .venv/bin/python benchmarks/window_latency.py --model runs/demo --out runs/window-latency.json

A state longer than the encoder's window (``FeatureSpec.max_length`` tokens, 512 for MiniLM) is read in windows of
that length and pooled across them, up to ``max_windows`` (8). Each state here is a plain-text state (a log, as a
ticket thread or an agent trace would be): the compact JSON of real typed-decisions test states of one workflow, one
a line, cut at the longest prefix that still fits in its number of windows, so that its windows are full. Without
``--model`` the model is the MiniLM-L6 backbone with untrained heads (what it answers does not change the time);
with it, a saved model (its workflow asked). The sizes take turns call by call, ``--warmup`` rounds first and then
``--runs`` timed rounds; it writes the median and 90th percentile per size, per decision and per window, the tokens
and windows of each state, the CPU (``latency.hardware``), the compute dtype with the CPU's kernels, and the load
average before and after (other work on a shared machine slows every size).
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

import decisionkit as dk
from decisionkit.contract import systemone
from decisionkit.core.atomic import write_text
from decisionkit.core.environment import synchronize
from decisionkit.course.latency import hardware
from decisionkit.data.cases import render_state
from decisionkit.model.backbone import ENCODER_BACKBONE
from decisionkit.model.decision_model import DecisionModel, FeatureSpec


def filled(model, source: str, workflow: str, windows: int) -> str:
    """The longest prefix of ``source`` that ``model`` reads, rendered as a state of ``workflow``, in ``windows``
    windows (so its windows are full)."""
    def count(prefix: str) -> int:
        try:
            return len(systemone.state_windows(model, render_state(prefix, workflow)))
        except systemone.QuestionError:  # past the model's cap
            return model.spec.max_windows + 1

    if count(source) <= windows:
        raise ValueError(f"the source text fits in {windows} windows; it needs to be longer")
    lo, hi = 1, len(source)
    while lo < hi:  # the longest prefix in at most ``windows`` windows
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(source[:mid]) <= windows else (lo, mid - 1)
    return source[:lo]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a saved model folder (default: MiniLM-L6 with untrained heads)")
    parser.add_argument("--workflow", default="agent_trace_observability", help="whose test states make the text")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    test = dk.load_typed_decisions("test")
    if args.model:
        model = dk.load(args.model)
    else:
        model = DecisionModel(dk.load_backbone(ENCODER_BACKBONE), dk.load_typed_decisions("train").schema(),
                              FeatureSpec()).eval()
    workflow = args.workflow if args.workflow in model.schema else next(iter(model.schema))
    source = "\n".join(json.dumps(c.state, ensure_ascii=False, separators=(",", ":"))
                       for c in test if c.workflow == workflow)
    if max(args.windows) > model.spec.max_windows:
        raise SystemExit(f"--windows {max(args.windows)} is past the model's cap of {model.spec.max_windows}")
    states = {n: filled(model, source, workflow, n) for n in args.windows}
    shape = {n: systemone.state_windows(model, systemone.checked(model.schema, s, None, workflow).text)
             for n, s in states.items()}
    for n, windows in shape.items():
        assert len(windows) == n, (n, len(windows))
    device = model.backbone.device
    load_before = os.getloadavg()[0]  # other work on the machine slows every size: the JSON keeps the load
    samples: dict[int, list[float]] = {n: [] for n in states}
    for round_ in range(args.warmup + args.runs):  # the sizes take turns; the warm-up rounds are not kept
        for n, state in states.items():
            started = time.perf_counter()
            model.decide(state, workflow=workflow)
            synchronize(device)
            if round_ >= args.warmup:
                samples[n].append((time.perf_counter() - started) * 1e3)
    rows = {}
    for n, ms in samples.items():
        ms = np.asarray(ms)
        label = f"{n} window{'s' if n > 1 else ''}"
        rows[label] = {
            "windows": n, "tokens": sum(len(ids) for ids in shape[n]),
            "p50 ms per decision": float(np.median(ms)), "p90 ms per decision": float(np.quantile(ms, 0.9)),
            "p50 ms per window": float(np.median(ms)) / n, "calls": len(ms)}
        row = rows[label]
        print(f"{label} ({row['tokens']:5d} tokens): p50 {row['p50 ms per decision']:7.1f} ms a decision, "
              f"{row['p50 ms per window']:6.1f} ms a window, p90 {row['p90 ms per decision']:7.1f} ms")
    write_text(Path(args.out), json.dumps({
        "model": args.model or f"{ENCODER_BACKBONE}, untrained heads", "backbone": model.backbone.resolved.name,
        "features": model.spec.to_json(), "workflow": workflow, "questions": len(model.schema[workflow]),
        "batch": 1, "warm-up rounds": args.warmup, "runs": args.runs, "hardware": hardware(),
        "load average (1 min) before and after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "compute dtype": model.backbone.precision.describe(), "sizes": rows}, indent=2))


if __name__ == "__main__":
    main()
