"""The decision model: backbone + pooling + one head per question, answering every question in one pass.

As in transformers, tokenizing comes first (``model.tokenize(texts)``) and the forward pass reads token tensors:
``model(**model.tokenize(texts), workflows=workflows, target=None)`` returns a ``DecisionOutput`` (the pooled,
standardized features, the logits of every question, the loss when targets are given), in the manner of
``...ForSequenceClassification``. Training, calibration, routing and the answers all read it.

A hybrid model (``structured`` set, ``training.fit_structured``) also reads the state's own fields with gradient-
boosted trees (``structured.py``, on ``fields.py``) and answers w * heads + (1 - w) * trees, a weight per question; its logits are
the log of that mixture, so temperatures, routing and answers treat them as the heads'.

What the model answers is ``answers.AnswerMixin`` (temperatures, the distance weight, the System One shape), which
the model inherits as transformers models inherit ``generate``; saving and loading is ``saving.py``; its features of
a whole split come from the on-disk cache (``features.py``). Its public interface:

- ``model.decide(state, questions=None)``: answers in the System One shape; ``model.route(state)`` adds the router's
  verdict ("answer" or "human") and the scores behind it; ``model.decide_many(requests)`` answers many requests
  with one padded forward pass per batch of similar lengths.
- ``model.save(path)`` and ``decisionkit.load(path)``, which refuses a backbone whose weights differ from the
  trained one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..data.cases import QUESTION_TYPES, Question
from . import features, saving
from .answers import AnswerMixin
from .backbone import Backbone, LoraSettings, load_backbone
from .engines import add_lora
from .features import FeatureSpec, hidden_states, standardization, tokenize
from .fitting import HeadRecipe
from .heads import HeadSet, Targets, decision_loss, group_rows, ungroup
from .pooling import pool_layers
from .structured import StructuredPart


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
    surprise: np.ndarray | None = None  # a hybrid's: per input, the share of field checks that fail (fields.py)

    def per_case(self) -> list[dict[str, torch.Tensor]]:
        """The logits by input: question id -> logits, in input order (``heads.ungroup``)."""
        return ungroup(self.logits, self.rows, len(self.workflows))


class DecisionModel(AnswerMixin, nn.Module):
    """A backbone read once per input, pooled, and answered by light linear heads (``AnswerMixin``: the answers)."""

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
        self.temperatures = {t: 1.0 for t in QUESTION_TYPES}  # for the probabilities; fitted on validation
        # For the ``confidence`` of choice and score answers, when fitted apart (to correctness, while the
        # probabilities follow the gold distribution); None: the confidence is the top probability.
        self.confidence_temperatures: dict[str, float] | None = None
        self.router = None  # routing.Router: distance-aware answers and the threshold that sends inputs to a human
        # structured.StructuredPart: the state's fields read by trees, averaged with the heads (the hybrid model);
        # None: the heads alone. Fitted by ``training.fit_structured`` once the heads are.
        self.structured: StructuredPart | None = None
        # How stage 1 fitted the heads: on a frozen backbone, fit_router re-fits them on folds of train to see the
        # confidence of cases they were not fitted on.
        self.head_recipe: HeadRecipe | None = None
        self.tuned = False  # True once every backbone weight has trained: saving then writes the backbone too
        self.base: dict | None = None  # for a loaded tuned model: the name and hash of the backbone it came from
        self.to(backbone.device)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` of ``texts``, cut at ``spec.max_length`` tokens: ``forward``'s input."""
        return tokenize(self.backbone, list(texts), self.spec.max_length)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, workflows: Sequence[str],
                target: Targets | None = None, ordinal: float = 0.0, questions: Sequence[str] | None = None,
                states: Sequence[Any] | None = None) -> DecisionOutput:
        """One forward pass over a tokenized batch (each row a state of its workflow, rendered), pooled at every
        layer of the spec, concatenated, standardized, and read by the heads of each row's workflow. With ``target``
        (gold aligned to the rows, ``heads.targets``) the output carries the loss. Gradients flow when the backbone
        trains. A hybrid model also reads ``states``, the states the rows render."""
        features = self.encode({"input_ids": input_ids, "attention_mask": attention_mask})
        return self.read(features, workflows, target, ordinal, questions, states=states)

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
        surprise = None
        if structured is not None:
            if states is None or len(states) != len(workflows):
                raise ValueError("this hybrid model reads each input's state fields too: pass states, one per input")
            logits, surprise = structured.mix(logits, states, rows)
        loss = None if target is None else decision_loss(self.schema, logits, target, ordinal)
        return DecisionOutput(features, list(workflows), logits, rows, loss, surprise)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``forward`` before the heads: the backbone, the pooling and the standardization (timed apart in the
        latency lab)."""
        return self.normalize(self.pooled(batch))

    def pooled(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The pooled vectors of every feature layer, concatenated, before the standardization."""
        return pool_layers(hidden_states(self.backbone, batch), batch["attention_mask"], self.spec.pooling,
                           self.spec.layers)

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

    def save(self, path: str | Path) -> Path:
        """Write the model into the folder ``path`` atomically, keeping whatever else the folder held (``saving``)."""
        return saving.save(self, path)


def load(path: str | Path, backbone: str | Path | None = None, device: str | None = None) -> DecisionModel:
    """Open a saved decision model. ``backbone`` overrides where the weights are found (a local folder, say);
    the weights must still be the ones the model was trained on."""
    path = Path(path)
    saved = saving.read_config(path)
    where, quantize = saving.saved_backbone(path, saved)
    base = load_backbone(backbone or where, quantize=quantize, device=device)
    saving.check_backbone(base, path, saved)
    model = DecisionModel(base, saving.schema_from_json(saved["schema"]), FeatureSpec.from_json(saved["features"]))
    saving.restore(model, path, saved)
    return model.eval()
