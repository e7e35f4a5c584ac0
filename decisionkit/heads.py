"""Decision heads: one small linear layer per typed question, all reading the same pooled vector.

A head's output size is its question's option count; a softmax over it is the answer distribution. Heads are
keyed by ``workflow/question`` so one model can serve several workflows, each asking its own questions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from . import settings
from .data import Question, Split


def head_key(workflow: str, qid: str) -> str:
    return f"{workflow}/{qid}"


class HeadSet(nn.Module):
    """Linear heads for every (workflow, question) of a schema."""

    def __init__(self, schema: dict[str, dict[str, Question]], in_features: int):
        super().__init__()
        self.schema = schema
        self.heads = nn.ModuleDict()
        for workflow, questions in schema.items():
            for qid, question in questions.items():
                head = nn.Linear(in_features, len(question.options))
                nn.init.zeros_(head.weight)  # start uniform: every option equally likely until trained
                nn.init.zeros_(head.bias)
                self.heads[head_key(workflow, qid)] = head

    def forward(self, features: torch.Tensor, workflow: str, questions=None) -> dict[str, torch.Tensor]:
        """Logits per question id for a batch of ``features`` that all come from ``workflow``."""
        qids = list(self.schema[workflow]) if questions is None else list(questions)
        return {qid: self.heads[head_key(workflow, qid)](features) for qid in qids}

    def probabilities(self, features: torch.Tensor, workflow: str, questions=None,
                      temperatures: dict[str, float] | None = None) -> dict[str, torch.Tensor]:
        """Answer distributions per question; ``temperatures`` (per question type) divide the logits first."""
        return {qid: calibrated(z, (temperatures or {}).get(self.schema[workflow][qid].type, 1.0))
                for qid, z in self(features, workflow, questions).items()}


def calibrated(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Answer distributions from head logits, divided by a temperature first (temperature scaling)."""
    return torch.softmax(logits / temperature, dim=-1)


def soft_cross_entropy(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -sum_k gold_k log softmax(logits)_k: cross-entropy against soft gold."""
    return -(gold * torch.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def expected_distance(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of E|i - j| / (K - 1), with level i drawn from softmax(logits) and j from the gold: how
    far apart, on the scale, the answer and the gold are. Cross-entropy alone treats a miss by one level like a miss
    by three; this term does not (an ordinal-aware loss for score questions)."""
    levels = torch.arange(logits.shape[-1], dtype=logits.dtype, device=logits.device)
    distance = (levels[:, None] - levels[None, :]).abs() / max(logits.shape[-1] - 1, 1)
    return torch.einsum("bi,ij,bj->b", torch.softmax(logits, dim=-1), distance, gold).mean()


@dataclass
class Targets:
    """Gold distributions of some cases, grouped by workflow and aligned to rows of a feature matrix."""

    rows: dict[str, torch.Tensor]  # workflow -> positions in the feature matrix
    gold: dict[str, dict[str, torch.Tensor]]  # workflow -> question id -> (rows, options)
    decisions: int


def targets(cases: Split, rows: list[int] | None = None, device: str | torch.device = "cpu") -> Targets:
    """Targets of ``cases[rows]`` (default: all), for features whose row j belongs to ``cases[rows[j]]``."""
    rows = list(range(len(cases))) if rows is None else list(rows)
    groups: dict[str, list[int]] = {}
    for position, i in enumerate(rows):
        groups.setdefault(cases[i].workflow, []).append(position)
    gold, decisions = {}, 0
    for workflow, positions in groups.items():
        members = [cases[rows[p]] for p in positions]
        gold[workflow] = {qid: torch.as_tensor(np.stack([c.gold[qid].probabilities for c in members]),
                                               dtype=torch.float32, device=device) for qid in members[0].questions}
        decisions += len(members) * len(gold[workflow])
    return Targets({w: torch.as_tensor(p, device=device) for w, p in groups.items()}, gold, decisions)


def batch_loss(heads: HeadSet, features: torch.Tensor, target: Targets, ordinal: float = 0.0) -> torch.Tensor:
    """Soft cross-entropy averaged over every decision (case x question) in ``target``; with ``ordinal`` > 0,
    score questions add ``ordinal`` times their expected level distance."""
    total = 0.0
    for workflow, rows in target.rows.items():
        for qid, z in heads(features[rows], workflow).items():
            gold = target.gold[workflow][qid]
            loss = soft_cross_entropy(z, gold)
            if ordinal and heads.schema[workflow][qid].type == "score":
                loss = loss + ordinal * expected_distance(z, gold)
            total = total + loss * len(gold)
    return total / target.decisions


def weight_norm(heads: HeadSet) -> torch.Tensor:
    """Sum of squared head weights (biases are not penalised): the L2 term."""
    return sum(head.weight.pow(2).sum() for head in heads.heads.values())


@dataclass
class HeadFit:
    history: list[dict]  # one row every 10 steps: L2, step, train loss, held-out loss
    best_val_loss: float  # on the held-out cases the (L2, step) was picked on
    l2: float
    step: int


def _descent(heads: HeadSet, x: torch.Tensor, target: Targets, l2: float, steps: int, lr: float, ordinal: float):
    """Full-batch AdamW from zero-initialised (uniform) heads: yields ``(step, train loss)`` before each update and
    after the last."""
    for head in heads.heads.values():
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps + 1):
        train_loss = batch_loss(heads, x, target, ordinal)
        yield step, train_loss.item()
        if step < steps:
            optimizer.zero_grad()
            (train_loss + l2 * weight_norm(heads)).backward()
            optimizer.step()


