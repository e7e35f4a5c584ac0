import numpy as np
import pytest
import torch

from decisionkit.core.precision import Precision
from decisionkit.data.cases import Split
from decisionkit.model.features import default_layers, encode, extract_features, padding_pitfall
from decisionkit.model.pooling import pool, pool_all


@pytest.fixture(scope="module")
def small(splits):
    return splits["validation"].head(2)


def test_default_layers():
    assert default_layers(30) == (8, 15, 22, 30)
    assert default_layers(2) == (1, 2)


def test_features_match_a_direct_forward_and_are_cached(tiny_backbone, small, tmp_path):
    first = extract_features(tiny_backbone, small, layers=(2, 4), max_length=128, max_windows=8, cache_dir=tmp_path)
    assert not first.from_cache and first.ids == small.ids and first.seconds_per_case > 0
    assert first.get("mean", 2).shape == (len(small), 64)
    enc = encode(tiny_backbone, [small[1].text], max_length=128, max_windows=8)  # every window of it
    np.testing.assert_allclose(first.get("last")[1], pool_all(enc.hidden[4], enc.attention_mask, enc.owner)["last"][0],
                               rtol=1e-4, atol=1e-4)
    again = extract_features(tiny_backbone, small, layers=(2, 4), max_length=128, max_windows=8, cache_dir=tmp_path)
    assert again.from_cache and again.seconds_per_case == first.seconds_per_case
    for key, array in first.arrays.items():
        np.testing.assert_array_equal(again.arrays[key], array)
    assert again.windows.tolist() == first.windows.tolist() and again.cut == first.cut == 0
    # Another window length is another cache entry; so is another cap on windows (cutting the longer texts).
    other = extract_features(tiny_backbone, small, layers=(2, 4), max_length=64, max_windows=8, cache_dir=tmp_path)
    assert not other.from_cache
    capped = extract_features(tiny_backbone, small, layers=(2, 4), max_length=128, max_windows=1, cache_dir=tmp_path)
    assert not capped.from_cache and capped.cut == int((first.windows > 1).sum()) > 0
    assert len(list((tmp_path / "features").glob("*.safetensors"))) == 3


def test_texts_cached_in_other_lists_are_read_back_and_only_new_texts_are_extracted(backbone, splits, tmp_path,
                                                                                      monkeypatch):
    from decisionkit.model import features as module

    four = splits["validation"].head(1)  # one case a workflow
    pool = extract_features(backbone, four, layers=(30,), max_length=64, cache_dir=tmp_path)
    passes, real = [], module.encode
    monkeypatch.setattr(module, "encode", lambda b, texts, *a, **k: passes.append(len(texts)) or real(b, texts, *a, **k))
    part = Split("part", [four[2], four[0]], "test")  # a slice of the pool, in another order
    sliced = extract_features(backbone, part, layers=(30,), max_length=64, cache_dir=tmp_path)
    assert passes == [] and sliced.from_cache and sliced.ids == part.ids
    for key, array in pool.arrays.items():
        np.testing.assert_array_equal(sliced.arrays[key], array[[2, 0]])
    new = next(c for c in splits["validation"] if c.id not in four.ids)
    mixed = extract_features(backbone, Split("mixed", [four[1], new], "test"), layers=(30,), max_length=64,
                             cache_dir=tmp_path)
    assert passes == [1] and not mixed.from_cache  # the new case alone went through the backbone
    alone = extract_features(backbone, Split("new", [new], "test"), layers=(30,), max_length=64, cache=False)
    for key, array in pool.arrays.items():
        np.testing.assert_array_equal(mixed.arrays[key][0], array[1])
        np.testing.assert_allclose(mixed.arrays[key][1], alone.arrays[key][0], rtol=1e-6, atol=1e-6)
    passes.clear()  # another cut, or other layers, reads nothing extracted at this one
    extract_features(backbone, part, layers=(30,), max_length=32, cache_dir=tmp_path)
    extract_features(backbone, part, layers=(15, 30), max_length=64, cache_dir=tmp_path)
    assert passes == [1] * 4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batching_does_not_change_features(tiny_backbone, small, dtype, monkeypatch):
    """float32: padding only reorders sums. bfloat16: the kernels depend on the batch's shape (on AMX, elements moved
    by 0.2 standard deviations), so only the vector as a whole is held: within 2% of its length (bfloat16 keeps 8 bits
    of mantissa, a rounding of 0.4% per operation). What answers guarantee is tested in test_numerics.py."""
    monkeypatch.setattr(tiny_backbone, "precision", Precision("cpu", dtype, "test"))
    # The tiny random Llama (mechanics: the same kernels at a hundredth of the cost; bfloat16 without its own
    # instructions is slow), one window a case, each cut at 96 tokens; windows are tested in test_model.py
    one = extract_features(tiny_backbone, small, layers=(4,), max_length=96, max_windows=1, batch_size=1, cache=False)
    two = extract_features(tiny_backbone, small, layers=(4,), max_length=96, max_windows=1, batch_size=2, cache=False)
    for key in one.arrays:
        if dtype == "float32":
            np.testing.assert_allclose(one.arrays[key], two.arrays[key], rtol=1e-4, atol=1e-4)
        else:
            moved = np.linalg.norm(one.arrays[key] - two.arrays[key], axis=1) / np.linalg.norm(one.arrays[key], axis=1)
            assert moved.max() < 0.02, (key, moved)


