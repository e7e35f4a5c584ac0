"""Training a decision model: soft-gold cross-entropy, one API, four modes (``presets.py`` names the runs).

- ``heads``: the backbone stays frozen; its pooled features are extracted once (cached on disk) and the heads
  train on them in seconds (stage 1, ``fitting.fit_heads``; every mode starts with it). The L2 strength and the
  number of steps are picked on a dev slice of train; the heads are then fitted again on all of train with that
  choice. A hybrid (``structured``) then adds trees on the state's fields, mixed with the heads at weights chosen
  out of fold (``fit_structured``).
- ``full``:  every backbone weight trains with the heads (stage 2, ``finetune.py``), starting from the stage-1 heads:
  a linear probe first, then fine-tuning, so random heads never pull the backbone around (LP-FT, Kumar et al. 2022).
- ``lora``:  stage 2 with only LoRA adapters trainable in the backbone.
- ``qlora``: ``lora`` on a 4-bit NF4 base (Unsloth on a GPU; bitsandbytes + peft elsewhere).

The validation split (80 cases) is left for temperatures and routing thresholds; the test split is never loaded
here.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import set_seed

from ..core.atomic import write_text
from ..core.environment import peak_rss_gb, synchronize
from ..data.cases import Split, dev_slice
from ..data.decisions import Decisions, load_decisions, typed_decisions
from ..data.metrics import Scores, score
from ..data.scenarios import scenario_decisions, scenario_name
from ..model.backbone import load_backbone
from ..model.decision_model import DecisionModel, load
from ..model.fitting import STRUCTURED_FOLDS, cross_fit, fit_heads, parts_out_of_fold, refit_heads
from ..model.heads import group_rows
from ..model.output import DecisionOutput
from ..model.saving import HISTORY_FILE
from ..model.structured import StructuredPart, choose_weights, named_blend
from ..model.trees import TREE_ROUNDS
from ..model.windows import over_cap
from .finetune import cut_lengths, finetune, mixed_steps, one_process, optimizer_step, prepare
from .presets import Preset, preset

PARTS = ("heads", "trees", "lexical", "hybrid")  # what ``fit_structured`` scores out of fold


def peak_memory_gb(device: str) -> float:
    """CUDA max allocated on a GPU; the process's peak resident memory on CPU."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 1e9
    return peak_rss_gb()  # portable: ru_maxrss is KiB on Linux, bytes on macOS; Windows has no resource module


@dataclass
class StructuredFit:
    """How the hybrid was fitted: each part's and the mixture's out-of-fold answers and scores on train, and the
    weights."""

    scores: pd.DataFrame  # (part, workflow) -> accuracy, KL: heads, trees and lexical alone, hybrid
    weights: dict[str, dict[str, dict[str, float]]]  # workflow -> question -> part -> weight
    held_out: dict[str, list[dict]] = field(default_factory=dict, repr=False)  # part -> out-of-fold answers

    def table(self) -> pd.DataFrame:
        """Out-of-fold accuracy by workflow (and all), one column per part (a part a workflow lacks: blank)."""
        table = self.scores["accuracy"].unstack("part")
        return table[[p for p in PARTS if p in table.columns]]


