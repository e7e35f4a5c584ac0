"""Decision heads: one small linear layer per typed question, all reading the same pooled vector.

A head's output size is its question's option count; a softmax over it is the answer distribution. Heads are
keyed by ``workflow/question`` so one model can serve several workflows, each asking its own questions.
Here: the heads, how a batch of mixed workflows is grouped for them (``group_rows``), the gold aligned the same
way (``targets``) and the loss. Fitting them is ``fitting.py`` (stage 1); fine-tuning under them, ``finetune.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.cases import Split
from ..data.questions import QUESTION_TYPES, Question


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

    def read(self, features: torch.Tensor, rows: dict[str, list[int]],
             questions=None) -> dict[str, dict[str, torch.Tensor]]:
        """Logits of every workflow's rows of ``features`` (``rows``: workflow -> row positions, as ``group_rows``
        gives): workflow -> question id -> (rows, options)."""
        return {workflow: self(features[positions], workflow, questions) for workflow, positions in rows.items()}


def group_rows(workflows: list[str]) -> dict[str, list[int]]:
    """Row positions per workflow, in order of first appearance: how a batch of mixed workflows meets its heads
    (each workflow has its own). Logits, gold and losses are all grouped this one way."""
    groups: dict[str, list[int]] = {}
    for position, workflow in enumerate(workflows):
        groups.setdefault(workflow, []).append(position)
    return groups


def ungroup(logits: dict[str, dict[str, torch.Tensor]], rows: dict[str, list[int]], count: int) -> list[dict]:
    """Grouped logits (workflow -> question -> one row per position in ``rows[workflow]``) back in input order: one
    dict (question -> its row) per each of ``count`` inputs. The inverse of ``group_rows``' grouping."""
    out: list[dict] = [{} for _ in range(count)]
    for workflow, positions in rows.items():
        for qid, z in logits[workflow].items():
            for j, i in enumerate(positions):
                out[i][qid] = z[j]
    return out


def calibrated(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Answer distributions from head logits, divided by a temperature first (temperature scaling)."""
    return torch.softmax(logits / temperature, dim=-1)


def expected_distance(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of E|i - j| / (K - 1), with level i drawn from softmax(logits) and j from the gold: how
    far apart, on the scale, the answer and the gold are. Cross-entropy alone treats a miss by one level like a miss
    by three; this term does not (an ordinal-aware loss for score questions)."""
    levels = torch.arange(logits.shape[-1], dtype=logits.dtype, device=logits.device)
    distance = (levels[:, None] - levels[None, :]).abs() / max(logits.shape[-1] - 1, 1)
    return torch.einsum("bi,ij,bj->b", torch.softmax(logits, dim=-1), distance, gold).mean()


@dataclass
class Targets:
    """Gold distributions of some cases, grouped by workflow (``group_rows``) and aligned to rows of a feature
    matrix."""

    rows: dict[str, list[int]]  # workflow -> positions in the feature matrix
    gold: dict[str, dict[str, torch.Tensor]]  # workflow -> question id -> (rows, options)
    decisions: int


def targets(cases: Split, rows: list[int] | None = None, device: str | torch.device = "cpu") -> Targets:
    """Targets of ``cases[rows]`` (default: all), for features whose row j belongs to ``cases[rows[j]]``."""
    members = [cases[i] for i in (range(len(cases)) if rows is None else rows)]
    groups = group_rows([c.workflow for c in members])
    gold, decisions = {}, 0
    for workflow, positions in groups.items():
        chosen = [members[p] for p in positions]
        gold[workflow] = {qid: torch.as_tensor(np.stack([c.gold[qid].probabilities for c in chosen]),
                                               dtype=torch.float32, device=device) for qid in chosen[0].questions}
        decisions += len(chosen) * len(gold[workflow])
    return Targets(groups, gold, decisions)


def decision_loss(schema: dict[str, dict[str, Question]], logits: dict[str, dict[str, torch.Tensor]],
                  target: Targets, ordinal: float = 0.0) -> torch.Tensor:
    """Soft cross-entropy averaged over every decision (case x question) in ``target``, from logits grouped as
    ``HeadSet.read`` gives them; with ``ordinal`` > 0, score questions add ``ordinal`` times their expected level
    distance."""
    total = 0.0
    for workflow, per_question in logits.items():
        for qid, z in per_question.items():
            gold = target.gold[workflow][qid]
            loss = F.cross_entropy(z, gold.to(z.dtype))  # probability targets: -sum_k gold_k log softmax(z)_k
            if ordinal and schema[workflow][qid].type == "score":
                loss = loss + ordinal * expected_distance(z, gold)
            total = total + loss * len(gold)
    return total / target.decisions


def weight_norm(heads: HeadSet) -> torch.Tensor:
    """Sum of squared head weights (biases are not penalised): the L2 term."""
    return sum(head.weight.pow(2).sum() for head in heads.heads.values())


@dataclass
class Temperatures:
    """What a model divides each question type's logits by before the softmax: for the probabilities and, when
    fitted apart (``calibration.calibrate``), for the ``confidence`` field of choice and score answers (None: the
    confidence is the top probability). A part of the model, saved with it; 1 everywhere until calibrated."""

    probabilities: dict[str, float] = field(default_factory=lambda: dict.fromkeys(QUESTION_TYPES, 1.0))
    confidence: dict[str, float] | None = None

    def of(self, question_type: str, confidence: bool = False) -> float:
        """The temperature of ``question_type``'s probabilities, or of its ``confidence`` field."""
        if confidence and self.confidence:
            return self.confidence[question_type]
        return self.probabilities[question_type]

    @property
    def fitted(self) -> bool:
        return self.confidence is not None or any(t != 1.0 for t in self.probabilities.values())
