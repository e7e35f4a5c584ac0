"""Reading answers in the System One shape (``systemone.answer`` writes them): each answer's probability per
option, its confidence, and the lowest confidence of a request's answers, the one number a routing threshold reads.

A yes/no (``noul``) answer carries P(true) alone: its options are ``false`` and ``true``, and as it has no
``confidence`` field, its top probability, max(P(true), P(false)), stands in wherever a confidence is read.
"""

from __future__ import annotations


def answer_probabilities(answer: dict) -> dict[str, float]:
    """Option -> probability of one answer (a noul answer's: false 1 - P(true), true P(true))."""
    return answer.get("probabilities") or {"false": 1 - answer["noul"], "true": answer["noul"]}


def answer_confidence(answer: dict) -> float:
    """One answer's ``confidence`` field, or a noul answer's top probability."""
    return answer["confidence"] if "confidence" in answer else max(answer["noul"], 1 - answer["noul"])


def lowest_confidence(answers: dict) -> float:
    """The smallest ``confidence`` field over System One answers (choice and score answers carry one; answers to
    yes/no questions alone fall back to their top probability)."""
    carried = [a["confidence"] for a in answers.values() if "confidence" in a]
    return min(carried) if carried else min(answer_confidence(a) for a in answers.values())
