"""Stage 2 of training: fine-tuning the backbone (all of it, or LoRA adapters) under the stage-1 heads.

Each choice below (the measurements behind them: ``benchmarks/results/choices.md``):

- Every optimizer step sees every workflow (``mixed_steps``): batches grouped by length are mostly one workflow
  (the workflows' states differ in length), so each step would move the shared backbone for one workflow's heads
  (choices.md#mixed-steps).
- A step's cases run as micro-batches of similar length inside one workflow: no padding to the longest state. A
  state longer than the window (``spec.max_length``) is read in windows pooled together (``model.tokenize``'s
  ``owner`` goes to the forward pass with the tokens: the loss is per state, not per window), its first
  ``spec.max_windows`` at most.
- The backbone and the heads have their own learning rates (the heads can be frozen), with warm-up and cosine
  decay; gradients are clipped.
- The dev slice is scored every ``eval_every`` steps and the best step is what is saved: training loss keeps
  falling after held-out loss turns. A checkpoint at each evaluation lets a run resume: the model, the optimizer
  and random state (safetensors) and the trainer state (JSON), written whole in a scratch folder and swapped in at
  once (``atomic.atomic_folder``), so a run killed mid-write resumes from the checkpoint before, never from a mix.
- The backbone runs in the compute dtype chosen for this machine (``precision.py``).
- One process, on one GPU or the CPU: several (``accelerate launch``, ``torchrun``) are refused at the start
  (``prepare``). Each would train the whole run on every case and write the same checkpoint; spreading a step's
  cases over GPUs (DDP) is not built.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..core import settings
from ..core.atomic import atomic_folder
from ..data.cases import Split
from ..model.decision_model import DecisionModel
from ..model.heads import decision_loss, targets, weight_norm
from ..model.saving import BACKBONE_DIR, CHECKPOINT_DIR, CONFIG_FILE, load_trained
from ..model.windows import window_lengths
from .presets import Preset

TRAINER_TENSORS = "trainer.safetensors"  # in the checkpoint folder: optimizer moments and random state
TRAINER_STATE = "trainer.json"  # step, history, scheduler
CHECKPOINT_FILES = (CONFIG_FILE, TRAINER_TENSORS, TRAINER_STATE)  # what a whole checkpoint holds (and the model's)


def mixed_steps(workflows: list[str], lengths: list[int], batch_size: int, micro_batch: int,
                seed: int) -> list[list[list[int]]]:
    """One epoch of optimizer steps over cases ``0..n-1``. Each step holds ``batch_size`` cases with the workflows
    mixed in proportion (each workflow shuffled, then interleaved evenly); its cases run as micro-batches of at most
    ``micro_batch`` cases of one workflow, sorted by length so little is padded."""
    rng = np.random.default_rng(seed)
    keyed = []
    for workflow in sorted(set(workflows)):
        members = rng.permutation([i for i, w in enumerate(workflows) if w == workflow])
        offset = rng.random()
        keyed += [((k + offset) / len(members), int(i)) for k, i in enumerate(members)]
    stream = [i for _, i in sorted(keyed)]
    steps = []
    for lo in range(0, len(stream), batch_size):
        micro = []
        for workflow in sorted({workflows[i] for i in stream[lo:lo + batch_size]}):
            group = sorted((i for i in stream[lo:lo + batch_size] if workflows[i] == workflow), key=lambda i: lengths[i])
            micro += [group[k:k + micro_batch] for k in range(0, len(group), micro_batch)]
        steps.append(micro)
    return steps


def _save_checkpoint(folder: Path, core: DecisionModel, optimizer, scheduler, state: dict) -> None:
    """The model, the optimizer moments and the random state (safetensors: a resumed run draws the dropout masks the
    run would have drawn) and the trainer state (JSON), written into a scratch folder beside ``folder`` that takes its
    place whole: a kill mid-write leaves the previous checkpoint, never this step's weights with its counters."""
    with atomic_folder(folder) as scratch:
        core.save(scratch)
        flat, meta = {"rng.cpu": torch.get_rng_state()}, {}
        if torch.cuda.is_available():
            flat["rng.cuda"] = torch.cuda.get_rng_state()
        for index, moments in optimizer.state_dict()["state"].items():
            for name, value in moments.items():
                if torch.is_tensor(value):
                    flat[f"{index}.{name}"] = value.detach().cpu().contiguous()
                else:
                    meta.setdefault(str(index), {})[name] = value
        save_file(flat, scratch / TRAINER_TENSORS)
        payload = {**state, "optimizer_state": meta, "param_groups": optimizer.state_dict()["param_groups"],
                   "scheduler": scheduler.state_dict()}
        (scratch / TRAINER_STATE).write_text(json.dumps(payload, default=float), encoding="utf-8")