def fit_structured(model: DecisionModel, cases: Split, features: torch.Tensor, folds: int = STRUCTURED_FOLDS,
                   rounds: int = TREE_ROUNDS, lexical: bool = True) -> StructuredFit:
    """Make ``model`` the hybrid: trees on the fields of ``cases``' JSON states and (``lexical``) the lexical part on
    their words, fitted on ``cases`` (the heads' training cases; ``features``: theirs, standardized), mixed with the
    heads at weights per question chosen on out-of-fold answers of every part (each case answered by parts fitted on
    the other folds; the lexical part's vocabulary is fitted once, on every case). On a model that is already a
    hybrid, its parts and weights are fitted again (at ``rounds``), as on the heads alone."""
    model.structured = None  # the folds' heads are read alone, and the other parts are fitted anew
    parts = StructuredPart.fit(cases, rounds=rounds, lexical=lexical)  # fitted on every case: what the model keeps
    held_out: dict[str, list[dict]] = {"heads": [{} for _ in cases]}
    for fold in cross_fit(model, cases, features, folds):
        output = fold.read(features[fold.held], [cases[i].workflow for i in fold.held], trees=False)
        for i, logits in zip(fold.held, output.per_case()):
            held_out["heads"][i] = {qid: torch.softmax(z.double(), -1).cpu().numpy() for qid, z in logits.items()}
    held_out.update(parts_out_of_fold(parts, cases, folds))
    parts.weights = choose_weights(cases, held_out)
    frames = {}
    for part, predictions in {**held_out, "hybrid": named_blend(cases, held_out, parts.weights)}.items():
        scored = [i for i, own in enumerate(predictions) if own]  # a part scores the workflows it answers
        mine = Split(cases.name, [cases[i] for i in scored], cases.source)
        scores = score(mine, [predictions[i] for i in scored])
        frames[part] = pd.concat([scores.summary("workflow"), scores.summary()])[["accuracy", "kl"]]
    model.structured = parts
    return StructuredFit(pd.concat(frames, names=["part", "workflow"]), parts.weights, held_out)


def part_answers(model: DecisionModel, cases: Split) -> dict[str, list[dict[str, np.ndarray]]]:
    """Each case's answer distributions from a hybrid's parts apart, none calibrated: "heads alone", "trees alone"
    (only when every workflow of ``cases`` has fields: trees answer nothing for text states) and "lexical alone"
    (when the model has one)."""
    features = model.split_features(cases)
    rows = group_rows(cases.case_workflows)
    with torch.no_grad():
        heads = DecisionOutput(features, cases.case_workflows, model.heads.read(features, rows), rows).per_case()
    out = {"heads alone": [{qid: torch.softmax(z.double(), -1).cpu().numpy() for qid, z in h.items()}
                           for h in heads]}
    for part, answers in model.structured.answers(cases).items():
        if all(answers):
            out[f"{part} alone"] = answers
    return out


def part_scores(model: DecisionModel, cases: Split) -> dict[str, Scores]:
    """A hybrid's parts scored apart on ``cases`` (``part_answers``): the parts a hybrid is measured against, it
    should beat each."""
    return {name: score(cases, answers) for name, answers in part_answers(model, cases).items()}


def with_trees(model: DecisionModel, cases: Split, parts: dict[str, list[dict[str, np.ndarray]]]) -> dict[str, Scores]:
    """Each of ``parts`` (name -> each case's answer distributions, e.g. ``part_answers``' heads or a token head) put
    where the heads sit in the hybrid: mixed with its other parts at its own weights per question, uncalibrated:
    "NAME + trees". The same weights for every part, so the rows differ by the part alone."""
    return {f"{name} + trees": score(cases, model.structured.blend(cases, answers)) for name, answers in parts.items()}


@dataclass
class TrainResult:
    """What a run did: the training curves, the best held-out loss, wall time and peak memory; the model as saved
    (the best step of a fine-tuning run, which may not be its last) and the cases it used (``train``: every train
    case it may fit on, dev slice included; ``validation``)."""

    preset: Preset
    history: pd.DataFrame
    best_val_loss: float
    seconds: float
    peak_memory_gb: float
    out: Path
    extra: dict = field(default_factory=dict)
    model: DecisionModel | None = field(default=None, repr=False)
    cases: dict[str, Split] = field(default_factory=dict, repr=False)
    hybrid: StructuredFit | None = field(default=None, repr=False)  # how a hybrid's weights were chosen

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"value": {
            "preset": self.preset.name, "mode": self.preset.mode, "best dev loss": round(self.best_val_loss, 4),
            "wall time (s)": round(self.seconds, 1), "peak memory (GB)": round(self.peak_memory_gb, 2),
            **self.extra}})

    def figure(self):
        from ..core.plots import training_curves

        return training_curves(self.history)


