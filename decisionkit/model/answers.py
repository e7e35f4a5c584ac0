"""The answer policy: from a decision model's logits to the answers it gives.

- Temperatures (``temperature``): the one place they are applied from; fitted on validation by
  ``calibration.calibrate``, for the probabilities and, apart, for the ``confidence`` field.
- The distance weight (``heads_weights``): with a router (``routing.Router``), an input far from the training data
  keeps a weight w < 1 of the heads' answers: its probabilities become w * heads + (1 - w) * the training prior and
  its confidence w * the heads' confidence (``answer_parts``), so a threshold on ``confidence`` alone sends it to a
  human. ``raw=True``: the calibrated heads alone.
- Answers in the System One shape (``decide``, ``decide_many``, ``route``; ``systemone`` checks the questions and
  formats each answer), and per-split probabilities and confidences for the metrics (``outputs``, ``predict``).

``AnswerMixin`` holds them as methods, and ``model.DecisionModel`` inherits it, as every transformers model inherits
``generate`` from ``GenerationMixin``: the model computes logits, the mixin turns them into answers.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from ..contract import systemone
from ..data.cases import Question, Split, render_state
from .heads import calibrated


class AnswerMixin:
    """What a decision model answers, from its logits (see the module's docstring)."""

    def temperature(self, question_type: str, confidence: bool = False) -> float:
        """The temperature that divides a question type's logits: for its probabilities, or for its ``confidence``
        field when that was fitted apart (``calibration.calibrate``)."""
        if confidence and self.confidence_temperatures:
            return self.confidence_temperatures[question_type]
        return self.temperatures[question_type]

    def answer_parts(self, logits: dict[str, torch.Tensor], workflow: str, weight: float = 1.0,
                     priors: dict | None = None) -> dict[str, tuple]:
        """``(probabilities, confidence)`` per question from one input's head logits. With ``weight`` w < 1 (an
        input far from the training data), the probabilities become w * heads + (1 - w) * the training prior, and
        the confidence (the chance the answer is right) w * the heads' confidence in that answer: an input unlike
        any the heads were fitted on has no answer they know to be right. A noul answer has no confidence field.
        ``priors`` (workflow -> question -> distribution): the router's unless given."""
        out = {}
        for qid, z in logits.items():
            kind = self.schema[workflow][qid].type
            p = calibrated(z, self.temperature(kind)).double().cpu().numpy()
            sure = calibrated(z, self.temperature(kind, confidence=True)).double().cpu().numpy()
            if weight < 1:
                p = weight * p + (1 - weight) * (self.router.priors if priors is None else priors)[workflow][qid]
            out[qid] = (p, None if kind == "noul" else float(weight * sure[int(np.argmax(p))]))
        return out

    def readout(self, output, weights: np.ndarray | None = None
                ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, float]]]:
        """Per input of ``output`` (a ``DecisionOutput``) and question, the probabilities (in option order) and the
        ``confidence`` field that ``decide`` answers with, at the heads' ``weights`` (default 1: the heads alone)."""
        weights = np.ones(len(output.workflows)) if weights is None else weights
        probabilities: list[dict[str, np.ndarray]] = []
        confidences: list[dict[str, float]] = []
        for logits, workflow, weight in zip(output.per_case(), output.workflows, weights):
            parts = self.answer_parts(logits, workflow, weight)
            probabilities.append({qid: p for qid, (p, _) in parts.items()})
            confidences.append({qid: c for qid, (_, c) in parts.items() if c is not None})
        return probabilities, confidences

    def heads_weights(self, output, raw: bool = False) -> np.ndarray:
        """Per input of ``output``, the weight the heads' answers keep: 1 inside the range of the training features,
        falling towards 0 beyond it (``routing.Router.weight``); all 1 without a router or with ``raw``."""
        if raw or self.router is None:
            return np.ones(len(output.workflows))
        return self.router.output_weights(output)[1]

    @torch.inference_mode()
    def outputs(self, cases: Split, raw: bool = False) -> tuple[list[dict[str, np.ndarray]], list[dict[str, float]]]:
        """``readout`` of a whole split, distance-aware when a router is fitted: what ``metrics.score`` takes.
        ``raw=True``: the calibrated heads alone."""
        output = self.split_output(cases)
        return self.readout(output, self.heads_weights(output, raw))

    def predict(self, cases: Split, raw: bool = False) -> list[dict[str, np.ndarray]]:
        """The probabilities of ``outputs``."""
        return self.outputs(cases, raw)[0]

    def _answers(self, logits: dict[str, torch.Tensor], workflow: str, questions: dict[str, Question],
                 weight: float) -> dict[str, dict]:
        """System One answers to ``questions`` from one input's logits (``DecisionOutput.per_case``)."""
        parts = self.answer_parts({qid: logits[qid] for qid in questions}, workflow, weight)
        return {qid: systemone.answer(q, *parts[qid]) for qid, q in questions.items()}

    def _read(self, state: Any, questions: dict | None, workflow: str | None, every: bool = False):
        """The output for one state (every trained question of its workflow with ``every``, as the router scores
        them; else the asked ones), its workflow and the asked questions."""
        workflow, asked = systemone.check(self.schema, questions, workflow)
        output = self(**self.tokenize([render_state(state, workflow)]), workflows=[workflow],
                      questions=None if every else list(asked), states=[state])
        return output, workflow, asked

    @torch.inference_mode()
    def decide(self, state: Any, questions: dict | None = None, workflow: str | None = None,
               raw: bool = False) -> dict[str, dict]:
        """Answer ``questions`` (System One shape; default: every trained question) about ``state``. With a router,
        the answers are distance-aware (``answer_parts``); ``raw=True`` gives the calibrated heads alone. A state
        longer than ``spec.max_length`` tokens is cut there, as the training features were; the server refuses it
        instead (422 on field 'state'), since a client cannot see the cut."""
        output, workflow, asked = self._read(state, questions, workflow)
        return self._answers(output.per_case()[0], workflow, asked, self.heads_weights(output, raw)[0])

    @torch.inference_mode()
    def route(self, state: Any, questions: dict | None = None, workflow: str | None = None,
              raw: bool = False) -> dict:
        """``decide`` plus a routing verdict: ``{"answers", "verdict": "answer" | "human", "reason", "scores"}``.
        The scores cover every trained question of the workflow, as when the threshold was set; the verdict does
        not depend on ``raw``, which only changes the answers shown."""
        self._require_router()
        output, workflow, asked = self._read(state, questions, workflow, every=True)
        scores = self.router.scores(self, output).iloc[0]  # its "in-domain" column is the answers' weight
        weight = 1.0 if raw else float(scores["in-domain"])
        return self._routed(scores, self._answers(output.per_case()[0], workflow, asked, weight))

    def _require_router(self) -> None:
        if self.router is None:
            raise ValueError("this model has no anomaly threshold; fit one with "
                             "decisionkit.training.anomaly.fit_router(model, train, validation) and save the model")

    def _routed(self, scores: pd.Series, answers: dict) -> dict:
        """The answers, the router's verdict on ``scores`` (one input's row of ``Router.scores``) and the scores."""
        scores = scores.to_dict()
        return {"answers": answers, **self.router.verdict(scores), "scores": {k: float(v) for k, v in scores.items()}}

    @torch.inference_mode()
    def decide_many(self, requests: Sequence[dict], batch_size: int = 16, route: bool = False) -> list[dict]:
        """``decide`` for many requests (each ``{"state", "questions"?, "workflow"?}``), or ``route`` with
        ``route=True``: states of similar length share one padded forward pass, ``batch_size`` at a time. Each
        answer agrees with ``decide``'s for the same request within ``precision.ANSWER_TOLERANCE`` of the compute
        dtype: 1e-5 on every probability and confidence in float32 (padding changes only the sums' order), 0.02 in
        bfloat16, whose CPU kernels depend on the batch's shape; a choice or score changes only where its top two
        options lie within twice that (``systemone.disagreements`` checks it)."""
        if route:
            self._require_router()
        checked = [systemone.check(self.schema, r.get("questions"), r.get("workflow")) for r in requests]
        texts = [render_state(r["state"], workflow) for r, (workflow, _) in zip(requests, checked)]
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths share a batch: less padding
        results: list[dict | None] = [None] * len(texts)
        for lo in range(0, len(texts), batch_size):
            rows = order[lo:lo + batch_size]
            output = self(**self.tokenize([texts[i] for i in rows]), workflows=[checked[i][0] for i in rows],
                          states=[requests[i]["state"] for i in rows])
            scores = self.router.scores(self, output) if route else None
            # with a router's scores at hand, their "in-domain" column is the weight: no second distance computation
            weights = scores["in-domain"].to_numpy() if route else self.heads_weights(output)
            logits = output.per_case()
            for j, i in enumerate(rows):
                answers = self._answers(logits[j], *checked[i], weights[j])
                results[i] = self._routed(scores.iloc[j], answers) if route else answers
        return results
