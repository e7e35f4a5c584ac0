"""Temperatures: the decisions' raw logits kept beside their gold, temperatures fitted to them, and the rule that
keeps a temperature only where it helps held-out data (``calibration.py`` applies them to a model and reports).

- ``DecisionLogits`` (one ``LogitGroup`` per workflow and question) holds a split's logits once, so any temperature
  is tried without running the model again; ``decision_logits`` runs the model, ``out_of_fold_logits`` reads every
  train case with heads cross-fitted without it.
- ``fit_temperature``: the temperature minimising the cross-entropy against the gold answer (``"label"``) or the
  soft gold (``"distribution"``), searched in log T within ``BOUNDS``; ``fit_temperatures``: global and per type.
- ``temperature_rule``: across folds of a pool, each type's temperature fitted on the other folds must lower the
  held-out loss it minimises without raising the held-out ECE of what it sets; otherwise T = 1 (``RuleCheck``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar

from ..data.cases import Split
from ..data.metrics import Scores, expected_calibration_error, score
from ..data.questions import QUESTION_TYPES
from ..model.fitting import cross_fit, fold_assignment
from ..model.heads import calibrated, targets

BOUNDS = (0.05, 20.0)  # a temperature outside this range means the model, not its confidence, needs fixing
TARGETS = ("label", "distribution")  # fit against the gold answer (for ECE) or the soft gold (for KL)
CALIBRATION_FOLDS = 5  # small data: folds of train cross-fitted, and folds of the pool the rule is decided on


@dataclass(frozen=True)
class LogitGroup:
    """The decisions of one (workflow, question) in a split: which cases, their raw logits, their gold."""

    workflow: str
    question: str
    type: str  # the question's type: noul, choice or score
    rows: list[int]  # positions of the cases in the split
    logits: torch.Tensor  # (cases, options), before any temperature
    gold: torch.Tensor  # (cases, options), the soft gold
    label: torch.Tensor  # (cases, options), one-hot gold answers

    def subset(self, kept: list[int], rows: list[int]) -> LogitGroup:
        """The decisions at ``kept`` (indices into this group), placed at ``rows``."""
        return replace(self, rows=rows, logits=self.logits[kept], gold=self.gold[kept], label=self.label[kept])


@dataclass
class DecisionLogits:
    """Head logits and gold of every decision of a split, one group per (workflow, question)."""

    cases: Split
    groups: list[LogitGroup] = field(default_factory=list)

    def nll(self, temperatures: dict[str, float], types=QUESTION_TYPES, target: str = "label") -> float:
        """Mean cross-entropy of the decisions whose type is in ``types`` against the gold answer (``label``)
        or the soft gold (``distribution``), at these temperatures."""
        total, count = 0.0, 0
        for g in self.groups:
            if g.type in types:
                wanted = g.label if target == "label" else g.gold
                total += F.cross_entropy(g.logits / temperatures[g.type], wanted).item() * len(g.rows)
                count += len(g.rows)
        return total / max(count, 1)

    def predictions(self, temperatures: dict[str, float]) -> list[dict[str, np.ndarray]]:
        """Per case and question, the calibrated probabilities in option order (what ``metrics.score`` takes)."""
        out: list[dict[str, np.ndarray]] = [{} for _ in self.cases]
        for g in self.groups:
            probs = calibrated(g.logits, temperatures[g.type]).numpy().astype(np.float64)
            for j, i in enumerate(g.rows):
                out[i][g.question] = probs[j]
        return out

    def confidences(self, temperatures: dict[str, float]) -> list[dict[str, float]]:
        """Per case, the ``confidence`` field of its choice and score answers at these temperatures."""
        out: list[dict[str, float]] = [{} for _ in self.cases]
        for g in self.groups:
            if g.type != "noul":
                top = calibrated(g.logits, temperatures[g.type]).max(dim=-1).values.tolist()
                for j, i in enumerate(g.rows):
                    out[i][g.question] = top[j]
        return out

    def subset(self, positions) -> DecisionLogits:
        """The decisions of the cases at ``positions`` (in that order)."""
        new = {int(i): j for j, i in enumerate(positions)}
        out = DecisionLogits(Split(self.cases.name, [self.cases[i] for i in new], self.cases.source))
        for g in self.groups:
            kept = [j for j, i in enumerate(g.rows) if i in new]
            if kept:
                out.groups.append(g.subset(kept, [new[g.rows[j]] for j in kept]))
        return out

    def tempered(self, temperatures: dict[str, float]) -> DecisionLogits:
        """The same decisions with each group's logits divided by its type's temperature (then read at T = 1)."""
        return DecisionLogits(self.cases, [replace(g, logits=g.logits / temperatures[g.type]) for g in self.groups])

    @staticmethod
    def joined(parts: list[DecisionLogits], name: str) -> DecisionLogits:
        """The cases of ``parts`` one after the other, with their decisions."""
        cases: list = []
        groups: list[LogitGroup] = []
        for part in parts:
            groups += [replace(g, rows=[len(cases) + i for i in g.rows]) for g in part.groups]
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
        output = fold.read(features[fold.held], held.case_workflows, states=held.states)
        parts.append(_from_output(model, held, output))
    return DecisionLogits.joined(parts, f"{train.name} (out of fold)")


def _from_output(model, cases: Split, output) -> DecisionLogits:
    target = targets(cases)
    result = DecisionLogits(cases)
    for workflow, per_question in output.logits.items():
        for qid, z in per_question.items():
            gold = target.gold[workflow][qid]
            result.groups.append(LogitGroup(workflow, qid, model.schema[workflow][qid].type, output.rows[workflow],
                                            z.cpu(), gold, gold_answer(gold)))
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


def fit_temperatures(logits: DecisionLogits, per_type: bool, target: str,
                     bounds: tuple[float, float] = BOUNDS) -> tuple[list[TemperatureFit], dict[str, float]]:
    """One global temperature, and with ``per_type`` one per question type (each type's replacing the global one
    for its decisions): the fits, and the temperature per type."""
    fits = [fit_temperature(logits, scope="global", bounds=bounds, target=target)]
    temperatures = dict.fromkeys(QUESTION_TYPES, fits[0].temperature)
    if per_type:
        for t in sorted({g.type for g in logits.groups}):
            fits.append(fit_temperature(logits, (t,), scope=t, bounds=bounds, target=target))
            temperatures[t] = fits[-1].temperature
    return fits, temperatures


@dataclass(frozen=True)
class RuleCheck:
    """One temperature of one question type weighed on held-out predictions: kept if it lowers the loss it minimises
    without raising the ECE of what it sets."""

    of: str  # "probabilities" or "confidence"
    target: str  # what it was fitted to: "distribution" or "label"
    temperature: float  # as fitted on the whole pool
    loss: str  # the held-out loss it must lower
    loss_one: float  # at T = 1
    loss_fitted: float  # at the temperatures fitted on the other folds
    ece_one: float
    ece_fitted: float

    @property
    def keep(self) -> bool:
        return bool(self.loss_fitted < self.loss_one and self.ece_fitted <= self.ece_one)

    def row(self) -> dict:
        why = (f"lowers {self.loss}, ECE not higher" if self.keep else
               f"{self.loss} not lower" if self.loss_fitted >= self.loss_one else "raises ECE")
        return {"fitted T": self.temperature, "held-out loss": self.loss, "loss at T = 1": self.loss_one,
                "loss at fitted T": self.loss_fitted, "ECE at T = 1": self.ece_one,
                "ECE at fitted T": self.ece_fitted, "kept": self.keep, "why": why}


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
    fold = fold_assignment(len(pool.cases), folds)
    held, tempered = [], {target: [] for target in TARGETS}
    for k in range(folds):
        inside, out = pool.subset(np.flatnonzero(fold != k)), pool.subset(np.flatnonzero(fold == k))
        held.append(out)
        for target in TARGETS:
            tempered[target].append(out.tempered(fit_temperatures(inside, True, target, bounds)[1]))
    name = f"held out ({folds}-fold)"
    raw = DecisionLogits.joined(held, name)
    tempered = {target: DecisionLogits.joined(parts, name) for target, parts in tempered.items()}
    ones = dict.fromkeys(QUESTION_TYPES, 1.0)
    scores = {"before": score(raw.cases, raw.predictions(ones)),
              "as fitted": score(raw.cases, tempered["distribution"].predictions(ones),
                                 tempered["label"].confidences(ones))}
    fits, fitted = fit_temperatures(pool, True, "distribution", bounds)
    label_fits, fitted_confidence = fit_temperatures(pool, True, "label", bounds)
    kept = {"distribution": dict(ones), "label": dict(ones)}
    rows = {}
    for t in sorted({g.type for g in pool.groups}):
        b, f = (scores[stage].decisions[scores[stage].decisions["type"] == t] for stage in ("before", "as fitted"))
        checks = [RuleCheck("probabilities", "distribution", fitted[t], "KL", b["kl"].mean(), f["kl"].mean(),
                            expected_calibration_error(b["confidence"], b["correct"]),
                            expected_calibration_error(f["confidence"], f["correct"]))]
        if t != "noul":
            checks.append(RuleCheck("confidence", "label", fitted_confidence[t], "log loss of the answer",
                                    raw.nll(ones, (t,), "label"), tempered["label"].nll(ones, (t,), "label"),
                                    expected_calibration_error(b["answer_confidence"], b["correct"]),
                                    expected_calibration_error(f["answer_confidence"], f["correct"])))
        for check in checks:
            if check.keep:
                kept[check.target][t] = check.temperature
            rows[(check.of, t)] = {**check.row(), "T after the rule": kept[check.target][t]}
    decisions = pd.DataFrame.from_dict(rows, orient="index")
    decisions.index.names = ["temperature of", "type"]
    return TemperatureRule(name, fits + label_fits, fitted, fitted_confidence, kept["distribution"], kept["label"],
                           decisions, scores)
