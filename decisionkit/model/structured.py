"""The state's own fields, read a second way: flattened into numbers and answered by gradient-boosted trees.

A typed-decisions state is JSON: numbers, flags, short categories and some free text. Mean-pooled hidden states
blur exactly the numbers and flags that decide an incident or a trace, and a linear head cannot compare two of
them; trees on the fields can, while the language model reads the free text that trees cannot. The hybrid
decision model (``model.DecisionModel`` with a ``StructuredPart``) averages the two in probability space.

- ``Fields.fit(states)`` learns, per workflow on train, which columns a state has: every number and flag (by
  path; ``a.b`` in objects, ``a[].b`` inside arrays, summed over the items), each array's length, each short
  category seen ``MIN_COUNT`` times or more (one 0/1 column per value, counted inside arrays), the length of
  longer text, and for two numbers that share a name in different objects (an invoice's and an order's
  ``total_usd``) their difference and ratio. ``Fields.encode(states)`` gives the matrix: a missing field, a field
  of another type, an unseen category or a state that is a plain string gives NaN or 0, never an error.
- ``Fields.surprise(states)``: the share of a state's field checks that fail against train: a path the workflow's
  states never had, a path nearly all of them had that is missing, a category value never kept, a number (or a
  difference, ratio or text length) outside the training range. A blanked state, a contradictory one or another
  workflow's state fails many; the router lowers the heads' weight on it (``routing.Router``), which pooled
  features alone cannot do for a state that reads like the real thing.
- ``Trees.fit(x, gold)``: one scikit-learn ``HistGradientBoostingClassifier`` per question, fitted on the soft
  gold (each case repeated once per option, weighted by the option's gold probability). Kept as flat arrays (node
  feature, threshold, children, leaf value), so the trees save into safetensors like every other weight and
  answer in numpy without scikit-learn's pickles.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from ..data.cases import Split

MIN_COUNT = 3  # a category value becomes a column once it occurs in this many train states of the workflow
MAX_CATEGORY_CHARS = 40  # longer strings are free text: the language model reads them, the fields keep the length
MAX_CATEGORIES = 30  # most frequent values kept per categorical path
EXPECTED = 0.9  # a path in this share of a workflow's train states or more is expected: its absence is a surprise
TREE_ROUNDS = 150  # boosting rounds of the full recipe, at a learning rate of 0.05
TREE_SHRINKAGE = 7.5  # rounds x learning rate: fewer rounds (quick presets) take proportionally larger steps
TREE_SETTINGS = dict(max_leaf_nodes=15, min_samples_leaf=8, l2_regularization=1.0)


def tree_settings(rounds: int = TREE_ROUNDS) -> dict:
    """The trees' scikit-learn settings at ``rounds`` boosting rounds (their time grows with the rounds)."""
    if rounds < 1:
        raise ValueError(f"tree rounds is {rounds}; expected a positive number of boosting rounds")
    return {"max_iter": rounds, "learning_rate": TREE_SHRINKAGE / rounds, **TREE_SETTINGS}


def _leaves(value: Any, path: str, out: list[tuple[str, Any]]) -> None:
    """(path, leaf) pairs of a JSON value; items of an array share the path ``name[]``; ``path#len`` is an
    array's length."""
    if isinstance(value, dict):
        for key, item in value.items():
            _leaves(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list):
        out.append((f"{path}#len", len(value)))
        for item in value:
            _leaves(item, f"{path}[]", out)
    else:
        out.append((path, value))


def leaves(state: Any) -> list[tuple[str, Any]]:
    """Every leaf of a state (a string state, or anything not JSON-like, has none)."""
    out: list[tuple[str, Any]] = []
    if isinstance(state, (dict, list)):
        _leaves(state, "", out)
    return out


