import pytest
import torch

from decisionkit.core import precision


@pytest.fixture(autouse=True)
def fresh_choice():
    precision.choose.cache_clear()
    yield
    precision.choose.cache_clear()


def test_the_override_is_obeyed_and_checked(monkeypatch):
    monkeypatch.setenv(precision.DTYPE_ENV, "float32")
    assert precision.choose("cpu").dtype == "float32"
    precision.choose.cache_clear()
    monkeypatch.setenv(precision.DTYPE_ENV, "bfloat16")
    chosen = precision.choose("cpu")
    assert chosen.dtype == "bfloat16" and precision.DTYPE_ENV in chosen.reason
    precision.choose.cache_clear()
    monkeypatch.setenv(precision.DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="expected auto, float32 or bfloat16"):
        precision.choose("cpu")


def test_auto_follows_the_cpu(monkeypatch):
    monkeypatch.delenv(precision.DTYPE_ENV, raising=False)
    chosen = precision.choose("cpu")
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert chosen.dtype == "float32" and "no bfloat16 instructions" in chosen.reason
    else:  # the probe measured both dtypes and says by how much bfloat16 ran
        assert "x float32 on this CPU" in chosen.reason
    described = chosen.describe()  # what every timing record carries: the dtype, why, and the kernels
    assert set(described) == {"device", "compute_dtype", "reason", "cpu_capability", "cpu_family", "onednn_bf16",
                              "onednn_max_isa"}
    assert described["cpu_family"] in {name for _, name in precision.CPU_FAMILIES} | {"other"}
    assert described["onednn_bf16"] == torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_a_slow_bfloat16_is_not_chosen(monkeypatch):
    monkeypatch.delenv(precision.DTYPE_ENV, raising=False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(precision, "matmul_seconds", lambda dtype: 3.0 if dtype == torch.bfloat16 else 1.0)
    chosen = precision.choose("cpu")
    assert chosen.dtype == "float32" and "0.3x" in chosen.reason


def test_autocast_runs_matmuls_in_the_chosen_dtype():
    x = torch.randn(4, 4)
    with precision.Precision("cpu", "bfloat16", "test").autocast():
        assert (x @ x).dtype == torch.bfloat16
    with precision.Precision("cpu", "float32", "test").autocast():
        assert (x @ x).dtype == torch.float32


def test_a_cast_made_once_gives_autocasts_logits_to_the_last_bit_and_puts_the_weights_back(tiny_backbone):
    """Decoding casts the frozen weights once (``frozen_weights_cast``) instead of autocast casting them per call:
    the same logits, bit for bit; the float32 weights (and the tied LM head) are back afterwards."""
    model = tiny_backbone.model
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    before = {name: p for name, p in model.named_parameters()}
    bfloat16 = precision.Precision("cpu", "bfloat16", "test")
    with torch.no_grad(), bfloat16.autocast():
        reference = model(ids).logits
        with bfloat16.frozen_weights_cast(model):
            linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
            assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
            cast = model(ids).logits
    assert reference.dtype == cast.dtype == torch.bfloat16 and torch.equal(reference, cast)
    assert {name: p for name, p in model.named_parameters()} == before  # the same float32 tensors, not copies
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied again
    with precision.Precision("cpu", "float32", "test").frozen_weights_cast(model):  # float32: nothing changes
        assert all(p.dtype == torch.float32 for p in model.parameters())


def test_the_cast_copies_are_made_once_and_made_again_when_the_weights_change():
    """``frozen_weights_cast`` keeps each layer's bfloat16 copies across entries (a decision pays no cast), and casts
    again when the float32 weights change: in place (an optimizer step, ``copy_``) or replaced (a load)."""
    layer = torch.nn.Linear(8, 4).requires_grad_(False)
    bfloat16 = precision.Precision("cpu", "bfloat16", "test")
    with bfloat16.frozen_weights_cast(layer):
        first = layer.weight
    with bfloat16.frozen_weights_cast(layer):
        assert layer.weight is first  # no second cast
    layer.weight.mul_(2)  # in place: the version counter moves
    with bfloat16.frozen_weights_cast(layer):
        assert layer.weight is not first
        assert torch.equal(layer.weight, (first.float() * 2).to(torch.bfloat16))
        second = layer.weight
    layer.weight = torch.nn.Parameter(torch.ones(4, 8), requires_grad=False)  # replaced, as a load does
    with bfloat16.frozen_weights_cast(layer):
        assert layer.weight is not second and torch.equal(layer.weight.float(), torch.ones(4, 8))
    assert layer.weight.dtype == torch.float32 and "weight" in dict(layer.named_parameters())
    assert set(layer.state_dict()) == {"weight", "bias"}  # the copies are not part of the model's state


def test_copies_made_in_inference_mode_serve_a_forward_that_records_gradients():
    """A decision (inference mode) makes the copies; LoRA training then runs a forward whose activations need
    gradients through the frozen layer: the kept copies must be ordinary tensors. Weights made in inference mode
    (no version counter) are cast at every call instead of failing."""
    layer = torch.nn.Linear(8, 4).requires_grad_(False)
    bfloat16 = precision.Precision("cpu", "bfloat16", "test")
    with torch.inference_mode(), bfloat16.frozen_weights_cast(layer):
        layer(torch.ones(2, 8, dtype=torch.bfloat16))
    x = torch.ones(2, 8, dtype=torch.bfloat16, requires_grad=True)
    with bfloat16.frozen_weights_cast(layer):
        assert not layer.weight.is_inference()
        layer(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
    with torch.inference_mode():
        made = torch.nn.Linear(8, 4).requires_grad_(False)
        with bfloat16.frozen_weights_cast(made):
            assert made.weight.dtype == torch.bfloat16
            first = made.weight
        with bfloat16.frozen_weights_cast(made):
            assert made.weight is not first  # nothing kept: no version to tell a changed weight by
    assert made.weight.dtype == torch.float32
