"""Linear probes on frozen features: how much of each answer a pooled vector already carries.

``learned_pooling`` sets a trained pooling beside them: a token head (attention over one layer's token states, a
learned query per question) in place of the fixed mean, last or max.

A probe is the decision model's own heads (one linear softmax layer per workflow and question, soft-gold
cross-entropy) trained on fixed features, standardized with train statistics (``fitting.fit_heads``). As training
does, the L2 strength and the step are picked on a dev slice of train (``DEV_SHARE`` of each workflow's cases,
``cases.dev_slice``), the heads are then refitted from zero on all of train with that choice
(``fitting.refit_heads``), and the cases the probe is scored on are read once, for the score. A probe's score is
still a comparison between settings on the validation split, not a test score.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..data.cases import Split, dev_slice
from ..data.metrics import Scores, score, wilson_interval
from ..model.features import Features, TokenStates, extract_features, standardization
from ..model.fitting import fit_heads, refit_heads
from ..model.heads import HeadSet, calibrated, group_rows
from ..model.output import DecisionOutput
from ..model.token_head import TokenHeadSpec, fit_token_head, token_head_probabilities

L2_GRID = (1e-3, 3e-3, 1e-2)  # L2 strengths tried; about 280 train cases per question
STEPS = 400  # full-batch steps per L2 strength, as training's stage 1
DEV_SHARE = 0.25  # share of each workflow's train cases held out to pick the L2 strength and the step


@dataclass
class ProbeResult:
    """Validation scores of the best L2 strength, with the search that found it."""

    name: str
    l2: float
    scores: Scores
    history: pd.DataFrame = field(repr=False)  # loss on the picking cases along training, per L2 strength

    def row(self) -> dict:
        by_type = self.scores.summary("type")["accuracy"]
        overall = self.scores.overall()
        return {"probe": self.name, "accuracy": overall["accuracy"],
                **{f"accuracy {t}": float(a) for t, a in by_type.items()},
                "kl": overall["kl"], "brier": overall["brier"], "ece": overall["ece"], "L2": self.l2}


def linear_probe(train_x: np.ndarray, train: Split, val_x: np.ndarray, validation: Split, name: str = "probe",
                 l2_grid=L2_GRID, steps: int = STEPS, dev_share: float | None = DEV_SHARE) -> ProbeResult:
    """Fit soft-label linear heads on ``train`` features and score them once on ``validation``.

    The L2 strength and the step are picked on a dev slice of ``train`` (``dev_share`` of each workflow's cases),
    then the heads are refitted on all of ``train``. ``dev_share=None`` picks them on ``validation`` itself: only
    for a curve of held-out loss (``learning_curve``), never for a score."""
    if dev_share is None:
        fit, held, fit_x, held_x = train, validation, train_x, val_x
    else:
        counts = pd.Series(train.case_workflows).value_counts()
        fit, held = dev_slice(train, {w: max(1, round(dev_share * n)) for w, n in counts.items()})
        position = {i: k for k, i in enumerate(train.ids)}
        fit_x, held_x = (train_x[[position[i] for i in split.ids]] for split in (fit, held))
    mean, std = standardization(fit_x)
    fx, hx = (torch.as_tensor((x - mean) / std, dtype=torch.float32) for x in (fit_x, held_x))
    heads = HeadSet(train.schema(), fx.shape[1])
    fit_result = fit_heads(heads, fit, held, fx, hx, l2_grid=l2_grid, steps=steps, progress=False)
    mean, std = standardization(train_x)
    if dev_share is not None:  # the choice is made: the dev cases are training data too
        heads = HeadSet(train.schema(), fx.shape[1])
        refit_heads(heads, train, torch.as_tensor((train_x - mean) / std, dtype=torch.float32), fit_result.recipe)
    vx = torch.as_tensor((val_x - mean) / std, dtype=torch.float32)
    rows = group_rows(validation.case_workflows)
    with torch.no_grad():
        output = DecisionOutput(vx, validation.case_workflows, heads.read(vx, rows), rows)
    probabilities = [{qid: calibrated(z).double().numpy() for qid, z in logits.items()} for logits in output.per_case()]
    return ProbeResult(name, fit_result.recipe.l2, score(validation, probabilities), pd.DataFrame(fit_result.history))


@dataclass
class ProbeComparison:
    """Probes of several feature sets side by side (the pooling / layer comparison)."""

    results: list[ProbeResult]

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([r.row() for r in self.results]).set_index("probe").round(3)

    def accuracies(self, level: float = 0.95) -> pd.DataFrame:
        """One row per probe and group of decisions (all, then each question type): its accuracy, decisions and
        Wilson interval at ``level`` (``metrics.wilson_interval``; decisions taken as independent, as the
        notebook's standard error does)."""
        rows = []
        for r in self.results:
            groups = pd.concat([r.scores.summary(), r.scores.summary("type")])  # "all", then each type
            for group, g in groups.iterrows():
                rows.append({"probe": r.name, "decisions": group, "accuracy": g["accuracy"], "n": int(g["decisions"])})
        frame = pd.DataFrame(rows)
        frame["low"], frame["high"] = wilson_interval(frame["accuracy"], frame["n"], level)
        return frame

    def figure(self):
        from ..core.plots import probe_bars

        return probe_bars(self)

    def best(self) -> ProbeResult:
        return max(self.results, key=lambda r: r.scores.overall()["accuracy"])


def compare_probes(train_features: Features, train: Split, val_features: Features, validation: Split,
                   settings: list[tuple[str, int | None]], l2_grid=L2_GRID, steps: int = STEPS) -> ProbeComparison:
    """One probe per (pooling, layer) setting, all trained on ``train`` (picking on its dev slice) and scored once on
    ``validation``."""
    if train_features.ids != train.ids or val_features.ids != validation.ids:
        raise ValueError("features and cases are not aligned: extract the features from these same splits")
    results = []
    for pooling, layer in settings:
        layer = train_features.layers[-1] if layer is None else layer
        results.append(linear_probe(train_features.get(pooling, layer), train, val_features.get(pooling, layer),
                                    validation, name=f"{pooling} pooling, layer {layer}", l2_grid=l2_grid,
                                    steps=steps))
    return ProbeComparison(results)


POOLING_SETTINGS = [("last", None), ("mean", None), ("max", None)]  # the three poolings of the last layer


def pooling_comparison(backbone, train: Split, validation: Split, settings=None, steps: int = STEPS,
                       learned: TokenHeadSpec | None = None, **feature_options) -> ProbeComparison:
    """Extract (or reuse cached) features of both splits and probe each (pooling, layer) setting.

    ``settings`` defaults to the three poolings of the last layer followed by mean pooling of every other
    cached layer, so one call answers both "which pooling" and "which layer". With ``learned``, a last row: a token
    head of that spec on its layer's token states (``learned_pooling``), kept by the same extraction.
    """
    layer = None if learned is None else learned.resolved(backbone.num_layers).layer
    if learned is not None:
        feature_options["token_layers"] = (layer,)
    train_features = extract_features(backbone, train, **feature_options)
    val_features = extract_features(backbone, validation, **feature_options)
    if settings is None:
        settings = POOLING_SETTINGS + [("mean", layer) for layer in train_features.layers[:-1]]
    comparison = compare_probes(train_features, train, val_features, validation, settings, steps=steps)
    if learned is not None:
        comparison.results.append(learned_pooling(train_features.tokens[layer], train, val_features.tokens[layer],
                                                  validation, learned))
    return comparison


def pooling_by_backbone(comparisons: dict[str, ProbeComparison]) -> pd.DataFrame:
    """Validation accuracy of the last, mean and max pooling of each backbone's last layer, one column per backbone
    (``comparisons``: backbone -> its ``pooling_comparison``), and the spread between its best and worst pooling."""
    columns = {}
    for backbone, comparison in comparisons.items():
        fixed = {}
        for r in comparison.results:
            match = re.fullmatch(r"(last|mean|max) pooling, layer (\d+)", r.name)
            if match:
                fixed[(match[1], int(match[2]))] = r.scores.overall()["accuracy"]
        last = max(layer for _, layer in fixed)
        column = {pooling: fixed[(pooling, last)] for pooling, _ in POOLING_SETTINGS}
        columns[f"{backbone} (layer {last})"] = {**column, "spread (best - worst)": max(column.values()) - min(column.values())}
    return pd.DataFrame(columns).round(3)


def learned_pooling(train_states: TokenStates, train: Split, validation_states: TokenStates, validation: Split,
                    spec: TokenHeadSpec = TokenHeadSpec()) -> ProbeResult:
    """A token head (``token_head.py``: attention over one layer's token states, a learned query per question)
    trained on ``train`` and scored on ``validation``: pooling learned, beside the fixed poolings' probes on the same
    cases. Nothing is picked here (the spec is fixed); the probes pick their L2 on a dev slice of ``train``."""
    head = fit_token_head(train.schema(), train_states, train, spec, progress=False)
    answers = token_head_probabilities(head, validation_states, validation)
    return ProbeResult(f"learned pooling (attention), layer {train_states.layer}", float("nan"),
                       score(validation, answers), pd.DataFrame())


def gold_entropy(cases: Split) -> float:
    """Mean entropy of the gold distributions: the lowest soft cross-entropy any model can reach on ``cases``."""
    values = [g.probabilities[g.probabilities > 0] for c in cases for g in c.gold.values()]
    return float(np.mean([-(v * np.log(v)).sum() for v in values]))


@dataclass
class LearningCurve:
    """Probes trained on growing shares of the training cases, scored on the same held-out cases."""

    rows: pd.DataFrame  # per size: train cases, held-out accuracy / KL / cross-entropy, train cross-entropy
    floor: float  # the held-out gold entropy: no model's cross-entropy goes below it

    def table(self) -> pd.DataFrame:
        return self.rows.round(4)

    def figure(self):
        from ..core.plots import learning_curve_figure

        return learning_curve_figure(self)


def learning_curve(model, train: Split, held_out: Split, per_workflow=(35, 70, 140, None),
                   l2_grid=L2_GRID, steps: int = STEPS) -> LearningCurve:
    """Heads on a frozen model's features (cached) of the first ``n`` train cases of each workflow (None: all),
    each scored on ``held_out``: how fast accuracy still grows with data tells whether data or capacity limits."""
    train_x = model.split_pooled(train).cpu().numpy()
    held_x = model.split_pooled(held_out).cpu().numpy()
    rows = []
    for n in per_workflow:
        subset = train if n is None else train.head(n)
        index = [train.ids.index(i) for i in subset.ids]
        result = linear_probe(train_x[index], subset, held_x, held_out, l2_grid=l2_grid, steps=steps, dev_share=None)
        best = result.history.loc[result.history["val_loss"].idxmin()]
        overall = result.scores.overall()
        rows.append({"train cases": len(subset), "accuracy": overall["accuracy"], "kl": overall["kl"],
                     "held-out cross-entropy": best["val_loss"], "train cross-entropy": best["train_loss"]})
    return LearningCurve(pd.DataFrame(rows).set_index("train cases"), gold_entropy(held_out))