def fit_heads(heads: HeadSet, train: Split, held_out: Split, train_x: torch.Tensor, held_x: torch.Tensor,
              l2_grid=(1e-3, 3e-3, 1e-2), steps: int = 400, lr: float = 0.003, ordinal: float = 0.0,
              progress: bool = True) -> HeadFit:
    """Fit every head at once, full batch, on fixed (standardized) features; for each L2 strength in
    ``l2_grid`` train from zero and keep the (L2, step) with the lowest loss on ``held_out``. Loads that state."""
    train_target = targets(train, device=train_x.device)
    held_target = targets(held_out, device=held_x.device)
    history, best = [], (float("inf"), None, None, 0)
    for l2 in tqdm(l2_grid, desc="heads (L2 grid)", disable=not progress or settings.progress_hidden()):
        for step, train_loss in _descent(heads, train_x, train_target, l2, steps, lr, ordinal):
            if step % 10 == 0 or step == steps:  # step 0 is the uniform start: the fit never ends worse
                with torch.no_grad():
                    held_loss = batch_loss(heads, held_x, held_target).item()
                history.append({"stage": "heads", "l2": l2, "step": step, "train_loss": train_loss,
                                "val_loss": held_loss})
                if held_loss < best[0]:
                    best = (held_loss, copy.deepcopy(heads.state_dict()), l2, step)
    heads.load_state_dict(best[1])
    return HeadFit(history, best[0], best[2], best[3])


def refit_heads(heads: HeadSet, cases: Split, x: torch.Tensor, fit: HeadFit, lr: float = 0.003,
                ordinal: float = 0.0) -> None:
    """Train the heads from zero on ``cases`` at the L2 and for the steps that ``fit`` picked on held-out cases:
    once the choice is made, the held-out cases are training data too."""
    for _ in _descent(heads, x, targets(cases, device=x.device), fit.l2, fit.step, lr, ordinal):
        pass


@torch.no_grad()
def predict(heads: HeadSet, features: torch.Tensor, cases: Split,
            temperatures: dict[str, float] | None = None) -> list[dict[str, np.ndarray]]:
    """Probabilities per case and question in option order (what ``metrics.score`` takes)."""
    out: list[dict[str, np.ndarray]] = [{} for _ in cases]
    for workflow, rows in targets(cases).rows.items():
        for qid, p in heads.probabilities(features[rows.to(features.device)], workflow, None, temperatures).items():
            probs = p.cpu().numpy().astype(np.float64)
            for j, i in enumerate(rows.tolist()):
                out[i][qid] = probs[j]
    return out
