"""Calibrate a trained model on validation, fit its routing threshold, and measure both; write a JSON result.

    .venv/bin/python benchmarks/calibrate_route.py --model runs/bench-cpu-heads --out runs/calibrated-cpu-heads

Saves the calibrated model (temperatures and anomaly threshold inside) to ``--out`` and writes
``<out>/calibration.json``: the fitted temperatures (for the probabilities and for the confidence field),
accuracy / KL / Brier / ECE (10 and 15 bins; of the top probability and of the confidence field) before and after
on validation and test (and what the other fitting targets would have given), AUROC and FPR at 95% TPR of every
anomaly score against the project's off-domain and near-domain sets, the share of each set sent to a human (test
with a bootstrap interval), the heads alone against the distance-aware answers (AUROC of confidence, share routed at
the one threshold, test answered; accuracy, KL, Brier and ECE on test) and the poem example. ``decisionkit train``
already calibrates and fits the router; this script re-does both on any saved model with other choices.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import decisionkit as dk
from decisionkit.core.answer_fields import lowest_confidence
from decisionkit.training.anomaly import (
    OFF_DOMAIN_DIR,
    SCORES,
    TARGET_REJECTION,
    evaluate_scores,
    fit_router,
    in_domain_calibration,
    load_inputs,
)
from decisionkit.training.calibration import CALIBRATIONS, calibrate
from decisionkit.training.report import git_commit

POEM = "autumn wind through golden leaves under the moon"


def frame_json(frame) -> dict:
    return json.loads(frame.to_json(orient="index"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="folder of a trained model")
    parser.add_argument("--out", required=True, help="folder for the calibrated model and calibration.json")
    parser.add_argument("--data", default=None)
    parser.add_argument("--target", default="both", choices=CALIBRATIONS,
                        help="what the temperatures are fitted to (both: probabilities to the distribution, "
                             "confidence to the answer)")
    parser.add_argument("--score", default="confidence", choices=SCORES)
    parser.add_argument("--rejection", type=float, default=TARGET_REJECTION)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    model = dk.load(args.model)
    model.router = None  # a routed model is calibrated again here, then routed again: temperatures come first
    splits = {name: dk.load_typed_decisions(name, args.data) for name in ("train", "validation", "test")}
    others = [t for t in CALIBRATIONS if t != args.target]
    alternatives = {t: calibrate(model, splits["validation"], splits["test"], target=t).table() for t in others}
    calibration = calibrate(model, splits["validation"], splits["test"], target=args.target)  # the one kept
    router = fit_router(model, splits["train"], splits["validation"], args.score, args.rejection)
    workflows = set(splits["train"].workflows)
    off = load_inputs(OFF_DOMAIN_DIR / "off_domain.jsonl", workflows)
    near = load_inputs(OFF_DOMAIN_DIR / "near_domain.jsonl", workflows)
    anomalies = evaluate_scores(model, splits["test"], off, near)
    model.save(args.out)
    table = calibration.table()
    result = {
        "model": args.model,
        "temperatures": calibration.temperatures,
        "confidence_temperatures": calibration.confidence_temperatures,
        "fits": frame_json(calibration.temperature_table()),
        "target": args.target,
        "calibration": {f"{split}/{stage}": table.loc[(split, stage)].to_dict() for split, stage in table.index},
        **{f"calibration_if_fitted_to_{t}": {f"{split}/{stage}": table.loc[(split, stage)].to_dict()
                                             for split, stage in table.index} for t, table in alternatives.items()},
        "router": {k: v for k, v in router.config().items() if k != "priors"},
        "separation": {name: frame_json(anomalies.separation(name)) for name in (off.name, near.name)},
        "sent_to_human": {f"{s}/{k}": v for (s, k), v in anomalies.routed()["sent to a human"].items()},
        "test_rejection": anomalies.rejection_interval(),
        "raw_vs_distance_aware": frame_json(anomalies.confidence_table(off.name, near.name)),
        "in_domain_calibration": frame_json(in_domain_calibration(model, splits["test"])),
        "poem": model.route(POEM, workflow="customer_service"),
        "poem_raw_lowest_confidence": lowest_confidence(model.decide(POEM, workflow="customer_service", raw=True)),
        "seconds": time.perf_counter() - started,
        "commit": git_commit(),
    }
    Path(args.out, "calibration.json").write_text(json.dumps(result, indent=2, default=float))
    test_before, test_after = table.loc[("test", "before")], table.loc[("test", "after")]
    best = anomalies.separation(off.name)["AUROC"]
    rejected = result["test_rejection"]
    print(f"test ECE (10 bins) {test_before['ece (10 bins)']:.4f} -> {test_after['ece (10 bins)']:.4f}, ECE of "
          f"confidence {test_after['ece of confidence (10 bins)']:.4f}, KL {test_after['kl']:.4f}; "
          f"off-domain AUROC best {best.idxmax()} {best.max():.4f}, msp {best['msp']:.4f}; {router.score} threshold "
          f"{router.threshold:.4f}: test sent to a human {rejected['share']:.2%} (90% bootstrap "
          f"{rejected['low']:.2%}-{rejected['high']:.2%}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
