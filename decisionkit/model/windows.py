"""Tokenizing in windows: what the backbone reads of a state longer than it reads at once.

A rendered state is tokenized in windows of ``max_length`` tokens (the encoder's length: MiniLM reads 512), each with
the tokenizer's special tokens, no overlap (the fast tokenizer's own windowing), at most ``max_windows`` of them
(``features.FeatureSpec``: 8, so 4,096 tokens at 512). ``tokenize`` gives the batch the backbone reads (a row per
window) and each row's ``owner`` (its text), which ``pooling.merge_windows`` pools across; ``windows`` gives every
window of each text as token ids (``systemone`` checks a request's against the cap and the server reads them as they
are: ``pad_windows``); ``window_lengths`` and ``over_cap`` count what a cap would cut. Past the cap, training reads a
text's first ``max_windows`` windows; ``DecisionModel.decide`` and the server refuse it, since a client cannot see a
cut.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..data.cases import Split
from .backbone import Backbone

DEFAULT_MAX_LENGTH = 512  # the longest typed-decisions state is about 490 SmolLM2 tokens rendered as compact JSON
DEFAULT_MAX_WINDOWS = 8  # a state is read in at most 8 windows: 4,096 tokens at 512


def _windowed(tokenizer, texts: Sequence[str], max_length: int, **kwargs):
    """The fast tokenizer's own windowing: every text in windows of ``max_length`` tokens, the special tokens added
    to each, no overlap (``overflow_to_sample_mapping``: the text of each window)."""
    batch = tokenizer(list(texts), truncation=True, max_length=max_length, return_overflowing_tokens=True, stride=0,
                      verbose=False, **kwargs)
    if "overflow_to_sample_mapping" not in batch:
        raise TypeError(f"{type(tokenizer).__name__} does not window long texts (no overflow_to_sample_mapping); "
                        "decisionkit reads them with a fast tokenizer")
    return batch


def tokenize(backbone: Backbone, texts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH,
             padding_side: str = "right", max_windows: int = 1) -> dict[str, torch.Tensor]:
    """What the backbone reads of ``texts``, on its device: ``input_ids`` and ``attention_mask``, one row per window
    of ``max_length`` tokens (special tokens included in each window), and ``owner``, the text each row is a window
    of (0..len(texts)-1, in order: ``torch.arange(len(texts))`` when every text fits in one window). A text of more
    than ``max_windows`` windows keeps its first ``max_windows`` (the default, 1: every text cut at ``max_length``).
    ``DecisionModel.forward`` takes the three as keyword arguments, and pools the windows of a text into one vector.
    """
    tokenizer = backbone.tokenizer
    kept, tokenizer.padding_side = tokenizer.padding_side, padding_side
    try:
        batch = _windowed(tokenizer, texts, max_length, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = kept
    owner = batch["overflow_to_sample_mapping"].long()
    out = {k: batch[k] for k in ("input_ids", "attention_mask")}
    if len(owner) > len(texts):
        first = torch.searchsorted(owner, owner, right=False)  # each text's first row (its windows are in order)
        keep = (torch.arange(len(owner)) - first) < max_windows
        if not bool(keep.all()):
            out, owner = {k: v[keep] for k, v in out.items()}, owner[keep]
    out["owner"] = owner
    return {k: v.to(backbone.device) for k, v in out.items()}


def windows(backbone: Backbone, texts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH
            ) -> list[tuple[tuple[int, ...], ...]]:
    """Each of ``texts`` tokenized in windows of ``max_length`` tokens as ``tokenize`` reads them, all of them (no
    cap): one tuple of windows, each a tuple of token ids, per text."""
    if not texts:
        return []
    batch = _windowed(backbone.tokenizer, texts, max_length)
    out: list[list[tuple[int, ...]]] = [[] for _ in texts]
    for ids, owner in zip(batch["input_ids"], batch["overflow_to_sample_mapping"]):
        out[owner].append(tuple(ids))
    return [tuple(w) for w in out]


def window_lengths(backbone: Backbone, texts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH,
                   max_windows: int = DEFAULT_MAX_WINDOWS) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, windows)`` per text: the tokens read of it (its first ``max_windows`` windows, special tokens
    included) and the windows it needs (more than ``max_windows``: cut in training, refused by ``decide``)."""
    split = windows(backbone, texts, max_length)
    return (np.array([sum(len(w) for w in ws[:max_windows]) for ws in split], dtype=np.int64),
            np.array([len(ws) for ws in split], dtype=np.int64))


def over_cap(model, cases: Split) -> list[str]:
    """The ids of ``cases`` whose rendered state is longer than ``model`` reads (more than ``spec.max_windows``
    windows of ``spec.max_length`` tokens): training reads their first ``max_windows`` windows; ``decide`` and the
    server refuse such a state. What a training report can count."""
    _, needed = window_lengths(model.backbone, cases.texts, model.spec.max_length, model.spec.max_windows)
    return [case_id for case_id, n in zip(cases.ids, needed) if n > model.spec.max_windows]


def pad(backbone: Backbone, input_ids: Sequence[Sequence[int]], padding_side: str = "right") -> dict[str, torch.Tensor]:
    """``tokenize``'s ``input_ids`` and ``attention_mask`` for rows tokenized already (each within the window the
    model reads): the rows padded into one batch, with their attention mask."""
    batch = backbone.tokenizer.pad({"input_ids": [list(ids) for ids in input_ids]}, padding=True,
                                   padding_side=padding_side, return_tensors="pt")
    return {k: batch[k].to(backbone.device) for k in ("input_ids", "attention_mask")}


def pad_windows(backbone: Backbone, texts: Sequence[Sequence[Sequence[int]]],
                padding_side: str = "right") -> dict[str, torch.Tensor]:
    """``tokenize``'s output for texts tokenized in windows already (``windows``; each text's windows as the model
    reads them, within the cap): every window of every text padded into one batch (``pad``), and their ``owner``."""
    batch = pad(backbone, [ids for text in texts for ids in text], padding_side)
    counts = torch.tensor([len(text) for text in texts])
    batch["owner"] = torch.repeat_interleave(torch.arange(len(texts)), counts).to(backbone.device)
    return batch


def window_batches(windows_per_text: Sequence[int], batch_size: int) -> list[list[int]]:
    """Positions ``0..n-1`` (texts, in the order to read them) grouped into forward passes of at most ``batch_size``
    windows each; a text of more windows than that is read alone. Every text's windows share its pass, so its
    windows are pooled together."""
    groups: list[list[int]] = []
    room = 0
    for i, n in enumerate(windows_per_text):
        if not groups or n > room:
            groups.append([])
            room = batch_size
        groups[-1].append(i)
        room -= n
    return groups
