"""Anomaly scores and routing: answer when the input looks like the training data, send it to a human otherwise.

A decision model always answers, even for a poem passed as an invoice. Four scores say how unusual an input is,
each oriented so that higher means more anomalous:

- ``msp``: 1 - the smallest max-softmax probability over the case's questions (calibrated; Hendrycks & Gimpel,
  2017). The per-question values are kept too.
- ``entropy``: the mean entropy of the answers, each divided by log(options) so 1 means uniform.
- ``energy``: the mean over questions of -T log sum exp(logits / T) (Liu et al., 2020): low for inputs the
  heads have strong logits for.
- ``mahalanobis``: the distance of the pooled feature to the training features of the same workflow (Lee et
  al., 2018): projected on the top principal directions of the training features, one mean per workflow and a
  shared Ledoit-Wolf shrinkage covariance.

``fit_router(model, train, validation)`` fits the Mahalanobis statistics on the training split and sets a
threshold on one score so that a target share of the validation split (5% by default) goes to a human; it is
saved with the model. ``model.route(state)`` then answers with ``{"verdict": "answer" | "human", ...}``.
``evaluate_scores`` compares in-domain and off-domain inputs: AUROC and the FPR at 95% TPR of every score.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .data import DataError, Split, jsonl_rows, render_state
from .heads import calibrated

SCORES = ("msp", "entropy", "energy", "mahalanobis")
OFF_DOMAIN_DIR = Path(__file__).resolve().parent.parent / "data" / "off-domain"  # written for this project
PCA_COMPONENTS = 128  # directions kept for the Mahalanobis distance: 2,304 raw dimensions vs 1,120 train cases
TARGET_REJECTION = 0.05  # share of in-domain validation inputs a threshold sends to a human


@dataclass
class Inputs:
    """Inputs to score, each rendered as the state of a workflow (what the model and the feature cache read)."""

    name: str
    ids: list[str]
    texts: list[str]
    workflows: list[str]
    kinds: list[str]

    def __len__(self) -> int:
        return len(self.ids)

    def per_kind(self, n: int) -> "Inputs":
        """The first ``n`` inputs of every kind (a quick-mode sample that keeps every kind)."""
        counts: dict[str, int] = {}
        keep = []
        for i, kind in enumerate(self.kinds):
            counts[kind] = counts.get(kind, 0) + 1
            if counts[kind] <= n:
                keep.append(i)
        columns = [[values[i] for i in keep] for values in (self.ids, self.texts, self.workflows, self.kinds)]
        return Inputs(self.name, *columns)

    @classmethod
    def from_split(cls, split: Split, kind: str = "in-domain") -> "Inputs":
        return cls(split.name, split.ids, split.texts, split.case_workflows, [kind] * len(split))


def load_inputs(path: str | Path, workflows=None) -> Inputs:
    """Read a JSONL of ``{"id", "kind", "workflow", "state"}`` lines; ``state`` is a string or a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    ids, texts, wfs, kinds = [], [], [], []
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
        texts.append(render_state(row["state"], row["workflow"]))
        wfs.append(row["workflow"])
        kinds.append(row["kind"])
    return Inputs(path.stem, ids, texts, wfs, kinds)


