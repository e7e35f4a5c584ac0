"""Pooling: turn a sequence of hidden states into one vector per example.

All three poolings respect the attention mask, so padding (right or left) never leaks into the vector:

- ``last``: the hidden state of the last real token. A causal LM has read the whole input there.
- ``mean``: the average over real tokens.
- ``max``:  the element-wise maximum over real tokens.
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


def pool_layers(hidden: tuple[torch.Tensor, ...], attention_mask: torch.Tensor, method: str, layers,
                checked: bool = True) -> torch.Tensor:
    """``pool`` of each of ``layers`` of ``hidden`` (every layer's hidden states), concatenated: the vector a decision
    model's heads read. ``checked=False``: ``pool_unchecked`` (for a graph export)."""
    pooled = pool if checked else pool_unchecked
    return torch.cat([pooled(hidden[layer], attention_mask, method) for layer in layers], dim=-1)


def pool_all(hidden: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every pooling of one forward pass, keyed by name."""
    return {method: pool(hidden, attention_mask, method) for method in POOLINGS}
