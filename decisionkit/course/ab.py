"""The A/B: the decision model against the generative baselines (``generative.py``), on the same backbone and cases.

``ab_test`` times and scores, one request at a time after untimed warm-up calls, the decision model, constrained and
free JSON at each token budget and option scoring; ``ABResult`` gives the latency table (p50, a tail from enough
timings, first token, each p50 over the decision model's with a 95% bootstrap interval), the accuracy table (which
methods were trained: ``how_trained``), per workflow, and the compute dtype each method ran in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.precision import Precision
from ..data.cases import Split
from ..data.metrics import Scores, expected_calibration_error, score
from .generative import WARMUP, ComputeDtype, GenerativeResult, generative_baseline, option_scoring
from .latency import Timing, median_ratio, tail_percentile, time_calls

RATIO_COLUMNS = ("x decision p50", "x low (95%)", "x high (95%)")  # latency_table's ratio and its interval
DECISION = "decision model"
ZERO_SHOT = "no: zero-shot"


def how_trained(model) -> str:
    """What of ``model`` was trained, in a few words, for the A/B's accuracy table: its heads (and a hybrid's trees)
    on train, its temperatures on validation ("calibrated"), its router ("routed"), and its backbone if it trained."""
    done = [("backbone + " if not model.backbone.frozen else "")
            + ("heads + trees on train" if model.structured is not None else "heads on train")]
    if model.temperatures.fitted:
        done.append("calibrated")
    if model.router is not None:
        done.append("routed")
    return "yes: " + ", ".join(done)


def _joined(dtypes: pd.Series) -> str:
    return "+".join(sorted({d for joined in dtypes for d in joined.split("+")}))


@dataclass
class ABResult:
    """The decision model against the generative baselines on the same backbone, cases, machine and compute dtype."""

    requests: pd.DataFrame  # one row per method and case: method, case, workflow, latency_ms, first_token_ms, valid,
    #                         correct, questions, compute_dtype
    scores: dict[str, Scores]  # per method that gives distributions: per-decision accuracy, KL, ECE
    trained: dict[str, str]  # per method: what was trained ("no: zero-shot ..." for the generative baselines)
    precision: Precision  # the compute dtype ``precision.choose`` picked for the backbone, and why
    generative: GenerativeResult = field(repr=False)

    @property
    def dtypes(self) -> dict[str, str]:
        """Per method, the dtype its backbone computed in, as ``ComputeDtype`` saw it over every request."""
        return self.requests.groupby("method", sort=False)["compute_dtype"].agg(_joined).to_dict()

    def _groups(self, by: str | None):
        return self.requests.groupby(["method"] + ([by] if by else []), sort=False)

    def latency_table(self, by: str | None = None) -> pd.DataFrame:
        """Per method (and per ``by``, e.g. "workflow"): timings, p50 and tail latency (p99 from ``P99_MIN_TIMINGS``
        timings, else p90), time to first token, each p50 over the decision model's with a 95% bootstrap interval
        over cases (``latency.median_ratio``), the compute dtype seen."""
        groups = self._groups(by)
        tail = tail_percentile(int(groups.size().min()))
        table = groups.agg(**{
            "timings": ("latency_ms", "size"), "p50 ms": ("latency_ms", "median"),
            f"p{tail} ms": ("latency_ms", lambda x: float(np.percentile(x, tail))),
            "first token ms": ("first_token_ms", "median"), "compute dtype": ("compute_dtype", _joined)})
        ms = self.requests.pivot(index="case", columns="method", values="latency_ms")  # the same cases per method
        group_of = self.requests.groupby("case")[by].first() if by else None
        ratios = []
        for key in table.index:
            method, group = key if by else (key, None)
            cases = group_of.index[group_of == group] if by else ms.index
            ratios.append(median_ratio(ms.loc[cases, method], ms.loc[cases, DECISION]))
        for i, name in enumerate(RATIO_COLUMNS):
            table.insert(4 + i, name, [r[i] for r in ratios])
        return table

    def accuracy_table(self, by: str | None = None) -> pd.DataFrame:
        """Per method (and per ``by``): whether it was trained, decisions, valid replies, accuracy, and KL and ECE
        where the method gives probabilities (a generated answer is one option: NaN)."""
        table = self._groups(by).agg(decisions=("questions", "sum"), valid=("valid", "mean"),
                                     correct=("correct", "sum"))
        table["accuracy"] = table.pop("correct") / table["decisions"]
        calibration = {}
        for method, s in self.scores.items():
            for key, d in (s.decisions.groupby(by) if by else [(None, s.decisions)]):
                calibration[(method, key) if by else method] = {
                    "kl": d["kl"].mean(), "ece": expected_calibration_error(d["confidence"], d["correct"], s.ece_bins)}
        table[["kl", "ece"]] = pd.DataFrame.from_dict(calibration, orient="index").reindex(table.index).to_numpy()
        table.insert(0, "trained", [self.trained[m] for m in table.index.get_level_values("method")])
        return table

    def figure(self):
        from ..core.plots import latency_boxes

        timings = [Timing(m, g["latency_ms"].to_numpy()) for m, g in self.requests.groupby("method", sort=False)]
        return latency_boxes(timings, f"Latency per request (every answer of one case), compute dtype "
                                      f"{self.precision.dtype}", axis="method")


def ab_test(model, cases: Split, budgets=(64, 256), constrained_budget: int | None = None,
            progress: bool = True) -> ABResult:
    """Time and score, on ``cases``, one request at a time after ``WARMUP`` untimed ones: the decision model (its
    whole ``decide`` call: one pass, every answer, a hybrid's trees on the fields and the router's weight too),
    option scoring, JSON constrained to the answers' schema, and free JSON at every budget, all on the model's
    backbone in its one compute dtype (recorded per request)."""
    backbone = model.backbone
    states, workflows = cases.states, cases.case_workflows
    with ComputeDtype(backbone) as decided:
        decision = time_calls(DECISION, lambda i: model.decide(states[i], workflow=workflows[i]), range(len(cases)),
                              WARMUP, backbone.device)
    probabilities, confidences = model.outputs(cases)
    with ComputeDtype(backbone) as scored_in:
        scoring, scored = option_scoring(backbone, cases, model.spec.max_length)
    generated = generative_baseline(backbone, cases, budgets, constrained_budget, progress)
    gold = [{qid: c.gold[qid].top for qid in c.questions} for c in cases]

    def rows(method: str, timing: Timing, predictions, dtype: str) -> list[dict]:
        return [{"method": method, "case": c.id, "workflow": c.workflow, "latency_ms": ms, "first_token_ms": np.nan,
                 "valid": True, "correct": sum(int(np.argmax(p[q])) == g[q] for q in c.questions),
                 "questions": len(c.questions), "compute_dtype": dtype}
                for c, ms, p, g in zip(cases, timing.samples_ms, predictions, gold)]

    g = generated.requests.assign(method=lambda f: np.where(f["method"] == "constrained", "constrained JSON",
                                                            "free JSON, " + f["budget"].astype(str) + " tokens"))
    requests = pd.concat([pd.DataFrame(rows(DECISION, decision, probabilities, decided.dtype)),
                          pd.DataFrame(rows(scoring.name, scoring, scored, scored_in.dtype)),
                          g[["method", "case", "workflow", "latency_ms", "first_token_ms", "valid", "correct",
                             "questions", "compute_dtype"]]], ignore_index=True)
    trained = {m: how_trained(model) if m == DECISION else ZERO_SHOT for m in requests["method"].unique()}
    return ABResult(requests, {DECISION: score(cases, probabilities, confidences), scoring.name: score(cases, scored)},
                    trained, backbone.precision, generated)