def _clear_interrupted(folder: Path) -> None:
    """Tidy what a run killed inside ``_save_checkpoint`` left beside the checkpoint ``folder``: its scratch folders
    (maybe half written: never read) go, and a checkpoint killed between ``publish``'s two renames, whole at
    ``.NAME.old``, is put back as ``publish`` would (its next save would do it, but resuming reads first)."""
    for scratch in [*folder.parent.glob(f".{folder.name}-*"), *folder.parent.glob(f"..{folder.name}-*")]:
        shutil.rmtree(scratch, ignore_errors=True)  # ours, and those of the core.save inside it
    old = folder.with_name(f".{folder.name}.old")
    if old.is_dir() and not folder.exists():
        os.replace(old, folder)
    shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(folder: Path, core: DecisionModel, optimizer, scheduler) -> dict:
    """Put the checkpoint in ``folder`` into the model, the optimizer and the scheduler; returns the trainer state.
    A folder that lacks a part was not written by ``_save_checkpoint`` (or was tampered with): starting over would
    silently throw away the steps it stands for, so it is refused and the caller decides (``resume=False``)."""
    missing = [name for name in CHECKPOINT_FILES if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"the fine-tuning checkpoint {folder} is incomplete (no {', '.join(missing)}): it cannot "
                           "be resumed. Delete it, or train with resume=False (decisionkit train --restart), to "
                           "fine-tune from the start")
    load_trained(core, folder)
    if core.tuned:  # a full fine-tune goes on from the checkpoint's backbone, not from the one it started with;
        # not strict: a causal LM's output layer, tied to its embeddings, is not saved apart
        core.encoder.load_state_dict({k: v for part in sorted((folder / BACKBONE_DIR).glob("*.safetensors"))
                                      for k, v in load_file(str(part)).items()}, strict=False)
    payload = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    tensors = load_file(str(folder / TRAINER_TENSORS))
    torch.set_rng_state(tensors.pop("rng.cpu"))
    if "rng.cuda" in tensors:
        torch.cuda.set_rng_state(tensors.pop("rng.cuda"))
    state: dict = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for index, moments in payload.pop("optimizer_state").items():
        state.setdefault(int(index), {}).update(moments)
    optimizer.load_state_dict({"state": state, "param_groups": payload.pop("param_groups")})
    scheduler.load_state_dict(payload.pop("scheduler"))
    return payload


@torch.no_grad()
def dev_scores(core: DecisionModel, dev: Split) -> dict:
    """Soft cross-entropy and accuracy (the benchmark's rule) of the current model on ``dev``."""
    output = core.split_output(dev, loss=True)
    gold = targets(dev).gold
    right = sum(int((z.argmax(-1).cpu() == gold[workflow][qid].argmax(-1)).sum())
                for workflow, per_question in output.logits.items() for qid, z in per_question.items())
    return {"val_loss": output.loss.item(), "val_accuracy": right / sum(len(g) for q in gold.values()
                                                                     for g in q.values())}


def one_process(processes: int) -> None:
    """Refuse a launch in several processes: each would run the whole training (every case, every step, its own
    dev scores) and write the same checkpoint and model, several GPUs doing one GPU's work N times over.
    ``trainer.fit_model`` asks before stage 1 (``WORLD_SIZE``, set by torchrun and accelerate launch), ``prepare``
    again (the accelerator's count) for fine-tuning called on its own."""
    if processes > 1:
        raise RuntimeError(f"training runs in one process; this one was launched in {processes} (accelerate "
                           "launch or torchrun), and each would train the whole run and write the same files. Run "
                           "`decisionkit train` (or python) as a single process, on one GPU (CUDA_VISIBLE_DEVICES=0 "
                           "picks it); to use several GPUs, run different presets or seeds side by side, one GPU and "
                           "one --out folder each")