def test_extraction_casts_the_weights_once_and_gives_autocasts_features_to_the_last_bit(tiny_backbone, small,
                                                                                         monkeypatch):
    """Under bfloat16 an extraction casts the frozen weights once for all its cases; each case's features equal its
    own forward pass under autocast alone, bit for bit, and the float32 weights are back afterwards."""
    monkeypatch.setattr(tiny_backbone, "precision", Precision("cpu", "bfloat16", "test"))
    features = extract_features(tiny_backbone, small, layers=(4,), max_length=96, max_windows=1, batch_size=1,
                                cache=False)  # one window a case (cut at 96 tokens), as encode reads by default
    assert all(p.dtype == torch.float32 for p in tiny_backbone.model.parameters())
    for i, case in enumerate(small):
        enc = encode(tiny_backbone, [case.text], max_length=96)  # autocast alone: weights cast at every call
        np.testing.assert_array_equal(features.get("mean", 4)[i], pool(enc.hidden[4], enc.attention_mask, "mean")[0].numpy())


def test_bad_layer_and_pooling_are_named(backbone, small):
    with pytest.raises(ValueError, match=r"layers \[31\] out of range"):
        extract_features(backbone, small, layers=(31,), cache=False)
    feats = extract_features(backbone, small, layers=(30,), max_length=32, max_windows=1, cache=False)
    with pytest.raises(KeyError, match="no features for pooling 'mean' at layer 15"):
        feats.get("mean", 15)


def test_padding_pitfall_shows_a_pad_token_vector(backbone):
    result = padding_pitfall(backbone, ["workflow: a\n{\"x\": 1}", "workflow: b\n" + "{\"y\": 2} " * 20])
    table = result.table()
    assert table["naive pools a pad token"].tolist() == [True, False]
    assert result.cosine[1] == pytest.approx(1.0, abs=1e-5)  # the longest row has no padding
    assert result.relative_l2[0] > 0.05  # the short row's naive vector is a different vector
    assert backbone.tokenizer.padding_side == "right"  # encode restores the tokenizer


