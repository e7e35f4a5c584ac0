"""Pooled features: one forward pass of the backbone per case, every pooling of a few layers, cached on disk.

Frozen features are what a heads-only decision model trains on, and what the pooling comparison probes.
A text longer than the window (``max_length`` tokens, the encoder's length: MiniLM reads 512) is read in windows of
``max_length`` tokens, each with the tokenizer's special tokens, at most ``max_windows`` of them (``FeatureSpec``:
8, so 4,096 tokens at 512; tokenized by ``windows.py``), and pooled across them (``pooling.merge_windows``): the
features of a text of one window are what they were when texts were cut at ``max_length``. Past the cap, training
keeps a text's first ``max_windows`` windows and counts it (``Features.cut``, ``windows.over_cap``);
``DecisionModel.decide`` and the server refuse it instead (``systemone.state_windows``), since a client cannot see a
cut. The on-disk cache (``feature_cache.py``) is keyed by the backbone's weights, the rendered texts (so the
rendering version), the window length, the cap on windows and the layers, so a change to any of them extracts again
instead of reusing stale vectors. A list of cases whose texts were extracted before as part of other lists (a model's train pool, then its train and dev
slices; the first 10 cases of each workflow, then the first 5) reads their rows from those files, and extracts only
the texts never seen: one forward pass per text, whatever list it comes in. An extraction saves the rows it made as
it goes (``feature_cache.Entry``), so one interrupted, or killed, loses at most the last ``PARTIAL_SECONDS``: run
again, it extracts only the rest.

The same pass can keep one layer's states at every real token (``token_layers``: ``TokenStates``, float16, cached
beside the pooled vectors under the same key plus the layer): what a token head (``token_head.py``) reads.

A decision model reads one of these vectors (``FeatureSpec``: a pooling of a few layers, concatenated), standardized
with its training features' statistics (``standardization``); ``split_pooled``, ``split_features`` and
``split_output`` give a model's features and output for a whole split, from the cache when its backbone is frozen.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from safetensors.numpy import load_file
from tqdm.auto import tqdm

from ..core import settings
from ..data.cases import Split
from .backbone import Backbone
from .feature_cache import Entry, cache_key, cached_rows, metadata, save_atomic, text_hashes
from .heads import targets
from .pooling import POOLINGS, last_token_index, pool_all
from .windows import DEFAULT_MAX_LENGTH, DEFAULT_MAX_WINDOWS, tokenize, window_batches, window_lengths


@dataclass(frozen=True)
class FeatureSpec:
    """Which pooled vector a decision model's heads read."""

    pooling: str = "mean"  # mean pooling probed best on frozen SmolLM2 (notebook 01)
    layers: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)  # concatenated; fractions of the depth, or layer numbers
    max_length: int = DEFAULT_MAX_LENGTH  # the window, in tokens (special tokens included)
    max_windows: int = DEFAULT_MAX_WINDOWS  # the cap: a state is read in at most this many windows

    def __post_init__(self):
        if self.max_length < 1 or self.max_windows < 1:
            raise ValueError(f"max_length is {self.max_length} and max_windows {self.max_windows}; both must be "
                             "at least 1")

    @property
    def max_tokens(self) -> int:
        """The most tokens a state may hold, special tokens of every window included: ``max_windows`` windows of
        ``max_length``."""
        return self.max_length * self.max_windows

    def resolved(self, num_layers: int) -> "FeatureSpec":
        """Layer fractions turned into layer numbers for a backbone of ``num_layers`` layers."""
        layers = tuple(int(x) if isinstance(x, int) else max(1, round(x * num_layers)) for x in self.layers)
        return replace(self, layers=layers)

    def to_json(self) -> dict:
        return {"pooling": self.pooling, "layers": list(self.layers), "max_length": self.max_length,
                "max_windows": self.max_windows}

    @classmethod
    def from_json(cls, obj: dict) -> "FeatureSpec":
        # a model saved before windows has no max_windows: it reads the default cap
        return cls(obj["pooling"], tuple(obj["layers"]), obj["max_length"],
                   obj.get("max_windows", DEFAULT_MAX_WINDOWS))


def default_layers(num_layers: int) -> tuple[int, ...]:
    """Quarter points of the stack, last layer included: (8, 15, 22, 30) for SmolLM2's 30 layers."""
    return tuple(sorted({max(1, round(num_layers * f)) for f in (0.25, 0.5, 0.75, 1.0)}))


