"""Temperature scaling, fitted on the validation split only, and what it changes.

A trained head's softmax is often over-confident: its top answer says 95% where it is right 80% of the time.
Temperature scaling (Guo et al., 2017) divides the logits by one number T > 0 before the softmax; T > 1 softens
every answer, T < 1 sharpens it. The ranking of the options never changes, so accuracy does not either.

- ``calibrate(model, validation)`` fits one global temperature and one per question type by minimising the
  NLL on the validation split, within ``BOUNDS`` (a fit on the bound is reported, not hidden). It sets
  ``model.temperatures`` (a ``Temperatures``); ``model.save`` stores them and ``decide`` applies them. The test split is only ever
  scored.
- Two targets, two meanings of "calibrated". Fitted against the gold answer (``"label"``: the top option of
  the gold distribution), the confidence estimates the chance of being right, which is what ECE and a threshold
  need. Fitted against the whole soft gold (``"distribution"``), the answer matches the teacher's spread, which
  is what KL measures. Heads trained on soft gold are already close to the second and, when the gold is spread
  out, under-confident for the first: one temperature cannot serve both.
- So by default (``target="both"``) the probabilities get the distribution's temperatures and the ``confidence``
  field of choice and score answers gets the label's (``model.temperatures.confidence``). A noul answer is one
  probability and keeps the distribution's. ``"label"`` or ``"distribution"`` alone set one temperature for both.
- ``CalibrationReport`` shows accuracy, KL, Brier and ECE (10 and 15 bins) before and after, reliability
  diagrams, confidence histograms and the risk-coverage curve (accuracy of the decisions kept as the
  confidence threshold rises).
- Small data (``calibrate_out_of_fold``): a validation split of a few dozen cases gives a temperature that fits
  its noise as much as the model. The temperatures are then fitted on more held-out predictions: every train case
  scored by heads cross-fitted without it (``fitting.cross_fit``), plus validation (which the model never trained
  on, when a dev slice of train chose its L2 and steps). And each is kept only if it helps data it was not fitted
  on (``temperature_rule``): across folds of that pool, a temperature fitted on the other folds must lower the
  held-out loss it minimises (KL to the soft gold for the probabilities, the log loss of the gold answer for the
  confidence) without raising the held-out ECE of what it sets (the top probability, the confidence field);
  otherwise T = 1. ``HeldOutCalibration`` shows both ways: the temperatures as fitted and after the rule.

Why validation only: temperatures fitted on the training split see a model that fits its own data too well, so
they come out near 1 (or below) and leave it over-confident on new inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..data.cases import Split
from ..data.metrics import Scores, expected_calibration_error, paired_difference, reliability_bins, score
from ..data.questions import QUESTION_TYPES
from ..model.heads import Temperatures
from .temperature import (
    BOUNDS,
    CALIBRATION_FOLDS,
    TARGETS,
    DecisionLogits,
    TemperatureFit,
    TemperatureRule,
    decision_logits,
    fit_temperature,
    fit_temperatures,
    out_of_fold_logits,
    temperature_rule,
)

CALIBRATIONS = ("both", *TARGETS)  # both: probabilities to the distribution, the confidence field to the answer
ECE_BIN_CHOICES = (10, 15)  # ECE moves with the binning: report both
STAGES = ("before", "as fitted", "after")  # T = 1, the temperatures as fitted, and after the rule (small data)


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

    def change(self, split: str, metrics=("ece", "kl", "brier"), before: str = "before",
               after: str = "after") -> pd.DataFrame:
        """Per metric: the ``change`` from stage ``before`` to stage ``after`` on ``split``'s decisions and its 95%
        bootstrap interval over cases (``metrics.paired_difference``): is it more than the noise of which cases
        were drawn?"""
        pair = self.scores[(split, before)], self.scores[(split, after)]
        return pd.DataFrame({m: dict(zip(("change", "95% interval, low", "95% interval, high"),
                                          paired_difference(*pair, m))) for m in metrics}).T

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
        from ..core.plots import reliability_diagram

        return reliability_diagram({stage: self.reliability(split, stage, bins) for stage in ("before", "after")},
                                   title=f"Reliability on {split} ({bins} bins)")

    def confidence_figure(self, split: str):
        from ..core.plots import confidence_histogram

        return confidence_histogram({stage: self.scores[(split, stage)].decisions for stage in ("before", "after")},
                                    title=f"Top-answer confidence on {split}")

    def risk_coverage_figure(self, split: str):
        from ..core.plots import risk_coverage_curve

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


def refuse_routed(model) -> None:
    """The order of fitting: temperatures first, then the router, whose threshold is set on the calibrated
    confidence; new temperatures under an old router would move every answer across its threshold unseen."""
    if model.router is not None:
        raise ValueError("this model already has a router, whose threshold was set on its current temperatures: "
                         "calibrate before fit_router (to calibrate again, set model.router = None, calibrate, then "
                         "fit the router again)")


def uncalibrated(model, heads_alone: bool = False):
    """``model`` as it stood before calibration, changed in place and returned: temperatures 1 and no router (its
    threshold was set on the calibrated confidence, so it goes with them: ``refuse_routed``). ``heads_alone`` also
    drops a hybrid's trees, so that temperatures act on one part's probabilities (the heads alone)."""
    model.temperatures = Temperatures()
    model.router = None
    if heads_alone:
        model.structured = None
    return model


def calibrate(model, validation: Split, *others: Split, per_type: bool = True, target: str = "both",
              bounds: tuple[float, float] = BOUNDS) -> CalibrationReport:
    """Fit temperatures on ``validation`` and set them on ``model``; score ``validation`` and ``others`` (the test
    split, say) before and after. ``target``: "both" (probabilities to the soft gold, the confidence field to the
    gold answer), "label" or "distribution" (one set of temperatures for both). Only ``validation`` is fitted."""
    if target not in CALIBRATIONS:
        raise ValueError(f"target is {target!r}; expected one of {', '.join(CALIBRATIONS)}")
    refuse_routed(model)
    logits = {s.name: decision_logits(model, s) for s in (validation, *others)}
    fit_on = logits[validation.name]
    fits, temperatures = fit_temperatures(fit_on, per_type, "distribution" if target == "both" else target, bounds)
    confidence = None
    if target == "both":
        label_fits, confidence = fit_temperatures(fit_on, per_type, "label", bounds)
        fits += label_fits
    ones = dict.fromkeys(QUESTION_TYPES, 1.0)
    scores = {}
    for name, split_logits in logits.items():
        scores[(name, "before")] = score(split_logits.cases, split_logits.predictions(ones))
        scores[(name, "after")] = score(split_logits.cases, split_logits.predictions(temperatures),
                                        split_logits.confidences(confidence or temperatures))
    model.temperatures = Temperatures(dict(temperatures), confidence)
    return CalibrationReport(fits, temperatures, confidence, scores)


@dataclass
class HeldOutCalibration(CalibrationReport):
    """``calibrate_out_of_fold``'s report. ``table()``: each scored split "before" (T = 1), "as fitted" and "after"
    the rule, and the pool's held-out predictions (the rule's evidence) before and as fitted; ``rule_table()``:
    which temperature was kept, and why; ``temperature_table()``: the fits on the whole pool."""

    rule: TemperatureRule
    fitted_on: dict[str, int]  # cases of each part of the pool, and the folds

    def rule_table(self) -> pd.DataFrame:
        return self.rule.decisions

    def summary(self, split: str) -> str:
        """One line: ``split``'s KL and ECE at T = 1, as fitted and after the rule, and the temperatures kept."""
        rows = self.table().loc[split]
        kept = self.rule.decisions[self.rule.decisions["kept"]]
        return (f"{split} KL " + ", ".join(f"{rows.loc[s, 'kl']:.3f} {s}" for s in STAGES) + "; ECE "
                + ", ".join(f"{rows.loc[s, 'ece (10 bins)']:.3f} {s}" for s in STAGES) + "; temperatures kept: "
                + (", ".join(f"{of} of {t} answers T = {row['fitted T']:.2f}" for (of, t), row in kept.iterrows())
                   or "none (T = 1)"))


