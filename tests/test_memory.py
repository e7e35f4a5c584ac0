import pytest

from decisionkit import LoraSettings, load_backbone
from decisionkit.memory import (ASSUMED_SHAPES, ModelShape, TrainingSetup, compare, estimate, nf4_bits_per_weight,
                                parameter_table)


@pytest.fixture(scope="module")
def qlora():
    return load_backbone(quantize="4bit", lora=LoraSettings())


def test_shape_from_config_counts_the_real_model(backbone):
    shape = ModelShape.from_config(backbone.config)
    assert shape.parameters == backbone.parameter_counts()[1]  # 134.5M, from shapes alone


def test_parameter_table_of_a_qlora_model(backbone, qlora):
    table = parameter_table(qlora)
    shape = ModelShape.from_config(backbone.config)
    assert table.total - table.trainable == shape.parameters  # 4-bit weights count what they stand for
    assert table.trainable == shape.lora_parameters(LoraSettings())  # only the adapters train
    assert set(table.rows.index[table.rows["trainable"] > 0]) == {"LoRA adapters"}
    # Bytes: the packed weights and constants measured on the model agree with the estimate's base term.
    adapters_mb = table.rows.loc["LoRA adapters", "bytes"] / 1e6
    setup = TrainingSetup(value_bytes=4)
    assert table.megabytes - adapters_mb == pytest.approx(estimate(shape, setup).terms["base weights"] * 1e3,
                                                          rel=0.02)
    assert abs(qlora.model.get_memory_footprint() / 1e6 - table.megabytes) / table.megabytes < 0.02


def test_first_layer_halves_adapters_and_activations(backbone):
    shape = ModelShape.from_config(backbone.config)
    full, half = LoraSettings(), LoraSettings(first_layer=0.5)
    assert shape.lora_parameters(half) * 2 == shape.lora_parameters(full)
    assert half.layers(30) == list(range(15, 30)) and full.layers(30) is None
    no_ckpt = TrainingSetup(lora=half, gradient_checkpointing=False)
    assert (estimate(shape, no_ckpt).terms["activations: every trained layer"] * 2
            == pytest.approx(estimate(shape, TrainingSetup(lora=full, gradient_checkpointing=False))
                             .terms["activations: every trained layer"]))


def test_estimates_grow_with_size_and_name_the_quoted_figure():
    assert nf4_bits_per_weight() == pytest.approx(4.127, abs=1e-3)
    comparison = compare(references={ASSUMED_SHAPES[1].name: (7.95, 7.95), ASSUMED_SHAPES[2].name: (14, 16)})
    totals = [e.total_gb for e in comparison.estimates]
    assert totals == sorted(totals)
    sizes = [round(s.parameters / 1e9, 1) for s in ASSUMED_SHAPES]
    assert sizes[0] == pytest.approx(0.8, abs=0.15) and sizes[1] == pytest.approx(4.0, abs=0.2)
    assert sizes[2] == pytest.approx(9.0, abs=0.3)
    table = comparison.table()
    assert table.loc[ASSUMED_SHAPES[1].name, "quoted (GB)"] == "7.95"
    assert table.loc[ASSUMED_SHAPES[2].name, "quoted (GB)"] == "14-16"
    assert len(comparison.figure().data) == len(comparison.estimates[0].terms) + 1
