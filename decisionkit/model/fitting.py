"""Fitting the heads on fixed features (stage 1 of training), and fitting them again on folds (cross-fitting).

- ``fit_heads``: every head at once, full batch, from zero (uniform answers), for each L2 strength of a grid;
  the (L2, step) with the lowest loss on held-out cases is kept (``HeadFit``, whose ``recipe`` is that choice).
- ``HeadRecipe``: how the heads were fitted once the choice is made (L2, steps, learning rate, ordinal weight). A
  model keeps its recipe, so that its heads can be fitted again on other cases or other features: on all of train
  (``refit_heads``), on folds of train (``cross_fit``), on the features of an int8 backbone (``latency``).
- ``cross_fit``: for each fold of a set of cases, heads (and a hybrid's other parts) fitted on the other folds. The
  router scores every train case with heads that never saw it (``anomaly.fit_router``); the hybrid picks its mixing
  weights on such out-of-fold answers of every part (``parts_out_of_fold``, ``training.fit_structured``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from sklearn.model_selection import KFold
from tqdm.auto import tqdm

from ..core import settings
from ..data.cases import Split
from .features import standardization
from .heads import HeadSet, Targets, calibrated, decision_loss, group_rows, targets, ungroup, weight_norm
from .output import DecisionOutput, read
from .structured import StructuredPart, blend, part_weights
from .trees import TREE_ROUNDS

STRUCTURED_FOLDS = 5  # folds of train the hybrid's mixing weights are chosen on


@dataclass(frozen=True)
class HeadRecipe:
    """How stage 1 fits the heads, once chosen: full-batch AdamW from zero for ``steps`` steps at ``lr``, with L2
    strength ``l2`` and the ordinal term at weight ``ordinal``."""

    l2: float
    steps: int
    lr: float = 0.003
    ordinal: float = 0.0


@dataclass
class HeadFit:
    """What stage 1 chose on held-out cases."""

    history: list[dict]  # one row every 10 steps: L2, step, train loss, held-out loss
    best_val_loss: float  # on the held-out cases the (L2, step) was picked on
    recipe: HeadRecipe  # the L2 and step picked, at the search's learning rate and ordinal weight


def _head_loss(heads: HeadSet, x: torch.Tensor, target: Targets, ordinal: float = 0.0) -> torch.Tensor:
    return decision_loss(heads.schema, heads.read(x, target.rows), target, ordinal)


def _descent(heads: HeadSet, x: torch.Tensor, target: Targets, l2: float, steps: int, lr: float, ordinal: float):
    """Full-batch AdamW from zero-initialised (uniform) heads: yields ``(step, train loss)`` before each update and
    after the last."""
    for head in heads.heads.values():
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
    # foreach: one fused update over every head's tensors instead of a Python loop over them (torch's default on
    # CPU); the same arithmetic, faster with many small heads (benchmarks/results/choices.md#foreach)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0, foreach=True)
    for step in range(steps + 1):
        train_loss = _head_loss(heads, x, target, ordinal)
        yield step, train_loss.item()
        if step < steps:
            optimizer.zero_grad()
            (train_loss + l2 * weight_norm(heads)).backward()
            optimizer.step()


def fit_heads(heads: HeadSet, train: Split, held_out: Split, train_x: torch.Tensor, held_x: torch.Tensor,
              l2_grid=(1e-3, 3e-3, 1e-2), steps: int = 400, lr: float = 0.003, ordinal: float = 0.0,
              progress: bool = True) -> HeadFit:
    """Stage 1: fit every head at once, full batch, on fixed (standardized) features; for each L2 strength in
    ``l2_grid`` train from zero and keep the (L2, step) with the lowest loss on ``held_out``. Loads that state."""
    train_target = targets(train, device=train_x.device)
    held_target = targets(held_out, device=held_x.device)
    history, best = [], (float("inf"), None, None, 0)
    for l2 in tqdm(l2_grid, desc="heads (L2 grid)", disable=not progress or settings.progress_hidden()):
        for step, train_loss in _descent(heads, train_x, train_target, l2, steps, lr, ordinal):
            if step % 10 == 0 or step == steps:  # step 0 is the uniform start: the fit never ends worse
                with torch.no_grad():
                    held_loss = _head_loss(heads, held_x, held_target).item()
                history.append({"stage": "heads", "l2": l2, "step": step, "train_loss": train_loss,
                                "val_loss": held_loss})
                if held_loss < best[0]:
                    best = (held_loss, copy.deepcopy(heads.state_dict()), l2, step)
    heads.load_state_dict(best[1])
    return HeadFit(history, best[0], HeadRecipe(best[2], best[3], lr, ordinal))


def refit_heads(heads: HeadSet, cases: Split, x: torch.Tensor, recipe: HeadRecipe) -> None:
    """Train the heads from zero on ``cases`` (``x``: their standardized features) as ``recipe`` says: once the
    choice is made on held-out cases, those are training data too."""
    for _ in _descent(heads, x, targets(cases, device=x.device), recipe.l2, recipe.steps, recipe.lr, recipe.ordinal):
        pass


def choose_recipe(pooled: dict[str, np.ndarray], fit: Split, held_out: Split, **search) -> HeadRecipe:
    """The ``HeadRecipe`` stage 1 picks for heads on ``pooled`` (case id -> vector; standardized with ``fit``'s
    statistics): ``fit_heads`` on ``fit``, chosen on ``held_out``; ``search``: ``fit_heads``' L2 grid, steps, rate."""
    fit_x, held_x = (np.stack([pooled[i] for i in split.ids]) for split in (fit, held_out))
    mean, std = standardization(fit_x)
    fit_x, held_x = (torch.as_tensor((x - mean) / std, dtype=torch.float32) for x in (fit_x, held_x))
    return fit_heads(HeadSet(fit.schema(), fit_x.shape[1]), fit, held_out, fit_x, held_x, progress=False,
                     **search).recipe


