"""The decision model: backbone + pooling + one head per question, answering every question in one pass.

``model(texts, workflows, target=None)`` is that pass: it returns a ``DecisionOutput`` (the pooled features, the
logits of every question, the loss when targets are given), in the manner of transformers'
``...ForSequenceClassification``. Training, calibration, routing and the answers below all read it;
``temperature()`` is the one place temperatures are applied from.

``model.decide(state, questions=None)`` returns answers in the System One shape (``systemone.py`` checks the
questions and formats the answers):

- noul:   ``{"type": "noul", "noul": P(true)}``
- choice: ``{"type": "choice", "choice": top, "confidence": P(top), "probabilities": {option: p}}``
- score:  ``{"type": "score", "score": expected level, "confidence": P(top level), "legend": {"0": criterion},
  "probabilities": {"0": p}}``

A hybrid model (``structured`` set, ``training.fit_structured``) also reads the state's own fields with gradient-
boosted trees (``structured.py``) and answers w * heads + (1 - w) * trees, a weight per question; its logits are
the log of that mixture, so temperatures, routing and answers treat them as the heads'.

With a router fitted (``anomaly.fit_router``), the probabilities and confidence take the input's distance from the
training data into account: an input far from every training case answers with the training prior and a confidence
near 0, so a threshold on ``confidence`` alone sends it to a human (``decide(..., raw=True)``: the heads alone).
``model.route(state)`` adds the router's verdict ("answer" or "human") and the scores behind it.
``model.decide_many(requests)`` answers many requests with one padded forward pass per batch of similar lengths.

``model.save(path)`` writes a folder: ``decisionkit.json`` (backbone id and weights checksum, rendering version,
feature settings, question schemas, temperatures, routing threshold, a hybrid's fields and mixing weights),
``heads.safetensors`` (with the anomaly statistics when a router is fitted, and a hybrid's trees as arrays) and, for LoRA models, ``adapter/``; for a fully fine-tuned model, the tuned
backbone itself in ``backbone/`` (safetensors, with its tokenizer).
Saving is atomic. ``decisionkit.load(path)`` refuses a backbone whose weights differ from the trained one.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from . import __version__, systemone
from .atomic import atomic_folder
from .backbone import Backbone, LoraSettings, QuantSettings, add_lora, load_backbone, weights_sha256
from .data import QUESTION_TYPES, RENDER_VERSION, Question, Split, render_state
from .features import default_layers, extract_features, hidden_states, tokenize
from .heads import HeadSet, Targets, calibrated, decision_loss, group_rows, targets
from .pooling import pool
from .structured import StructuredPart
from .systemone import QuestionError, answer  # noqa: F401 (QuestionError is part of this module's interface)

CONFIG_FILE = "decisionkit.json"
HEADS_FILE = "heads.safetensors"
ADAPTER_DIR = "adapter"
BACKBONE_DIR = "backbone"  # a fully fine-tuned backbone, saved whole
MODEL_ITEMS = {CONFIG_FILE, HEADS_FILE, ADAPTER_DIR, BACKBONE_DIR}  # what a save writes; the rest of the folder stays
FORMAT_VERSION = 1  # bump when the saved layout changes


@dataclass(frozen=True)
class FeatureSpec:
    """Which pooled vector the heads read."""

    pooling: str = "mean"  # mean pooling probed best on frozen SmolLM2 (notebook 01)
    layers: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)  # concatenated; fractions of the depth, or layer numbers
    max_length: int = 512  # truncation; every typed-decisions state fits

    def resolved(self, num_layers: int) -> "FeatureSpec":
        """Layer fractions turned into layer numbers for a backbone of ``num_layers`` layers."""
        layers = tuple(int(x) if isinstance(x, int) else max(1, round(x * num_layers)) for x in self.layers)
        return replace(self, layers=layers)

    def to_json(self) -> dict:
        return {"pooling": self.pooling, "layers": list(self.layers), "max_length": self.max_length}

    @classmethod
    def from_json(cls, obj: dict) -> "FeatureSpec":
        return cls(obj["pooling"], tuple(obj["layers"]), obj["max_length"])


def _schema_to_json(schema: dict[str, dict[str, Question]]) -> dict:
    return {wf: {qid: q.to_json() for qid, q in questions.items()} for wf, questions in schema.items()}


def _schema_from_json(obj: dict) -> dict[str, dict[str, Question]]:
    return {wf: {qid: Question.from_json(qid, q, "saved schema") for qid, q in qs.items()} for wf, qs in obj.items()}


@dataclass
class DecisionOutput:
    """What one pass of a ``DecisionModel`` gives, in the manner of transformers' ``SequenceClassifierOutput``:
    the pooled features, the logits of every question and, when targets were given, the loss. Everything that reads
    the heads (training, calibration, routing, answers) reads this."""

    features: torch.Tensor  # (inputs, dim): the standardized pooled vector the heads read
    workflows: list[str]  # each input's workflow
    logits: dict[str, dict[str, torch.Tensor]]  # workflow -> question -> (that workflow's inputs, options)
    rows: dict[str, list[int]]  # workflow -> which inputs its logits belong to (``heads.group_rows``)
    loss: torch.Tensor | None = None  # soft-gold cross-entropy per decision, when targets were given

    def per_case(self) -> list[dict[str, torch.Tensor]]:
        """The logits by input: question id -> logits, in input order (the one place they are regrouped)."""
        out: list[dict[str, torch.Tensor]] = [{} for _ in self.workflows]
        for workflow, positions in self.rows.items():
            for qid, z in self.logits[workflow].items():
                for j, i in enumerate(positions):
                    out[i][qid] = z[j]
        return out


class DecisionModel(nn.Module):
    """A backbone read once per input, pooled, and answered by light linear heads."""

    def __init__(self, backbone: Backbone, schema: dict[str, dict[str, Question]], spec: FeatureSpec = FeatureSpec()):
        super().__init__()
        self.backbone = backbone
        self.encoder = backbone.model  # registered, so optimizers and accelerate see LoRA parameters
        self.schema = schema
        self.spec = spec = spec.resolved(backbone.num_layers)
        dim = backbone.hidden_size * len(spec.layers)
        self.heads = HeadSet(schema, dim)
        # Hidden states have a few huge dimensions; standardizing with train statistics lets one learning rate
        # and one weight decay serve every head. Set by ``normalize_fitted`` from the train features.
        self.register_buffer("feature_mean", torch.zeros(dim))
        self.register_buffer("feature_std", torch.ones(dim))
        self.temperatures = {t: 1.0 for t in QUESTION_TYPES}  # for the probabilities; fitted on validation
        # For the ``confidence`` of choice and score answers, when fitted apart (to correctness, while the
        # probabilities follow the gold distribution); None: the confidence is the top probability.
        self.confidence_temperatures: dict[str, float] | None = None
        self.router = None  # anomaly.Router: distance-aware answers and the threshold that sends inputs to a human
        # structured.StructuredPart: the state's fields read by trees, averaged with the heads (the hybrid model);
        # None: the heads alone. Fitted by ``training.fit_structured`` once the heads are.
        self.structured: StructuredPart | None = None
        # How stage 1 fitted the heads ({"l2", "steps", "lr", "ordinal"}): on a frozen backbone, fit_router re-fits
        # them on folds of train to see the confidence of cases they were not fitted on.
        self.head_fit: dict | None = None
        self.tuned = False  # True once every backbone weight has trained: saving then writes the backbone too
        self.base: dict | None = None  # for a loaded tuned model: the name and hash of the backbone it came from
        self.to(backbone.device)

    # ----- features -------------------------------------------------------------------------------------------
    def normalize_fitted(self, features: torch.Tensor) -> torch.Tensor:
        """Set the standardization from these (train) features, and return them standardized."""
        self.feature_mean.copy_(features.mean(dim=0))
        self.feature_std.copy_(features.std(dim=0, unbiased=False) + 1e-6)
        return self.normalize(features)

    def normalize(self, features: torch.Tensor) -> torch.Tensor:
        return (features - self.feature_mean) / self.feature_std

    def attach_lora(self, settings: LoraSettings) -> None:
        add_lora(self.backbone, settings)
        self.encoder = self.backbone.model

    def unfreeze_backbone(self) -> None:
        """Make every backbone weight trainable (full fine-tuning); ``save`` then writes the backbone as well."""
        self.encoder.requires_grad_(True)
        self.tuned = True

    def forward(self, texts: Sequence[str], workflows: Sequence[str], target: Targets | None = None,
                ordinal: float = 0.0, questions: Sequence[str] | None = None,
                states: Sequence[Any] | None = None) -> DecisionOutput:
        """One forward pass over ``texts`` (each rendered as a state of its workflow), pooled at every layer of the
        spec, concatenated, standardized, and read by the heads of each text's workflow. With ``target`` (gold
        aligned to the texts, ``heads.targets``) the output carries the loss. Gradients flow when the backbone
        trains. A hybrid model (``structured`` set) also reads ``states``, the states the texts render."""
        return self.read(self.encode(tokenize(self.backbone, list(texts), self.spec.max_length)), workflows, target,
                         ordinal, questions, states=states)

    def read(self, features: torch.Tensor, workflows: Sequence[str], target: Targets | None = None,
             ordinal: float = 0.0, questions: Sequence[str] | None = None, heads: HeadSet | None = None,
             states: Sequence[Any] | None = None, structured: StructuredPart | None = None) -> DecisionOutput:
        """The heads (the model's, or ``heads``) on standardized ``features``, one row per input of ``workflows``;
        ``questions``: only these (one workflow). A hybrid model averages them with its trees (or ``structured``'s)
        on the fields of ``states``."""
        heads = self.heads if heads is None else heads
        structured = self.structured if structured is None else structured
        rows = group_rows(list(workflows))
        logits = heads.read(features, rows, questions)
        if structured is not None:
            if states is None or len(states) != len(workflows):
                raise ValueError("this hybrid model reads each input's state fields too: pass states, one per input")
            logits = structured.mix(logits, states, rows)
        loss = None if target is None else decision_loss(self.schema, logits, target, ordinal)
        return DecisionOutput(features, list(workflows), logits, rows, loss)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``forward`` after tokenization: the backbone, the pooling and the standardization (timed apart in the
        latency lab)."""
        return self.normalize(self.pooled(batch))

    def pooled(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The pooled vectors of every feature layer, concatenated, before the standardization."""
        hidden = hidden_states(self.backbone, batch)
        return torch.cat([pool(hidden[layer], batch["attention_mask"], self.spec.pooling)
                          for layer in self.spec.layers], dim=-1)

    def raw_split_features(self, cases) -> torch.Tensor:
        """Unnormalized features of a frozen backbone, read from (or written to) the on-disk cache. The cache
        holds the default layers too, so notebooks, probes and training share one extraction."""
        layers = sorted(set(default_layers(self.backbone.num_layers)) | set(self.spec.layers))
        feats = extract_features(self.backbone, cases, layers=layers, max_length=self.spec.max_length)
        raw = np.hstack([feats.get(self.spec.pooling, layer) for layer in self.spec.layers])
        return torch.as_tensor(raw, device=self.backbone.device)

    def split_features(self, cases) -> torch.Tensor:
        """Normalized features of a split: from the cache when the backbone is frozen, else one pass per case."""
        if self.backbone.frozen:
            return self.normalize(self.raw_split_features(cases))
        with torch.inference_mode():
            return torch.cat([self.encode(tokenize(self.backbone, [text], self.spec.max_length))
                              for text in cases.texts])

    @torch.no_grad()
    def split_output(self, cases, loss: bool = False) -> DecisionOutput:
        """``forward`` over a whole split (features from the cache when the backbone is frozen); ``loss=True``
        adds the loss against the cases' gold."""
        features = self.split_features(cases)
        return self.read(features, cases.case_workflows, targets(cases, device=features.device) if loss else None,
                         states=cases.states)

    # ----- answers --------------------------------------------------------------------------------------------
    def temperature(self, question_type: str, confidence: bool = False) -> float:
        """The temperature that divides a question type's logits: for its probabilities, or for its ``confidence``
        field when that was fitted apart (``calibration.calibrate``). The one place temperatures are applied from."""
        if confidence and self.confidence_temperatures:
            return self.confidence_temperatures[question_type]
        return self.temperatures[question_type]

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
            p = calibrated(z, self.temperature(kind)).double().cpu().numpy()
            sure = calibrated(z, self.temperature(kind, confidence=True)).double().cpu().numpy()
            if weight < 1:
                p = weight * p + (1 - weight) * (self.router.priors if priors is None else priors)[workflow][qid]
            out[qid] = (p, None if kind == "noul" else float(weight * sure[int(np.argmax(p))]))
        return out

    def readout(self, output: DecisionOutput, weights: np.ndarray | None = None
                ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, float]]]:
        """Per input and question, the probabilities (in option order) and the ``confidence`` field that
        ``decide`` answers with, at the heads' ``weights`` (``in_domain``; default 1: the heads alone)."""
        weights = np.ones(len(output.workflows)) if weights is None else weights
        probabilities: list[dict[str, np.ndarray]] = []
        confidences: list[dict[str, float]] = []
        for logits, workflow, weight in zip(output.per_case(), output.workflows, weights):
            parts = self.answer_parts(logits, workflow, weight)
            probabilities.append({qid: p for qid, (p, _) in parts.items()})
            confidences.append({qid: c for qid, (_, c) in parts.items() if c is not None})
        return probabilities, confidences

    @torch.inference_mode()
    def outputs(self, cases: Split, raw: bool = False) -> tuple[list[dict[str, np.ndarray]], list[dict[str, float]]]:
        """``readout`` of a whole split, distance-aware when a router is fitted: what ``metrics.score`` takes.
        ``raw=True``: the calibrated heads alone (see ``anomaly``)."""
        output = self.split_output(cases)
        return self.readout(output, self.in_domain(output, raw))

    def predict(self, cases: Split, raw: bool = False) -> list[dict[str, np.ndarray]]:
        """The probabilities of ``outputs``."""
        return self.outputs(cases, raw)[0]

    def in_domain(self, output: DecisionOutput, raw: bool = False) -> np.ndarray:
        """Per input of ``output``, the weight the heads' answers keep: 1 inside the range of the training features,
        falling towards 0 beyond it (``anomaly.Router.in_domain``); all 1 without a router or with ``raw``."""
        if raw or self.router is None:
            return np.ones(len(output.workflows))
        return self.router.in_domain(self.router.density.distance(output.features.cpu().double().numpy(),
                                                                  output.workflows))

    def _answers(self, logits: dict[str, torch.Tensor], workflow: str, questions: dict[str, Question],
                 weight: float) -> dict[str, dict]:
        """System One answers to ``questions`` from one input's logits (``DecisionOutput.per_case``)."""
        parts = self.answer_parts({qid: logits[qid] for qid in questions}, workflow, weight)
        return {qid: answer(q, *parts[qid]) for qid, q in questions.items()}

    def _read(self, state: Any, questions: dict | None, workflow: str | None, every: bool = False):
        """The output for one state (every trained question of its workflow with ``every``, as the router scores
        them; else the asked ones), its workflow and the asked questions."""
        workflow, asked = systemone.check(self.schema, questions, workflow)
        output = self([render_state(state, workflow)], [workflow], questions=None if every else list(asked),
                      states=[state])
        return output, workflow, asked

    @torch.inference_mode()
    def decide(self, state: Any, questions: dict | None = None, workflow: str | None = None,
               raw: bool = False) -> dict[str, dict]:
        """Answer ``questions`` (System One shape; default: every trained question) about ``state``. With a router,
        the answers are distance-aware (``answer_parts``); ``raw=True`` gives the calibrated heads alone. A state
        longer than ``spec.max_length`` tokens is cut there, as the training features were; the server refuses it
        instead (422 on field 'state'), since a client cannot see the cut."""
        output, workflow, asked = self._read(state, questions, workflow)
        return self._answers(output.per_case()[0], workflow, asked, self.in_domain(output, raw)[0])

    @torch.inference_mode()
    def route(self, state: Any, questions: dict | None = None, workflow: str | None = None,
              raw: bool = False) -> dict:
        """``decide`` plus a routing verdict: ``{"answers", "verdict": "answer" | "human", "reason", "scores"}``.
        The scores cover every trained question of the workflow, as when the threshold was set; the verdict does
        not depend on ``raw``, which only changes the answers shown."""
        self._require_router()
        output, workflow, asked = self._read(state, questions, workflow, every=True)
        scores = self.router.scores(self, output).iloc[0]  # its "in-domain" column is the answers' weight
        weight = 1.0 if raw else float(scores["in-domain"])
        return self._routed(scores, self._answers(output.per_case()[0], workflow, asked, weight))

    def _require_router(self) -> None:
        if self.router is None:
            raise ValueError("this model has no anomaly threshold; fit one with "
                             "decisionkit.anomaly.fit_router(model, train, validation) and save the model")

    def _routed(self, scores: pd.Series, answers: dict) -> dict:
        """The answers, the router's verdict on ``scores`` (one input's row of ``Router.scores``) and the scores."""
        scores = scores.to_dict()
        return {"answers": answers, **self.router.verdict(scores), "scores": {k: float(v) for k, v in scores.items()}}

    @torch.inference_mode()
    def decide_many(self, requests: Sequence[dict], batch_size: int = 16, route: bool = False) -> list[dict]:
        """``decide`` for many requests (each ``{"state", "questions"?, "workflow"?}``), or ``route`` with
        ``route=True``: states of similar length share one padded forward pass, ``batch_size`` at a time. Each
        answer agrees with ``decide``'s for the same request within ``precision.ANSWER_TOLERANCE`` of the compute
        dtype: 1e-5 on every probability and confidence in float32 (padding changes only the sums' order), 0.02 in
        bfloat16, whose CPU kernels depend on the batch's shape; a choice or score changes only where its top two
        options lie within twice that (``systemone.disagreements`` checks it)."""
        if route:
            self._require_router()
        checked = [systemone.check(self.schema, r.get("questions"), r.get("workflow")) for r in requests]
        texts = [render_state(r["state"], workflow) for r, (workflow, _) in zip(requests, checked)]
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths share a batch: less padding
        results: list[dict | None] = [None] * len(texts)
        for lo in range(0, len(texts), batch_size):
            rows = order[lo:lo + batch_size]
            output = self([texts[i] for i in rows], [checked[i][0] for i in rows],
                          states=[requests[i]["state"] for i in rows])
            scores = self.router.scores(self, output) if route else None
            # with a router's scores at hand, their "in-domain" column is the weight: no second distance computation
            weights = scores["in-domain"].to_numpy() if route else self.in_domain(output)
            logits = output.per_case()
            for j, i in enumerate(rows):
                answers = self._answers(logits[j], *checked[i], weights[j])
                results[i] = self._routed(scores.iloc[j], answers) if route else answers
        return results

    # ----- saving ---------------------------------------------------------------------------------------------
    def config(self) -> dict:
        backbone = self.backbone
        return {
            "format": FORMAT_VERSION,
            "decisionkit": __version__,
            "backbone": {**(self.base or {"name": backbone.name, "weights_sha256": backbone.checksum}),
                         "quantize": asdict(backbone.quantize) if backbone.quantize else None,
                         "lora": asdict(backbone.lora) if backbone.lora else None,
                         "tuned": self.tuned},  # the tuned weights are in backbone/, their hash in tuned_sha256
            "render_version": RENDER_VERSION,
            "features": self.spec.to_json(),
            "schema": _schema_to_json(self.schema),
            "temperatures": dict(self.temperatures),
            "confidence_temperatures": self.confidence_temperatures,
            "head_fit": self.head_fit,
            "router": self.router.config() if self.router is not None else None,
            "structured": self.structured.config() if self.structured is not None else None,
        }

    def save(self, path: str | Path) -> Path:
        """Write the model folder atomically: a crash mid-save leaves the previous save intact, and whatever else
        the folder held (training history, reports, a checkpoint) is carried over."""
        path = Path(path)
        with atomic_folder(path) as scratch:
            tensors = {f"heads.{k}": v.detach().cpu().contiguous() for k, v in self.heads.state_dict().items()}
            tensors["feature_mean"] = self.feature_mean.cpu()
            tensors["feature_std"] = self.feature_std.cpu()
            if self.router is not None:
                tensors.update(self.router.density.tensors())
            if self.structured is not None:
                tensors.update({k: torch.from_numpy(v) for k, v in self.structured.tensors().items()})
            save_file(tensors, scratch / HEADS_FILE)
            if self.backbone.lora is not None:
                self.backbone.model.save_pretrained(scratch / ADAPTER_DIR, safe_serialization=True)
            config = self.config()
            if self.tuned:
                self.backbone.model.save_pretrained(scratch / BACKBONE_DIR, safe_serialization=True)
                self.backbone.tokenizer.save_pretrained(scratch / BACKBONE_DIR)
                config["backbone"]["tuned_sha256"] = weights_sha256(scratch / BACKBONE_DIR)
            (scratch / CONFIG_FILE).write_text(json.dumps(config, indent=2))
            if path.exists():
                _carry_over(path, scratch)
        return path

    def load_trained(self, path: str | Path) -> None:
        """Load the heads, normalization and (when saved) adapter weights of a saved folder into this model."""
        path = Path(path)
        tensors = load_file(str(path / HEADS_FILE))
        self.heads.load_state_dict({k[len("heads."):]: v for k, v in tensors.items() if k.startswith("heads.")})
        self.feature_mean.copy_(tensors["feature_mean"])
        self.feature_std.copy_(tensors["feature_std"])
        adapter = path / ADAPTER_DIR / "adapter_model.safetensors"
        if self.backbone.lora is not None and adapter.is_file():
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.encoder, load_file(str(adapter)))


