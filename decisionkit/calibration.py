"""Temperature scaling, fitted on the validation split only, and what it changes.

A trained head's softmax is often over-confident: its top answer says 95% where it is right 80% of the time.
Temperature scaling (Guo et al., 2017) divides the logits by one number T > 0 before the softmax; T > 1 softens
every answer, T < 1 sharpens it. The ranking of the options never changes, so accuracy does not either.

- ``calibrate(model, validation)`` fits one global temperature and one per question type by minimising the
  NLL on the validation split, within ``BOUNDS`` (a fit on the bound is reported, not hidden). It sets
  ``model.temperatures``; ``model.save`` stores them and ``decide`` applies them. The test split is only ever
  scored.
- Two targets, two meanings of "calibrated". Fitted against the gold answer (``"label"``: the top option of
  the gold distribution), the confidence estimates the chance of being right, which is what ECE and a threshold
  need. Fitted against the whole soft gold (``"distribution"``), the answer matches the teacher's spread, which
  is what KL measures. Heads trained on soft gold are already close to the second and, when the gold is spread
  out, under-confident for the first: one temperature cannot serve both.
- So by default (``target="both"``) the probabilities get the distribution's temperatures and the ``confidence``
  field of choice and score answers gets the label's (``model.confidence_temperatures``). A noul answer is one
  probability and keeps the distribution's. ``"label"`` or ``"distribution"`` alone set one temperature for both.
- ``CalibrationReport`` shows accuracy, KL, Brier and ECE (10 and 15 bins) before and after, reliability
  diagrams, confidence histograms and the risk-coverage curve (accuracy of the decisions kept as the
  confidence threshold rises).

Why validation only: temperatures fitted on the training split see a model that fits its own data too well, so
they come out near 1 (or below) and leave it over-confident on new inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from scipy.optimize import minimize_scalar

from .data import QUESTION_TYPES, Split
from .heads import calibrated, soft_cross_entropy, targets
from .metrics import Scores, expected_calibration_error, reliability_bins, score

BOUNDS = (0.05, 20.0)  # a temperature outside this range means the model, not its confidence, needs fixing
TARGETS = ("label", "distribution")  # fit against the gold answer (for ECE) or the soft gold (for KL)
CALIBRATIONS = ("both", *TARGETS)  # both: probabilities to the distribution, the confidence field to the answer
ECE_BIN_CHOICES = (10, 15)  # ECE moves with the binning: report both


@dataclass
class DecisionLogits:
    """Head logits and gold of every decision of a split, one group per (workflow, question)."""

    cases: Split
    groups: list[dict] = field(default_factory=list)  # workflow, question, type, rows, logits, gold, label

    def nll(self, temperatures: dict[str, float], types=QUESTION_TYPES, target: str = "label") -> float:
        """Mean cross-entropy of the decisions whose type is in ``types`` against the gold answer (``label``)
        or the soft gold (``distribution``), at these temperatures."""
        key = {"label": "label", "distribution": "gold"}[target]
        total, count = 0.0, 0
        for g in self.groups:
            if g["type"] in types:
                total += soft_cross_entropy(g["logits"] / temperatures[g["type"]], g[key]).item() * len(g["rows"])
                count += len(g["rows"])
        return total / max(count, 1)

    def predictions(self, temperatures: dict[str, float]) -> list[dict[str, np.ndarray]]:
        """Per case and question, the calibrated probabilities in option order (what ``metrics.score`` takes)."""
        out: list[dict[str, np.ndarray]] = [{} for _ in self.cases]
        for g in self.groups:
            probs = calibrated(g["logits"], temperatures[g["type"]]).numpy().astype(np.float64)
            for j, i in enumerate(g["rows"]):
                out[i][g["question"]] = probs[j]
        return out

    def confidences(self, temperatures: dict[str, float]) -> list[dict[str, float]]:
        """Per case, the ``confidence`` field of its choice and score answers at these temperatures."""
        out: list[dict[str, float]] = [{} for _ in self.cases]
        for g in self.groups:
            if g["type"] != "noul":
                top = calibrated(g["logits"], temperatures[g["type"]]).max(dim=-1).values.tolist()
                for j, i in enumerate(g["rows"]):
                    out[i][g["question"]] = top[j]
        return out


@torch.no_grad()
def decision_logits(model, cases: Split) -> DecisionLogits:
    """Run ``model`` on ``cases`` once and keep the raw head outputs beside the gold."""
    output = model.split_output(cases)
    target = targets(cases)
    result = DecisionLogits(cases)
    for workflow, per_question in output.logits.items():
        for qid, z in per_question.items():
            gold = target.gold[workflow][qid]
            result.groups.append({"workflow": workflow, "question": qid, "type": model.schema[workflow][qid].type,
                                  "rows": output.rows[workflow], "logits": z.cpu(), "gold": gold,
                                  "label": gold_answer(gold)})
    return result


def gold_answer(gold: torch.Tensor) -> torch.Tensor:
    """One-hot rows of the gold's top option, ties to the first-listed (the benchmark's accuracy rule)."""
    top = torch.as_tensor(np.argmax(gold.numpy(), axis=-1))
    return torch.nn.functional.one_hot(top, gold.shape[-1]).float()


@dataclass(frozen=True)
class TemperatureFit:
    scope: str  # "global" or a question type
    target: str  # "label" or "distribution"
    temperature: float
    at_bound: bool  # the optimum lies on (or beyond) the edge of BOUNDS
    nll_before: float
    nll_after: float


def fit_temperature(logits: DecisionLogits, types=QUESTION_TYPES, scope: str = "global",
                    bounds: tuple[float, float] = BOUNDS, target: str = "label") -> TemperatureFit:
    """The temperature minimising the NLL of the decisions of ``types`` against ``target`` (searched in log T)."""
    if target not in TARGETS:
        raise ValueError(f"target is {target!r}; expected one of {', '.join(TARGETS)}")

    def nll(log_t: float) -> float:
        return logits.nll(dict.fromkeys(QUESTION_TYPES, math.exp(log_t)), types, target)

    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    best = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    at_bound = min(best.x - lo, hi - best.x) < 1e-2
    return TemperatureFit(scope, target, math.exp(best.x), bool(at_bound), nll(0.0), float(best.fun))


@dataclass
class CalibrationReport:
    """Temperatures fitted on validation, and the scores before and after on every split given."""

    fits: list[TemperatureFit]
    temperatures: dict[str, float]  # what the model now applies to its probabilities, per question type
    confidence_temperatures: dict[str, float] | None  # and to the confidence field (None: the top probability)
    scores: dict[tuple[str, str], Scores]  # (split, "before" | "after") -> per-decision scores

    def temperature_table(self) -> pd.DataFrame:
        table = pd.DataFrame([f.__dict__ for f in self.fits]).set_index(["target", "scope"])
        return table.round({"temperature": 3, "nll_before": 4, "nll_after": 4})

    def table(self) -> pd.DataFrame:
        rows = {}
        for (split, stage), s in self.scores.items():
            row = s.summary().iloc[0]
            rows[(split, stage)] = {"decisions": int(row["decisions"]), "accuracy": row["accuracy"], "kl": row["kl"],
                                    "brier": row["brier"],
                                    **{f"ece ({b} bins)": expected_calibration_error(s.decisions["confidence"],
                                                                                 s.decisions["correct"], b)
                                       for b in ECE_BIN_CHOICES},
                                    **{f"ece of confidence ({b} bins)": s.confidence_ece(bins=b)
                                       for b in ECE_BIN_CHOICES}}
        table = pd.DataFrame.from_dict(rows, orient="index")
        table.index.names = ["split", "temperature"]
        return table

    def reliability(self, split: str, stage: str, bins: int = 10) -> pd.DataFrame:
        d = self.scores[(split, stage)].decisions
        return reliability_bins(d["confidence"], d["correct"], bins)

    def risk_coverage(self, split: str, stage: str = "after") -> pd.DataFrame:
        return risk_coverage(self.scores[(split, stage)])

    def coverage_at(self, split: str, thresholds=(0.5, 0.6, 0.7, 0.8, 0.9), stage: str = "after") -> pd.DataFrame:
        """For each confidence threshold t: the share of decisions whose confidence is at least t (answered) and
        their accuracy. Thresholds above every confidence are left out."""
        curve = self.risk_coverage(split, stage)
        rows = {f"confidence >= {t}": curve[curve["threshold"] >= t].iloc[-1] for t in thresholds
                if (curve["threshold"] >= t).any()}
        return pd.DataFrame({name: {"answered": row["coverage"], "accuracy when answered": row["accuracy"]}
                             for name, row in rows.items()}).T

    def reliability_figure(self, split: str, bins: int = 10):
        from .plots import reliability_diagram

        return reliability_diagram({stage: self.reliability(split, stage, bins) for stage in ("before", "after")},
                                   title=f"Reliability on {split} ({bins} bins)")

    def confidence_figure(self, split: str):
        from .plots import confidence_histogram

        return confidence_histogram({stage: self.scores[(split, stage)].decisions for stage in ("before", "after")},
                                    title=f"Top-answer confidence on {split}")

    def risk_coverage_figure(self, split: str):
        from .plots import risk_coverage_curve

        return risk_coverage_curve({stage: self.risk_coverage(split, stage) for stage in ("before", "after")},
                                   title=f"Risk-coverage on {split}")


def risk_coverage(scores: Scores) -> pd.DataFrame:
    """Keep the decisions whose confidence is at least each threshold: the share kept and their accuracy."""
    d = scores.decisions.sort_values("confidence", ascending=False, kind="stable")
    kept = np.arange(1, len(d) + 1)
    return pd.DataFrame({"threshold": d["confidence"].to_numpy(), "coverage": kept / len(d),
                         "accuracy": d["correct"].cumsum().to_numpy() / kept})


def fitted_where(model, fit_on: dict[str, Split], test: Split) -> pd.DataFrame:
    """One global temperature (to the answer) fitted on each split of ``fit_on`` (name -> split), and the ECE it
    gives on ``test``: a temperature fitted on the heads' own training data suits a model that looks better than
    it is."""
    test_logits = decision_logits(model, test)
    rows = {}
    for name, cases in fit_on.items():
        fit = fit_temperature(decision_logits(model, cases))
        ece = score(test, test_logits.predictions(dict.fromkeys(QUESTION_TYPES, fit.temperature))).overall()["ece"]
        rows[f"fitted on {name}"] = {"temperature": fit.temperature, "test ECE": ece}
    return pd.DataFrame.from_dict(rows, orient="index")


def _fit(logits: DecisionLogits, per_type: bool, target: str, bounds) -> tuple[list[TemperatureFit], dict]:
    fits = [fit_temperature(logits, scope="global", bounds=bounds, target=target)]
    temperatures = dict.fromkeys(QUESTION_TYPES, fits[0].temperature)
    if per_type:
        for t in sorted({g["type"] for g in logits.groups}):
            fits.append(fit_temperature(logits, (t,), scope=t, bounds=bounds, target=target))
            temperatures[t] = fits[-1].temperature
    return fits, temperatures


def calibrate(model, validation: Split, *others: Split, per_type: bool = True, target: str = "both",
              bounds: tuple[float, float] = BOUNDS) -> CalibrationReport:
    """Fit temperatures on ``validation`` and set them on ``model``; score ``validation`` and ``others`` (the test
    split, say) before and after. ``target``: "both" (probabilities to the soft gold, the confidence field to the
    gold answer), "label" or "distribution" (one set of temperatures for both). Only ``validation`` is fitted."""
    if target not in CALIBRATIONS:
        raise ValueError(f"target is {target!r}; expected one of {', '.join(CALIBRATIONS)}")
    logits = {s.name: decision_logits(model, s) for s in (validation, *others)}
    fit_on = logits[validation.name]
    fits, temperatures = _fit(fit_on, per_type, "distribution" if target == "both" else target, bounds)
    confidence = None
    if target == "both":
        label_fits, confidence = _fit(fit_on, per_type, "label", bounds)
        fits += label_fits
    ones = dict.fromkeys(QUESTION_TYPES, 1.0)
    scores = {}
    for name, split_logits in logits.items():
        scores[(name, "before")] = score(split_logits.cases, split_logits.predictions(ones))
        scores[(name, "after")] = score(split_logits.cases, split_logits.predictions(temperatures),
                                        split_logits.confidences(confidence or temperatures))
    model.temperatures.update(temperatures)
    model.confidence_temperatures = confidence
    return CalibrationReport(fits, temperatures, confidence, scores)