def heads_answers(pooled: dict[str, np.ndarray], recipe: HeadRecipe):
    """``answers(fitted_on, asked)``, a part ``mix_out_of_fold`` mixes: linear heads fitted from zero by ``recipe``
    on the pooled features of the Split ``fitted_on`` (``pooled``: case id -> vector; standardized with
    ``fitted_on``'s statistics), answering ``asked`` (question -> probabilities, per case)."""
    def answers(fitted_on: Split, asked: Split) -> list[dict[str, np.ndarray]]:
        x = np.stack([pooled[i] for i in fitted_on.ids])
        mean, std = standardization(x)
        heads = HeadSet(fitted_on.schema(), x.shape[1])
        refit_heads(heads, fitted_on, torch.as_tensor((x - mean) / std, dtype=torch.float32), recipe)
        rows = group_rows(asked.case_workflows)
        with torch.no_grad():
            asked_x = torch.as_tensor((np.stack([pooled[i] for i in asked.ids]) - mean) / std, dtype=torch.float32)
            logits = ungroup(heads.read(asked_x, rows), rows, len(asked))
        return [{qid: calibrated(z).double().numpy() for qid, z in case.items()} for case in logits]
    return answers


def fold_assignment(cases: int, folds: int) -> np.ndarray:
    """Each of ``cases`` cases' fold, the same for every call (scikit-learn's ``KFold``, shuffled with a fixed
    seed)."""
    fold = np.empty(cases, dtype=int)
    for k, (_, held) in enumerate(KFold(folds, shuffle=True, random_state=0).split(np.arange(cases))):
        fold[held] = k
    return fold


@dataclass
class OutOfFoldMix:
    """Parts of a model fitted on training cases, each alone and mixed with trees on the fields, and all of them with
    the trees (``mix_out_of_fold``), answering the scored cases."""

    alone: dict[str, list[dict]]  # part -> its answers, fitted on every training case
    hybrid: dict[str, list[dict]]  # part -> w * part + (1 - w) * trees
    together: list[dict]  # every part and the trees, weighted (the same as ``hybrid`` for one part)
    weights: dict[str, dict]  # part name, or "together" -> workflow -> question -> the weights (the trees' last)
    seconds: float  # every fit: the parts' and the trees' on the folds and on all of train
    held_out: dict[str, list[dict]]  # part name or "trees" -> its answers on each training case, out of fold

    def on_scored(self) -> dict[str, list[dict]]:
        """Every row on the scored cases by name: each part, each part + trees, and "together"."""
        return _named(self.alone, self.hybrid, self.together)

    def out_of_fold(self, train: Split) -> dict[str, list[dict]]:
        """``on_scored``'s rows on the training cases out of fold (at the weights chosen on these same answers:
        slightly optimistic, alike for every part)."""
        return _named(*_mixed(train, self.held_out, self.weights))


def _mixed(cases: Split, answers: dict[str, list[dict]], weights: dict[str, dict]):
    """``(alone, hybrid, together)`` of ``answers`` (part name or "trees" -> answers on ``cases``) at ``weights``."""
    parts = [name for name in answers if name != "trees"]
    return ({name: answers[name] for name in parts},
            {name: blend(cases, [answers[name], answers["trees"]], weights[name]) for name in parts},
            blend(cases, [answers[name] for name in [*parts, "trees"]], weights["together"]))


def _named(alone: dict, hybrid: dict, together: list[dict]) -> dict[str, list[dict]]:
    return {**alone, **{f"{name} + trees": answers for name, answers in hybrid.items()}, "together": together}


