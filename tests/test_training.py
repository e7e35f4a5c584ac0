import json
import math

import pytest

import decisionkit
from decisionkit import training as train_module
from decisionkit.model import ADAPTER_DIR
from decisionkit.training import CHECKPOINT_DIR, HISTORY_FILE, preset, train

TINY_HEADS = preset("cpu-quick", train_per_workflow=4, validation_per_workflow=2, head_steps=20,
                    features=decisionkit.FeatureSpec(max_length=48))


@pytest.fixture(autouse=True)
def test_split_is_never_loaded_while_training(monkeypatch):
    """Training may read train and validation only: loading test inside train() fails the test."""
    real = train_module.load_typed_decisions

    def guarded(split, data_dir=None):
        assert split != "test", "training loaded the test split"
        return real(split, data_dir)

    monkeypatch.setattr(train_module, "load_typed_decisions", guarded)


def test_heads_mode_learns_and_saves(tmp_path, splits):
    result = train(TINY_HEADS, tmp_path / "run", progress=False)
    uniform_loss = sum(math.log(len(q.options)) for q in splits["validation"][0].questions.values()) / 5
    assert result.best_val_loss < uniform_loss  # better than the zero-initialised (uniform) heads
    assert set(result.history["l2"]) == set(TINY_HEADS.l2_grid)
    assert result.peak_memory_gb > 0 and result.seconds > 0
    saved = json.loads((tmp_path / "run" / HISTORY_FILE).read_text())
    assert saved["best_val_loss"] == pytest.approx(result.best_val_loss)
    model = decisionkit.load(tmp_path / "run")
    case = splits["validation"][0]
    assert set(model.decide(case.state, workflow=case.workflow)) == set(case.questions)
    assert len(result.figure().data) == len(TINY_HEADS.l2_grid)


def test_presets_are_checked():
    with pytest.raises(ValueError, match="expected one of"):
        preset("cpu-huge")
    with pytest.raises(ValueError, match="needs lora settings and epochs"):
        preset("cpu-quick", mode="lora")
    assert preset("gpu").mode == "qlora" and preset("gpu").lora.r == 16 and preset("gpu").lora.alpha == 16


def test_lora_mode_checkpoints_and_resumes(tmp_path, monkeypatch, splits):
    p = preset("cpu-lora-quick", train_per_workflow=2, validation_per_workflow=1, head_steps=10, epochs=1)
    out = tmp_path / "lora"
    # Interrupted after epoch 1: the final clean-up never ran, so the checkpoint is still there.
    monkeypatch.setattr(train_module.shutil, "rmtree", lambda *a, **k: None)
    first = train(p, out, progress=False)
    assert (out / CHECKPOINT_DIR / "state.pt").is_file()
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    epoch_one = first.history[first.history["stage"] == "lora"]
    monkeypatch.undo()
    resumed = train(preset("cpu-lora-quick", train_per_workflow=2, validation_per_workflow=1, head_steps=10,
                           epochs=2), out, progress=False)
    lora = resumed.history[resumed.history["stage"] == "lora"]
    assert len(lora[lora["epoch"] == 1]) == len(epoch_one)  # epoch 1 came from the checkpoint, not a re-run
    assert (lora["epoch"] == 2).any()
    assert not (out / CHECKPOINT_DIR).exists()  # finished runs clean up
    model = decisionkit.load(out)
    assert model.backbone.lora is not None
    case = splits["validation"][0]
    assert set(model.decide(case.state, workflow=case.workflow)) == set(case.questions)
