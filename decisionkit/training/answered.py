"""One scoring, said plainly: the shipped model's raw answers (the way every ladder row is scored) and, beside them,
what it does as served.

A routed model answers a case far from its training data with the training prior (the distance weight) and sends it
to a human. Scoring those answers as if they were the model's mixes two things: how good its answers are and how
often it declines. ``answered(model, cases)`` keeps them apart:

- ``raw``: the calibrated model before the router (``outputs(raw=True)``): a hybrid's every part, no distance
  weight. The run report's "trained model" rows, the ladder and ``evaluate`` score this, as they score each part;
- ``as_answered``: the distance-aware answers ``decide`` and the server give;
- the cases the router sends to a human (its verdict on each), their share, and the accuracy of the cases it
  answers (as answered), with their count.

``Answered.summary()`` is the one row the report, ``evaluate``, the notebooks and the README read, at the rounding
of ``ROUNDING``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..data.cases import Split
from ..data.metrics import Scores, score

ROUNDING = 3  # digits every accuracy and share of ``summary`` is shown with


@dataclass
class Answered:
    """The shipped model on one split: ``raw`` and ``as_answered`` scores, and the ids of the cases sent to a human."""

    raw: Scores
    as_answered: Scores
    human: list[str]
    cases: int

    def summary(self) -> dict[str, float | int]:
        answered = self.as_answered.decisions[~self.as_answered.decisions["case"].isin(self.human)]
        return {"accuracy (raw)": self.raw.overall()["accuracy"],
                "accuracy as answered": self.as_answered.overall()["accuracy"],
                "sent to a human": len(self.human) / self.cases if self.cases else float("nan"),
                "answered cases": self.cases - len(self.human),
                "accuracy of the answered cases": float(answered["correct"].mean()) if len(answered) else float("nan")}


def shown(summary: dict) -> str:
    """A ``summary`` (saved in a report's JSON) in words, at ``ROUNDING``."""
    r = ROUNDING
    return (f"raw {summary['accuracy (raw)']:.{r}f}; as answered {summary['accuracy as answered']:.{r}f}, "
            f"{summary['sent to a human']:.1%} sent to a human, {summary['accuracy of the answered cases']:.{r}f} on "
            f"the {summary['answered cases']} cases it answers")


def answered(model, cases: Split) -> Answered:
    """``cases`` answered by ``model`` both ways from one pass, with the router's verdict on each (none without a
    router)."""
    output = model.split_output(cases)
    raw = score(cases, *model.readout(output, model.heads_weights(output, raw=True)))
    as_answered = score(cases, *model.readout(output, model.heads_weights(output)))
    human = []
    if model.router is not None:
        verdicts = model.router.scores(model, output).to_dict(orient="records")
        human = [case.id for case, row in zip(cases, verdicts) if model.router.verdict(row)["verdict"] == "human"]
    return Answered(raw, as_answered, human, len(cases))
