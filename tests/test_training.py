import json
import math
from dataclasses import replace

import pytest

import decisionkit
from decisionkit import training as train_module
from decisionkit.backbone import ENCODER_BACKBONE
from decisionkit.model import ADAPTER_DIR, BACKBONE_DIR
from decisionkit.training import CHECKPOINT_DIR, HISTORY_FILE, TRAINER_STATE, preset, train

# 16 cases: at the full recipe's rate (0.003) they are overfitted by step 10 and the fit keeps step 0 (uniform
# heads); a smaller rate than even cpu-quick's, with its strong L2, learns: measured, step 20 at L2 10, dev loss
# 1.177 against 1.212 for uniform answers.
TINY_HEADS = preset("cpu-quick", train_per_workflow=4, validation_per_workflow=2, head_steps=20, head_lr=1e-4,
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
    # The uniform answer's loss on the dev slice the steps are picked on: ln(options) averaged over its decisions.
    # Step 0 of every L2 is the zero-initialised (uniform) heads, so picking step 0 would score exactly this.
    _, dev, _ = train_module.training_splits(TINY_HEADS)
    uniform_loss = sum(math.log(len(q.options)) for c in dev for q in c.questions.values()) / (5 * len(dev))
    start = result.history[result.history["step"] == 0]
    assert start["val_loss"].tolist() == pytest.approx([uniform_loss] * len(TINY_HEADS.l2_grid))
    assert result.extra["head steps"] > 0 and result.best_val_loss < uniform_loss - 0.01  # the heads learned
    assert result.best_val_loss == pytest.approx(result.history["val_loss"].min())
    assert set(result.history["l2"]) == set(TINY_HEADS.l2_grid)
    assert result.extra["train cases"] == 4 * (4 + TINY_HEADS.dev_per_workflow)  # refitted on train + dev
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
    with pytest.raises(ValueError, match="expected one of heads, full, lora, qlora"):
        preset("cpu-quick", mode="partial")
    with pytest.raises(ValueError, match="needs epochs > 0"):
        preset("cpu-quick", mode="full")
    with pytest.raises(ValueError, match="needs lora settings"):
        preset("cpu-quick", mode="lora", epochs=1)
    assert preset("gpu").mode == "qlora" and preset("gpu").lora.r == 16 and preset("gpu").lora.alpha == 16


def test_training_splits_hold_a_dev_slice_out_of_train(splits):
    train, dev, validation = train_module.training_splits(preset("cpu-heads"))
    assert (len(train), len(dev), len(validation)) == (960, 160, 80)
    assert not set(train.ids) & set(dev.ids) and not set(dev.ids) & set(validation.ids)
    assert set(train.ids) | set(dev.ids) == set(splits["train"].ids)
    _, dev_is_validation, _ = train_module.training_splits(preset("cpu-heads", dev_per_workflow=0))
    assert dev_is_validation.ids == splits["validation"].ids


def test_mixed_steps_put_every_workflow_in_every_step():
    workflows = ["a"] * 12 + ["b"] * 12 + ["c"] * 6
    lengths = list(range(30, 0, -1))
    steps = train_module.mixed_steps(workflows, lengths, batch_size=5, micro_batch=2, seed=1)
    seen = [i for step in steps for micro in step for i in micro]
    assert sorted(seen) == list(range(30))  # each case once an epoch
    assert all({workflows[i] for micro in step for i in micro} == {"a", "b", "c"} for step in steps[:-1])
    for step in steps:
        for micro in step:
            assert len(micro) <= 2 and len({workflows[i] for i in micro}) == 1
            assert [lengths[i] for i in micro] == sorted(lengths[i] for i in micro)
    assert steps == train_module.mixed_steps(workflows, lengths, 5, 2, seed=1)
    assert steps != train_module.mixed_steps(workflows, lengths, 5, 2, seed=2)


def _interrupted(monkeypatch, p, out):
    """Train ``p`` as if the process died after the last evaluation: the final clean-up never runs."""
    monkeypatch.setattr(train_module.shutil, "rmtree", lambda *a, **k: None)
    first = train(p, out, progress=False)
    monkeypatch.undo()
    assert (out / CHECKPOINT_DIR / TRAINER_STATE).is_file()
    return first


def test_full_mode_trains_every_weight_and_resumes(tmp_path, monkeypatch, splits):
    p = preset("cpu-full-quick", backbone=ENCODER_BACKBONE, features=decisionkit.FeatureSpec("mean", (1.0,), 64),
               lr=1e-3, epochs=1)
    out = tmp_path / "full"
    first = _interrupted(monkeypatch, p, out)
    steps_one = first.history[first.history["stage"] == "full"].dropna(subset=["train_loss"])
    checkpoint = json.loads((out / CHECKPOINT_DIR / "decisionkit.json").read_text())["backbone"]
    assert checkpoint["tuned"] and checkpoint["tuned_sha256"] != checkpoint["weights_sha256"]  # every weight moved
    resumed = train(replace(p, epochs=2), out, progress=False)
    steps = resumed.history[resumed.history["stage"] == "full"].dropna(subset=["train_loss"])
    assert steps["step"].tolist() == list(range(1, 2 * len(steps_one) + 1))  # continued, not started again
    assert steps["train_loss"].iloc[:len(steps_one)].tolist() == steps_one["train_loss"].tolist()
    assert not (out / CHECKPOINT_DIR).exists()  # finished runs clean up
    model = decisionkit.load(out)
    assert model.tuned and (out / BACKBONE_DIR / "model.safetensors").is_file() and model.backbone.kind == "encoder"
    case = splits["validation"][0]
    assert set(model.decide(case.state, workflow=case.workflow)) == set(case.questions)


def test_lora_mode_checkpoints_and_resumes(tmp_path, monkeypatch, splits):
    p = preset("cpu-lora-quick", train_per_workflow=2, head_steps=10, batch_size=4, eval_every=1)
    out = tmp_path / "lora"
    first = _interrupted(monkeypatch, p, out)
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    steps_one = first.history[first.history["stage"] == "lora"].dropna(subset=["train_loss"])
    resumed = train(replace(p, epochs=2), out, progress=False)
    steps = resumed.history[resumed.history["stage"] == "lora"].dropna(subset=["train_loss"])
    assert steps["step"].tolist() == list(range(1, 2 * len(steps_one) + 1))
    assert not (out / CHECKPOINT_DIR).exists()
    model = decisionkit.load(out)
    assert model.backbone.lora is not None
    case = splits["validation"][0]
    assert set(model.decide(case.state, workflow=case.workflow)) == set(case.questions)
