"""Token heads: a small readout trained on a frozen backbone's token states, beside the pooled linear heads.

Mean pooling gives every token of a state the same weight, and a linear head reads that one average. A token head
learns where to look: the token states of one layer (normalized and projected to ``width``, optionally
through ``blocks`` small transformer layers trained from scratch) are pooled once per question by a learned query
(attention pooling: each (workflow, question) has its own), and a linear layer per question reads its pooled
vector into the option logits. Its output is grouped as ``HeadSet.read``'s (workflow -> question -> logits), so the
soft-gold loss (``heads.decision_loss``) and the metrics read it as they read the heads.

The states are cached once per (backbone weights, compute dtype, rendering, window, cap on windows, layer)
(``features.extract_features(token_layers=...)``, ``features.TokenStates``), so a setting costs its training alone:
AdamW, a linear warm-up and cosine decay over ``epochs`` passes of shuffled batches of similar length (less
padding), soft-gold cross-entropy, the gradient clipped at 1.

What it measured here (``benchmarks/token_head.py``, ``benchmarks/results/token_head_*.json``, notebook 01): on
MiniLM-L6 no setting beat the mean-pooled linear heads on the dev slice, and on test the finalist was level with
them; set beside the pooled heads and the trees as a third part, it lowered KL by more than noise and raised
accuracy by less than noise. A model does not carry it yet: a hybrid of three parts fits it about eleven times
(five folds for the mixing weights, the final fit, five folds for the router), over ten minutes on two cores for
MiniLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..core import settings
from ..data.cases import Split
from ..data.questions import Question
from .features import TokenStates, extract_features
from .fitting import HeadRecipe, OutOfFoldMix, heads_answers, mix_out_of_fold
from .heads import decision_loss, group_rows, head_key, targets, ungroup
from .trees import TREE_ROUNDS
from .windows import DEFAULT_MAX_LENGTH


@dataclass(frozen=True)
class TokenHeadSpec:
    """A token head's shape, the layer it reads and how it is trained."""

    layer: float | int = 1.0  # the hidden states it reads: a fraction of the depth, or a layer number
    width: int = 128  # the token states are projected to this width before pooling
    blocks: int = 0  # transformer layers (pre-norm) over the projected tokens before pooling; 0: attention pooling
    attention_heads: int = 4  # of the pooling attention and of each block
    feed_forward: int = 256  # each block's feed-forward width
    dropout: float = 0.1  # on the projected tokens and inside the blocks
    # passes over the training cases (2,100 steps on 1,120 cases at batch 16): the head learns late, as the rate
    # decays; fewer epochs and other peak rates measured worse (benchmarks/results/choices.md#token-head)
    epochs: int = 30
    batch_size: int = 16
    lr: float = 1e-3  # peak rate
    weight_decay: float = 0.01
    warmup: float = 0.06  # share of the steps with a linear warm-up, then cosine decay to zero
    seed: int = 3407

    def resolved(self, num_layers: int) -> "TokenHeadSpec":
        """The layer as a layer number for a backbone of ``num_layers`` layers (as ``FeatureSpec.resolved``)."""
        layer = self.layer if isinstance(self.layer, int) else max(1, round(self.layer * num_layers))
        return replace(self, layer=layer)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "TokenHeadSpec":
        return cls(**obj)


class TokenHead(nn.Module):
    """Attention pooling per question over one layer's token states, then a linear layer per question."""

    def __init__(self, schema: dict[str, dict[str, Question]], dim: int, spec: TokenHeadSpec = TokenHeadSpec()):
        super().__init__()
        self.schema, self.spec = schema, spec
        # no affine part: a scale and shift before a linear layer are the linear layer's own (and the states need no
        # gradient, so none is computed through the norm)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.project = nn.Linear(dim, spec.width)
        self.dropout = nn.Dropout(spec.dropout)  # on the projected tokens: a third of the states' width on MiniLM
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(spec.width, spec.attention_heads, spec.feed_forward, spec.dropout,
                                       batch_first=True, norm_first=True) for _ in range(spec.blocks)])
        # one query per question, small and random: at the start every question pools (nearly) the mean of the tokens
        generator = torch.Generator().manual_seed(spec.seed)
        self.queries = nn.ParameterDict({
            workflow: nn.Parameter(0.02 * torch.randn(len(questions), spec.width, generator=generator))
            for workflow, questions in schema.items()})
        self.pool = nn.MultiheadAttention(spec.width, spec.attention_heads, batch_first=True)
        self.pooled_norm = nn.LayerNorm(spec.width)
        self.outputs = nn.ModuleDict()
        for workflow, questions in schema.items():
            for qid, question in questions.items():
                out = nn.Linear(spec.width, len(question.options))
                nn.init.zeros_(out.weight)  # uniform answers until trained, as the linear heads start
                nn.init.zeros_(out.bias)
                self.outputs[head_key(workflow, qid)] = out

    def forward(self, states: torch.Tensor, mask: torch.Tensor, workflows: list[str]
                ) -> dict[str, dict[str, torch.Tensor]]:
        """Logits of every question of each row's workflow: workflow -> question id -> (that workflow's rows,
        options), rows grouped by ``heads.group_rows``. ``states``: (rows, tokens, hidden); ``mask``: True at the
        real tokens."""
        h = self.dropout(self.project(self.norm(states)))
        padding = ~mask
        for block in self.blocks:
            h = block(h, src_key_padding_mask=padding)
        out = {}
        for workflow, rows in group_rows(list(workflows)).items():
            queries = self.queries[workflow].unsqueeze(0).expand(len(rows), -1, -1)
            pooled, _ = self.pool(queries, h[rows], h[rows], key_padding_mask=padding[rows], need_weights=False)
            pooled = self.pooled_norm(pooled)  # (rows, questions, width)
            out[workflow] = {qid: self.outputs[head_key(workflow, qid)](pooled[:, j])
                             for j, qid in enumerate(self.schema[workflow])}
        return out