def decisions_of(p: Preset, data=None, schema=None, **reading) -> Decisions:
    """The data a run of preset ``p`` reads, as ``Decisions`` (train, validation, test and their record): ``data``
    itself when it is one; any source ``decisions.load_decisions`` reads (a file, a folder, a DataFrame, a list of
    dicts, a ``datasets.Dataset``; ``schema``: its questions; ``reading``: how its columns are read, ``rows.Reading``);
    a project scenario named ``scenario:NAME``; with no ``data``, the preset's own dataset (typed-decisions from
    ``$DECISIONKIT_DATA`` or the hub, or its scenario). A path always means the path, even one named like a scenario."""
    if isinstance(data, Decisions):
        return data
    if data is None:
        return typed_decisions() if p.dataset == "typed-decisions" else scenario_decisions(p.dataset)
    name = scenario_name(data)
    if name is not None:
        return scenario_decisions(name)
    return load_decisions(data, schema, **reading)


def training_pool(p: Preset, data=None) -> Split:
    """Every train case preset ``p`` uses, the dev slice included, in file order (features are cached for it)."""
    train = decisions_of(p, data)["train"]
    return train.head(p.train_per_workflow + p.dev_per_workflow) if p.train_per_workflow else train


def held_out_test(p: Preset, data=None) -> Split:
    """The test cases a run of preset ``p`` is scored on: all, or ``test_per_workflow`` of each workflow."""
    test = decisions_of(p, data)["test"]
    return test.head(p.test_per_workflow) if p.test_per_workflow else test


