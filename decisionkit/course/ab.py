"""The A/B: the decision model against the generative baselines (``generative.py``), on the same backbone and cases.

``ab_test`` times and scores, one request at a time after untimed warm-up calls, the decision model on the same
backbone, any other decision models (the main model on another backbone, say), constrained and free JSON at each token
budget and option scoring; ``ABResult`` gives the latency table (p50, a tail from enough timings, first token, each
p50 over the same-backbone decision model's with a 95% bootstrap interval), the accuracy table (which methods were
trained: ``how_trained``), per workflow, the compute dtype each method ran in, and ``against_seed``: the seed's two
quoted latencies beside this run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.precision import Precision
from ..data.cases import Split
from ..data.metrics import Scores, case_interval, case_rows, expected_calibration_error, score
from ..data.seed import SEED
from .generative import WARMUP, ComputeDtype, GenerativeResult, generative_baseline, option_scoring
from .latency import Timing, median_ratio, tail_percentile, time_calls

RATIO_COLUMNS = ("x same-backbone p50", "x low (95%)", "x high (95%)")  # latency_table's ratio and its interval
DECISION = "decision model, same backbone"  # the fair row: the generative baselines run on its backbone
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
    """The decision model against the generative baselines on the same backbone, cases, machine and compute dtype
    (and any other decision model, on its own backbone, beside them)."""

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
        timings, else p90), time to first token, each p50 over the same-backbone decision model's with a 95%
        bootstrap interval over cases (``latency.median_ratio``), the compute dtype seen."""
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
        where the method gives probabilities (a generated answer is one option: NaN), accuracy and ECE each with its
        95% bootstrap interval over cases (``case_interval``: a case's questions share one state)."""
        groups = self._groups(by)
        table = groups.agg(decisions=("questions", "sum"), valid=("valid", "mean"), correct=("correct", "sum"))
        table["accuracy"] = table.pop("correct") / table["decisions"]
        table[["accuracy low (95%)", "accuracy high (95%)"]] = [
            case_interval(list(np.arange(len(g))[:, None]),
                          lambda k, g=g: g["correct"].to_numpy()[k].sum() / g["questions"].to_numpy()[k].sum())
            for _, g in groups]
        calibration = {}
        for method, s in self.scores.items():
            for key, d in (s.decisions.groupby(by) if by else [(None, s.decisions)]):
                confidence, correct = d["confidence"].to_numpy(float), d["correct"].to_numpy(float)
                ece = lambda k: expected_calibration_error(confidence[k], correct[k], s.ece_bins)  # noqa: E731
                calibration[(method, key) if by else method] = {
                    "kl": d["kl"].mean(), "ece": ece(np.arange(len(d))),
                    **dict(zip(("ece low (95%)", "ece high (95%)"), case_interval(case_rows(d["case"]), ece)))}
        columns = ["kl", "ece", "ece low (95%)", "ece high (95%)"]
        table[columns] = pd.DataFrame.from_dict(calibration, orient="index").reindex(table.index)[columns].to_numpy()
        table.insert(0, "trained", [self.trained[m] for m in table.index.get_level_values("method")])
        return table

    def against_seed(self, generated: str, decisions=(DECISION,)) -> pd.DataFrame:
        """The seed's decision and generated-JSON latencies and their ratio (quoted from ``data.seed``), beside this
        run's p50 of each of ``decisions`` (row names), this run's p50 of the ``generated`` method and the ratio with
        its 95% bootstrap interval over cases. A decision model on another backbone than the generation's sets two
        backbones against each other as well as two methods: its column says so."""
        decision, made = SEED["decision latency"], SEED["generated JSON latency"]
        columns = {"seed (quoted)": [decision.quoted, made.quoted, f"{made.value / decision.value:.1f}x"]}
        ms = self.requests.pivot(index="case", columns="method", values="latency_ms")
        for method in decisions:
            ratio, low, high = median_ratio(ms[generated], ms[method])
            backbone = "same backbone" if method == DECISION else "across backbones"
            columns[f"this run: {method} ({backbone})"] = [
                f"{ms[method].median():,.1f} ms", f"{ms[generated].median():,.1f} ms",
                f"{ratio:.1f}x ({low:.1f}-{high:.1f}x)"]
        rows = ["decision latency (p50)", f"generated JSON latency (p50; here {generated})",
                "generated / decision (95% interval over cases)"]
        return pd.DataFrame(columns, index=pd.Index(rows, name=f"{len(ms)} cases"))

    def figure(self):
        from ..core.plots import latency_boxes

        timings = [Timing(m, g["latency_ms"].to_numpy()) for m, g in self.requests.groupby("method", sort=False)]
        return latency_boxes(timings, f"Latency per request (every answer of one case), compute dtype "
                                      f"{self.precision.dtype}", axis="method")


def ab_test(model, cases: Split, budgets=(64, 256), constrained_budget: int | None = None,
            progress: bool = True, others: dict | None = None) -> ABResult:
    """Time and score, on ``cases``, one request at a time after ``WARMUP`` untimed ones: the decision model (its
    whole ``decide`` call: one pass, every answer, a hybrid's trees on the fields and the router's weight too),
    option scoring, JSON constrained to the answers' schema, and free JSON at every budget, all on the model's
    backbone in its one compute dtype (recorded per request). ``others``: more decision models by row name (the
    main model on another backbone, say), each timed and scored the same way, in its own backbone's dtype."""
    backbone = model.backbone
    states, workflows = cases.states, cases.case_workflows

    def decided(name: str, m) -> tuple[Timing, str, tuple]:
        with ComputeDtype(m.backbone) as seen:
            timing = time_calls(name, lambda i: m.decide(states[i], workflow=workflows[i]), range(len(cases)),
                                WARMUP, m.backbone.device)
        return timing, seen.dtype, m.outputs(cases)

    deciders = {DECISION: model, **(others or {})}
    decisions = {name: decided(name, m) for name, m in deciders.items()}
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
    requests = pd.concat([*(pd.DataFrame(rows(name, timing, outputs[0], dtype))
                            for name, (timing, dtype, outputs) in decisions.items()),
                          pd.DataFrame(rows(scoring.name, scoring, scored, scored_in.dtype)),
                          g[["method", "case", "workflow", "latency_ms", "first_token_ms", "valid", "correct",
                             "questions", "compute_dtype"]]], ignore_index=True)
    trained = {m: how_trained(deciders[m]) if m in deciders else ZERO_SHOT for m in requests["method"].unique()}
    scores = {name: score(cases, *outputs) for name, (_, _, outputs) in decisions.items()}
    return ABResult(requests, {**scores, scoring.name: score(cases, scored)}, trained, backbone.precision, generated)
