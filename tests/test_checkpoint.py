"""Fine-tuning checkpoints under a real kill: a training process SIGKILLed inside a checkpoint write resumes, in a
fresh process, as if it had never stopped; a launch in several processes is refused. (The in-process resume tests of
each mode, killed between whole checkpoints, are in test_training.py.)"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from decisionkit.model.saving import CHECKPOINT_DIR, CONFIG_FILE, HISTORY_FILE
from decisionkit.training import finetune
from decisionkit.training.finetune import TRAINER_STATE, TRAINER_TENSORS
from decisionkit.training.trainer import fit_model, preset

# LoRA on the tiny Llama, 8 training cases, 4 a step: 2 steps an epoch, 4 in all, a checkpoint after each. The
# stage-1 heads learn (test_training.LEARNING_HEADS: zero heads pass no gradient to the adapters) and train on in
# stage 2, so adapter and head moments both go through the checkpoint.
RUN = dict(train_per_workflow=2, head_steps=20, head_lr=1e-4, l2_grid=(1.0, 10.0), eval_every=1, epochs=2,
           finetune_head_lr=1e-3)

# A training run in its own process. argv: backbone, out, where to die: "tensors:N" (the Nth checkpoint's
# trainer.safetensors written, then killed before its trainer.json and its swap), "swap:N" (killed between
# publish's two renames of the Nth checkpoint: the previous one is at .checkpoint.old) or "none". Prints a line per
# optimizer step, so a killed run says how far it got.
TRAINING = textwrap.dedent(f"""
    import os, signal, sys
    from pathlib import Path
    from decisionkit.training import finetune
    from decisionkit.training.trainer import fit_model, preset

    backbone, out, kill = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    real_step, real_save_file, real_replace = finetune.optimizer_step, finetune.save_file, os.replace
    written = 0

    def step(*args, **kwargs):
        print("step", flush=True)
        return real_step(*args, **kwargs)

    def save_file(tensors, path):
        global written
        real_save_file(tensors, path)
        written += 1
        if kill == f"tensors:{{written}}":
            os.kill(os.getpid(), signal.SIGKILL)

    def replace(src, dst):
        if os.path.basename(src).startswith(".{CHECKPOINT_DIR}-") and kill == f"swap:{{written}}":
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    finetune.optimizer_step, finetune.save_file, os.replace = step, save_file, replace
    fit_model(preset("cpu-lora-quick", backbone=backbone, **{RUN!r}), out, progress=False)
""")


def _train(backbone, out, kill: str) -> tuple[int, int]:
    """Run ``TRAINING`` in a fresh process; returns its exit status and the optimizer steps it ran."""
    done = subprocess.run([sys.executable, "-c", TRAINING, str(backbone), str(out), kill], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
    return done.returncode, done.stdout.split().count("step")


def _hidden(out) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


def _step_of(folder) -> int:
    return json.loads((folder / TRAINER_STATE).read_text())["step"]


def test_a_run_killed_inside_checkpoint_writes_resumes_as_if_never_stopped(tmp_path, tiny_backbone_path):
    p = preset("cpu-lora-quick", backbone=str(tiny_backbone_path), **RUN)
    whole = tmp_path / "whole"
    fit_model(p, whole, progress=False)
    out = tmp_path / "run"

    # Killed inside the 2nd checkpoint: its tensors written, its trainer.json not. The 1st stays whole in place.
    assert _train(tiny_backbone_path, out, "tensors:2") == (-signal.SIGKILL, 2)
    assert _step_of(out / CHECKPOINT_DIR) == 1
    [half] = _hidden(out)  # the kill skipped the scratch folder's cleanup
    assert (out / half / TRAINER_TENSORS).is_file() and not (out / half / TRAINER_STATE).exists()

    # Resumed from step 1 (step 2 again, then 3), killed between the renames that swap in the checkpoint of step 3.
    assert _train(tiny_backbone_path, out, "swap:2") == (-signal.SIGKILL, 2)
    assert not (out / CHECKPOINT_DIR).exists() and _step_of(out / f".{CHECKPOINT_DIR}.old") == 2
    [unpublished] = set(_hidden(out)) - {f".{CHECKPOINT_DIR}.old"}  # the last run's half-written one is gone
    assert unpublished != half and _step_of(out / unpublished) == 3  # whole, but never swapped in: not to be read

    # Resumed from step 2, put back from .checkpoint.old (not from the unpublished step 3): steps 3 and 4.
    assert _train(tiny_backbone_path, out, "none") == (0, 2)
    assert _hidden(out) == [] and not (out / CHECKPOINT_DIR).exists()
    ran, alone = (json.loads((folder / HISTORY_FILE).read_text()) for folder in (out, whole))
    assert ran["history"] == alone["history"] and ran["best_val_loss"] == alone["best_val_loss"]
    saved = sorted(f.relative_to(out) for f in out.rglob("*.safetensors"))
    assert saved == sorted(f.relative_to(whole) for f in whole.rglob("*.safetensors"))
    for name in saved:
        a, b = load_file(str(out / name)), load_file(str(whole / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_an_incomplete_checkpoint_is_refused_not_resumed(tmp_path):
    folder = tmp_path / CHECKPOINT_DIR
    folder.mkdir()
    (folder / CONFIG_FILE).write_text("{}")
    (folder / TRAINER_TENSORS).write_bytes(b"")
    with pytest.raises(RuntimeError, match=r"incomplete \(no trainer\.json\).*--restart"):
        finetune._load_checkpoint(folder, None, None, None)


def test_a_launch_in_several_processes_is_refused_before_training(tmp_path, tiny_backbone_path):
    script = tmp_path / "launched.py"
    script.write_text(textwrap.dedent("""
        import sys
        from decisionkit.training.trainer import fit_model, preset
        fit_model(preset("cpu-lora-quick", backbone=sys.argv[1], train_per_workflow=2), sys.argv[2], progress=False)
    """))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), str(tiny_backbone_path), str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0  # (torchrun stops the other process once one fails: one message may be all)
    assert "RuntimeError: training runs in one process; this one was launched in 2" in done.stderr, done.stderr
    assert not out.exists()  # neither process wrote anything
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES"):
        finetune.one_process(2)
    finetune.one_process(1)
