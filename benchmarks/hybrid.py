"""The hybrid decision model against its parts and against a joint head; what the fields cost per decision.

    .venv/bin/python benchmarks/hybrid.py --run runs/bench-cpu-best --out benchmarks/results

``--run``: a saved hybrid run (``benchmarks/train_preset.py --preset cpu-best``; features cached). Writes
``hybrid_<cpu family>.json``:

- test accuracy and KL of the heads alone, the trees alone, the hybrid (a weight per question chosen out of fold,
  ``training.fit_structured``) and a **joint head**: one linear head per question on the pooled features and the
  standardized fields together (missing fields at 0, plus a missing flag), fitted as the heads are (L2 and steps on
  the dev slice, then on all of train); overall and by workflow. None calibrated: accuracy is what they compare.
- per decision at batch 1, in the compute dtype chosen at run time: the fields and trees alone (every question of
  the case), and ``decide`` with and without the structured part, on the same test cases, interleaved.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import decisionkit as dk
from decisionkit.core.precision import kernels
from decisionkit.data.cases import DEV_PER_WORKFLOW, dev_slice
from decisionkit.data.metrics import score
from decisionkit.model.fitting import STRUCTURED_FOLDS, cross_fit, fit_heads, parts_out_of_fold, refit_heads
from decisionkit.model.heads import HeadSet
from decisionkit.model.output import read
from decisionkit.model.structured import StructuredPart, mix_weights, mixed
from decisionkit.training.trainer import part_scores


def field_block(model, train, *others):
    """The fields of every workflow side by side (a case fills its workflow's columns), standardized on train,
    missing at 0 with a 0/1 missing flag per column: what a linear head can read."""
    workflows = list(model.structured.fields)
    widths = [len(model.structured.fields[w].columns) for w in workflows]
    starts = np.concatenate([[0], np.cumsum(widths)])

    def raw(cases):
        x = np.full((len(cases), starts[-1]), np.nan)
        for c_index, case in enumerate(cases):
            w = workflows.index(case.workflow)
            x[c_index, starts[w]:starts[w + 1]] = model.structured.fields[case.workflow].encode([case.state])[0]
        return x

    blocks = [raw(s) for s in (train, *others)]
    mean, std = np.nanmean(blocks[0], axis=0), np.nanstd(blocks[0], axis=0) + 1e-6
    out = []
    for x in blocks:
        missing = np.isnan(x)
        z = np.where(missing, 0.0, (x - np.nan_to_num(mean)) / np.nan_to_num(std, nan=1.0))
        out.append(torch.as_tensor(np.hstack([np.clip(z, -10, 10), missing]), dtype=torch.float32))
    return out


def _probabilities(output) -> list[dict]:
    return [{q: torch.softmax(z.double(), -1).numpy() for q, z in logits.items()} for logits in output.per_case()]


def joint_head(model, train, test, preset, folds: int = STRUCTURED_FOLDS):
    """Test scores of one linear head per question on [pooled features, fields], alone and averaged with the trees
    (a weight per question chosen out of fold, as the hybrid's)."""
    x_train, x_test = model.split_features(train), model.split_features(test)
    f_train, f_test = field_block(model, train, test)
    joint_train, joint_test = torch.cat([x_train, f_train], 1), torch.cat([x_test, f_test], 1)
    inside, dev = dev_slice(train, DEV_PER_WORKFLOW)
    index = {c.id: i for i, c in enumerate(train)}
    heads = HeadSet(model.schema, joint_train.shape[1])
    fit = fit_heads(heads, inside, dev, joint_train[[index[c.id] for c in inside]],
                    joint_train[[index[c.id] for c in dev]], preset.l2_grid, preset.head_steps, preset.head_lr,
                    progress=False)
    refit_heads(heads, train, joint_train, fit.recipe)
    joint_model = copy.copy(model)  # the same model reading the joint features with its heads alone
    joint_model.structured = None
    joint_model.head_recipe = fit.recipe
    with torch.no_grad():
        joint = _probabilities(read(model.schema, heads, None, joint_test, test.case_workflows))
    # out of fold on train: joint heads and trees fitted on the other folds, for the mixing weights
    oof_joint = [None] * len(train)
    for fold in cross_fit(joint_model, train, joint_train, folds):
        held = [train[i] for i in fold.held]
        found = _probabilities(fold.read(joint_train[fold.held], [c.workflow for c in held], trees=False))
        for i, p in zip(fold.held, found):
            oof_joint[i] = p
    trees_part = StructuredPart.fit(train, rounds=model.structured.rounds, lexical=False)
    weights = mix_weights(train, oof_joint, parts_out_of_fold(trees_part, train, folds)["trees"])
    trees = trees_part.answers(test)["trees"]
    return score(test, joint), score(test, mixed(test, joint, trees, weights))


def per_decision_ms(model, cases, repeats: int = 3) -> dict:
    """Median milliseconds per case at batch 1: the structured part alone, and decide with and without it."""
    part = model.structured
    timings = {"fields and trees": [], "decide, hybrid": [], "decide, heads alone": []}
    for case in cases:
        model.decide(case.state, workflow=case.workflow)  # warm
    for _ in range(repeats):
        for case in cases:
            start = time.perf_counter()
            part.probabilities([case.state], case.workflow, list(case.questions))
            timings["fields and trees"].append(time.perf_counter() - start)
            for name, structured in (("decide, hybrid", part), ("decide, heads alone", None)):
                model.structured = structured
                start = time.perf_counter()
                model.decide(case.state, workflow=case.workflow)
                timings[name].append(time.perf_counter() - start)
            model.structured = part
    return {name: float(np.median(t) * 1e3) for name, t in timings.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a saved hybrid run (cpu-best)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--latency-cases", type=int, default=5, help="test cases per workflow timed")
    args = parser.parse_args(argv)
    model = dk.load(args.run)
    if model.structured is None:
        raise SystemExit(f"{args.run} is not a hybrid model (train it with --preset cpu-best)")
    preset = dk.preset(json.loads((Path(args.run) / "history.json").read_text())["preset"]["name"])
    train, test = dk.load_typed_decisions("train"), dk.load_typed_decisions("test")
    hybrid_part = model.structured
    hybrid = score(test, model.predict(test, raw=True))
    joint, joint_and_trees = joint_head(model, train, test, preset)
    rows = {**part_scores(model, test), "hybrid (mixture)": hybrid, "joint head": joint,
            "joint head + trees": joint_and_trees}
    result = {
        "run": Path(args.run).name, "test cases": len(test),
        "scores": {name: {**{k: s.overall()[k] for k in ("accuracy", "kl", "brier")},
                          "by_workflow": s.summary("workflow")["accuracy"].to_dict()} for name, s in rows.items()},
        "weights": hybrid_part.weights,
        "ms per decision, batch 1": per_decision_ms(model, test.head(args.latency_cases)),
        "compute_dtype": model.backbone.precision.dtype, **kernels(),
    }
    path = Path(args.out) / f"hybrid_{result['cpu_family']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    for name, s in result["scores"].items():
        print(f"{name:<18} test accuracy {s['accuracy']:.4f}  KL {s['kl']:.4f}")
    print(json.dumps(result["ms per decision, batch 1"]), "->", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
