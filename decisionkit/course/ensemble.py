"""Averaging decision models in probability space: several trained models answer the same cases and their
probabilities are averaged, question by question. Models whose errors differ (heads on different frozen backbones)
gain the most; the cost is one forward pass of each backbone per decision.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..data.cases import Split


def average(models: Sequence, cases: Split) -> list[dict[str, np.ndarray]]:
    """The mean of ``models``' answers (``predict``: calibrated, and distance-aware where a router is fitted) on
    ``cases``, one ``{question id: probabilities}`` per case, as ``metrics.score`` takes them."""
    if not models:
        raise ValueError("models is empty; expected at least one trained decision model")
    return mean_answers([model.predict(cases) for model in models])


def mean_answers(answers: Sequence[list[dict[str, np.ndarray]]]) -> list[dict[str, np.ndarray]]:
    """Answers already predicted on the same cases (one list per model, as ``predict`` returns them), averaged
    question by question."""
    if not answers or len({len(a) for a in answers}) != 1:
        raise ValueError("answers must hold one list per model, each with one entry per case of the same cases")
    return [{qid: np.mean([a[i][qid] for a in answers], axis=0) for qid in answers[0][i]}
            for i in range(len(answers[0]))]