def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, chunk: int = 16) -> list:
    """Positions in shuffled batches of similar length: shuffled, sorted by length within chunks of ``chunk``
    batches, and the batches shuffled again (less padding, every epoch a new order)."""
    order = rng.permutation(len(lengths))
    batches = []
    for lo in range(0, len(order), batch_size * chunk):
        part = sorted(order[lo:lo + batch_size * chunk], key=lambda i: lengths[i])
        batches += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def fit_token_head(schema: dict[str, dict[str, Question]], states: TokenStates, cases: Split,
                   spec: TokenHeadSpec = TokenHeadSpec(), progress: bool = True) -> TokenHead:
    """Train a token head on ``cases`` (their states in ``states``) against their soft gold, as ``spec`` says."""
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    head = TokenHead(schema, states.dim, spec)
    optimizer = torch.optim.AdamW(head.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    steps = spec.epochs * math.ceil(len(cases) / spec.batch_size)
    warmup = max(1, round(spec.warmup * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, max(0, s - warmup) / max(1, steps - warmup)))))
    lengths = np.array([states.length(i) for i in cases.ids])
    head.train()
    for _ in tqdm(range(spec.epochs), desc="token head", unit="epoch",
                  disable=not progress or settings.progress_hidden()):
        for batch in length_batches(lengths, spec.batch_size, rng):
            x, mask = states.batch([cases.ids[i] for i in batch])
            loss = decision_loss(schema, head(x, mask, [cases[i].workflow for i in batch]), targets(cases, batch))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            schedule.step()
    return head.eval()


@torch.no_grad()
def token_head_probabilities(head: TokenHead, states: TokenStates, cases: Split, batch_size: int = 32
                             ) -> list[dict[str, np.ndarray]]:
    """Each case's answer distributions (question -> probabilities), as ``metrics.score`` takes them."""
    head.eval()
    out: list[dict[str, np.ndarray]] = [{} for _ in cases]
    order = np.argsort([states.length(i) for i in cases.ids], kind="stable")
    for lo in range(0, len(order), batch_size):
        rows = order[lo:lo + batch_size]
        x, mask = states.batch([cases.ids[i] for i in rows])
        workflows = [cases[i].workflow for i in rows]
        for i, logits in zip(rows, ungroup(head(x, mask, workflows), group_rows(workflows), len(rows))):
            out[i] = {qid: torch.softmax(z.double(), -1).numpy() for qid, z in logits.items()}
    return out


def token_answers(states: TokenStates, spec: TokenHeadSpec = TokenHeadSpec()):
    """``answers(fitted_on, asked)``: a token head fitted as ``spec`` says on the Split ``fitted_on``, answering
    ``asked`` (both cases' states in ``states``): a part ``fitting.mix_out_of_fold`` mixes with the trees."""
    def answers(fitted_on: Split, asked: Split) -> list[dict[str, np.ndarray]]:
        head = fit_token_head(fitted_on.schema(), states, fitted_on, spec, progress=False)
        return token_head_probabilities(head, states, asked)
    return answers


def token_hybrid(backbone, train: Split, scored: Split, spec: TokenHeadSpec = TokenHeadSpec(),
                 max_length: int = DEFAULT_MAX_LENGTH, rounds: int = TREE_ROUNDS, heads: HeadRecipe | None = None,
                 pooled_layers: Sequence[int] = (), max_windows: int = 1) -> OutOfFoldMix:
    """A token head on ``backbone``'s token states of ``spec.layer``, fitted on ``train``, answering
    ``scored`` alone and mixed with trees on the fields as the hybrid mixes its pooled heads
    (``fitting.mix_out_of_fold``, trees of ``rounds`` boosting rounds). With ``heads`` (a ``HeadRecipe``, as a
    model keeps it), mean-pooled linear heads on ``pooled_layers`` are a second part, fitted the same way: each part
    alone, each with the trees, and both with the trees. One forward pass per case of ``train`` and ``scored`` gives
    the token states and the pooled features (cached); a state longer than ``max_length`` tokens is read in windows,
    at most ``max_windows``, its token states those of its windows one after the other."""
    layer = spec.resolved(backbone.num_layers).layer
    both = Split(f"{train.name} and {scored.name}", list(train) + list(scored), train.source)
    features = extract_features(backbone, both, layers=tuple(pooled_layers) or None, max_length=max_length,
                                max_windows=max_windows, token_layers=(layer,), progress=False)
    parts = {"token head": token_answers(features.tokens[layer], spec)}
    if heads is not None:
        pooled = np.hstack([features.get("mean", pooled) for pooled in pooled_layers])
        parts["pooled heads"] = heads_answers(dict(zip(both.ids, pooled)), heads)
    return mix_out_of_fold(parts, train, scored, rounds=rounds)
