import pytest
import torch

from decisionkit.model.pooling import POOLINGS, last_token_index, merge_windows, pool, pool_all, pool_layers


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


def _windows(padding_side: str, seed: int = 0):
    """A batch of 6 windows of 3 texts (3, 1 and 2 windows, in order), each window with some real tokens."""
    hidden, mask = _random_batch(padding_side, seed)
    return hidden[:6], mask[:6], torch.tensor([0, 0, 0, 1, 2, 2])


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_windows_merge_into_one_vector_per_text(padding_side):
    """mean: the mean over every real token of the text's windows taken together; max: over them too; last: the
    last window's last real token."""
    for seed in range(5):
        hidden, mask, owner = _windows(padding_side, seed)
        merged = pool_all(hidden, mask, owner)
        for text in range(3):
            rows = (owner == text).nonzero().flatten().tolist()
            real = torch.cat([hidden[r][mask[r].bool()] for r in rows])  # the text's tokens, window after window
            torch.testing.assert_close(merged["mean"][text], real.mean(0))
            torch.testing.assert_close(merged["max"][text], real.max(0).values)
            torch.testing.assert_close(merged["last"][text], real[-1])


def test_one_window_a_text_keeps_its_vectors_bit_for_bit():
    hidden, mask = _random_batch("right")
    for method in POOLINGS:
        alone = pool(hidden, mask, method)
        assert torch.equal(merge_windows(alone, torch.arange(len(hidden)), mask, method), alone)
        assert torch.equal(merge_windows(alone, None, mask, method), alone)
    layers = tuple(torch.randn(hidden.shape, generator=torch.Generator().manual_seed(i)) for i in range(3))
    assert torch.equal(pool_layers(layers, mask, "mean", (1, 2), owner=torch.arange(len(hidden))),
                       pool_layers(layers, mask, "mean", (1, 2)))


def test_pool_layers_merges_every_layer_by_owner_and_gradients_flow():
    hidden, mask, owner = _windows("right")
    layers = (hidden.clone().requires_grad_(True), hidden * 2)
    for method in POOLINGS:
        both = pool_layers(layers, mask, method, (0, 1), owner=owner)
        assert both.shape == (3, 2 * hidden.shape[-1])
        torch.testing.assert_close(both[:, hidden.shape[-1]:], pool_all(hidden * 2, mask, owner)[method])
        both.sum().backward()
        assert layers[0].grad is not None and torch.isfinite(layers[0].grad).all()
        layers[0].grad = None
