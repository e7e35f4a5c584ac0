"""Gradient-boosted trees on the state's fields (``fields.py``), one model per question, kept as arrays.

``Trees.fit(x, gold)``: one scikit-learn ``HistGradientBoostingClassifier`` per question, fitted on the soft gold
(each case repeated once per option, weighted by the option's gold probability). Kept as flat arrays (node feature,
threshold, children, leaf value), so the trees save into safetensors like every other weight and answer in numpy
without scikit-learn's pickles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TREE_ROUNDS = 150  # boosting rounds of the full recipe, at a learning rate of 0.05
TREE_SHRINKAGE = 7.5  # rounds x learning rate: fewer rounds (quick presets) take proportionally larger steps
TREE_SETTINGS = dict(max_leaf_nodes=15, min_samples_leaf=8, l2_regularization=1.0)


def tree_settings(rounds: int = TREE_ROUNDS) -> dict:
    """The trees' scikit-learn settings at ``rounds`` boosting rounds (their time grows with the rounds)."""
    if rounds < 1:
        raise ValueError(f"tree rounds is {rounds}; expected a positive number of boosting rounds")
    return {"max_iter": rounds, "learning_rate": TREE_SHRINKAGE / rounds, **TREE_SETTINGS}


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
