import pytest
import torch

from decisionkit.model.pooling import POOLINGS, last_token_index, pool, pool_all


def _random_batch(padding_side: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (7,), generator=gen)
    seq = int(lengths.max()) + 3  # always some padding, even on the longest row
    hidden = torch.randn(7, seq, 5, generator=gen)
    mask = torch.zeros(7, seq, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        if padding_side == "right":
            mask[row, :n] = 1
        else:
            mask[row, seq - n:] = 1
    return hidden, mask


def _loop(hidden, mask, method):
    """The obvious per-example computation, one row at a time."""
    out = []
    for h, m in zip(hidden, mask):
        real = h[m.bool()]
        out.append({"last": real[-1], "mean": real.mean(0), "max": real.max(0).values}[method])
    return torch.stack(out)


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("method", POOLINGS)
def test_pooling_matches_a_per_example_loop(padding_side, method):
    for seed in range(5):
        hidden, mask = _random_batch(padding_side, seed)
        torch.testing.assert_close(pool(hidden, mask, method), _loop(hidden, mask, method))


def test_padding_values_never_leak():
    hidden, mask = _random_batch("right")
    poisoned = hidden.masked_fill(~mask.bool().unsqueeze(-1), 1e6)
    for method, vectors in pool_all(poisoned, mask).items():
        torch.testing.assert_close(vectors, pool(hidden, mask, method))


def test_last_token_index_both_sides():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [1, 3, 3]


def test_bad_input_is_named():
    hidden, mask = _random_batch("right")
    with pytest.raises(ValueError, match="expected one of last, mean, max"):
        pool(hidden, mask, "first")
    mask[0] = 0
    with pytest.raises(ValueError, match="no real token"):
        pool(hidden, mask, "mean")
