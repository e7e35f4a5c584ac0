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

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from scipy.optimize import minimize_scalar

from ..data.cases import QUESTION_TYPES, Split
from ..data.metrics import Scores, expected_calibration_error, paired_difference, reliability_bins, score
from ..model.fitting import cross_fit
from ..model.heads import calibrated, soft_cross_entropy, targets

BOUNDS = (0.05, 20.0)  # a temperature outside this range means the model, not its confidence, needs fixing
TARGETS = ("label", "distribution")  # fit against the gold answer (for ECE) or the soft gold (for KL)
CALIBRATIONS = ("both", *TARGETS)  # both: probabilities to the distribution, the confidence field to the answer
ECE_BIN_CHOICES = (10, 15)  # ECE moves with the binning: report both
CALIBRATION_FOLDS = 5  # small data: folds of train cross-fitted, and folds of the pool the rule is decided on
STAGES = ("before", "as fitted", "after")  # T = 1, the temperatures as fitted, and after the rule (small data)


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

    def subset(self, positions) -> DecisionLogits:
        """The decisions of the cases at ``positions`` (in that order)."""
        new = {int(i): j for j, i in enumerate(positions)}
        out = DecisionLogits(Split(self.cases.name, [self.cases[i] for i in new], self.cases.source))
        for g in self.groups:
            kept = [j for j, i in enumerate(g["rows"]) if i in new]
            if kept:
                out.groups.append({**g, "rows": [new[g["rows"][j]] for j in kept],
                                   **{key: g[key][kept] for key in ("logits", "gold", "label")}})
        return out

    def tempered(self, temperatures: dict[str, float]) -> DecisionLogits:
        """The same decisions with each group's logits divided by its type's temperature (then read at T = 1)."""
        return DecisionLogits(self.cases, [{**g, "logits": g["logits"] / temperatures[g["type"]]} for g in self.groups])

    @staticmethod
    def joined(parts: list[DecisionLogits], name: str) -> DecisionLogits:
        """The cases of ``parts`` one after the other, with their decisions."""
        cases: list = []
        groups: list[dict] = []
        for part in parts:
            groups += [{**g, "rows": [len(cases) + i for i in g["rows"]]} for g in part.groups]
            cases += part.cases.cases
        return DecisionLogits(Split(name, cases, parts[0].cases.source), groups)


@torch.no_grad()
def decision_logits(model, cases: Split) -> DecisionLogits:
    """Run ``model`` on ``cases`` once and keep the raw head outputs beside the gold."""
    return _from_output(model, cases, model.split_output(cases))


def out_of_fold_logits(model, train: Split, folds: int = CALIBRATION_FOLDS) -> DecisionLogits:
    """Every case of ``train`` (the cases ``model``'s heads were fitted on) scored by heads, and a hybrid's trees,
    fitted without it on the other ``folds`` folds by ``model.head_recipe`` (``fitting.cross_fit``): predictions as
    held out as validation's, and many more of them. Cases come fold by fold."""
    if not model.backbone.frozen or model.head_recipe is None:
        raise ValueError("out-of-fold logits need heads fitted on a frozen backbone by a known recipe "
                         "(model.head_recipe); a fine-tuned model has none: calibrate it on validation")
    features = model.split_features(train)
    parts = []
    for fold in cross_fit(model, train, features, folds, structured=model.structured is not None):
        held = Split(train.name, [train[i] for i in fold.held], train.source)
        with torch.no_grad():
            output = model.read(features[fold.held], held.case_workflows, heads=fold.heads, states=held.states,
                                structured=fold.structured)
        parts.append(_from_output(model, held, output))
    return DecisionLogits.joined(parts, f"{train.name} (out of fold)")


def _from_output(model, cases: Split, output) -> DecisionLogits:
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


@dataclass
class TemperatureRule:
    """What ``temperature_rule`` decided on a pool of held-out predictions: the temperatures fitted on all of it,
    those kept, and the cross-validated evidence for each."""

    name: str  # what the pool's held-out predictions are called in a table
    fits: list[TemperatureFit]  # on the whole pool, to the soft gold and to the answer
    fitted: dict[str, float]  # the probabilities' temperatures as fitted, per question type
    fitted_confidence: dict[str, float]  # the confidence field's, as fitted
    temperatures: dict[str, float]  # the probabilities' after the rule (1.0 where a fitted one did not help)
    confidence_temperatures: dict[str, float]  # the confidence field's after the rule
    decisions: pd.DataFrame  # (temperature of, question type) -> fitted T, held-out loss and ECE each way, kept, why
    scores: dict[str, Scores]  # the pool's held-out predictions: "before" (T = 1) and "as fitted" (each fold's T)