def dev_counts(p: Preset, pool: Split) -> dict[str, int]:
    """Dev cases of each workflow held out of ``pool``: the preset's ``dev_per_workflow``, at most a third of the
    workflow's cases (a few dozen rows of a user's workflow keep two thirds to fit on)."""
    return {w: min(p.dev_per_workflow, n // 3) for w, n in Counter(pool.case_workflows).items()}


def training_splits(p: Preset, data=None) -> tuple[Split, Split, Split]:
    """``(train, dev, validation)`` for preset ``p``: the dev slice is held out of the training pool (``dev_counts``),
    or is the validation split itself when ``dev_per_workflow`` is 0."""
    decisions = decisions_of(p, data)
    pool = training_pool(p, decisions)
    validation = decisions["validation"]
    if p.validation_per_workflow:
        validation = validation.head(p.validation_per_workflow)
    if p.dev_per_workflow:
        train, dev = dev_slice(pool, dev_counts(p, pool))
    else:
        train, dev = pool, validation
    return train, dev, validation


def split_uses(p, data=None) -> pd.DataFrame:
    """What each split of preset ``p``'s data (a preset or its name) is used for when its heads are trained and
    calibrated on small data (``calibrate_out_of_fold``), and its cases. With a dev slice (``dev_per_workflow``), it
    picks L2 and steps and the validation split is left to calibration; without one, validation does both."""
    p = preset(p) if isinstance(p, str) else p
    data = decisions_of(p, data)
    _, dev, validation = training_splits(p, data)
    train, test = training_pool(p, data), held_out_test(p, data)
    if dev is validation:
        rows = {"train": (len(train), "fits the heads; scored out of fold for the temperatures"),
                "validation": (len(validation), "picks L2 and steps, and fits the temperatures")}
    else:
        rows = {"train": (len(train), "fits the heads (without its dev slice while L2 and steps are picked); "
                                      "scored out of fold for the temperatures"),
                "dev (a slice of train)": (len(dev), "picks L2 and steps"),
                "validation": (len(validation), "fits the temperatures, with train out of fold; nothing else")}
    rows["test"] = (len(test), "scored only")
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["cases", "used for"])
    table.index.name = "split"
    return table


def fit_model(p: Preset | str, out: str | Path, data=None, resume: bool = True,
              progress: bool = True) -> TrainResult:
    """The weights of preset ``p``'s model on ``data`` (``decisions_of``; default: the preset's dataset): stage 1
    (heads, and a hybrid's trees) and stage 2 (fine-tuning), the best saved to ``out``, neither calibrated nor
    routed. ``decisionkit.train`` (``pipeline.train``) calls this, then calibrates and routes; a lesson that shows
    those steps itself starts here. A hybrid preset gives a workflow whose states are all text no trees (they read a
    JSON state's fields), and says so (``extra["trees"]``); ``extra["parts"]`` names each workflow's parts."""
    one_process(int(os.environ.get("WORLD_SIZE", "1")))  # a torchrun / accelerate launch: refused before stage 1
    p = preset(p) if isinstance(p, str) else p
    out = Path(out)
    data = decisions_of(p, data)
    text_only = data.text_workflows
    trees_note = {}
    if p.structured and text_only:
        trees_note = {"trees": f"none for {', '.join(text_only)}: their states are text, and trees read the fields "
                               "of a JSON state; " + ("the heads and the lexical part answer there" if p.lexical
                                                      else "the heads answer there alone")}
    started = time.perf_counter()
    backbone = load_backbone(p.backbone, quantize="4bit" if p.mode == "qlora" else None)
    # seeded after the load: a process's first load probes the compute dtype on random matrices, and the dropout
    # masks of stage 2 must not depend on whether this run came first
    set_seed(p.seed)
    train_split, dev, validation = training_splits(p, data)
    model = DecisionModel(backbone, data.schema, p.features)

    # Stage 1: heads on frozen, cached features; L2 and steps picked on the dev slice.
    pool = training_pool(p, data)  # one cached extraction for train and dev (and the router, later)
    extraction = time.perf_counter()
    pooled = dict(zip(pool.ids, model.split_pooled(pool)))
    extraction = time.perf_counter() - extraction  # a second or two when the on-disk cache has the features
    train_pooled = torch.stack([pooled[i] for i in train_split.ids])
    dev_pooled = model.split_pooled(dev) if dev is validation else torch.stack([pooled[i] for i in dev.ids])
    train_x, dev_x = model.normalize_fitted(train_pooled), model.normalize(dev_pooled)
    fit = fit_heads(model.heads, train_split, dev, train_x, dev_x, p.l2_grid, p.head_steps, p.head_lr, p.ordinal,
                    progress)
    history, best = fit.history, fit.best_val_loss
    extra = {"head L2": fit.recipe.l2, "head steps": fit.recipe.steps, "train cases": len(train_split), "dev cases": len(dev),
             "validation cases": len(validation), "feature extraction (s)": round(extraction, 1),
             # states longer than the cap of windows: training read their first max_windows windows
             f"train states past {model.spec.max_windows} windows of {model.spec.max_length} tokens":
                 len(over_cap(model, pool)),
             **trees_note, **backbone.precision.describe()}
    hybrid_fit = None
    if p.mode == "heads":
        model.head_recipe = fit.recipe
        if p.dev_per_workflow:  # the choice is made: fit again on every training case
            train_x = model.normalize_fitted(torch.stack(list(pooled.values())))
            refit_heads(model.heads, pool, train_x, fit.recipe)
            extra["train cases"] = len(pool)
        if p.structured:
            hybrid_fit = fit_structured(model, pool if p.dev_per_workflow else train_split, train_x, rounds=p.tree_rounds,
                                    lexical=p.lexical)
            extra.update({f"out-of-fold accuracy, {part}": round(float(hybrid_fit.scores.loc[(part, "all"), "accuracy"]), 4)
                          for part in PARTS if (part, "all") in hybrid_fit.scores.index})
            extra["parts"] = {w: model.structured.parts(w) for w in model.schema}
        model.save(out)
        model.eval()
    else:
        history, best, step = finetune(model, train_split, dev, p, out, history, best, fit.recipe.l2, resume,
                                       progress)
        extra["best step"] = step
        model = load(out)  # the best step saved, which may not be the last
    seconds = time.perf_counter() - started
    peak = peak_memory_gb(backbone.device)
    result = TrainResult(p, pd.DataFrame(history), best, seconds, peak, out, extra, model,
                         {"train": pool, "validation": validation}, hybrid_fit)
    write_text(out / HISTORY_FILE, json.dumps({
        "preset": p.to_json(), "history": history, "best_val_loss": best, "seconds": seconds, "peak_memory_gb": peak,
        "machine": platform.platform(), **extra}, indent=2, default=str))
    return result


@dataclass
class StepCost:
    """What one optimizer step of a fine-tuning preset costs on this machine, and the epoch and run it implies
    (the dev evaluations and stage 1 not counted)."""

    preset: Preset
    backbone: str
    trainable: int  # parameters the step updates
    tokens: list[int]  # per timed step, up to the cap (max_windows windows of max_length)
    seconds: list[float]  # per timed step
    steps_per_epoch: int
    compute_dtype: str

    @property
    def step_seconds(self) -> float:
        return float(np.mean(self.seconds))

    def row(self) -> dict:
        run_steps = max(1, round(self.preset.epochs * self.steps_per_epoch))
        return {"backbone": self.backbone, "mode": self.preset.mode, "trainable parameters": self.trainable,
                "cases per step": self.preset.batch_size, "tokens per step": float(np.mean(self.tokens)),
                "timed steps": len(self.seconds), "s per step": self.step_seconds,
                "steps per epoch": self.steps_per_epoch, "epoch (min)": self.step_seconds * self.steps_per_epoch / 60,
                "epochs": self.preset.epochs, "run (h)": self.step_seconds * run_steps / 3600,
                "compute dtype": self.compute_dtype}


@dataclass
class StepCosts:
    """``step_costs``' measurements, one per preset."""

    costs: dict[str, StepCost]

    def table(self) -> pd.DataFrame:
        return pd.DataFrame.from_dict({name: c.row() for name, c in self.costs.items()}, orient="index")


def step_cost(p: Preset | str, steps: int = 3, warmup: int = 1, data=None) -> StepCost:
    """Time ``steps`` optimizer steps of fine-tuning preset ``p`` (after ``warmup`` untimed ones) exactly as
    ``train`` runs them: its backbone made trainable as the mode says, its batches (every workflow mixed, micro-batches
    of similar length), its optimizer and clipping; the heads start uniform, which costs the same. What a step costs
    is what decides whether fine-tuning fits a CPU: the epoch is ``steps_per_epoch`` of them."""
    from transformers import get_cosine_schedule_with_warmup

    p = preset(p) if isinstance(p, str) else p
    if p.mode == "heads":
        raise ValueError(f"preset {p.name!r} has mode 'heads': it has no fine-tuning step to time")
    backbone = load_backbone(p.backbone, quantize="4bit" if p.mode == "qlora" else None)
    set_seed(p.seed)
    train_split, _, _ = training_splits(p, data)
    model = DecisionModel(backbone, train_split.schema(), p.features)
    accelerator, optimizer = prepare(model, p)
    per_epoch = math.ceil(len(train_split) / p.batch_size)
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(p.warmup * per_epoch), per_epoch)
    trainable = sum(q.numel() for q in model.parameters() if q.requires_grad)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lengths = cut_lengths(accelerator.unwrap_model(model), train_split)
    plans = mixed_steps(train_split.case_workflows, lengths, p.batch_size, p.micro_batch, p.seed)
    if warmup + steps > len(plans):
        raise ValueError(f"steps + warmup is {warmup + steps}; preset {p.name!r} has {len(plans)} steps an epoch")
    seconds, tokens = [], []
    for k, plan in enumerate(plans[:warmup + steps]):
        started = time.perf_counter()
        optimizer_step(model, accelerator, optimizer, scheduler, plan, train_split, p, p.l2_grid[0])
        synchronize(backbone.device)
        if k >= warmup:
            seconds.append(time.perf_counter() - started)
            tokens.append(sum(lengths[i] for micro in plan for i in micro))
    return StepCost(p, backbone.name.split("/")[-1], trainable, tokens, seconds, per_epoch,
                    backbone.precision.dtype)


def step_costs(presets, steps: int = 3, warmup: int = 1, data=None) -> StepCosts:
    """``step_cost`` of each preset, one after the other (each loads its own backbone)."""
    return StepCosts({(p if isinstance(p, str) else p.name): step_cost(p, steps, warmup, data) for p in presets})