def test_a_long_text_is_read_in_windows_up_to_the_cap(tiny_backbone, splits):
    """tokenize: windows of max_length tokens, special tokens in each, their owner; the first max_windows kept.
    extract_features: the token states of a text are its windows' real tokens, one window after the other, and a
    text past the cap is counted."""
    from decisionkit.model.windows import tokenize, window_lengths, windows

    case = max(splits["validation"].head(1), key=lambda c: len(c.text))
    split = windows(tiny_backbone, [case.text, "short"], 32)
    whole = tiny_backbone.tokenizer(case.text)["input_ids"]
    assert [ids for w in split[0] for ids in w] == whole and all(len(w) <= 32 for w in split[0])
    assert len(split[0]) == -(-len(whole) // 32) > 3 and len(split[1]) == 1
    batch = tokenize(tiny_backbone, [case.text, "short"], 32, max_windows=8)
    assert batch["owner"].tolist() == [0] * min(8, len(split[0])) + [1]
    assert batch["input_ids"][0].tolist() == list(split[0][0])
    cut = tokenize(tiny_backbone, [case.text, "short"], 32, max_windows=2)
    assert cut["owner"].tolist() == [0, 0, 1] and torch.equal(cut["input_ids"], batch["input_ids"][[0, 1, -1]])
    one = tokenize(tiny_backbone, ["short", "a bit longer"], 32)
    assert one["owner"].tolist() == [0, 1]  # nothing overflows: one row a text
    tokens, needed = window_lengths(tiny_backbone, [case.text, "short"], 32, 2)
    assert needed.tolist() == [len(split[0]), 1] and tokens.tolist() == [64, len(split[1][0])]
    short = min(splits["validation"], key=lambda c: len(c.text))
    cap = int(window_lengths(tiny_backbone, [short.text], 32)[1][0])
    assert len(split[0]) > cap  # the long case is cut at the cap, the short one is not
    two = Split("two", [case, short], "test")
    features = extract_features(tiny_backbone, two, layers=(2,), max_length=32, max_windows=cap, token_layers=(2,),
                                cache=False)
    assert features.cut_ids == [case.id] and features.windows[0] == len(split[0])
    assert features.tokens[2].length(case.id) == cap * 32  # its first windows' tokens
    wide = extract_features(tiny_backbone, two, layers=(2,), max_length=32, max_windows=8, token_layers=(2,),
                            cache=False)
    enc = encode(tiny_backbone, [case.text], 32, max_windows=8)
    real = torch.cat([enc.hidden[2][w][enc.attention_mask[w].bool()] for w in range(len(enc.owner))])
    np.testing.assert_allclose(wide.tokens[2].get(case.id), real.numpy(), rtol=1e-2, atol=1e-2)  # float16
    np.testing.assert_allclose(wide.get("mean", 2)[0], real.mean(0).numpy(), rtol=1e-4, atol=1e-5)


def test_an_interrupted_extraction_keeps_its_rows_and_a_rerun_extracts_only_the_rest(tiny_backbone, splits,
                                                                                      tmp_path, monkeypatch):
    """Rows are saved as partial entries while extracting (here after every batch) and on the way out of an
    interruption; a re-run reads them and runs the backbone on the other texts alone, with the features of a run
    never interrupted. Once the list's entry is whole its partial entries are gone."""
    from decisionkit.model import feature_cache
    from decisionkit.model import features as module

    monkeypatch.setattr(tiny_backbone, "precision", Precision("cpu", "float32", "test"))
    cases = splits["validation"].head(2)  # 8 cases
    kwargs = dict(layers=(2, 4), max_length=64, batch_size=1)
    whole = extract_features(tiny_backbone, cases, cache=False, **kwargs)
    encoded, stop, real = [], [3], module.encode

    def interrupted(backbone, texts, *args, **more):  # Ctrl-C once `stop` batches have gone through
        if len(encoded) == stop[0]:
            raise KeyboardInterrupt
        encoded.append(texts)
        return real(backbone, texts, *args, **more)

    def parts():
        return sorted((tmp_path / "features").glob("*.part-*.safetensors"))

    monkeypatch.setattr(module, "encode", interrupted)
    monkeypatch.setattr(feature_cache, "PARTIAL_SECONDS", 0.0)
    with pytest.raises(KeyboardInterrupt):
        extract_features(tiny_backbone, cases, cache_dir=tmp_path, **kwargs)
    assert len(parts()) == 3  # one a batch, as it went
    monkeypatch.setattr(feature_cache, "PARTIAL_SECONDS", 30.0)
    stop[0] = 5
    with pytest.raises(KeyboardInterrupt):
        extract_features(tiny_backbone, cases, cache_dir=tmp_path, **kwargs)
    assert len(parts()) == 4  # the two batches since, saved on the way out
    first = [t for batch in encoded for t in batch]
    assert len(first) == len(set(first)) == 5  # no text read twice
    stop[0] = None
    encoded.clear()
    resumed = extract_features(tiny_backbone, cases, cache_dir=tmp_path, **kwargs)
    assert sorted(t for batch in encoded for t in batch) == sorted(set(cases.texts) - set(first))
    assert not resumed.from_cache and resumed.windows.tolist() == whole.windows.tolist()
    assert resumed.arrays.keys() == whole.arrays.keys()
    for key, array in whole.arrays.items():
        np.testing.assert_array_equal(resumed.arrays[key], array)
    assert parts() == [] and len(list((tmp_path / "features").glob("*.safetensors"))) == 1
    encoded.clear()
    assert extract_features(tiny_backbone, cases, cache_dir=tmp_path, **kwargs).from_cache and encoded == []
