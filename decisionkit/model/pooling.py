"""Pooling: turn a sequence of hidden states into one vector per example.

All three poolings respect the attention mask, so padding (right or left) never leaks into the vector:

- ``last``: the hidden state of the last real token. A causal LM has read the whole input there.
- ``mean``: the average over real tokens.
- ``max``:  the element-wise maximum over real tokens.

A text longer than the encoder's window is read in several windows (rows of the batch; ``owner`` maps each row to
its text, ``windows.tokenize``), each pooled alone, then merged into one vector per text by ``merge_windows``: the
mean weighted by each window's real tokens (the mean over every real token of the text), the element-wise maximum
over its windows, or its last window's vector. A text of one window keeps its vector as it is.
"""

from __future__ import annotations

import torch

POOLINGS = ("last", "mean", "max")


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of the last real token in each row, for right or left padding."""
    seq_len = attention_mask.shape[1]
    # Flip so the last real token comes first; argmax returns the first maximum.
    return seq_len - 1 - attention_mask.flip(dims=[1]).long().argmax(dim=1)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, method: str = "last") -> torch.Tensor:
    """Pool ``hidden`` (batch, seq, dim) over the real tokens of ``attention_mask`` (batch, seq)."""
    if method not in POOLINGS:
        raise ValueError(f"pooling is {method!r}; expected one of {', '.join(POOLINGS)}")
    if attention_mask.sum(dim=1).min() == 0:
        raise ValueError("attention_mask has a row with no real token; every example needs at least one")
    return pool_unchecked(hidden, attention_mask, method)


def pool_unchecked(hidden: torch.Tensor, attention_mask: torch.Tensor, method: str) -> torch.Tensor:
    """``pool`` without the checks on the values, which a graph export cannot trace (``onnx_runtime``)."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    if method == "last":
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return hidden[rows, last_token_index(attention_mask)]
    if method == "mean":
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    return hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).amax(dim=1)


def one_window_each(owner: torch.Tensor | None, rows: int) -> bool:
    """True when every row of a batch is a text of its own, in order (no ``owner``, or ``owner`` is 0..rows-1)."""
    return owner is None or (owner.numel() == rows and
                             torch.equal(owner.cpu(), torch.arange(rows, dtype=owner.dtype)))


def merge_windows(vectors: torch.Tensor, owner: torch.Tensor | None, attention_mask: torch.Tensor,
                  method: str) -> torch.Tensor:
    """One vector per text from the pooled vectors of its windows: ``vectors`` (windows, dim), row ``i`` a window of
    text ``owner[i]`` (texts 0..n-1, each with at least one window, its windows in reading order); ``attention_mask``
    (windows, seq): the windows' real tokens. ``mean``: the windows' means weighted by their real tokens, which is
    the mean over every real token of the text; ``max``: the element-wise maximum over the windows; ``last``: the
    last window's vector. Texts of one window keep their vectors as they are (bit for bit); gradients flow."""
    if method not in POOLINGS:
        raise ValueError(f"pooling is {method!r}; expected one of {', '.join(POOLINGS)}")
    if one_window_each(owner, vectors.shape[0]):
        return vectors
    owner = owner.to(vectors.device).long()
    texts = int(owner.max()) + 1
    if method == "last":
        rows = torch.arange(len(owner), device=owner.device)
        last = torch.full((texts,), -1, dtype=torch.long, device=owner.device).scatter_reduce(
            0, owner, rows, "amax", include_self=True)
        return vectors[last]
    if method == "mean":
        weights = attention_mask.sum(dim=1).to(vectors.dtype)
        total = vectors.new_zeros(texts, vectors.shape[1]).index_add(0, owner, vectors * weights.unsqueeze(-1))
        return total / vectors.new_zeros(texts).index_add(0, owner, weights).unsqueeze(-1)
    index = owner.unsqueeze(-1).expand_as(vectors)
    return vectors.new_zeros(texts, vectors.shape[1]).scatter_reduce(0, index, vectors, "amax", include_self=False)


def pool_layers(hidden: tuple[torch.Tensor, ...], attention_mask: torch.Tensor, method: str, layers,
                checked: bool = True, owner: torch.Tensor | None = None) -> torch.Tensor:
    """``pool`` of each of ``layers`` of ``hidden`` (every layer's hidden states), concatenated: the vector a decision
    model's heads read, one per text (``owner``: the text each row is a window of, ``merge_windows``; None: one row
    a text). ``checked=False``: ``pool_unchecked`` (for a graph export, of one window a text)."""
    pooled = pool if checked else pool_unchecked
    vectors = torch.cat([pooled(hidden[layer], attention_mask, method) for layer in layers], dim=-1)
    return merge_windows(vectors, owner, attention_mask, method)


def pool_all(hidden: torch.Tensor, attention_mask: torch.Tensor,
             owner: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Every pooling of one forward pass, keyed by name, one vector per text (``owner`` as in ``pool_layers``)."""
    return {method: merge_windows(pool(hidden, attention_mask, method), owner, attention_mask, method)
            for method in POOLINGS}