def standardization(x):
    """Per-dimension mean and standard deviation (of the population; plus 1e-6, so that no dimension divides by 0)
    of training features, a numpy array or a torch tensor (rows: cases). Hidden states have a few huge dimensions:
    standardized, every dimension weighs alike for one learning rate and one L2 strength."""
    std = x.std(axis=0) if isinstance(x, np.ndarray) else x.std(dim=0, unbiased=False)
    return x.mean(0), std + 1e-6


@dataclass
class Encoded:
    """Hidden states of one batch: ``hidden[layer]`` is (rows, seq, dim); layer 0 is the embeddings. A row is one
    window of the text ``owner[row]`` (``tokenize``)."""

    hidden: tuple[torch.Tensor, ...]
    attention_mask: torch.Tensor
    input_ids: torch.Tensor
    owner: torch.Tensor | None = None


def hidden_states(backbone: Backbone, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Every layer's hidden states for a tokenized batch (one row per window; its ``owner``, if any, is not read),
    in the backbone's compute dtype, returned as float32 (gradients flow: training uses this too). Under bfloat16
    the frozen weights are the copies cast once per process (``Precision.frozen_weights_cast``), not cast again by
    autocast on every call."""
    with backbone.precision.autocast(), backbone.precision.frozen_weights_cast(backbone.model):
        out = backbone.body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            output_hidden_states=True)
    return tuple(h.float() for h in out.hidden_states)


@torch.inference_mode()
def encode(backbone: Backbone, texts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH,
           padding_side: str = "right", max_windows: int = 1) -> Encoded:
    """Tokenize ``texts`` (in at most ``max_windows`` windows each: ``tokenize``) and run the backbone once without
    gradients, keeping every layer."""
    batch = tokenize(backbone, texts, max_length, padding_side, max_windows)
    return Encoded(hidden_states(backbone, batch), batch["attention_mask"], batch["input_ids"], batch["owner"])


@dataclass
class Features:
    """Pooled features of a list of cases: ``get(pooling, layer)`` is an (n_cases, hidden) array."""

    ids: list[str]
    layers: tuple[int, ...]
    arrays: dict[str, np.ndarray]
    seconds_per_case: float  # measured when the features were extracted (kept in the cache)
    from_cache: bool
    tokens: dict[int, "TokenStates"] = field(default_factory=dict)  # layer -> its token states, when asked for
    windows: np.ndarray | None = None  # per case, the windows its text needs (more than max_windows: cut)
    max_windows: int = DEFAULT_MAX_WINDOWS  # the cap the features were read under

    @property
    def cut_ids(self) -> list[str]:
        """The cases whose text is longer than the cap: their features read the first ``max_windows`` windows."""
        if self.windows is None:
            return []
        return [case_id for case_id, n in zip(self.ids, self.windows) if n > self.max_windows]

    @property
    def cut(self) -> int:
        """How many cases were cut at the cap."""
        return len(self.cut_ids)

    def get(self, pooling: str = "last", layer: int | None = None) -> np.ndarray:
        layer = self.layers[-1] if layer is None else layer
        key = f"{pooling}@{layer}"
        if key not in self.arrays:
            raise KeyError(f"no features for pooling {pooling!r} at layer {layer}; have layers {list(self.layers)} "
                           f"and poolings {list(POOLINGS)}")
        return self.arrays[key]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class TokenStates:
    """One layer's hidden states at every real token of each case (the attention mask's ones; a text of several
    windows: its windows' real tokens one after the other, special tokens of each included, up to the cap), in
    float16: case ``i``'s tokens are ``states[offsets[i]:offsets[i + 1]]``."""

    ids: list[str]
    layer: int
    offsets: np.ndarray  # (cases + 1,) int64
    states: np.ndarray  # (tokens of every case, hidden) float16

    def __post_init__(self):
        self._row = {case_id: i for i, case_id in enumerate(self.ids)}

    def get(self, case_id: str) -> np.ndarray:
        """The (tokens, hidden) states of one case."""
        i = self._row[case_id]
        return self.states[self.offsets[i]:self.offsets[i + 1]]

    def length(self, case_id: str) -> int:
        i = self._row[case_id]
        return int(self.offsets[i + 1] - self.offsets[i])

    @property
    def dim(self) -> int:
        return self.states.shape[1]

    def batch(self, ids: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The cases ``ids`` padded on the right into one float32 batch: (cases, longest, hidden) states and the
        (cases, longest) mask of real tokens."""
        parts = [self.get(i) for i in ids]
        x = np.zeros((len(parts), max(len(p) for p in parts), self.dim), dtype=np.float32)
        mask = np.zeros(x.shape[:2], dtype=bool)
        for row, part in enumerate(parts):
            x[row, :len(part)], mask[row, :len(part)] = part, True
        return torch.from_numpy(x), torch.from_numpy(mask)

    @classmethod
    def from_rows(cls, ids: list[str], layer: int, rows: Sequence[np.ndarray]) -> "TokenStates":
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        return cls(ids, layer, offsets, np.concatenate(rows).astype(np.float16))


def extract_features(
    backbone: Backbone,
    cases: Split,
    *,
    layers: Sequence[int] | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    max_windows: int = 1,
    token_layers: Sequence[int] = (),
    batch_size: int | None = None,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> Features:
    """Pooled features (every pooling, at ``layers``) of every case, from one forward pass per case; with
    ``token_layers``, the same pass also keeps those layers' states at every real token (``Features.tokens``).
    A text longer than ``max_length`` tokens is read in windows of that length, at most ``max_windows`` (its first
    ones: ``Features.cut`` counts the texts cut there), pooled across them (``pooling.merge_windows``). The default,
    one window, cuts every text at ``max_length`` as the course's probes read them; a model's features pass its own
    cap (``split_pooled``: ``spec.max_windows``), so training reads what ``decide`` reads.

    On CPU the default batch size is 1 (padding costs more than batching gains on two cores); on a GPU, 16. The
    batch size counts windows: a pass reads whole texts up to that many windows (a longer text is read alone).
    A backbone that is training (LoRA adapters, or every weight) changes its features, so they are not cached.
    """
    layers = tuple(layers or default_layers(backbone.num_layers))
    token_layers = tuple(token_layers)
    bad = [layer for layer in layers + token_layers if not 1 <= layer <= backbone.num_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range; the backbone has layers 1..{backbone.num_layers}")
    if max_windows < 1:
        raise ValueError(f"max_windows is {max_windows}; a text is read in at least one window")
    texts = cases.texts
    hashes = text_hashes(texts)
    cache = cache and backbone.frozen
    entry, token_paths, pooled, known, seconds = None, {}, {}, {}, None
    if cache:
        root = Path(cache_dir) if cache_dir is not None else settings.cache_dir()
        family = cache_key(backbone, (), max_length, layers, max_windows)[:12]
        path = root / "features" / (f"{family}-{cache_key(backbone, texts, max_length, layers, max_windows)}"
                                    ".safetensors")
        # token states are keyed by the same texts, weights, dtype, rendering, window and cap, and by their own layer
        token_paths = {layer: root / "features" / f"{cache_key(backbone, texts, max_length, (layer,), max_windows)}"
                       f".tokens.safetensors" for layer in token_layers}
        if path.is_file() and all(p.is_file() for p in token_paths.values()):
            features = _load(path)
            features.tokens = {layer: _load_tokens(p) for layer, p in token_paths.items()}
            return features
        entry = Entry(path, cases.ids, hashes, layers, max_windows, partial=not token_layers)
        if not token_layers:  # token states need the forward pass anyway
            pooled, known, seconds = cached_rows(path.parent, family, hashes)  # rows extracted before, read back
    missing = [i for i in range(len(texts)) if i not in known]
    batch_size = batch_size or (16 if backbone.device == "cuda" else 1)
    needed = np.zeros(len(texts), dtype=np.int64)  # windows each text needs, before the cap
    needed[list(known)] = list(known.values())
    read = np.zeros(0, dtype=np.int64)  # tokens read of each missing text
    if missing:
        read, needed[missing] = window_lengths(backbone, [texts[i] for i in missing], max_length, max_windows)
    # similar lengths share a batch: less padding
    order = np.array(missing)[np.argsort(read, kind="stable")].astype(int)
    tokens: dict[int, list] = {layer: [None] * len(texts) for layer in token_layers}
    start = time.perf_counter()
    groups = window_batches([min(int(needed[i]), max_windows) for i in order], batch_size)
    bar = tqdm(groups, desc=f"features {cases.name}", unit="batch", disable=not progress or settings.progress_hidden())
    try:
        for group in bar:
            rows = order[group]
            enc = encode(backbone, [texts[i] for i in rows], max_length, max_windows=max_windows)
            for layer in layers:
                for method, vectors in pool_all(enc.hidden[layer], enc.attention_mask, enc.owner).items():
                    key = f"{method}@{layer}"
                    if key not in pooled:
                        pooled[key] = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)
                    pooled[key][rows] = vectors.cpu().numpy()
            real, owner = enc.attention_mask.bool().cpu(), enc.owner.cpu()
            for layer in token_layers:
                states = enc.hidden[layer].cpu()
                for j, i in enumerate(rows):  # its windows' real tokens, one window after the other
                    mine = (owner == j).nonzero().flatten().tolist()
                    tokens[layer][i] = torch.cat([states[w][real[w]] for w in mine]).numpy().astype(np.float16)
            if entry is not None:
                entry.add(rows, pooled, needed)
    except BaseException:  # an interruption keeps the rows made (a re-run reads them)
        if entry is not None:
            entry.save_partial(pooled, needed)
        raise
    if missing or seconds is None:
        seconds = (time.perf_counter() - start) / max(len(missing), 1)
    features = Features(cases.ids, layers, pooled, seconds, from_cache=not missing,
                        tokens={layer: TokenStates.from_rows(cases.ids, layer, rows) for layer, rows in tokens.items()},
                        windows=needed, max_windows=max_windows)
    if entry is not None:
        entry.finish(pooled, needed, seconds)
        for layer, states in features.tokens.items():
            save_atomic(token_paths[layer], {"states": states.states, "offsets": states.offsets},
                        {"ids": json.dumps(cases.ids), "layer": str(layer)})
    return features


def split_pooled(model, cases: Split) -> torch.Tensor:
    """The pooled features of ``cases`` that a model with a frozen backbone reads, before their standardization:
    read from (or written to) the on-disk cache, which holds the default layers too, so notebooks, probes and
    training share one extraction."""
    spec, backbone = model.spec, model.backbone
    layers = sorted(set(default_layers(backbone.num_layers)) | set(spec.layers))
    features = extract_features(backbone, cases, layers=layers, max_length=spec.max_length,
                                max_windows=spec.max_windows)
    return torch.as_tensor(np.hstack([features.get(spec.pooling, layer) for layer in spec.layers]),
                           device=backbone.device)


def split_features(model, cases: Split) -> torch.Tensor:
    """The standardized features of ``cases`` that ``model`` reads: from the cache when its backbone is frozen, else
    one pass per case."""
    if model.backbone.frozen:
        return model.normalize(split_pooled(model, cases))
    with torch.inference_mode():
        return torch.cat([model.encode(model.tokenize([text])) for text in cases.texts])


@torch.no_grad()
def split_output(model, cases: Split, loss: bool = False):
    """``model``'s output (``DecisionOutput``) over a whole split, its features from ``split_features``; with
    ``loss=True``, the loss against the cases' gold."""
    features = split_features(model, cases)
    return model.read(features, cases.case_workflows, targets(cases, device=features.device) if loss else None,
                      states=cases.states)


def _load(path: Path) -> Features:
    meta = metadata(path)
    return Features(json.loads(meta["ids"]), tuple(json.loads(meta["layers"])), load_file(str(path)),
                    float(meta["seconds_per_case"]), from_cache=True,
                    windows=np.array(json.loads(meta["windows"]), dtype=np.int64), max_windows=int(meta["max_windows"]))


def _load_tokens(path: Path) -> TokenStates:
    meta, arrays = metadata(path), load_file(str(path))
    return TokenStates(json.loads(meta["ids"]), int(meta["layer"]), arrays["offsets"], arrays["states"])


@dataclass
class PaddingPitfall:
    """How far a naive "last position" vector under right padding lands from the true last-token vector."""

    texts_tokens: list[int]
    padded_to: int
    cosine: np.ndarray  # cosine similarity of naive vs correct, per example
    relative_l2: np.ndarray  # ||naive - correct|| / ||correct||, per example

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"real tokens": self.texts_tokens, "padded to": self.padded_to,
                             "naive pools a pad token": [n < self.padded_to for n in self.texts_tokens],
                             "cosine(naive, correct)": self.cosine.round(4),
                             "relative L2 difference": self.relative_l2.round(4)})


def padding_pitfall(backbone: Backbone, texts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH) -> PaddingPitfall:
    """Pool ``texts`` in one right-padded batch two ways: position -1 (naive) and the last real token."""
    enc = encode(backbone, texts, max_length, padding_side="right")
    hidden = enc.hidden[-1]
    naive = hidden[:, -1]
    correct = hidden[torch.arange(hidden.shape[0]), last_token_index(enc.attention_mask)]
    cosine = torch.nn.functional.cosine_similarity(naive, correct, dim=-1)
    relative = (naive - correct).norm(dim=-1) / correct.norm(dim=-1)
    lengths = enc.attention_mask.sum(dim=1).tolist()
    return PaddingPitfall(lengths, hidden.shape[1], cosine.cpu().numpy(), relative.cpu().numpy())
