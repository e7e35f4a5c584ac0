import numpy as np
import pytest

from decisionkit.course.probe import compare_probes, linear_probe
from decisionkit.data.cases import Split
from decisionkit.model.features import Features


def _informative(split: Split, noise: float, seed: int = 0) -> np.ndarray:
    """Features that carry every gold distribution (plus noise): a probe must read the answers off them."""
    rng = np.random.default_rng(seed)
    rows = [np.concatenate([c.gold[q].probabilities for q in c.questions]) for c in split]
    gold = np.array([np.pad(r, (0, 30 - len(r))) for r in rows])
    return gold + noise * rng.standard_normal(gold.shape)


@pytest.fixture(scope="module")
def halves(splits):
    cases = splits["validation"].cases + splits["train"].head(20).cases
    return (Split("fit", [c for i, c in enumerate(cases) if i % 4], "x"),
            Split("held", [c for i, c in enumerate(cases) if i % 4 == 0], "x"))


def test_probe_reads_answers_from_informative_features_but_not_from_noise(halves):
    fit, held = halves
    informed = linear_probe(_informative(fit, 0.05), fit, _informative(held, 0.05, 1), held, l2_grid=(1e-3, 1e-1))
    rng = np.random.default_rng(2)
    noise = linear_probe(rng.standard_normal((len(fit), 20)), fit, rng.standard_normal((len(held), 20)), held,
                         l2_grid=(1e-3, 1e-1))
    assert informed.scores.overall()["accuracy"] > 0.85
    assert noise.scores.overall()["accuracy"] < informed.scores.overall()["accuracy"] - 0.2
    assert set(informed.history["l2"]) == {1e-3, 1e-1} and informed.l2 in (1e-3, 1e-1)


def test_compare_probes_table_and_alignment(halves):
    fit, held = halves
    layers = (1, 2)

    def feats(split, seed):
        x = _informative(split, 0.05, seed)
        return Features(split.ids, layers, {f"{p}@{layer}": x for p in ("last", "mean") for layer in layers}, 0.0, False)

    comparison = compare_probes(feats(fit, 0), fit, feats(held, 1), held, [("last", None), ("mean", 1)])
    table = comparison.table()
    assert table.index.tolist() == ["last pooling, layer 2", "mean pooling, layer 1"]
    assert {"accuracy", "accuracy noul", "accuracy choice", "accuracy score", "kl", "L2"} <= set(table.columns)
    assert len(comparison.figure().data) == 2
    with pytest.raises(ValueError, match="not aligned"):
        compare_probes(feats(held, 0), fit, feats(held, 1), held, [("last", None)])


class _FixedFeatures:
    """Stands in for a frozen model: ``split_pooled`` is all ``learning_curve`` reads."""

    def __init__(self, noise: float):
        self.noise = noise

    def split_pooled(self, cases):
        import torch

        return torch.as_tensor(_informative(cases, self.noise, seed=len(cases)), dtype=torch.float32)


def test_a_learning_curve_rises_with_data_and_stays_above_the_gold_floor(halves):
    from decisionkit.course.probe import gold_entropy, learning_curve

    fit, held = halves
    curve = learning_curve(_FixedFeatures(0.3), fit, held, per_workflow=(2, None), l2_grid=(1e-2,))
    rows = curve.rows
    assert rows.index.tolist() == [8, len(fit)]
    assert rows["accuracy"].iloc[-1] > rows["accuracy"].iloc[0]
    assert curve.floor == pytest.approx(gold_entropy(held)) and (rows["held-out cross-entropy"] > curve.floor).all()
    assert len(curve.figure().data) == 3


def test_learned_pooling_is_a_row_beside_the_fixed_poolings_from_one_extraction(tiny_backbone, halves, tmp_path):
    from decisionkit.course.probe import pooling_comparison
    from decisionkit.model.token_head import TokenHeadSpec

    fit, held = halves
    options = dict(max_length=32, cache_dir=tmp_path, progress=False)
    plain = pooling_comparison(tiny_backbone, fit, held, steps=20, **options)
    comparison = pooling_comparison(tiny_backbone, fit, held, steps=20, learned=TokenHeadSpec(width=16, epochs=2),
                                    **options)
    table = comparison.table()
    assert table.index.tolist() == plain.table().index.tolist() + ["learned pooling (attention), layer 4"]
    assert np.isnan(table["L2"].iloc[-1]) and 0 <= table["accuracy"].iloc[-1] <= 1
    assert table.iloc[:-1].equals(plain.table())  # the fixed poolings read the same features either way
    assert len(comparison.figure().data) == len(table)