def temperature_rule(pool: DecisionLogits, folds: int = CALIBRATION_FOLDS,
                     bounds: tuple[float, float] = BOUNDS) -> TemperatureRule:
    """Fit the temperatures per question type on ``pool`` (probabilities to the soft gold, confidence to the answer,
    as ``calibrate`` does), and keep each only if it helps held-out predictions: split the cases into ``folds``
    folds, fit on the other folds, read each fold at its fitted temperatures and at T = 1, and pool the folds. A
    probabilities' temperature is kept when its held-out KL is lower than at T = 1 and the held-out ECE of the top
    probability is not higher; a confidence temperature when the held-out log loss of the gold answer is lower and
    the held-out ECE of the confidence field is not higher. Otherwise T = 1. (A yes/no answer carries no separate
    confidence: its confidence temperature is 1.)"""
    fold = np.random.default_rng(0).permutation(len(pool.cases)) % folds
    held, tempered = [], {target: [] for target in TARGETS}
    for k in range(folds):
        inside, out = pool.subset(np.flatnonzero(fold != k)), pool.subset(np.flatnonzero(fold == k))
        held.append(out)
        for target in TARGETS:
            tempered[target].append(out.tempered(_fit(inside, True, target, bounds)[1]))
    name = f"held out ({folds}-fold)"
    raw = DecisionLogits.joined(held, name)
    tempered = {target: DecisionLogits.joined(parts, name) for target, parts in tempered.items()}
    ones = dict.fromkeys(QUESTION_TYPES, 1.0)
    scores = {"before": score(raw.cases, raw.predictions(ones)),
              "as fitted": score(raw.cases, tempered["distribution"].predictions(ones),
                                 tempered["label"].confidences(ones))}
    fits, fitted = _fit(pool, True, "distribution", bounds)
    label_fits, fitted_confidence = _fit(pool, True, "label", bounds)
    kept = {"distribution": dict(ones), "label": dict(ones)}
    rows = {}
    for t in sorted({g["type"] for g in pool.groups}):
        b, f = (scores[stage].decisions[scores[stage].decisions["type"] == t] for stage in ("before", "as fitted"))
        checks = [("probabilities", "distribution", fitted, "KL", b["kl"].mean(), f["kl"].mean(),
                   expected_calibration_error(b["confidence"], b["correct"]),
                   expected_calibration_error(f["confidence"], f["correct"]))]
        if t != "noul":
            checks.append(("confidence", "label", fitted_confidence, "log loss of the answer",
                           raw.nll(ones, (t,), "label"), tempered["label"].nll(ones, (t,), "label"),
                           expected_calibration_error(b["answer_confidence"], b["correct"]),
                           expected_calibration_error(f["answer_confidence"], f["correct"])))
        for of, target, temperatures, loss, loss_one, loss_fitted, ece_one, ece_fitted in checks:
            keep = bool(loss_fitted < loss_one and ece_fitted <= ece_one)
            if keep:
                kept[target][t] = temperatures[t]
            why = (f"lowers {loss}, ECE not higher" if keep else
                   f"{loss} not lower" if loss_fitted >= loss_one else "raises ECE")
            rows[(of, t)] = {"fitted T": temperatures[t], "held-out loss": loss, "loss at T = 1": loss_one,
                             "loss at fitted T": loss_fitted, "ECE at T = 1": ece_one, "ECE at fitted T": ece_fitted,
                             "kept": keep, "T after the rule": kept[target][t], "why": why}
    decisions = pd.DataFrame.from_dict(rows, orient="index")
    decisions.index.names = ["temperature of", "type"]
    return TemperatureRule(name, fits + label_fits, fitted, fitted_confidence, kept["distribution"], kept["label"],
                           decisions, scores)


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
    model.temperatures.update(rule.temperatures)
    model.confidence_temperatures = rule.confidence_temperatures
    return HeldOutCalibration(rule.fits, rule.temperatures, rule.confidence_temperatures, scores, rule,
                              {f"{train.name} (out of fold)": len(train), validation.name: len(validation),
                               "folds": folds})


def split_uses(p) -> pd.DataFrame:
    """What each split of preset ``p``'s data (a preset or its name) is used for when its heads are trained and
    calibrated on small data (``calibrate_out_of_fold``), and its cases. With a dev slice (``dev_per_workflow``), it
    picks L2 and steps and the validation split is left to calibration; without one, validation does both."""
    from .presets import preset
    from .trainer import held_out_test, training_pool, training_splits

    p = preset(p) if isinstance(p, str) else p
    _, dev, validation = training_splits(p)
    train, test = training_pool(p), held_out_test(p)
    if dev is validation:
        rows = {"train": (len(train), "fits the heads; scored out of fold for the temperatures"),
                "validation": (len(validation), "picks L2 and steps, and fits the temperatures")}
    else:
        rows = {"train": (len(train), "fits the heads (without its dev slice while L2 and steps are picked); "
                                      "scored out of fold for the temperatures"),
                "dev (a slice of train)": (len(dev), "picks L2 and steps"),
                "validation": (len(validation), "fits the temperatures, with train out of fold; nothing else")}
    rows["test"] = (len(test), "scored only")
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["cases", "used for"])
    table.index.name = "split"
    return table
