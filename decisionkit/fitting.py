"""Fitting the heads on fixed features (stage 1 of training), and fitting them again on folds (cross-fitting).

- ``fit_heads``: every head at once, full batch, from zero (uniform answers), for each L2 strength of a grid;
  the (L2, step) with the lowest loss on held-out cases is kept (``HeadFit``, whose ``recipe`` is that choice).
- ``HeadRecipe``: how the heads were fitted once the choice is made (L2, steps, learning rate, ordinal weight). A
  model keeps its recipe, so that its heads can be fitted again on other cases or other features: on all of train
  (``refit_heads``), on folds of train (``cross_fit``), on the features of an int8 backbone (``latency``).
- ``cross_fit``: for each fold of a set of cases, heads (and a hybrid's trees) fitted on the other folds. The router
  scores every train case with heads that never saw it (``anomaly.fit_router``); the hybrid picks its mixing weights
  on such out-of-fold answers (``training.fit_structured``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from . import settings
from .data import Split
from .heads import HeadSet, Targets, decision_loss, targets, weight_norm
from .structured import TREE_ROUNDS, StructuredPart

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
    # CPU); the same arithmetic, measured identical to the last bit, and faster with many small heads
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


@dataclass
class Fold:
    """One fold of a cross-fit: the positions its models were fitted on and the ones they score, the heads (and
    the hybrid's trees, when asked) fitted on the rest."""

    inside: np.ndarray
    held: np.ndarray
    heads: HeadSet
    structured: StructuredPart | None


def cross_fit(model, cases: Split, features: torch.Tensor, folds: int, structured: bool = False,
              rounds: int = TREE_ROUNDS):
    """Yield a ``Fold`` for each of ``folds`` folds of ``cases`` (``features``: theirs, standardized): heads fitted
    on the other folds by ``model.head_recipe``, and with ``structured`` the trees too (at the model's mixing
    weights and boosting rounds, if it has them; else at ``rounds``). The folds are the same for every call on the
    same cases."""
    fold = np.random.default_rng(0).permutation(len(cases)) % folds
    weights = model.structured.weights if model.structured is not None else None
    rounds = model.structured.rounds if model.structured is not None else rounds
    for k in range(folds):
        inside, held = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        rest = Split(f"{cases.name} - fold {k}", [cases[i] for i in inside], cases.source)
        heads = HeadSet(model.schema, features.shape[1]).to(features.device)
        refit_heads(heads, rest, features[inside], model.head_recipe)
        yield Fold(inside, held, heads.eval(), StructuredPart.fit(rest, weights, rounds=rounds) if structured else None)