def calibrate_out_of_fold(model, train: Split, validation: Split, *others: Split, folds: int = CALIBRATION_FOLDS,
                          bounds: tuple[float, float] = BOUNDS) -> HeldOutCalibration:
    """Calibrate on small data: fit the temperatures on held-out predictions of ``train`` (the cases the heads were
    fitted on, each scored by heads cross-fitted without it: ``out_of_fold_logits``) and of ``validation`` (scored
    by the model, which must not have chosen anything on it), keep each only where ``temperature_rule`` finds it
    helps held-out data, and set those on ``model``. ``others`` (the test split, say) are only scored: at T = 1, at
    the temperatures as fitted and after the rule."""
    refuse_routed(model)
    seen = set(train.ids)
    for cases in (validation, *others):
        shared = sorted(set(cases.ids) & seen)
        if shared:
            raise ValueError(f"{len(shared)} cases of {cases.name!r} (ids {shared[:3]}) are also in a split before "
                             "it; expected train, validation and each split scored to hold cases of their own")
        seen |= set(cases.ids)
    pool = DecisionLogits.joined([out_of_fold_logits(model, train, folds), decision_logits(model, validation)],
                                 f"{train.name} (out of fold) + {validation.name}")
    rule = temperature_rule(pool, folds, bounds)
    scores = {(rule.name, stage): s for stage, s in rule.scores.items()}
    stages = dict(zip(STAGES, ((dict.fromkeys(QUESTION_TYPES, 1.0), None),
                               (rule.fitted, rule.fitted_confidence),
                               (rule.temperatures, rule.confidence_temperatures))))
    for cases in others:
        logits = decision_logits(model, cases)
        for stage, (temperatures, confidence) in stages.items():
            scores[(cases.name, stage)] = score(cases, logits.predictions(temperatures),
                                                None if confidence is None else logits.confidences(confidence))
    model.temperatures = Temperatures(dict(rule.temperatures), rule.confidence_temperatures)
    return HeldOutCalibration(rule.fits, rule.temperatures, rule.confidence_temperatures, scores, rule,
                              {f"{train.name} (out of fold)": len(train), validation.name: len(validation),
                               "folds": folds})
