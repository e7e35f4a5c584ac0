"""The hybrid's second part: the fields and trees of every workflow, and how each question mixes them with the heads.

``StructuredPart`` holds, per workflow, the ``fields.Fields`` a state is flattened into and the ``trees.Trees`` of
each question, and the weight w of p = w * heads + (1 - w) * trees per question. The weights of any number of
parts are chosen on a grid of the simplex from out-of-fold answers (``simplex_weights``, ``part_weights``,
``blend``; two parts: ``mix_weight``, ``mix_weights``, ``mixed``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from ..data.cases import Split
from .fields import Fields
from .trees import TREE_ROUNDS, Trees, tree_settings

MIX_STEPS = 20  # mixing weights are multiples of 1/20


def simplex_grid(parts: int) -> np.ndarray:
    """Every vector of ``parts`` weights that are multiples of 1 / ``MIX_STEPS`` and sum to 1, the first weight
    ascending (for two parts: (0, 1), (0.05, 0.95), ..., (1, 0))."""
    heads = [p for p in itertools.product(range(MIX_STEPS + 1), repeat=parts - 1) if sum(p) <= MIX_STEPS]
    return np.array([[*p, MIX_STEPS - sum(p)] for p in heads]) / MIX_STEPS


def simplex_weights(parts: Sequence[np.ndarray], gold: np.ndarray) -> np.ndarray:
    """The weights on ``simplex_grid`` whose mixture of ``parts`` (each cases x options, predicted on cases none of
    them was fitted on) has the lowest soft cross-entropy against ``gold``; the first such vector on a tie."""
    grid = simplex_grid(len(parts))
    mixtures = np.einsum("gk,kno->gno", grid, np.stack(parts))
    losses = -(gold * np.log(np.maximum(mixtures, 1e-12))).sum(axis=2).mean(axis=1)
    return grid[int(np.argmin(losses))]


def mix_weight(language: np.ndarray, trees: np.ndarray, gold: np.ndarray) -> float:
    """The weight w whose mixture w * language + (1 - w) * trees has the lowest soft cross-entropy against ``gold``
    (``simplex_weights`` of the two)."""
    return float(simplex_weights([language, trees], gold)[0])


def part_weights(cases: Split, sources: Sequence[list[dict]]) -> dict[str, dict[str, np.ndarray]]:
    """``simplex_weights`` of ``sources`` for every (workflow, question) of ``cases``, from each source's per-case
    predictions (question -> probabilities, one dict per case, out of fold)."""
    weights: dict[str, dict[str, np.ndarray]] = {}
    for workflow in dict.fromkeys(cases.case_workflows):
        mine = [i for i, c in enumerate(cases) if c.workflow == workflow]
        weights[workflow] = {qid: simplex_weights([np.stack([s[i][qid] for i in mine]) for s in sources],
                                                  np.stack([cases[i].gold[qid].probabilities for i in mine]))
                             for qid in cases[mine[0]].questions}
    return weights


def blend(cases: Split, sources: Sequence[list[dict]], weights: dict[str, dict[str, Sequence[float]]]) -> list[dict]:
    """Per case and question: the sources' probabilities weighted by that question's ``weights`` (one per source)."""
    return [{qid: sum(w * s[i][qid] for w, s in zip(weights[c.workflow][qid], sources)) for qid in c.questions}
            for i, c in enumerate(cases)]


def mix_weights(cases: Split, language: list[dict], trees: list[dict]) -> dict[str, dict[str, float]]:
    """``mix_weight`` for every (workflow, question) of ``cases``: the language part's weight, the trees having the
    rest (``part_weights`` of the two)."""
    return {workflow: {qid: float(w[0]) for qid, w in per_question.items()}
            for workflow, per_question in part_weights(cases, [language, trees]).items()}


def mixed(cases: Split, language: list[dict], trees: list[dict], weights: dict[str, dict[str, float]]) -> list[dict]:
    """Per case: w * language + (1 - w) * trees for each of its questions."""
    return blend(cases, [language, trees], {workflow: {qid: (w, 1 - w) for qid, w in per_question.items()}
                                            for workflow, per_question in weights.items()})


@dataclass
class StructuredPart:
    """The fields and trees of every workflow, and how much each question's answer trusts the language model:
    ``weights[workflow][question]`` = w in p = w * heads + (1 - w) * trees (1: the heads alone, 0: the trees)."""

    fields: dict[str, Fields]
    trees: dict[str, dict[str, Trees]]
    weights: dict[str, dict[str, float]]
    rounds: int = TREE_ROUNDS  # boosting rounds of every tree (``tree_settings``): what a refit on folds uses

    @classmethod
    def fit(cls, cases: Split, weights: dict[str, dict[str, float]] | None = None, seed: int = 0,
            rounds: int = TREE_ROUNDS) -> "StructuredPart":
        """Fields and trees per workflow, fitted on ``cases`` against their soft gold with ``rounds`` boosting
        rounds; ``weights`` default to 1 (the heads alone): set them from out-of-fold predictions (``mix_weight``)."""
        fields, trees = {}, {}
        for workflow in dict.fromkeys(cases.case_workflows):
            mine = [c for c in cases if c.workflow == workflow]
            fields[workflow] = Fields.fit([c.state for c in mine])
            x = fields[workflow].encode([c.state for c in mine])
            trees[workflow] = {qid: Trees.fit(x, np.stack([c.gold[qid].probabilities for c in mine]), seed, rounds)
                               for qid in mine[0].questions}
        weights = weights or {w: dict.fromkeys(qs, 1.0) for w, qs in trees.items()}
        return cls(fields, trees, weights, rounds)

    def table(self) -> pd.DataFrame:
        """The mixing weights, one row per (workflow, question), with the fields each workflow's trees read."""
        return pd.DataFrame([{"workflow": w, "question": q, "weight of the heads": v, "weight of the trees": 1 - v,
                              "fields read": len(self.fields[w].columns)}
                             for w, per_question in self.weights.items() for q, v in per_question.items()]
                            ).set_index(["workflow", "question"])

    def probabilities(self, states: Sequence[Any], workflow: str, questions: Sequence[str]) -> dict[str, np.ndarray]:
        """The trees' answer distributions for ``states`` of ``workflow``: question -> (states, options)."""
        x = self.fields[workflow].encode(states)
        return {qid: self.trees[workflow][qid].probabilities(x) for qid in questions}

    def answers(self, cases: Split) -> list[dict[str, np.ndarray]]:
        """The trees' answer distributions for every case of ``cases`` (question -> probabilities), each workflow's
        states encoded together."""
        out: list[dict[str, np.ndarray]] = [{} for _ in cases]
        for workflow in dict.fromkeys(cases.case_workflows):
            mine = [i for i, c in enumerate(cases) if c.workflow == workflow]
            found = self.probabilities([cases[i].state for i in mine], workflow, list(cases[mine[0]].questions))
            for j, i in enumerate(mine):
                out[i] = {qid: p[j] for qid, p in found.items()}
        return out

    def mix(self, logits: dict[str, dict[str, torch.Tensor]], states: Sequence[Any], rows: dict[str, list[int]]
            ) -> tuple[dict[str, dict[str, torch.Tensor]], np.ndarray]:
        """The hybrid's logits: log(w * softmax(heads' logits) + (1 - w) * trees), per workflow and question
        (``rows``: workflow -> positions in ``states``, as ``heads.group_rows`` gives), and each state's
        ``Fields.surprise``, both from one ``encode`` per workflow. Gradients reach the heads' logits; temperatures
        divide these as they divide the heads'."""
        out, surprise = {}, np.zeros(len(states))
        for workflow, per_question in logits.items():
            mine = [states[i] for i in rows[workflow]]
            x = self.fields[workflow].encode(mine)
            surprise[rows[workflow]] = self.fields[workflow].surprise(mine, x)
            trees = {qid: self.trees[workflow][qid].probabilities(x) for qid in per_question}
            out[workflow] = {}
            for qid, z in per_question.items():
                w = self.weights[workflow][qid]
                if w >= 1:
                    out[workflow][qid] = z
                    continue
                tree = torch.as_tensor(trees[qid], dtype=z.dtype, device=z.device).clamp_min(1e-12)
                parts = [torch.log(tree) + math.log(1 - w)]
                if w > 0:
                    parts.append(torch.log_softmax(z, dim=-1) + math.log(w))
                out[workflow][qid] = torch.logsumexp(torch.stack(parts), dim=0)
        return out, surprise

    def tensors(self) -> dict[str, np.ndarray]:
        return {k: v for workflow, per_question in self.trees.items() for qid, trees in per_question.items()
                for k, v in trees.tensors(f"structured.{workflow}/{qid}").items()}

    def config(self) -> dict:
        return {"fields": {w: f.to_json() for w, f in self.fields.items()},
                "trees": {w: {q: t.config() for q, t in qs.items()} for w, qs in self.trees.items()},
                "weights": self.weights, "tree_settings": tree_settings(self.rounds)}

    @classmethod
    def from_saved(cls, config: dict, arrays: dict[str, np.ndarray]) -> "StructuredPart":
        trees = {w: {q: Trees.from_saved(c, arrays, f"structured.{w}/{q}") for q, c in qs.items()}
                 for w, qs in config["trees"].items()}
        rounds = config["tree_settings"]["max_iter"]
        return cls({w: Fields.from_json(f) for w, f in config["fields"].items()}, trees,
                   {w: dict(qs) for w, qs in config["weights"].items()}, rounds)
