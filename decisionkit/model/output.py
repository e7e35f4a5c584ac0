"""What the heads (and a hybrid's trees) give for a batch: ``DecisionOutput``, read by training, calibration, routing
and the answers alike, and ``read``, the one way heads and trees are read on standardized features: by the model
(``DecisionModel.read``) and by the models of each fold of a cross-fit (``fitting.Fold.read``), which are their own
objects and never pass through the model they were fitted for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..data.questions import Question
from .heads import HeadSet, Targets, decision_loss, group_rows, ungroup
from .structured import StructuredPart


@dataclass
class DecisionOutput:
    """What one pass of a ``DecisionModel`` gives, in the manner of transformers' ``SequenceClassifierOutput``:
    the pooled features, the logits of every question and, when targets were given, the loss. Everything that reads
    the heads (training, calibration, routing, answers) reads this."""

    features: torch.Tensor  # (inputs, dim): the standardized pooled vector the heads read
    workflows: list[str]  # each input's workflow
    logits: dict[str, dict[str, torch.Tensor]]  # workflow -> question -> (that workflow's inputs, options)
    rows: dict[str, list[int]]  # workflow -> which inputs its logits belong to (``heads.group_rows``)
    loss: torch.Tensor | None = None  # soft-gold cross-entropy per decision, when targets were given
    surprise: np.ndarray | None = None  # a hybrid's: per input, the share of field checks that fail (fields.py)

    def per_case(self) -> list[dict[str, torch.Tensor]]:
        """The logits by input: question id -> logits, in input order (``heads.ungroup``)."""
        return ungroup(self.logits, self.rows, len(self.workflows))


def read(schema: dict[str, dict[str, Question]], heads: HeadSet, structured: StructuredPart | None,
         features: torch.Tensor, workflows: Sequence[str], target: Targets | None = None, ordinal: float = 0.0,
         questions: Sequence[str] | None = None, states: Sequence[Any] | None = None) -> DecisionOutput:
    """``heads`` on standardized ``features``, one row per input of ``workflows`` (``questions``: only these, of one
    workflow), averaged with ``structured``'s trees on the fields of ``states`` when there are trees; the loss
    against ``target`` when given."""
    rows = group_rows(list(workflows))
    logits = heads.read(features, rows, questions)
    surprise = None
    if structured is not None:
        if states is None or len(states) != len(workflows):
            raise ValueError("this hybrid model reads each input's state fields too: pass states, one per input")
        logits, surprise = structured.mix(logits, states, rows)
    loss = None if target is None else decision_loss(schema, logits, target, ordinal)
    return DecisionOutput(features, list(workflows), logits, rows, loss, surprise)
