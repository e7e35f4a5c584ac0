"""The router that answers need: where the training data ends, the weight the heads keep beyond it, and the
threshold past which a human answers.

- ``FeatureDensity``: the training features per workflow in a low-dimensional projection (the top principal
  directions, one mean per workflow, a shared Ledoit-Wolf shrinkage covariance); ``distance`` is the Mahalanobis
  distance of a pooled feature to its workflow's training features (Lee et al., 2018).
- ``Router.weight``: past the distance of the farthest ``anomaly.TAIL_SHARE`` of held-out real inputs
  (``reference``), the weight w = exp(-(distance - reference) / scale) the heads keep falls from 1 towards 0; the
  answers become w * heads + (1 - w) * the training prior (``DecisionModel.answer_parts``). A hybrid's router
  also reads the fields: past the field surprise of the farthest ``TAIL_SHARE`` of its workflow's held-out real
  inputs (``field_reference``), w is multiplied by exp(-(surprise - field_reference) / field_scale). A blanked
  state, a contradictory one or another workflow's state reads like a real one to the pooled features, not to
  the fields (``fields.Fields.surprise``).
- ``Router.scores``: every anomaly score of the inputs of a model's output (``output_scores``, with the model's
  temperatures and answers, ``DecisionModel.answer_parts``; the distance and the weight as columns ``mahalanobis`` and
  ``in-domain``); ``Router.verdict``: "answer" or "human" from one of them against the threshold.

``anomaly.fit_router`` fits a router; it is saved with the model (``saving.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from .heads import calibrated

SCORES = ("confidence", "raw confidence", "msp", "entropy", "energy", "mahalanobis")
LOW_IS_ANOMALOUS = {"confidence", "raw confidence"}  # the other scores grow as inputs get stranger
PCA_COMPONENTS = 128  # directions kept for the Mahalanobis distance: 2,304 raw dimensions vs 1,120 train cases
TARGET_REJECTION = 0.05  # share of held-out real inputs a threshold sends to a human


def output_scores(model, logits: dict[str, torch.Tensor], workflow: str, weight: float, priors: dict) -> dict:
    """Confidence (the lowest of the answers, distance-aware at ``weight`` towards ``priors``, and raw), MSP (per
    question and the case's minimum), entropy and energy of one input's head outputs. A workflow of yes/no questions
    alone has no confidence field: there, ``weight`` times the lowest top probability stands in for it."""
    scores, msps, entropies, energies = {}, [], [], []
    for qid, z in logits.items():
        t = model.temperatures.of(model.schema[workflow][qid].type)
        p = calibrated(z, t)
        msps.append(float(p.max()))
        scores[f"msp:{qid}"] = msps[-1]
        entropies.append(float(-(p * torch.log(p.clamp_min(1e-12))).sum() / np.log(len(p))))
        energies.append(float(-t * torch.logsumexp(z / t, dim=-1)))
    for name, w in (("confidence", weight), ("raw confidence", 1.0)):
        carried = [c for _, c in model.answer_parts(logits, workflow, w, priors).values() if c is not None]
        scores[name] = min(carried) if carried else w * min(msps)
    scores.update(msp=1 - min(msps), entropy=float(np.mean(entropies)), energy=float(np.mean(energies)))
    return scores


def shown(value: float) -> str:
    """A score as a reason states it: three significant digits, and 0.000 rather than 3e-47 for a weight or a
    confidence that the distance or the fields took to nothing."""
    return f"{value:.3g}" if abs(value) >= 1e-3 else f"{value:.3f}"


def anomalous(score: str, values, threshold: float):
    """True where ``values`` of ``score`` lie on the human side of ``threshold``."""
    return np.asarray(values) < threshold if score in LOW_IS_ANOMALOUS else np.asarray(values) > threshold


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
        # float64, as fitted: in float32 the reloaded model's distance weights (and so its answers) differed from the
        # model that was saved by about 1e-8 (a few hundred kB for a k x dim projection)
        return {f"density.{k}": torch.as_tensor(np.ascontiguousarray(v), dtype=torch.float64) for k, v in out.items()}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "FeatureDensity":
        get = {k[len("density."):]: v.double().numpy() for k, v in tensors.items() if k.startswith("density.")}
        centres = {k[len("centre."):]: v for k, v in get.items() if k.startswith("centre.")}
        return cls(get["mean"], get["components"], centres, get["precision"])


@dataclass
class Router:
    """Where the training data ends (a feature density and its held-out tail), what the answers fall back to beyond
    it, and a threshold on one score, chosen on held-out real inputs: past it, a human answers."""

    density: FeatureDensity
    priors: dict[str, dict[str, np.ndarray]]  # workflow -> question -> mean training gold: the far inputs' answer
    reference: float = float("inf")  # distance of the farthest TAIL_SHARE of held-out real inputs
    scale: float = 1.0  # their mean excess distance: the weight falls e-fold every ``scale`` past ``reference``
    field_reference: dict[str, float] = field(default_factory=dict)  # a hybrid's: workflow -> surprise of its tail
    field_scale: float = 1.0  # the held-out inputs' mean excess surprise past their workflow's reference
    score: str = "confidence"
    threshold: float = 0.0
    rejection: float = TARGET_REJECTION  # the share of held-out real inputs the threshold sends to a human
    fitted_on: dict = field(default_factory=dict)  # which held-out inputs set the tail and threshold, how many

    def weight(self, distances: np.ndarray, surprise: np.ndarray | None = None,
               workflows: list[str] | None = None) -> np.ndarray:
        """The weight the heads keep at these distances: 1 up to ``reference``, then exp(-excess / scale); times
        the same fall past each workflow's ``field_reference`` of the fields' ``surprise`` when both are known."""
        weight = np.exp(-np.maximum(np.asarray(distances, dtype=float) - self.reference, 0.0) / self.scale)
        if surprise is not None and self.field_reference:
            reference = np.array([self.field_reference.get(w, np.inf) for w in workflows])
            weight = weight * np.exp(-np.maximum(np.asarray(surprise, dtype=float) - reference, 0.0) / self.field_scale)
        return weight

    def output_weights(self, output, density: FeatureDensity | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The distances of ``output``'s inputs to the training features (``density``: the router's unless given)
        and the weights the heads keep on them."""
        density = self.density if density is None else density
        distances = density.distance(output.features.cpu().double().numpy(), output.workflows)
        return distances, self.weight(distances, output.surprise, output.workflows)

    @torch.no_grad()
    def scores(self, model, output, density: FeatureDensity | None = None) -> pd.DataFrame:
        """Every anomaly score (and the per-question MSP) of the inputs of ``output`` (a ``DecisionOutput``: their
        features and every trained question's logits), one row each; ``density`` replaces the router's (for a fold
        of cross-fitting). ``model`` supplies the temperatures and the answers' arithmetic."""
        distances, weights = self.output_weights(output, density)
        frame = pd.DataFrame([output_scores(model, {q: v.cpu() for q, v in z.items()}, w, float(v), self.priors)
                              for z, w, v in zip(output.per_case(), output.workflows, weights)])
        frame["mahalanobis"], frame["in-domain"] = distances, weights
        if output.surprise is not None:
            frame["field surprise"] = output.surprise
        return frame

    def verdict(self, scores: dict[str, float]) -> dict:
        value = scores[self.score]
        side = "below" if self.score in LOW_IS_ANOMALOUS else "above"
        if anomalous(self.score, value, self.threshold):
            reason = (f"{self.score} {shown(value)} is {side} the threshold {shown(self.threshold)} (set so that "
                      f"{self.rejection:.0%} of held-out real inputs go to a human)")
            return {"verdict": "human", "reason": reason}
        return {"verdict": "answer", "reason": f"{self.score} {shown(value)} is not {side} the threshold "
                                               f"{shown(self.threshold)}"}

    def config(self) -> dict:
        return {"score": self.score, "threshold": self.threshold, "rejection": self.rejection,
                "reference": self.reference, "scale": self.scale, "field_reference": self.field_reference,
                "field_scale": self.field_scale, "fitted_on": self.fitted_on,
                "priors": {w: {q: p.tolist() for q, p in qs.items()} for w, qs in self.priors.items()}}

    @classmethod
    def from_saved(cls, config: dict, tensors: dict[str, torch.Tensor]) -> "Router":
        priors = {w: {q: np.asarray(p, dtype=float) for q, p in qs.items()} for w, qs in config["priors"].items()}
        return cls(FeatureDensity.from_tensors(tensors), priors,
                   **{k: v for k, v in config.items() if k != "priors"})
