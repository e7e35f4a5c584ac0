"""Anomaly scores, distance-aware answers and routing: answer when the input looks like the training data, send
it to a human otherwise.

Linear heads answer a poem passed as an invoice as surely as a real invoice: confidence alone cannot tell (MSP is
worse than a coin off-domain). A distance in feature space can. The scores below say how unusual an input is:

- ``confidence``: the lowest ``confidence`` field of the case's answers, as clients receive them (low: route).
  With a router fitted the answers are distance-aware (below), so this one number carries both the heads'
  uncertainty and the distance; ``raw confidence`` is the same without the distance weight.
- ``msp``: 1 - the smallest max-softmax probability over the case's questions (calibrated; Hendrycks & Gimpel,
  2017). The per-question values are kept too.
- ``entropy``: the mean entropy of the answers, each divided by log(options) so 1 means uniform.
- ``energy``: the mean over questions of -T log sum exp(logits / T) (Liu et al., 2020): low for inputs the
  heads have strong logits for.
- ``mahalanobis``: the distance of the pooled feature to the training features of the same workflow (Lee et
  al., 2018): projected on the top principal directions of the training features, one mean per workflow and a
  shared Ledoit-Wolf shrinkage covariance. ``in-domain`` is the weight it gives the heads (below).

Distance-aware answers (``routing.Router``). Past the distance of the farthest ``TAIL_SHARE`` of held-out real
inputs, the weight w = exp(-(distance - reference) / scale) falls from 1 towards 0, ``scale`` being the mean excess
of those farthest inputs (an exponential tail fitted to them). The model then answers w * heads + (1 - w) * the
training prior, with confidence w * the heads' confidence (``DecisionModel.answer_parts``). Real inputs keep their
answers (w = 1 for all but about ``TAIL_SHARE`` of them); a poem, far beyond every training case, answers the prior
with confidence ~0. A hybrid's weight falls the same way past its workflow's tail of held-out field surprise
(``field surprise``, ``fields.Fields.surprise``): that is what sends near-domain states (blanked,
contradictory, another workflow's) to a human, which the pooled features place among the real ones.

``fit_router(model, train, validation)`` fits the feature density on the training split, the tail and the threshold
on held-out real inputs: the validation split and, on a frozen backbone, every train case scored by heads re-fitted
without it (``CROSS_FIT_FOLDS`` folds), 1,200 cases instead of 80. The threshold sends a target share of them (5%)
to a human. It is saved with the model; ``model.route(state)`` answers with ``{"verdict": "answer" | "human", ...}``.
``evaluate_scores`` compares in-domain and off-domain inputs: AUROC and the FPR at 95% TPR of every score.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..data.cases import DataError, Split, jsonl_rows, render_state
from ..data.metrics import gold_priors
from ..data.scenarios import DATA_DIR
from ..model.fitting import STRUCTURED_FOLDS, cross_fit
from ..model.heads import targets
from ..model.routing import LOW_IS_ANOMALOUS, SCORES, TARGET_REJECTION, FeatureDensity, Router, anomalous

OFF_DOMAIN_DIR = DATA_DIR / "off-domain"  # package data: ships in the wheel
MIN_FIELD_SCALE = 0.01  # the field surprise moves in steps of one failed check in ~20-100: never fall faster
TAIL_SHARE = 0.01  # the farthest share of held-out real inputs, past which answers lose confidence: ECE moves < 0.01
CROSS_FIT_FOLDS = 10  # heads re-fitted on 90% of train score the other 10%: close to the final heads' confidence
# A hybrid's folds re-fit its trees too: the 5 folds its mixing weights were chosen on keep make demo within its
# 15 minutes.
HYBRID_CROSS_FIT_FOLDS = STRUCTURED_FOLDS


@dataclass
class Inputs:
    """Inputs to score: states (a string or JSON), each read as the state of a workflow."""

    name: str
    ids: list[str]
    states: list[Any]
    workflows: list[str]
    kinds: list[str]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def texts(self) -> list[str]:
        """Each state rendered for its workflow (what the model and the feature cache read)."""
        return [render_state(s, w) for s, w in zip(self.states, self.workflows)]

    @property
    def case_workflows(self) -> list[str]:
        """Each input's workflow, under the name a ``Split`` gives it (so both go through ``split_output``)."""
        return self.workflows

    def per_kind(self, n: int) -> "Inputs":
        """The first ``n`` inputs of every kind (a quick-mode sample that keeps every kind)."""
        counts: dict[str, int] = {}
        keep = []
        for i, kind in enumerate(self.kinds):
            counts[kind] = counts.get(kind, 0) + 1
            if counts[kind] <= n:
                keep.append(i)
        columns = [[values[i] for i in keep] for values in (self.ids, self.states, self.workflows, self.kinds)]
        return Inputs(self.name, *columns)

    @classmethod
    def from_split(cls, split: Split, kind: str = "in-domain") -> "Inputs":
        return cls(split.name, split.ids, split.states, split.case_workflows, [kind] * len(split))