def prepare(model: DecisionModel, p: Preset):
    """Make the backbone trainable as ``p.mode`` says (every weight, or LoRA adapters), freeze or free the heads, and
    build the optimizer: the backbone and the heads at their own rates. Returns ``(accelerator, optimizer)``; a launch
    in several processes is refused first (``one_process``)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=model.backbone.device == "cpu")
    one_process(accelerator.num_processes)
    if p.mode == "full":
        model.unfreeze_backbone()
    else:
        model.attach_lora(p.lora)
    if p.gradient_checkpointing and model.backbone.engine != "unsloth":  # Unsloth's adapters bring their own
        model.backbone.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.heads.requires_grad_(p.finetune_head_lr > 0)
    backbone_params = [q for q in model.encoder.parameters() if q.requires_grad]
    groups = [{"params": backbone_params, "lr": p.lr, "weight_decay": p.weight_decay}]
    if p.finetune_head_lr > 0:
        groups.append({"params": list(model.heads.parameters()), "lr": p.finetune_head_lr, "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups)
    optimizer.zero_grad()  # stage 1 leaves its last gradients on the heads: the first step must not add them
    return accelerator, optimizer


def optimizer_step(model, accelerator, optimizer, scheduler, plan: list[list[int]], train_split: Split, p: Preset,
          l2: float) -> float:
    """One optimizer step over ``plan``'s micro-batches (gradients accumulated, clipped); returns its data loss."""
    core = accelerator.unwrap_model(model)
    core.train()
    workflows = train_split.case_workflows
    decisions = sum(len(train_split[i].questions) for micro in plan for i in micro)
    data_loss = 0.0
    for k, rows in enumerate(plan):
        target = targets(train_split, rows, core.backbone.device)
        output = model(**core.tokenize([train_split[i].text for i in rows]),
                       workflows=[workflows[i] for i in rows], target=target, ordinal=p.ordinal)
        loss = output.loss * (target.decisions / decisions)
        if p.finetune_head_lr > 0:
            loss = loss + l2 * weight_norm(core.heads) / len(plan)
        with accelerator.no_sync(model) if k < len(plan) - 1 else nullcontext():
            accelerator.backward(loss)
        plain = decision_loss(core.schema, output.logits, target) if p.ordinal else output.loss  # no ordinal term
        data_loss += plain.item() * target.decisions / decisions
    accelerator.clip_grad_norm_(model.parameters(), p.max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return data_loss


def cut_lengths(model: DecisionModel, cases: Split) -> list[int]:
    """The tokens the model reads of each case: its windows' (special tokens included), up to the cap of
    ``spec.max_windows`` windows of ``spec.max_length`` (a longer state is cut there in training)."""
    return window_lengths(model.backbone, cases.texts, model.spec.max_length, model.spec.max_windows)[0].tolist()


def finetune(model: DecisionModel, train_split: Split, dev: Split, p: Preset, out: Path, history: list,
             best: float, l2: float, resume: bool, progress: bool) -> tuple[list, float, int]:
    """Stage 2: the backbone (all of it, or LoRA adapters) and the heads together; the dev slice is scored every
    ``eval_every`` steps, the best step is saved to ``out``, and a checkpoint lets an interrupted run resume."""
    from transformers import get_cosine_schedule_with_warmup

    accelerator, optimizer = prepare(model, p)
    lengths = cut_lengths(model, train_split)
    workflows = train_split.case_workflows
    per_epoch = math.ceil(len(train_split) / p.batch_size)
    total = max(1, round(p.epochs * per_epoch))
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(p.warmup * total), total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    core = accelerator.unwrap_model(model)
    checkpoint = out / CHECKPOINT_DIR
    _clear_interrupted(checkpoint)
    step, best_step, stale = 0, 0, 0
    if resume and checkpoint.exists():
        state = _load_checkpoint(checkpoint, core, optimizer, scheduler)
        history, best, step, best_step, stale = (state[k] for k in ("history", "best", "step", "best_step", "stale"))
    else:
        core.save(out)  # the stage-1 model is the best so far
    bar = tqdm(total=total, initial=step, desc=f"{p.mode} fine-tuning", unit="step",
               disable=not progress or settings.progress_hidden())
    while step < total and not (p.patience and stale >= p.patience):
        epoch, within = divmod(step, per_epoch)
        plan = mixed_steps(workflows, lengths, p.batch_size, p.micro_batch, p.seed + epoch)[within]
        data_loss = optimizer_step(model, accelerator, optimizer, scheduler, plan, train_split, p, l2)
        step += 1
        bar.update()
        history.append({"stage": p.mode, "step": step, "epoch": step / per_epoch, "train_loss": data_loss,
                        "lr": scheduler.get_last_lr()[0]})
        if step % p.eval_every == 0 or step == total:
            core.eval()
            scores = dev_scores(core, dev)
            history.append({"stage": p.mode, "step": step, "epoch": step / per_epoch, **scores})
            bar.set_postfix(dev_loss=f"{scores['val_loss']:.4f}", dev_acc=f"{scores['val_accuracy']:.3f}")
            if scores["val_loss"] < best:
                best, best_step, stale = scores["val_loss"], step, 0
                core.save(out)
            else:
                stale += 1
            _save_checkpoint(checkpoint, core, optimizer, scheduler,
                             {"history": history, "best": best, "step": step, "best_step": best_step, "stale": stale})
    bar.close()
    shutil.rmtree(checkpoint, ignore_errors=True)  # finished: the best model is in ``out``
    return history, best, best_step
