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


def test_probe_picks_on_a_dev_slice_of_train_and_reads_validation_only_to_score(halves):
    fit, held = halves
    train_x = _informative(fit, 0.5)
    rng = np.random.default_rng(3)
    informed = linear_probe(train_x, fit, _informative(held, 0.5, 1), held, l2_grid=(1e-3, 1e-1))
    scrambled = linear_probe(train_x, fit, rng.standard_normal(train_x[: len(held)].shape), held, l2_grid=(1e-3, 1e-1))
    # the choice (L2, step, the loss curve it read) is the same whatever the validation features hold
    assert scrambled.l2 == informed.l2 and scrambled.history.equals(informed.history)
    assert scrambled.scores.overall()["accuracy"] < informed.scores.overall()["accuracy"]
    # picking on the scored split is only for a held-out curve: it reads validation's loss, so the history differs
    on_validation = linear_probe(train_x, fit, _informative(held, 0.5, 1), held, l2_grid=(1e-3, 1e-1), dev_share=None)
    assert not on_validation.history["val_loss"].equals(informed.history["val_loss"])


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


def test_pooling_by_backbone_sets_the_last_layers_poolings_side_by_side(halves):
    from decisionkit.course.probe import POOLING_SETTINGS, pooling_by_backbone

    fit, held = halves

    def comparison(layers, noise):
        def feats(split, seed):
            x = _informative(split, noise, seed)
            return Features(split.ids, layers, {f"{p}@{layer}": x for p in ("last", "mean", "max") for layer in layers},
                            0.0, False)

        return compare_probes(feats(fit, 0), fit, feats(held, 1), held, POOLING_SETTINGS + [("mean", layers[0])],
                              steps=50)

    table = pooling_by_backbone({"a": comparison((1, 2), 0.05), "b": comparison((3, 6), 2.0)})
    assert table.columns.tolist() == ["a (layer 2)", "b (layer 6)"]
    assert table.index.tolist() == ["last", "mean", "max", "spread (best - worst)"]
    for column in table:
        poolings = table[column].iloc[:3]
        assert table[column].iloc[3] == pytest.approx(poolings.max() - poolings.min(), abs=2e-3)
    assert (table["a (layer 2)"].iloc[:3] > table["b (layer 6)"].iloc[:3]).all()
