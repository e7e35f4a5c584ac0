"""The hybrid's parts beside the heads, and how each question mixes them.

``StructuredPart`` holds, per workflow whose states are JSON, the ``fields.Fields`` a state is flattened into and the
``trees.Trees`` of each question; the lexical part (``lexical.Lexical``: TF-IDF and a linear model per question)
for every workflow; and per question the weights of p = w_heads * heads + w_trees * trees + w_lexical * lexical
(a workflow of text states mixes the heads and the lexical part only). The weights are chosen on a grid of the
simplex from out-of-fold answers (``simplex_weights``; by part name: ``choose_weights``, ``named_blend``; by
position: ``part_weights``, ``blend``; two parts: ``mix_weight``, ``mix_weights``, ``mixed``), so a part that does
not help a question gets weight 0 there.
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
from .lexical import Lexical
from .trees import TREE_ROUNDS, Trees, tree_settings

MIX_STEPS = 20  # mixing weights are multiples of 1/20
PARTS = ("heads", "trees", "lexical")  # what a hybrid's question can mix, in this order


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


def choose_weights(cases: Split, answers: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, float]]]:
    """``simplex_weights`` for every (workflow, question) of ``cases`` over the parts that answer its workflow:
    ``answers``: part name -> per-case predictions (question -> probabilities, out of fold; an empty dict where the
    case's workflow has not that part). Returns workflow -> question -> part -> weight."""
    weights: dict[str, dict[str, dict[str, float]]] = {}
    for workflow in dict.fromkeys(cases.case_workflows):
        mine = [i for i, c in enumerate(cases) if c.workflow == workflow]
        parts = [name for name, found in answers.items() if found[mine[0]]]
        chosen = part_weights(Split(workflow, [cases[i] for i in mine], cases.source),
                              [[answers[name][i] for i in mine] for name in parts])[workflow]
        weights[workflow] = {qid: {name: float(v) for name, v in zip(parts, w)} for qid, w in chosen.items()}
    return weights


def named_blend(cases: Split, answers: dict[str, list[dict]], weights: dict[str, dict[str, dict[str, float]]]
                ) -> list[dict]:
    """Per case and question: the parts' probabilities (``answers``: part name -> per-case predictions) weighted by
    that question's ``weights`` (part name -> weight, ``choose_weights``)."""
    return [{qid: sum(w * answers[part][i][qid] for part, w in weights[c.workflow][qid].items()) for qid in c.questions}
            for i, c in enumerate(cases)]


def mixed(cases: Split, language: list[dict], trees: list[dict], weights: dict[str, dict[str, float]]) -> list[dict]:
    """Per case: w * language + (1 - w) * trees for each of its questions."""
    return blend(cases, [language, trees], {workflow: {qid: (w, 1 - w) for qid, w in per_question.items()}
                                            for workflow, per_question in weights.items()})


@dataclass
class StructuredPart:
    """The hybrid's parts beside the heads, per workflow: the fields and trees of a workflow whose states are JSON,
    the lexical part (``lexical.Lexical``) of every workflow, and the weights each question gives its parts:
    ``weights[workflow][question][part]``, on the simplex, over ``parts(workflow)`` ("heads" first)."""

    fields: dict[str, Fields]
    trees: dict[str, dict[str, Trees]]
    weights: dict[str, dict[str, dict[str, float]]]
    rounds: int = TREE_ROUNDS  # boosting rounds of every tree (``tree_settings``): what a refit on folds uses
    lexical: Lexical | None = None

    @classmethod
    def fit(cls, cases: Split, weights: dict | None = None, seed: int = 0, rounds: int = TREE_ROUNDS,
            lexical: bool | Lexical = True) -> "StructuredPart":
        """Fields and trees for each workflow with JSON states, fitted on ``cases`` against their soft gold with
        ``rounds`` boosting rounds, and the lexical part (``lexical``: True fits it with its vocabulary, a fitted
        ``Lexical`` lends its vocabulary, False leaves it out); ``weights`` default to the heads alone: set them from
        out-of-fold answers (``choose_weights``)."""
        fields, trees = {}, {}
        for workflow in dict.fromkeys(cases.case_workflows):
            mine = [c for c in cases if c.workflow == workflow]
            if not any(isinstance(c.state, (dict, list)) for c in mine):
                continue  # text states: no field for a tree to split on
            fields[workflow] = Fields.fit([c.state for c in mine])
            x = fields[workflow].encode([c.state for c in mine])
            trees[workflow] = {qid: Trees.fit(x, np.stack([c.gold[qid].probabilities for c in mine]), seed, rounds)
                               for qid in mine[0].questions}
        if isinstance(lexical, Lexical):
            lexical = lexical.refit(cases)
        else:
            lexical = Lexical.fit(cases) if lexical else None
        weights = weights or {w: {q: {"heads": 1.0} for q in cases[cases.case_workflows.index(w)].questions}
                              for w in dict.fromkeys(cases.case_workflows)}
        return cls(fields, trees, weights, rounds, lexical)

    def refit(self, cases: Split) -> "StructuredPart":
        """The same parts fitted again on ``cases`` (a fold of the training cases) at these weights and rounds, the
        lexical part over this vocabulary."""
        return StructuredPart.fit(cases, self.weights, rounds=self.rounds,
                                  lexical=self.lexical if self.lexical is not None else False)

    def parts(self, workflow: str) -> list[str]:
        """The parts ``workflow``'s answers mix: the heads, its trees if its states have fields, the lexical part."""
        return ["heads", *(["trees"] if workflow in self.trees else []),
                *(["lexical"] if self.lexical is not None and workflow in self.lexical.models else [])]

    def table(self) -> pd.DataFrame:
        """The mixing weights, one row per (workflow, question), a column per part (blank where a workflow has not
        that part), with the fields each workflow's trees read."""
        return pd.DataFrame([{"workflow": w, "question": q,
                              **{f"weight of the {part}": per_part.get(part, np.nan) for part in PARTS},
                              "fields read": len(self.fields[w].columns) if w in self.fields else 0}
                             for w, per_question in self.weights.items() for q, per_part in per_question.items()]
                            ).set_index(["workflow", "question"])

    def probabilities(self, states: Sequence[Any], workflow: str, questions: Sequence[str],
                      x: np.ndarray | None = None, parts: set[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        """Each part's answer distributions (the heads' aside) for ``states`` of ``workflow``: part -> question ->
        (states, options); ``x``: their ``Fields.encode``, when the caller has it already; ``parts``: only these."""
        out = {}
        wanted = set(self.parts(workflow)) if parts is None else parts
        if workflow in self.trees and "trees" in wanted:
            x = self.fields[workflow].encode(states) if x is None else x
            out["trees"] = {qid: self.trees[workflow][qid].probabilities(x) for qid in questions}
        if "lexical" in self.parts(workflow) and "lexical" in wanted:
            out["lexical"] = self.lexical.probabilities(states, workflow, questions)
        return out

    def answers(self, cases: Split) -> dict[str, list[dict[str, np.ndarray]]]:
        """Each part's answer distributions (question -> probabilities) for every case of ``cases``, each workflow's
        states read together: part -> one dict per case, empty where the case's workflow has not that part."""
        out: dict[str, list[dict[str, np.ndarray]]] = {}
        for workflow in dict.fromkeys(cases.case_workflows):
            mine = [i for i, c in enumerate(cases) if c.workflow == workflow]
            found = self.probabilities([cases[i].state for i in mine], workflow, list(cases[mine[0]].questions))
            for part, per_question in found.items():
                answers = out.setdefault(part, [{} for _ in cases])
                for j, i in enumerate(mine):
                    answers[i] = {qid: p[j] for qid, p in per_question.items()}
        return out

    def blend(self, cases: Split, heads: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The hybrid's answers on ``cases`` with ``heads`` (each case's answers) where the heads sit: every part at
        this model's weights, uncalibrated."""
        return named_blend(cases, {"heads": heads, **self.answers(cases)}, self.weights)

    def mix(self, logits: dict[str, dict[str, torch.Tensor]], states: Sequence[Any], rows: dict[str, list[int]]
            ) -> tuple[dict[str, dict[str, torch.Tensor]], np.ndarray]:
        """The hybrid's logits: log(sum of weight x probabilities over the parts), the heads' from their logits,
        per workflow and question (``rows``: workflow -> positions in ``states``, as ``heads.group_rows`` gives), and
        each state's ``Fields.surprise`` (0 for a workflow without fields), from one ``encode`` per workflow.
        Gradients reach the heads' logits; temperatures divide these as they divide the heads'."""
        out, surprise = {}, np.zeros(len(states))
        for workflow, per_question in logits.items():
            mine = [states[i] for i in rows[workflow]]
            x = None
            if workflow in self.fields:
                x = self.fields[workflow].encode(mine)
                surprise[rows[workflow]] = self.fields[workflow].surprise(mine, x)
            # only the parts some asked question gives weight: a question the heads answer alone costs no TF-IDF
            wanted = {part for qid in per_question for part, w in self.weights[workflow][qid].items()
                      if part != "heads" and w > 0}
            others = self.probabilities(mine, workflow, list(per_question), x, wanted) if wanted else {}
            out[workflow] = {}
            for qid, z in per_question.items():
                weights = self.weights[workflow][qid]
                if weights.get("heads", 0.0) >= 1:
                    out[workflow][qid] = z
                    continue
                terms = [torch.log(torch.as_tensor(others[part][qid], dtype=z.dtype, device=z.device
                                                   ).clamp_min(1e-12)) + math.log(w)
                         for part, w in weights.items() if part != "heads" and w > 0]
                if weights.get("heads", 0.0) > 0:
                    terms.append(torch.log_softmax(z, dim=-1) + math.log(weights["heads"]))
                out[workflow][qid] = torch.logsumexp(torch.stack(terms), dim=0)
        return out, surprise

    def tensors(self) -> dict[str, np.ndarray]:
        out = {k: v for workflow, per_question in self.trees.items() for qid, trees in per_question.items()
               for k, v in trees.tensors(f"structured.{workflow}/{qid}").items()}
        if self.lexical is not None:
            out.update(self.lexical.tensors("lexical"))
        return out

    def config(self) -> dict:
        return {"fields": {w: f.to_json() for w, f in self.fields.items()},
                "trees": {w: {q: t.config() for q, t in qs.items()} for w, qs in self.trees.items()},
                "weights": self.weights, "tree_settings": tree_settings(self.rounds),
                "lexical": self.lexical.config() if self.lexical is not None else None}

    @classmethod
    def from_saved(cls, config: dict, arrays: dict[str, np.ndarray]) -> "StructuredPart":
        trees = {w: {q: Trees.from_saved(c, arrays, f"structured.{w}/{q}") for q, c in qs.items()}
                 for w, qs in config["trees"].items()}
        rounds = config["tree_settings"]["max_iter"]
        # a model saved before the lexical part kept one number per question: the heads' weight, the trees the rest
        weights = {w: {q: v if isinstance(v, dict) else {"heads": v, "trees": 1 - v} for q, v in qs.items()}
                   for w, qs in config["weights"].items()}
        lexical = config.get("lexical")
        return cls({w: Fields.from_json(f) for w, f in config["fields"].items()}, trees, weights, rounds,
                   Lexical.from_saved(lexical, arrays, "lexical") if lexical else None)