@torch.no_grad()
def head_logits(model, features: torch.Tensor, workflows: list[str]) -> list[dict[str, torch.Tensor]]:
    """Logits of every trained question of each input's workflow (a row of ``features`` per input)."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in workflows]
    for workflow in sorted(set(workflows)):
        rows = [i for i, w in enumerate(workflows) if w == workflow]
        for qid, z in model.heads(features[rows], workflow).items():
            for j, i in enumerate(rows):
                out[i][qid] = z[j].cpu()
    return out


def output_scores(model, logits: dict[str, torch.Tensor], workflow: str) -> dict[str, float]:
    """MSP (per question and the case's minimum), entropy and energy of one input's head outputs."""
    scores, msps, entropies, energies = {}, [], [], []
    for qid, z in logits.items():
        t = model.temperatures.get(model.schema[workflow][qid].type, 1.0)
        p = calibrated(z, t)
        msps.append(float(p.max()))
        scores[f"msp:{qid}"] = msps[-1]
        entropies.append(float(-(p * torch.log(p.clamp_min(1e-12))).sum() / np.log(len(p))))
        energies.append(float(-t * torch.logsumexp(z / t, dim=-1)))
    scores.update(msp=1 - min(msps), entropy=float(np.mean(entropies)), energy=float(np.mean(energies)))
    return scores


@dataclass
class FeatureDensity:
    """Training features per workflow in a low-dimensional projection: a mean each, one shrunk covariance."""

    mean: np.ndarray  # (dim,) centre of the projection
    components: np.ndarray  # (k, dim) principal directions
    centres: dict[str, np.ndarray]  # workflow -> (k,) mean of its projected training features
    precision: np.ndarray  # (k, k) inverse of the shared covariance

    @classmethod
    def fit(cls, features: np.ndarray, workflows: list[str], components: int = PCA_COMPONENTS) -> "FeatureDensity":
        from sklearn.covariance import LedoitWolf
        from sklearn.decomposition import PCA

        pca = PCA(n_components=min(components, len(features) - 1), random_state=0).fit(features)
        projected = pca.transform(features)
        labels = np.asarray(workflows)
        centres = {w: projected[labels == w].mean(axis=0) for w in sorted(set(workflows))}
        centred = projected - np.stack([centres[w] for w in labels])
        return cls(pca.mean_, pca.components_, centres, LedoitWolf().fit(centred).precision_)

    def distance(self, features: np.ndarray, workflows: list[str]) -> np.ndarray:
        projected = (features - self.mean) @ self.components.T
        diff = projected - np.stack([self.centres[w] for w in workflows])
        return np.sqrt(np.einsum("ij,jk,ik->i", diff, self.precision, diff))

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"mean": self.mean, "components": self.components, "precision": self.precision,
               **{f"centre.{w}": c for w, c in self.centres.items()}}
        return {f"density.{k}": torch.as_tensor(np.ascontiguousarray(v), dtype=torch.float32) for k, v in out.items()}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "FeatureDensity":
        get = {k[len("density."):]: v.double().numpy() for k, v in tensors.items() if k.startswith("density.")}
        centres = {k[len("centre."):]: v for k, v in get.items() if k.startswith("centre.")}
        return cls(get["mean"], get["components"], centres, get["precision"])


@dataclass
class Router:
    """A threshold on one anomaly score, chosen on validation: above it, a human answers."""

    density: FeatureDensity
    score: str = "mahalanobis"
    threshold: float = float("inf")
    rejection: float = TARGET_REJECTION  # the share of validation inputs the threshold sends to a human

    def scores(self, model, features: torch.Tensor, workflows: list[str]) -> pd.DataFrame:
        """Every anomaly score (and the per-question MSP) of a batch of inputs, one row each."""
        rows = [output_scores(model, z, w) for z, w in zip(head_logits(model, features, workflows), workflows)]
        frame = pd.DataFrame(rows)
        frame["mahalanobis"] = self.density.distance(features.cpu().double().numpy(), workflows)
        return frame

    def verdict(self, scores: dict[str, float]) -> dict:
        value = scores[self.score]
        if value > self.threshold:
            reason = (f"{self.score} score {value:.3f} is above the threshold {self.threshold:.3f} (set so that "
                      f"{self.rejection:.0%} of validation inputs go to a human)")
            return {"verdict": "human", "reason": reason}
        return {"verdict": "answer", "reason": f"{self.score} score {value:.3f} is within the threshold "
                                               f"{self.threshold:.3f}"}

    def config(self) -> dict:
        return {"score": self.score, "threshold": self.threshold, "rejection": self.rejection}


def fit_router(model, train: Split, validation: Split, score: str = "mahalanobis",
               rejection: float = TARGET_REJECTION) -> Router:
    """Fit the feature density on ``train``, set the threshold on ``validation``; attach it to ``model``."""
    if score not in SCORES:
        raise ValueError(f"score is {score!r}; expected one of {', '.join(SCORES)}")
    if not 0 < rejection < 1:
        raise ValueError(f"rejection is {rejection}; expected a share between 0 and 1")
    density = FeatureDensity.fit(model.split_features(train).cpu().double().numpy(), train.case_workflows)
    router = Router(density, score, rejection=rejection)
    values = router.scores(model, model.split_features(validation), validation.case_workflows)[score]
    router.threshold = float(np.quantile(values, 1 - rejection))
    model.router = router
    return router


@dataclass
class AnomalyReport:
    """Anomaly scores of in-domain and other inputs, and how well each score separates them."""

    frames: dict[str, pd.DataFrame]  # set name -> one row per input: id, kind, workflow, every score
    router: Router
    in_domain: str  # the name of the in-domain set

    def all_scores(self) -> pd.DataFrame:
        return pd.concat([f.assign(set=name) for name, f in self.frames.items()], ignore_index=True)

    def separation(self, other: str) -> pd.DataFrame:
        """AUROC (off-domain as the positive class) and FPR at 95% TPR (the share of ``other`` still answered
        when 95% of in-domain inputs are answered) per score."""
        from sklearn.metrics import roc_auc_score

        inside, outside = self.frames[self.in_domain], self.frames[other]
        y = np.r_[np.zeros(len(inside)), np.ones(len(outside))]
        rows = {}
        for s in SCORES:
            values = np.r_[inside[s].to_numpy(), outside[s].to_numpy()]
            keep_95 = np.quantile(inside[s], 0.95)
            rows[s] = {"AUROC": roc_auc_score(y, values), "FPR at 95% TPR": float((outside[s] <= keep_95).mean())}
        return pd.DataFrame.from_dict(rows, orient="index")

    def routed(self) -> pd.DataFrame:
        """The share of each set (and each kind) the saved threshold sends to a human."""
        frame = self.all_scores()
        frame["human"] = frame[self.router.score] > self.router.threshold
        return frame.groupby(["set", "kind"])["human"].agg(["size", "mean"]).rename(
            columns={"size": "inputs", "mean": "sent to a human"})

    def figure(self, score: str | None = None):
        from .plots import score_distributions

        return score_distributions(self.all_scores(), score or self.router.score, self.router.threshold
                                   if (score or self.router.score) == self.router.score else None)


def evaluate_scores(model, in_domain: Split, *others: Inputs) -> AnomalyReport:
    """Score ``in_domain`` (a real split, e.g. test) and each set of ``others`` with ``model.router``."""
    if model.router is None:
        raise ValueError("the model has no router; call anomaly.fit_router(model, train, validation) first")
    frames = {}
    for inputs in (Inputs.from_split(in_domain), *others):
        frame = model.router.scores(model, model.split_features(inputs), inputs.workflows)
        frame.insert(0, "id", inputs.ids)
        frame.insert(1, "kind", inputs.kinds)
        frame.insert(2, "workflow", inputs.workflows)
        frames[inputs.name] = frame
    return AnomalyReport(frames, model.router, in_domain.name)

