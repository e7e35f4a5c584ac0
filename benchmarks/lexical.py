"""The hybrid's parts on typed-decisions and each shipped scenario: every part alone, the hybrid with and without the
lexical part, and what the lexical part costs a decision.

    .venv/bin/python benchmarks/lexical.py --out benchmarks/results

For each dataset its preset's weights are fitted as ``decisionkit train`` fits them (``trainer.fit_model``: the
heads, the trees where states are JSON, the lexical part, weights per question chosen out of fold on train), and the
test cases are answered raw (uncalibrated, before the router) by: the heads alone, the trees alone (where every
workflow has fields), the lexical part alone (TF-IDF and a linear model per question: the ten-line baseline a user
would write), the hybrid without the lexical part (its weights chosen again on the same out-of-fold answers, the
lexical part left out) and the hybrid. Each row has its bootstrap interval against the best single part
(``metrics.paired_difference`` over test cases). The lexical part's cost: the median over test states of its
answers to every question of the state's workflow at batch 1 (vocabulary lookup, TF-IDF, one sparse product per
question), beside the model's whole ``decide`` on the same states. Writes ``lexical_<cpu family>.json`` with the CPU
and the compute dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")
import decisionkit as dk  # noqa: E402
from decisionkit.core.atomic import write_text  # noqa: E402
from decisionkit.core.precision import kernels  # noqa: E402
from decisionkit.course.latency import hardware  # noqa: E402
from decisionkit.data.metrics import paired_difference, score  # noqa: E402
from decisionkit.model.structured import choose_weights, named_blend  # noqa: E402
from decisionkit.training.trainer import decisions_of, fit_model, held_out_test, part_answers  # noqa: E402

DATASETS = {"typed-decisions": ("cpu-fast", None), "tickets": ("tickets", None), "ngs-qc": ("ngs-qc", None),
            "expenses": ("cpu-fast", "scenario:expenses")}
TIMED = 40  # test states the per-decision costs are measured on (every k-th)


def _median_ms(call, states) -> float:
    times = []
    for state in states:
        started = time.perf_counter()
        call(state)
        times.append((time.perf_counter() - started) * 1000)
    return float(np.median(times))


def measure(name: str, preset_name: str, data, folder: Path) -> dict:
    p = dk.preset(preset_name)
    decisions = decisions_of(p, data)
    fitted = fit_model(p, folder, decisions, progress=False)
    model, train = fitted.model, fitted.cases["train"]
    test = held_out_test(p, decisions)
    answers = part_answers(model, test)
    rows = {part: score(test, found) for part, found in answers.items()}
    held_out = fitted.hybrid.held_out
    if "lexical" in held_out:
        without = choose_weights(train, {k: v for k, v in held_out.items() if k != "lexical"})
        on_test = {"heads": answers["heads alone"], **{k: v for k, v in model.structured.answers(test).items()
                                                      if k != "lexical"}}
        rows["hybrid without the lexical part"] = score(test, named_blend(test, on_test, without))
    rows["hybrid"] = score(test, model.structured.blend(test, answers["heads alone"]))
    alone = [part for part in answers]
    best = max(alone, key=lambda part: rows[part].overall()["accuracy"])
    table = {}
    for row, s in rows.items():
        difference, low, high = paired_difference(rows[best], s)
        table[row] = {"accuracy": float(s.overall()["accuracy"]), "kl": float(s.overall()["kl"]),
                      f"accuracy - {best}": {"difference": difference, "interval": [low, high]}}
        print(f"{name:16s} {row:34s} {table[row]['accuracy']:.4f}  {difference:+.4f} [{low:+.4f}, {high:+.4f}]",
              file=sys.stderr, flush=True)
    timed = list(test)[::max(1, len(test) // TIMED)][:TIMED]
    lexical = model.structured.lexical
    cost = {"lexical part, all questions of a state (ms, median)":
            _median_ms(lambda c: lexical.probabilities([c.state], c.workflow, list(c.questions)), timed),
            "decide, all questions of a state (ms, median)":
            _median_ms(lambda c: model.decide(c.state, workflow=c.workflow), timed), "states timed": len(timed)}
    return {"preset": p.name, "backbone": model.backbone.name.split("/")[-1],
            "compute dtype": model.backbone.precision.dtype, "train cases": len(train), "test cases": len(test),
            "best single part": best, "rows": table, "parts": fitted.extra.get("parts"),
            "weights": model.structured.weights, "training seconds": fitted.seconds,
            "vocabulary": {"words": len(lexical.vocabulary.words), "characters": len(lexical.vocabulary.chars)},
            "cost": cost}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder of the JSON results")
    parser.add_argument("--datasets", nargs="*", default=list(DATASETS), choices=list(DATASETS))
    args = parser.parse_args(argv)
    result = {"cpu": kernels(), "hardware": hardware(), "datasets": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.datasets:
            preset_name, data = DATASETS[name]
            result["datasets"][name] = measure(name, preset_name, data, Path(scratch) / name)
    path = Path(args.out) / f"lexical_{kernels()['cpu_family']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(result, indent=2, default=float))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