def load_inputs(path: str | Path, workflows=None) -> Inputs:
    """Read a JSONL of ``{"id", "kind", "workflow", "state"}`` lines; ``state`` is a string or a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    ids, states, wfs, kinds = [], [], [], []
    for where, row in jsonl_rows(path):
        if not isinstance(row, dict):
            raise DataError(f"{where}: each line must be a JSON object")
        for key, kind in (("id", str), ("kind", str), ("workflow", str)):
            if not isinstance(row.get(key), kind):
                raise DataError(f"{where}: field {key!r} must be a string")
        if "state" not in row or not isinstance(row["state"], (str, dict, list)):
            raise DataError(f"{where}: field 'state' must be a string or a JSON object")
        if workflows is not None and row["workflow"] not in workflows:
            raise DataError(f"{where}: field 'workflow' is {row['workflow']!r}; expected one of {sorted(workflows)}")
        ids.append(row["id"])
        states.append(row["state"])
        wfs.append(row["workflow"])
        kinds.append(row["kind"])
    return Inputs(path.stem, ids, states, wfs, kinds)


def off_domain(workflows, per_kind: int | None = None) -> Inputs:
    """The project's off-domain set (poems, recipes, code, noise, ...: ``off_domain.jsonl``), each input read as the
    state of one of ``workflows``: as the file assigns them when they are typed-decisions' own, else given to
    ``workflows`` in turn (a poem is off-domain for any workflow). ``per_kind``: the first that many of each kind."""
    workflows = sorted(workflows)
    off = load_inputs(OFF_DOMAIN_DIR / "off_domain.jsonl")
    if not set(off.workflows) <= set(workflows):
        off = Inputs(off.name, off.ids, off.states, [workflows[i % len(workflows)] for i in range(len(off))],
                     off.kinds)
    return off.per_kind(per_kind) if per_kind else off


def with_reviewed(off: Inputs, not_a_case: list[tuple[str, Any]]) -> Inputs:
    """The off-domain set ``off`` plus the inputs reviewers marked not a case (``(workflow, state)`` pairs, from the
    decision log: ``loop.retrain``), of the kind "not a case (reviewed)"."""
    from ..data.states import state_digest

    return Inputs(off.name, off.ids + [f"reviewed-{state_digest(s)}" for _, s in not_a_case],
                  off.states + [s for _, s in not_a_case], off.workflows + [w for w, _ in not_a_case],
                  off.kinds + ["not a case (reviewed)"] * len(not_a_case))


def fit_router(model, train: Split, validation: Split, score: str = "confidence",
               rejection: float = TARGET_REJECTION, folds: int | None = None) -> Router:
    """Fit the feature density and the priors on ``train``; the tail and the threshold on held-out real inputs
    (``validation``, plus every train case cross-fitted when the backbone is frozen and the model knows how its heads
    were fitted; ``folds``: ``CROSS_FIT_FOLDS``, or ``HYBRID_CROSS_FIT_FOLDS`` for a hybrid); attach the router to
    ``model``. Calibrate first: the confidence it routes on is the calibrated one."""
    if score not in SCORES:
        raise ValueError(f"score is {score!r}; expected one of {', '.join(SCORES)}")
    if not 0 < rejection < 1:
        raise ValueError(f"rejection is {rejection}; expected a share between 0 and 1")
    train_x = model.split_features(train)
    density = FeatureDensity.fit(train_x.cpu().double().numpy(), train.case_workflows)
    priors: dict[str, dict[str, np.ndarray]] = {}
    for (workflow, qid), prior in gold_priors(train).items():
        priors.setdefault(workflow, {})[qid] = prior
    router = Router(density, priors, score=score, rejection=rejection)
    held = [(model.split_output(validation), None)]  # each held-out set's output and the density it is far from
    if folds is None:
        folds = CROSS_FIT_FOLDS if model.structured is None else HYBRID_CROSS_FIT_FOLDS
    cross_fitted = model.backbone.frozen and model.head_recipe is not None and folds > 1
    if cross_fitted:
        held += list(_cross_fitted(model, train, train_x, folds))
    distances = np.concatenate([(density if d is None else d).distance(o.features.cpu().double().numpy(),
                                                                       o.workflows) for o, d in held])
    router.reference = float(np.quantile(distances, 1 - TAIL_SHARE))
    excess = distances[distances > router.reference] - router.reference
    router.scale = float(excess.mean()) if len(excess) else float(distances.std() or 1.0)
    if all(o.surprise is not None for o, _ in held):  # a hybrid: the fields' surprise falls the same way
        surprise = np.concatenate([o.surprise for o, _ in held])
        workflows = np.concatenate([o.workflows for o, _ in held])
        router.field_reference = {str(w): float(np.quantile(surprise[workflows == w], 1 - TAIL_SHARE))
                                  for w in sorted(set(workflows))}
        excess = surprise - np.array([router.field_reference[w] for w in workflows])
        router.field_scale = max(float(excess[excess > 0].mean()) if (excess > 0).any() else 0.0, MIN_FIELD_SCALE)
    values = pd.concat([router.scores(model, o, d)[score] for o, d in held], ignore_index=True)
    router.threshold = float(np.quantile(values, rejection if score in LOW_IS_ANOMALOUS else 1 - rejection))
    router.fitted_on = {"validation": len(validation), "cross-fitted train": len(train) if cross_fitted else 0,
                        "folds": folds if cross_fitted else 0}
    model.router = router
    return router


def _cross_fitted(model, train: Split, features: torch.Tensor, folds: int):
    """For each of ``folds`` folds of ``train``: the output of heads (and a hybrid's trees) fitted on the other
    folds on its features, with its loss, and the feature density of the other folds."""
    for fold in cross_fit(model, train, features, folds, structured=model.structured is not None):
        held = [train[i] for i in fold.held]
        density = FeatureDensity.fit(features[fold.inside].cpu().double().numpy(),
                                     [train[i].workflow for i in fold.inside])
        output = fold.read(features[fold.held], [c.workflow for c in held], targets(train, list(fold.held)),
                           states=[c.state for c in held])
        yield output, density


@dataclass
class AnomalyReport:
    """Anomaly scores of in-domain and other inputs, and how well each score separates them."""

    frames: dict[str, pd.DataFrame]  # set name -> one row per input: id, kind, workflow, every score
    router: Router
    real: str  # the name of the set of real (in-domain) inputs
    names: tuple[str, str] = ("the hybrid", "the hybrid, distance-aware")  # answer_names of the model scored

    def all_scores(self) -> pd.DataFrame:
        return pd.concat([f.assign(set=name) for name, f in self.frames.items()], ignore_index=True)

    def separation(self, other: str) -> pd.DataFrame:
        """AUROC (off-domain as the positive class) and FPR at 95% TPR (the share of ``other`` still answered
        when 95% of in-domain inputs are answered) per score."""
        from sklearn.metrics import roc_auc_score

        inside, outside = self.frames[self.real], self.frames[other]
        y = np.r_[np.zeros(len(inside)), np.ones(len(outside))]
        rows = {}
        for s in [*SCORES, *(["field surprise"] if "field surprise" in inside else [])]:
            sign = -1.0 if s in LOW_IS_ANOMALOUS else 1.0  # oriented so that higher means stranger
            values = sign * np.r_[inside[s].to_numpy(), outside[s].to_numpy()]
            keep_95 = np.quantile(sign * inside[s], 0.95)
            rows[s] = {"AUROC": roc_auc_score(y, values),
                       "FPR at 95% TPR": float((sign * outside[s] <= keep_95).mean())}
        return pd.DataFrame.from_dict(rows, orient="index")

    def routed(self) -> pd.DataFrame:
        """The share of each set (and each kind) the saved threshold sends to a human."""
        frame = self.all_scores()
        frame["human"] = anomalous(self.router.score, frame[self.router.score], self.router.threshold)
        return frame.groupby(["set", "kind"])["human"].agg(["size", "mean"]).rename(
            columns={"size": "inputs", "mean": "sent to a human"})

    def confidence_table(self, *others: str) -> pd.DataFrame:
        """The model's answers without the distance weight (``raw confidence``) against the distance-aware ones
        (``confidence``), named as ``answer_names``, both at the router's one threshold on confidence: AUROC against each set of ``others``, the share of each sent to a
        human, and the share of in-domain inputs answered."""
        rows = {}
        for label, s in ((f"{self.names[0]} (raw confidence)", "raw confidence"),
                         (f"{self.names[1]} (confidence)", "confidence")):
            inside = self.frames[self.real][s]
            row = {f"{o} AUROC": self.separation(o).loc[s, "AUROC"] for o in others}
            row.update({f"{o} sent to a human": float((self.frames[o][s] < self.router.threshold).mean())
                        for o in others})
            row[f"{self.real} answered"] = float((inside >= self.router.threshold).mean())
            rows[label] = row
        return pd.DataFrame.from_dict(rows, orient="index")

    def rejection_interval(self, level: float = 0.9, draws: int = 2000, seed: int = 0) -> dict[str, float]:
        """The share of in-domain inputs the threshold sends to a human, and a bootstrap interval over those
        inputs: how far from the target it may land by the draw of the set alone."""
        human = anomalous(self.router.score, self.frames[self.real][self.router.score], self.router.threshold)
        rng = np.random.default_rng(seed)
        shares = rng.choice(human, (draws, len(human))).mean(axis=1)
        lo, hi = np.quantile(shares, [(1 - level) / 2, (1 + level) / 2])
        return {"share": float(human.mean()), "low": float(lo), "high": float(hi), "level": level,
                "target": self.router.rejection}

    def figure(self, score: str | None = None):
        """The spread of ``score`` (default: the router's) per set, with the threshold when it is the router's."""
        from ..core.plots import score_distributions

        score = score or self.router.score
        threshold = self.router.threshold if score == self.router.score else None
        return score_distributions(self.all_scores(), score, threshold, human_below=score in LOW_IS_ANOMALOUS)


def routing_table(model, states: dict[str, object], workflow: str) -> pd.DataFrame:
    """One row per named state: the lowest confidence of the answers without the distance weight (``raw
    confidence``) and of the distance-aware ones, the
    distance, the weight it leaves the heads, and the router's verdict."""
    rows = {}
    for name, state in states.items():
        routed = model.route(state, workflow=workflow)
        rows[name] = {**{k: routed["scores"][k] for k in ("raw confidence", "confidence", "mahalanobis",
                                                          "field surprise", "in-domain") if k in routed["scores"]},
                      "verdict": routed["verdict"]}
    return pd.DataFrame.from_dict(rows, orient="index")


def answer_names(model) -> tuple[str, str]:
    """The names of ``model``'s answers without and with the distance weight: "the hybrid" and "the hybrid,
    distance-aware" (a model without trees: "heads alone" and "heads alone, distance-aware")."""
    name = "heads alone" if model.structured is None else "the hybrid"
    return name, f"{name}, distance-aware"


def in_domain_calibration(model, cases: Split) -> pd.DataFrame:
    """Accuracy, KL, Brier and ECE on ``cases`` of the answers without and with the distance weight (rows named
    by ``answer_names``): what the distance costs real inputs."""
    from ..data.metrics import score

    rows = {label: score(cases, *model.outputs(cases, raw=raw)).overall()
            for label, raw in zip(answer_names(model), (True, False))}
    return pd.DataFrame.from_dict(rows, orient="index")[["accuracy", "kl", "brier", "ece", "ece_confidence"]]


def evaluate_scores(model, real: Split, *others: Inputs) -> AnomalyReport:
    """Score ``real`` (a split of real inputs, e.g. test) and each set of ``others`` with ``model.router``."""
    if model.router is None:
        raise ValueError("the model has no router; call anomaly.fit_router(model, train, validation) first")
    frames = {}
    for inputs in (Inputs.from_split(real), *others):
        frame = model.router.scores(model, model.split_output(inputs))
        frame.insert(0, "id", inputs.ids)
        frame.insert(1, "kind", inputs.kinds)
        frame.insert(2, "workflow", inputs.workflows)
        frames[inputs.name] = frame
    return AnomalyReport(frames, model.router, real.name, answer_names(model))

