"""The decision model: backbone + pooling + one head per question, answering every question in one pass.

As in transformers, tokenizing comes first (``model.tokenize(texts)``) and the forward pass reads token tensors:
``model(**model.tokenize(texts), workflows=workflows, target=None)`` returns a ``DecisionOutput`` (the pooled,
standardized features, the logits of every question, the loss when targets are given), in the manner of
``...ForSequenceClassification``. Training, calibration, routing and the answers all read it.

A state longer than the encoder's window (``spec.max_length`` tokens) is read in windows of that length, each pooled,
then pooled across them into one vector per state (``pooling.merge_windows``; ``tokenize``'s ``owner`` says which
state each window belongs to), up to ``spec.max_windows`` windows: training reads a longer state's first windows;
``decide``, ``decide_many`` and the server refuse it (``systemone.state_windows``: a ``QuestionError`` on field
'state', 422 ``too_long`` on the wire).

A hybrid model (``structured`` set, ``training.fit_structured``) also reads the state's own fields with gradient-
boosted trees (``structured.py``, on ``fields.py``) and its words with the lexical part (``lexical.py``), and answers
w_heads * heads + w_trees * trees + w_lexical * lexical, weights per question; its logits are the log of that
mixture, so temperatures, routing and answers treat them as the heads'.

What the model answers is in the model itself, from the state it defines: the temperatures (``Temperatures``, a part of
the model like its router and trees, applied in ``answer_parts``; fitted on validation by ``calibration.calibrate``, for the probabilities and, apart, for
the ``confidence`` field); the distance weight (``heads_weights``: with a router, an input far from the training
data keeps a weight w < 1 of the heads' answers, its probabilities w * heads + (1 - w) * the training prior and its
confidence w * the heads' confidence, ``answer_parts``, so a threshold on ``confidence`` alone sends it to a human;
``raw=True``: the calibrated hybrid before the router); answers in the System One shape (``systemone`` checks the questions and
formats each answer). Saving and loading is ``saving.py``; its features of a whole split come from the on-disk cache
(``features.py``). Its public interface:

- ``model.decide(state, questions=None)``: answers in the System One shape; ``model.route(state)`` adds the router's
  verdict ("answer" or "human") and the scores behind it; ``model.decide_many(requests)`` answers many requests
  with one padded forward pass per batch of similar lengths.
- ``model.outputs(split)`` / ``model.predict(split)``: per-split probabilities and confidences for the metrics.
- ``model.save(path)`` and ``decisionkit.load(path)``, which refuses a backbone whose weights differ from the
  trained one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..contract import systemone
from ..data.cases import Split
from ..data.questions import Question
from . import features, saving
from .backbone import Backbone, LoraSettings, load_backbone
from .engines import add_lora
from .features import FeatureSpec, hidden_states, standardization
from .fitting import HeadRecipe
from .heads import HeadSet, Targets, Temperatures, calibrated
from .output import DecisionOutput, read
from .pooling import pool_layers
from .structured import StructuredPart
from .windows import pad_windows, tokenize, window_batches, windows


class DecisionModel(nn.Module):
    """A backbone read once per input, pooled, and answered by light linear heads."""

    def __init__(self, backbone: Backbone, schema: dict[str, dict[str, Question]], spec: FeatureSpec = FeatureSpec()):
        super().__init__()
        self.backbone = backbone
        self.encoder = backbone.model  # registered, so optimizers and accelerate see LoRA parameters
        self.schema = schema
        self.spec = spec = spec.resolved(backbone.num_layers)
        if backbone.kind == "encoder" and max(spec.layers) < backbone.num_layers:
            backbone.truncate(max(spec.layers))  # nothing reads past the deepest feature layer: it is not computed
        dim = backbone.hidden_size * len(spec.layers)
        self.heads = HeadSet(schema, dim)
        # The heads read standardized features (``features.standardization``), with the train features' statistics
        # set by ``normalize_fitted``.
        self.register_buffer("feature_mean", torch.zeros(dim))
        self.register_buffer("feature_std", torch.ones(dim))
        self.temperatures = Temperatures()  # 1 until fitted on validation (``calibration.calibrate``)
        self.router = None  # routing.Router: distance-aware answers and the threshold that sends inputs to a human
        # structured.StructuredPart: the state's fields read by trees, averaged with the heads (the hybrid model);
        # None: the heads alone. Fitted by ``training.fit_structured`` once the heads are.
        self.structured: StructuredPart | None = None
        # How stage 1 fitted the heads: on a frozen backbone, fit_router re-fits them on folds of train to see the
        # confidence of cases they were not fitted on.
        self.head_recipe: HeadRecipe | None = None
        self.tuned = False  # True once every backbone weight has trained: saving then writes the backbone too
        self.base: dict | None = None  # for a loaded tuned model: the name, hash and revision of the backbone it came from
        # a loaded model's folder and version (``saving.model_version``): what the decision log records of it
        self.folder: Path | None = None
        self.version: str | None = None
        self.to(backbone.device)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` of ``texts`` in windows of ``spec.max_length`` tokens, and each
        window's ``owner`` (its text): ``forward``'s input. A text of more than ``spec.max_windows`` windows keeps
        its first ones, as training reads it (``decide`` refuses such a state instead: ``systemone.state_windows``)."""
        return tokenize(self.backbone, list(texts), self.spec.max_length, max_windows=self.spec.max_windows)

    def windows_of(self, texts: Sequence[str]) -> list[tuple[tuple[int, ...], ...]]:
        """Every window of each of ``texts`` (rendered states) as token ids, as this model reads them (no cap:
        ``systemone.within_cap`` checks it)."""
        return windows(self.backbone, list(texts), self.spec.max_length)

    def pad(self, windows: Sequence[Sequence[Sequence[int]]]) -> dict[str, torch.Tensor]:
        """``forward``'s input for states tokenized in windows already (``systemone.state_windows``)."""
        return pad_windows(self.backbone, windows)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, workflows: Sequence[str],
                target: Targets | None = None, ordinal: float = 0.0, questions: Sequence[str] | None = None,
                states: Sequence[Any] | None = None, owner: torch.Tensor | None = None) -> DecisionOutput:
        """One forward pass over a tokenized batch (each row a window of a state of its workflow, rendered; ``owner``:
        the state each row is a window of, None: one row a state), pooled at every layer of the spec, concatenated,
        pooled across each state's windows, standardized, and read by the heads of each state's workflow. With
        ``target`` (gold aligned to the states, ``heads.targets``) the output carries the loss. Gradients flow when
        the backbone trains. A hybrid model also reads ``states``, the states the rows render."""
        features = self.encode({"input_ids": input_ids, "attention_mask": attention_mask, "owner": owner})
        return self.read(features, workflows, target, ordinal, questions, states=states)

    def read(self, features: torch.Tensor, workflows: Sequence[str], target: Targets | None = None,
             ordinal: float = 0.0, questions: Sequence[str] | None = None,
             states: Sequence[Any] | None = None) -> DecisionOutput:
        """The heads on standardized ``features``, one row per input of ``workflows``; ``questions``: only these (one
        workflow). A hybrid model averages them with its trees on the fields of ``states`` (``output.read``)."""
        return read(self.schema, self.heads, self.structured, features, workflows, target, ordinal, questions, states)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``forward`` before the heads: the backbone, the pooling and the standardization (timed apart in the
        latency lab); one row per state."""
        return self.normalize(self.pooled(batch))

    def pooled(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The pooled vectors of every feature layer, concatenated, before the standardization: one row per state,
        its windows (``batch["owner"]``, when the batch has one) pooled together."""
        return pool_layers(hidden_states(self.backbone, batch), batch["attention_mask"], self.spec.pooling,
                           self.spec.layers, owner=batch.get("owner"))

    def normalize_fitted(self, pooled: torch.Tensor) -> torch.Tensor:
        """Set the standardization from these (train) pooled features, and return them standardized."""
        mean, std = standardization(pooled)
        self.feature_mean.copy_(mean)
        self.feature_std.copy_(std)
        return self.normalize(pooled)

    def normalize(self, pooled: torch.Tensor) -> torch.Tensor:
        return (pooled - self.feature_mean) / self.feature_std

    def attach_lora(self, settings: LoraSettings) -> None:
        add_lora(self.backbone, settings)
        self.encoder = self.backbone.model

    def unfreeze_backbone(self) -> None:
        """Make every backbone weight trainable (full fine-tuning); ``save`` then writes the backbone as well."""
        self.encoder.requires_grad_(True)
        self.tuned = True

    # Its features of a whole split, from the on-disk cache when the backbone is frozen (features.py)
    split_pooled = features.split_pooled
    split_features = features.split_features
    split_output = features.split_output

    # ----- what the model answers, from its logits --------------------------------------------------------------
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
            p = calibrated(z, self.temperatures.of(kind)).double().cpu().numpy()
            sure = calibrated(z, self.temperatures.of(kind, confidence=True)).double().cpu().numpy()
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
        ``raw=True``: the calibrated answers before the router (a hybrid's every part, no distance weight)."""
        output = self.split_output(cases)
        return self.readout(output, self.heads_weights(output, raw))

    def predict(self, cases: Split, raw: bool = False) -> list[dict[str, np.ndarray]]:
        """The probabilities of ``outputs``."""
        return self.outputs(cases, raw)[0]

    def _answers(self, logits: dict[str, torch.Tensor], item: systemone.Checked, weight: float) -> dict[str, dict]:
        """System One answers to a checked request's questions from one input's logits (``DecisionOutput.per_case``)."""
        parts = self.answer_parts({qid: logits[qid] for qid in item.questions}, item.workflow, weight)
        return {qid: systemone.answer(q, *parts[qid]) for qid, q in item.questions.items()}

    def _read(self, state: Any, questions: dict | None, workflow: str | None, every: bool = False):
        """The output for one state (every trained question of its workflow with ``every``, as the router scores
        them; else the asked ones) and the request checked."""
        item = systemone.checked(self.schema, state, questions, workflow)
        output = self(**self.pad([systemone.state_windows(self, item.text)]), workflows=[item.workflow],
                      questions=None if every else list(item.questions), states=[item.state])
        return output, item

    @torch.inference_mode()
    def decide(self, state: Any, questions: dict | None = None, workflow: str | None = None,
               raw: bool = False, log=None) -> dict[str, dict]:
        """Answer ``questions`` (System One shape; default: every trained question) about ``state``. With a router,
        the answers are distance-aware (``answer_parts``); ``raw=True`` gives them before the router. A state
        longer than ``spec.max_length`` tokens is read in windows of that length, pooled across them, as the
        training features were; past ``spec.max_windows`` windows (``spec.max_tokens``) it is refused with a
        ``QuestionError`` on field 'state' (the server's 422 ``too_long``): training cuts such a state, but a client
        cannot see a cut. ``log`` (a ``loop.log.DecisionLog``): the answer is kept there as the server keeps it,
        and queued for review when the router sends it to a human."""
        if log is not None:
            return self._logged(log, state, questions, workflow, raw)["answers"]
        output, item = self._read(state, questions, workflow)
        return self._answers(output.per_case()[0], item, self.heads_weights(output, raw)[0])

    @torch.inference_mode()
    def route(self, state: Any, questions: dict | None = None, workflow: str | None = None,
              raw: bool = False, log=None) -> dict:
        """``decide`` plus a routing verdict: ``{"answers", "verdict": "answer" | "human", "reason", "scores"}``.
        The scores cover every trained question of the workflow, as when the threshold was set; the verdict does
        not depend on ``raw``, which only changes the answers shown. ``log``: as ``decide``'s."""
        if log is not None:
            return self._logged(log, state, questions, workflow, raw)
        self._require_router()
        output, item = self._read(state, questions, workflow, every=True)
        scores = self.router.scores(self, output).iloc[0]  # its "in-domain" column is the answers' weight
        weight = 1.0 if raw else float(scores["in-domain"])
        return self._routed(scores, self._answers(output.per_case()[0], item, weight))

    def _logged(self, log, state: Any, questions: dict | None, workflow: str | None, raw: bool) -> dict:
        """``route`` (or ``decide``, without a router) with the answer recorded in ``log`` (a DecisionLog) and its
        request id added."""
        started = time.perf_counter()
        if self.router is not None:
            found = self.route(state, questions, workflow, raw)
        else:
            found = {"answers": self.decide(state, questions, workflow, raw)}
        workflow = systemone.workflow_for(self.schema, questions, workflow)
        asked = questions if questions is not None else {q: x.to_json() for q, x in self.schema[workflow].items()}
        asked = {q: x.to_json() if isinstance(x, Question) else x for q, x in asked.items()}
        found["request_id"] = log.record(
            model=self.folder.name if self.folder else "model", version=self.version, folder=self.folder,
            workflow=workflow, state=state, questions=asked, answers=found["answers"],
            routing={k: found[k] for k in ("verdict", "reason", "scores")} if "verdict" in found else None,
            latency_ms=(time.perf_counter() - started) * 1000)
        return found

    def _require_router(self) -> None:
        if self.router is None:
            raise ValueError("this model has no anomaly threshold; fit one with "
                             "decisionkit.training.anomaly.fit_router(model, train, validation) and save the model")

    def _routed(self, scores: pd.Series, answers: dict) -> dict:
        """The answers, the router's verdict on ``scores`` (one input's row of ``Router.scores``) and the scores."""
        scores = scores.to_dict()
        return {"answers": answers, **self.router.verdict(scores), "scores": {k: float(v) for k, v in scores.items()}}

    def decide_many(self, requests: Sequence[dict], batch_size: int = 16, route: bool = False) -> list[dict]:
        """``decide`` for many requests (each ``{"state", "questions"?, "workflow"?}``), or ``route`` with
        ``route=True``: states of similar length share one padded forward pass, ``batch_size`` windows at a time (a
        state of more windows is read alone); a state past the cap is refused as ``decide`` refuses it. Each
        answer agrees with ``decide``'s for the same request within ``precision.ANSWER_TOLERANCE`` of the compute
        dtype: 1e-5 on every probability and confidence in float32 (padding changes only the sums' order), 0.02 in
        bfloat16, whose CPU kernels depend on the batch's shape; a choice or score changes only where its top two
        options lie within twice that (``systemone.disagreements`` checks it)."""
        return self.decide_checked([systemone.checked(self.schema, r["state"], r.get("questions"), r.get("workflow"))
                                    for r in requests], batch_size, route)

    @torch.inference_mode()
    def decide_checked(self, items: Sequence[systemone.Checked], batch_size: int = 16, route: bool = False,
                       input_ids: Sequence[Sequence[Sequence[int]]] | None = None) -> list[dict]:
        """``decide_many`` for requests checked already (``systemone.checked``); ``input_ids``: their rendered
        states tokenized already in windows, each within the cap (the server's, from ``systemone.prepare``), read
        as they are. Without them each state is tokenized here, and one past the cap refused (``QuestionError``)."""
        if route:
            self._require_router()
        if input_ids is None:  # one tokenizer call for them all
            input_ids = [systemone.within_cap(self, found) for found in
                         self.windows_of([item.text for item in items])]
        lengths = [sum(len(ids) for ids in found) for found in input_ids]
        order = np.argsort(lengths, kind="stable")  # similar lengths share a batch: less padding
        results: list[dict | None] = [None] * len(items)
        for group in window_batches([len(input_ids[i]) for i in order], batch_size):
            rows = order[group]
            batch = self.pad([input_ids[i] for i in rows])
            output = self(**batch, workflows=[items[i].workflow for i in rows], states=[items[i].state for i in rows])
            scores = self.router.scores(self, output) if route else None
            # with a router's scores at hand, their "in-domain" column is the weight: no second distance computation
            weights = scores["in-domain"].to_numpy() if route else self.heads_weights(output)
            logits = output.per_case()
            for j, i in enumerate(rows):
                answers = self._answers(logits[j], items[i], weights[j])
                results[i] = self._routed(scores.iloc[j], answers) if route else answers
        return results

    def save(self, path: str | Path) -> Path:
        """Write the model into the folder ``path`` atomically, keeping whatever else the folder held (``saving``)."""
        return saving.save(self, path)


def load(path: str | Path, backbone: str | Path | None = None, device: str | None = None) -> DecisionModel:
    """Open a saved decision model as it was trained: the backbone at its saved revision, computing in the saved
    dtype (``DECISIONKIT_DTYPE`` still wins: ``precision.as_saved``). ``backbone`` overrides where the weights are
    found (a local folder, say; the saved revision is then not asked for); the weights must still be the ones the
    model was trained on."""
    path = Path(path).expanduser()
    saved = saving.ModelConfig.read(path)
    where, how = saving.saved_backbone(path, saved)
    if backbone is not None and str(backbone) != str(where):
        how.pop("revision", None)
    base = load_backbone(backbone or where, device=device, **how)
    saving.check_backbone(base, path, saved)
    model = DecisionModel(base, saving.schema_from_json(saved.schema), FeatureSpec.from_json(saved.features))
    saving.restore(model, path, saved)
    model.folder, model.version = path, saving.model_version(path)
    return model.eval()
