"""Linear probes on frozen features: how much of each answer a pooled vector already carries.

A probe is one multinomial logistic regression per (workflow, question), trained on soft gold: each training
case appears once per option with the gold probability as its sample weight, which makes scikit-learn's
log-loss exactly the soft-label cross-entropy. The L2 strength is picked on the validation split only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from .data import Split
from .features import Features, extract_features
from .metrics import Scores, score

C_GRID = (0.003, 0.01, 0.03, 0.1)  # inverse L2 strength; ~280 cases per question against 576 features
MAX_ITER = 300  # lbfgs converges well before this on standardized features


def _soft_rows(x: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repeat each case once per option with positive gold probability: features, option index, weight."""
    case, option = np.nonzero(gold > 0)
    return x[case], option, gold[case, option]


def _fit_predict(x_train, gold_train, x_eval, c: float) -> np.ndarray:
    k = gold_train.shape[1]
    xs, ys, ws = _soft_rows(x_train, gold_train)
    model = LogisticRegression(C=c, max_iter=MAX_ITER).fit(xs, ys, sample_weight=ws)
    probs = np.zeros((len(x_eval), k))
    probs[:, model.classes_] = model.predict_proba(x_eval)  # options never seen in training get 0
    return probs


def _gold_matrix(cases: Split, index: list[int], qid: str) -> np.ndarray:
    return np.stack([cases[i].gold[qid].probabilities for i in index])


def _predict(train_x, train: Split, eval_x, cases: Split, c: float) -> list[dict[str, np.ndarray]]:
    predictions: list[dict[str, np.ndarray]] = [{} for _ in cases]
    for workflow, questions in cases.schema().items():
        tr = [i for i, case in enumerate(train) if case.workflow == workflow]
        ev = [i for i, case in enumerate(cases) if case.workflow == workflow]
        for qid in questions:
            probs = _fit_predict(train_x[tr], _gold_matrix(train, tr, qid), eval_x[ev], c)
            for row, i in enumerate(ev):
                predictions[i][qid] = probs[row]
    return predictions


@dataclass
class ProbeResult:
    """Validation scores of the best L2 strength, with the search that found it."""

    name: str
    c: float
    scores: Scores
    search: dict[float, float] = field(repr=False)  # C -> validation KL

    def row(self) -> dict:
        by_type = self.scores.summary("type")["accuracy"]
        overall = self.scores.overall()
        return {"probe": self.name, "accuracy": overall["accuracy"],
                **{f"accuracy {t}": float(a) for t, a in by_type.items()},
                "kl": overall["kl"], "brier": overall["brier"], "ece": overall["ece"], "C": self.c}


def linear_probe(train_x: np.ndarray, train: Split, val_x: np.ndarray, validation: Split, name: str = "probe",
                 c_grid=C_GRID) -> ProbeResult:
    """Fit soft-label probes on ``train`` features and score them on ``validation`` (picking C there)."""
    scaler = StandardScaler().fit(train_x)
    train_x, val_x = scaler.transform(train_x), scaler.transform(val_x)
    best = None
    search = {}
    for c in c_grid:
        scores = score(validation, _predict(train_x, train, val_x, validation, c))
        search[c] = scores.overall()["kl"]
        if best is None or search[c] < search[best[0]]:
            best = (c, scores)
    return ProbeResult(name, best[0], best[1], search)


@dataclass
class ProbeComparison:
    """Probes of several feature sets side by side (the pooling / layer comparison)."""

    results: list[ProbeResult]

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([r.row() for r in self.results]).set_index("probe").round(3)

    def figure(self):
        from .plots import probe_bars

        return probe_bars(self)

    def best(self) -> ProbeResult:
        return max(self.results, key=lambda r: r.scores.overall()["accuracy"])


def compare_probes(train_features: Features, train: Split, val_features: Features, validation: Split,
                   settings: list[tuple[str, int | None]], c_grid=C_GRID) -> ProbeComparison:
    """One probe per (pooling, layer) setting, all trained on ``train`` and scored on ``validation``."""
    if train_features.ids != train.ids or val_features.ids != validation.ids:
        raise ValueError("features and cases are not aligned: extract the features from these same splits")
    results = []
    for pooling, layer in settings:
        layer = train_features.layers[-1] if layer is None else layer
        results.append(linear_probe(train_features.get(pooling, layer), train, val_features.get(pooling, layer),
                                    validation, name=f"{pooling} pooling, layer {layer}", c_grid=c_grid))
    return ProbeComparison(results)


POOLING_SETTINGS = [("last", None), ("mean", None), ("max", None)]  # the three poolings of the last layer


def pooling_comparison(backbone, train: Split, validation: Split, settings=None, **feature_options) -> ProbeComparison:
    """Extract (or reuse cached) features of both splits and probe each (pooling, layer) setting.

    ``settings`` defaults to the three poolings of the last layer followed by mean pooling of every other
    cached layer, so one call answers both "which pooling" and "which layer".
    """
    train_features = extract_features(backbone, train, **feature_options)
    val_features = extract_features(backbone, validation, **feature_options)
    if settings is None:
        settings = POOLING_SETTINGS + [("mean", layer) for layer in train_features.layers[:-1]]
    return compare_probes(train_features, train, val_features, validation, settings)