def _number(value: Any) -> float | None:
    """A JSON number or boolean as a float; anything else None (a string is not read as a number)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _name(path: str) -> str:
    return path.rsplit(".", 1)[-1].removesuffix("[]")


@dataclass
class Fields:
    """The columns of one workflow's states, learned on train: ``numbers`` (paths read as numbers; within arrays,
    summed), ``categories`` (path -> values with a 0/1 column each, counted within arrays), ``texts`` (paths whose
    string length is a column) and ``pairs`` (two number paths compared by difference and ratio); for
    ``surprise``, ``presence`` (path -> share of train states that have it) and each column's train range
    (``low``, ``high``; None where train never had a value)."""

    numbers: list[str]
    categories: dict[str, list[str]]
    texts: list[str]
    pairs: list[tuple[str, str]]
    presence: dict[str, float] = field(default_factory=dict)
    low: list[float | None] = field(default_factory=list)
    high: list[float | None] = field(default_factory=list)

    @classmethod
    def fit(cls, states: Sequence[Any]) -> "Fields":
        numeric, strings, values, seen = Counter(), Counter(), {}, Counter()
        for state in states:
            for path in {path for path, _ in leaves(state)}:
                seen[path] += 1
            for path, value in leaves(state):
                if _number(value) is not None:
                    numeric[path] += 1
                elif isinstance(value, str):
                    strings[path] += 1
                    values.setdefault(path, Counter())[value] += 1
        numbers = sorted(numeric)
        categories, texts = {}, []
        for path in sorted(strings):
            if any(len(v) > MAX_CATEGORY_CHARS for v in values[path]):
                texts.append(path)
                continue
            kept = [v for v, n in values[path].most_common(MAX_CATEGORIES) if n >= MIN_COUNT]
            if kept and len(kept) < len(states):  # an id-like field (a value per state) tells nothing
                categories[path] = sorted(kept)
        scalar = [p for p in numbers if not p.endswith("#len")]
        pairs = [(a, b) for i, a in enumerate(scalar) for b in scalar[i + 1:]
                 if _name(a) == _name(b) and a.split(".")[0] != b.split(".")[0]]
        fields = cls(numbers, categories, texts, pairs, {p: n / len(states) for p, n in sorted(seen.items())})
        x = fields.encode(states)
        known = ~np.isnan(x)
        low, high = np.where(known, x, np.inf).min(axis=0), np.where(known, x, -np.inf).max(axis=0)
        fields.low = [float(v) if np.isfinite(v) else None for v in low]
        fields.high = [float(v) if np.isfinite(v) else None for v in high]
        return fields

    @property
    def columns(self) -> list[str]:
        """The name of every column ``encode`` gives, in order."""
        return (self.numbers + [f"{p}={v}" for p, vs in self.categories.items() for v in vs]
                + [f"{p}#chars" for p in self.texts]
                + [f"{a}-{b}" for a, b in self.pairs] + [f"{a}/{b}" for a, b in self.pairs])

    def encode(self, states: Sequence[Any]) -> np.ndarray:
        """One row per state, one column per ``columns``: NaN where a number is missing or not a number, 0 for a
        category value the state does not have."""
        numbers = {p: i for i, p in enumerate(self.numbers)}
        offset = len(self.numbers)
        category = {}
        for path, vs in self.categories.items():
            for v in vs:
                category[(path, v)] = offset
                offset += 1
        texts = {p: offset + i for i, p in enumerate(self.texts)}
        pairs = offset + len(self.texts)
        x = np.full((len(states), len(self.columns)), np.nan)
        for row, state in enumerate(states):
            found = leaves(state)
            if found:  # a structured state: its categories start at 0 (absent), not unknown
                x[row, len(self.numbers):pairs - len(self.texts)] = 0.0
            for path, value in found:
                number = _number(value)
                if number is not None and path in numbers:
                    column = numbers[path]
                    x[row, column] = number if np.isnan(x[row, column]) or "[]" not in path else x[row, column] + number
                elif isinstance(value, str):
                    if (path, value) in category:
                        x[row, category[(path, value)]] += 1
                    elif path in texts:
                        x[row, texts[path]] = len(value)
            for i, (a, b) in enumerate(self.pairs):
                va, vb = x[row, numbers[a]], x[row, numbers[b]]
                x[row, pairs + i] = va - vb
                x[row, pairs + len(self.pairs) + i] = va / vb if vb else np.nan
        return x

    def surprise(self, states: Sequence[Any], x: np.ndarray | None = None) -> np.ndarray:
        """Per state, the share of its field checks that fail (0: every field as in train; 1: nothing is, as for a
        plain string or another workflow's state). Checks: each path of the state (known to the workflow?), each
        expected path (present?), each category value (kept?), each number column (inside the train range?).
        A model saved before these were learned (no ``presence``) finds no surprise."""
        if not self.presence:
            return np.zeros(len(states))
        x = self.encode(states) if x is None else x  # ``x``: their ``encode``, when the caller has it already
        first_category = len(self.numbers)
        after_categories = first_category + sum(len(v) for v in self.categories.values())
        numeric = [c for c in range(x.shape[1]) if not first_category <= c < after_categories
                   and self.low[c] is not None]
        low = np.array([self.low[c] for c in numeric])
        high = np.array([self.high[c] for c in numeric])
        expected = {p for p, share in self.presence.items() if share >= EXPECTED}
        out = np.zeros(len(states))
        for row, state in enumerate(states):
            found = leaves(state)
            paths = {p for p, _ in found}
            categorical = [(p, value) for p, value in found if p in self.categories and isinstance(value, str)]
            checks = len(paths | expected) + len(categorical)
            failed = len(paths - self.presence.keys()) + len(expected - paths)
            failed += sum(value not in self.categories[p] for p, value in categorical)
            values = x[row, numeric]
            known = ~np.isnan(values)
            checks += int(known.sum())
            failed += int(((values[known] < low[known]) | (values[known] > high[known])).sum())
            out[row] = failed / checks if checks else 1.0
        return out

    def to_json(self) -> dict:
        return {"numbers": self.numbers, "categories": self.categories, "texts": self.texts,
                "pairs": [list(p) for p in self.pairs], "presence": self.presence, "low": self.low,
                "high": self.high}

    @classmethod
    def from_json(cls, obj: dict) -> "Fields":
        return cls(list(obj["numbers"]), {k: list(v) for k, v in obj["categories"].items()}, list(obj["texts"]),
                   [tuple(p) for p in obj["pairs"]], dict(obj.get("presence", {})), list(obj.get("low", [])),
                   list(obj.get("high", [])))


def _expanded(x: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The soft gold as classification rows: each case once per option it gives weight, weighted by it."""
    rows, options = np.nonzero(gold > 0)
    return x[rows], options, gold[rows, options]


@dataclass
class Trees:
    """A fitted gradient-boosted tree model of one question, as arrays: ``baseline`` (per output), and per node
    ``feature``, ``threshold``, ``missing_left``, ``left``, ``right`` (global node indices), ``leaf``, ``value``;
    ``roots`` (iterations x outputs). One output per option (softmax), or one for a yes/no question (sigmoid)."""

    options: int
    baseline: np.ndarray
    roots: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf: np.ndarray
    value: np.ndarray
    depth: int
    binary_classes: list[int] | None = None  # a two-class fit: the two options its one logit separates

    ARRAYS = ("baseline", "roots", "feature", "threshold", "missing_left", "left", "right", "leaf", "value")

    @classmethod
    def fit(cls, x: np.ndarray, gold: np.ndarray, seed: int = 0, rounds: int = TREE_ROUNDS) -> "Trees":
        """Fit on features ``x`` (cases x columns, NaN missing) against soft ``gold`` (cases x options), with
        ``rounds`` boosting rounds (``tree_settings``)."""
        from sklearn.ensemble import HistGradientBoostingClassifier
        from threadpoolctl import threadpool_limits

        options = gold.shape[1]
        rows, labels, weights = _expanded(x, gold)
        if len(np.unique(labels)) < 2 or x.shape[1] == 0:  # one option ever weighed, or no field to split on
            return cls.prior(gold.mean(axis=0))
        model = HistGradientBoostingClassifier(**tree_settings(rounds), early_stopping=False,
                                               random_state=seed)
        # One OpenMP thread: a workflow's few hundred rows are too few to share, and on 2 cores the threads'
        # spin-waits cost more than the work, by an order of magnitude when another process holds a core.
        with threadpool_limits(1, user_api="openmp"):
            model.fit(rows, labels, sample_weight=weights)
        return cls.from_sklearn(model, options)

    @classmethod
    def prior(cls, distribution: np.ndarray) -> "Trees":
        """No trees: every state gets ``distribution`` (the training prior)."""
        options = len(distribution)
        empty = np.zeros(0)
        return cls(options, np.log(np.maximum(distribution, 1e-13)), np.zeros((0, options), dtype=np.int64),
                   empty.astype(np.int64), empty, empty.astype(bool), empty.astype(np.int64), empty.astype(np.int64),
                   empty.astype(bool), empty, 0)

    @classmethod
    def from_sklearn(cls, model, options: int) -> "Trees":
        """The arrays of a fitted ``HistGradientBoostingClassifier`` whose classes are a subset of ``range(options)``
        (options the gold never weighs get no output: their probability is 0, as the classifier's)."""
        classes = [int(c) for c in model.classes_]
        nodes, roots, count = [], [], 0
        for iteration in model._predictors:
            row = []
            for predictor in iteration:
                row.append(count)
                nodes.append(predictor.nodes)
                count += len(predictor.nodes)
            roots.append(row)
        all_nodes = np.concatenate(nodes)
        offsets = np.concatenate([np.full(len(n), start) for n, start in zip(nodes, np.array(roots).ravel())])
        binary = len(classes) == 2
        baseline = np.asarray(model._baseline_prediction, dtype=float).ravel()
        # Every option gets an output slot; options absent from training stay at -inf-like logits.
        roots = np.asarray(roots, dtype=np.int64)
        if binary:  # one tree per iteration: the logit of classes[1] against classes[0]
            full_roots, full_baseline = roots, baseline
        else:
            full_roots = np.full((len(roots), options), -1, dtype=np.int64)
            full_roots[:, classes] = roots
            full_baseline = np.full(options, -30.0)
            full_baseline[classes] = baseline
        leaf = all_nodes["is_leaf"].astype(bool)
        depth = int(all_nodes["depth"].max()) if len(all_nodes) else 0
        return cls(options, full_baseline, full_roots, all_nodes["feature_idx"].astype(np.int64),
                   all_nodes["num_threshold"].astype(float), all_nodes["missing_go_to_left"].astype(bool),
                   np.where(leaf, 0, all_nodes["left"] + offsets).astype(np.int64),
                   np.where(leaf, 0, all_nodes["right"] + offsets).astype(np.int64), leaf,
                   all_nodes["value"].astype(float), depth, classes if binary else None)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Summed leaf values plus the baseline, per case and output: the logits the probabilities come from."""
        out = np.tile(self.baseline, (len(x), 1))
        if not self.roots.size:
            return out
        outputs = self.roots.shape[1]
        roots = self.roots.ravel()
        live = roots >= 0
        node = np.tile(np.where(live, roots, 0), (len(x), 1))  # cases x trees
        for _ in range(self.depth + 1):
            inner = ~self.leaf[node]
            if not inner.any():
                break
            value = np.take_along_axis(x, self.feature[node], axis=1)
            go_left = np.where(np.isnan(value), self.missing_left[node], value <= self.threshold[node])
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        sums = np.where(live, self.value[node], 0.0).reshape(len(x), len(self.roots), outputs).sum(axis=1)
        return out + sums

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """Answer distributions (cases x options)."""
        logits = self.logits(x)
        if self.binary_classes is not None:
            p = 1 / (1 + np.exp(-logits[:, 0]))
            out = np.zeros((len(x), self.options))
            out[:, self.binary_classes[0]], out[:, self.binary_classes[1]] = 1 - p, p
            return out
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def tensors(self, prefix: str) -> dict[str, np.ndarray]:
        arrays = {name: np.ascontiguousarray(getattr(self, name)) for name in self.ARRAYS}
        arrays["missing_left"] = arrays["missing_left"].astype(np.uint8)
        arrays["leaf"] = arrays["leaf"].astype(np.uint8)
        return {f"{prefix}.{name}": a for name, a in arrays.items()}

    def config(self) -> dict:
        return {"options": self.options, "depth": self.depth, "binary_classes": self.binary_classes}

    @classmethod
    def from_saved(cls, config: dict, arrays: dict[str, np.ndarray], prefix: str) -> "Trees":
        got = {name: arrays[f"{prefix}.{name}"] for name in cls.ARRAYS}
        got["missing_left"], got["leaf"] = got["missing_left"].astype(bool), got["leaf"].astype(bool)
        return cls(config["options"], depth=config["depth"], binary_classes=config["binary_classes"], **got)


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
        rounds = config.get("tree_settings", {}).get("max_iter", TREE_ROUNDS)
        return cls({w: Fields.from_json(f) for w, f in config["fields"].items()}, trees,
                   {w: dict(qs) for w, qs in config["weights"].items()}, rounds)