def _carry_over(previous: Path, new: Path) -> None:
    """Hard-link into ``new`` whatever ``previous`` holds besides a model (training history, reports, a checkpoint):
    saving a model again must not delete the rest of its folder. Links cost no copy and leave ``previous`` whole
    until the swap."""
    for item in previous.iterdir():
        if item.name in MODEL_ITEMS:
            continue
        if item.is_dir():
            shutil.copytree(item, new / item.name, copy_function=os.link)
        else:
            os.link(item, new / item.name)


def load(path: str | Path, backbone: str | Path | None = None, device: str | None = None) -> DecisionModel:
    """Open a saved decision model. ``backbone`` overrides where the weights are found (a local folder, say);
    the weights must still be the ones the model was trained on."""
    path = Path(path)
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: {path} is not a saved decision model")
    config = json.loads(config_path.read_text())
    if config.get("format") != FORMAT_VERSION:
        raise ValueError(f"{config_path}: format {config.get('format')!r}; this decisionkit reads {FORMAT_VERSION}")
    saved = config["backbone"]
    quantize = QuantSettings(**saved["quantize"]) if saved["quantize"] else None  # as trained, not the defaults
    tuned = saved.get("tuned", False)
    base = load_backbone(backbone or (path / BACKBONE_DIR if tuned else saved["name"]), quantize=quantize,
                         device=device)
    expected = saved["tuned_sha256"] if tuned else saved["weights_sha256"]
    if base.checksum != expected:
        raise ValueError(f"backbone {base.name!r} has weights sha256 {base.checksum[:16]}…; the model at {path} was "
                         f"trained on {saved['name']!r} with {expected[:16]}…")
    if config["render_version"] != RENDER_VERSION:
        raise ValueError(f"{config_path}: rendering {config['render_version']!r}; this decisionkit renders "
                         f"{RENDER_VERSION!r}")
    model = DecisionModel(base, _schema_from_json(config["schema"]), FeatureSpec.from_json(config["features"]))
    model.tuned = tuned
    if tuned:
        model.base = {"name": saved["name"], "weights_sha256": saved["weights_sha256"]}
    if saved["lora"] is not None:
        model.attach_lora(LoraSettings(**{**saved["lora"], "target_modules": tuple(saved["lora"]["target_modules"])}))
    model.load_trained(path)
    model.temperatures.update(config["temperatures"])
    model.confidence_temperatures = config.get("confidence_temperatures")
    model.head_fit = config.get("head_fit")
    if config.get("structured"):
        arrays = {k: v.numpy() for k, v in load_file(str(path / HEADS_FILE)).items() if k.startswith("structured.")}
        model.structured = StructuredPart.from_saved(config["structured"], arrays)
    if config.get("router") and "priors" not in config["router"]:
        warnings.warn(f"{config_path}: the routing threshold was fitted by an older decisionkit (no distance-aware "
                      f"answers); it is left out. Fit it again with decisionkit.anomaly.fit_router and save the model")
    elif config.get("router"):
        from .anomaly import Router

        model.router = Router.from_saved(config["router"], load_file(str(path / HEADS_FILE)))
    return model.eval()