def mix_out_of_fold(parts: dict, train: Split, scored: Split, folds: int = STRUCTURED_FOLDS,
                    rounds: int = TREE_ROUNDS) -> OutOfFoldMix:
    """Mix parts with trees on the fields as a hybrid mixes its heads. A part is a function
    ``answers(fitted_on, asked)`` that fits it on the Split ``fitted_on`` and returns its probabilities on ``asked``
    (question -> probabilities, per case). Every part and the trees answer each fold of ``train`` fitted on the other
    folds (the trees once per fold for all parts); those answers choose the weights per question
    (``structured.part_weights``): of each part with the trees, and of all parts with the trees. Then all are fitted
    on ``train`` and answer ``scored``."""
    started = time.perf_counter()
    held_out = {name: [{} for _ in train] for name in [*parts, "trees"]}
    fold = fold_assignment(len(train), folds)
    for k in range(folds):
        inside = Split(f"{train.name} - fold {k}", [c for c, f in zip(train, fold) if f != k], train.source)
        held = Split(f"{train.name}, fold {k}", [c for c, f in zip(train, fold) if f == k], train.source)
        answers = {"trees": StructuredPart.fit(inside, rounds=rounds, lexical=False).answers(held)["trees"],
                   **{name: part(inside, held) for name, part in parts.items()}}
        for name, found in answers.items():
            for i, own in zip(np.flatnonzero(fold == k), found):
                held_out[name][i] = own
    final = {"trees": StructuredPart.fit(train, rounds=rounds, lexical=False).answers(scored)["trees"],
             **{name: part(train, scored) for name, part in parts.items()}}
    weights = {name: part_weights(train, [held_out[name], held_out["trees"]]) for name in parts}
    weights["together"] = part_weights(train, [held_out[name] for name in [*parts, "trees"]])
    return OutOfFoldMix(*_mixed(scored, final, weights), weights, time.perf_counter() - started, held_out)


def parts_out_of_fold(parts: StructuredPart, cases: Split, folds: int = STRUCTURED_FOLDS) -> dict[str, list[dict]]:
    """Each of a hybrid's parts beside the heads (``parts``: trees, lexical, fitted on ``cases``) answering every
    case of ``cases`` refitted on the other folds (``StructuredPart.refit``; ``cross_fit``'s folds): part -> one dict
    per case (question -> probabilities; empty where the case's workflow has not that part)."""
    held_out: dict[str, list[dict]] = {}
    fold = fold_assignment(len(cases), folds)
    for k in range(folds):
        inside = Split(f"{cases.name} - fold {k}", [c for c, f in zip(cases, fold) if f != k], cases.source)
        held = Split(f"{cases.name}, fold {k}", [c for c, f in zip(cases, fold) if f == k], cases.source)
        for part, answers in parts.refit(inside).answers(held).items():
            found = held_out.setdefault(part, [{} for _ in cases])
            for i, own in zip(np.flatnonzero(fold == k), answers):
                found[i] = own
    return held_out


@dataclass
class Fold:
    """One fold of a cross-fit: the positions its models were fitted on and the ones they score, the heads (and
    the hybrid's trees, when asked) fitted on the rest. It reads features itself (``read``), as the model does."""

    inside: np.ndarray
    held: np.ndarray
    schema: dict
    heads: HeadSet
    structured: StructuredPart | None

    @torch.no_grad()
    def read(self, features: torch.Tensor, workflows: Sequence[str], target: Targets | None = None,
             states: Sequence[Any] | None = None, trees: bool = True) -> DecisionOutput:
        """This fold's heads (and trees; ``trees=False``: the heads alone) on standardized ``features`` of its
        held-out cases (``output.read``)."""
        return read(self.schema, self.heads, self.structured if trees else None, features, workflows, target,
                    states=states)


def cross_fit(model, cases: Split, features: torch.Tensor, folds: int, structured: bool = False):
    """Yield a ``Fold`` for each of ``folds`` folds of ``cases`` (``features``: theirs, standardized): heads fitted
    on the other folds by ``model.head_recipe``, and with ``structured`` a hybrid's other parts too
    (``StructuredPart.refit``: its weights, boosting rounds and vocabulary). The folds are the same for every call
    on the same cases (``parts_out_of_fold``'s)."""
    fold = fold_assignment(len(cases), folds)
    for k in range(folds):
        inside, held = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        rest = Split(f"{cases.name} - fold {k}", [cases[i] for i in inside], cases.source)
        heads = HeadSet(model.schema, features.shape[1]).to(features.device)
        refit_heads(heads, rest, features[inside], model.head_recipe)
        yield Fold(inside, held, model.schema, heads.eval(), model.structured.refit(rest) if structured else None)
