"""The one training call and the run around it: from data and a preset to a finished, saved model and its report.

- ``train(data, out, schema=..., preset=...)`` (``decisionkit.train``; the CLI's ``train`` and ``demo`` go through
  it): the data read once (``trainer.decisions_of``: your own rows from any source, or the preset's dataset), the
  weights (``trainer.fit_model``), the temperatures (typed-decisions: fitted on validation, ``calibration.calibrate``;
  your own data, small: out of fold on train plus validation, ``calibration.calibrate_out_of_fold``), the router
  (``anomaly.fit_router``) checked on the held-out test rows and on the project's off-domain set read as states of
  the data's own workflows (``anomaly.off_domain``), validation and test scored raw (before the router, as each of a
  hybrid's parts and the majority answer of each question are scored beside them) and as the saved model answers them
  (``answered.answered``: accuracy as answered, the share sent to a human, the accuracy of the cases it answers); the model, what it was trained on
  (``saving.write_data``) and the report saved. ``out`` is checked before anything trains and held by one run at a
  time; everything is written in a working folder beside it (``.NAME.training``, where an interrupted fine-tuning run
  of the same data resumes) and moved into ``out`` once whole, beside whatever else ``out`` held (``run_folder``): a
  run that fails leaves no model that looks finished, and an older one in ``out`` stays whole until then.
- ``run_report(preset, out)``: ``train`` for a preset's own dataset, as the notebooks call it; with ``reuse``, a
  folder that holds a report of the same settings is read instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import RunError
from ..data.cases import Split
from ..data.decisions import Decisions
from ..data.metrics import prior_predictions, score
from ..model import saving
from ..model.backbone import load_backbone
from ..model.decision_model import DecisionModel
from . import presets
from .anomaly import evaluate_scores, fit_router, off_domain, with_reviewed
from .answered import answered
from .calibration import calibrate, calibrate_out_of_fold
from .presets import DEFAULT_PRESET, Preset
from .report import RunReport
from .run_folder import check_out, claimed, prepare_work, publish_run
from .trainer import TrainResult, decisions_of, fit_model, held_out_test, part_scores
from .zeroshot import zero_shot_predictions


@dataclass
class Trained:
    """What ``train`` returns: the finished model (calibrated, routed, saved in ``out``; ``decisionkit.load(out)``
    gives it back), its report (saved beside it), how its weights were fitted, and the data it read."""

    model: DecisionModel
    report: RunReport
    fitted: TrainResult
    splits: dict[str, Split]  # the preset's train pool, validation and test cases
    data: Decisions


def train(data=None, out: str | Path = "runs/model", *, schema=None, preset: str | Preset = DEFAULT_PRESET,
          zero_shot: int = 0, resume: bool = True, progress: bool = True, route: bool = True,
          not_a_case: list | None = None, **reading) -> Trained:
    """Train a decision model on ``data`` into ``out``: the weights, temperatures, router, scores and report.

    ``data``: your decisions from any source ``decisions.load_decisions`` reads (a ``.csv``, ``.tsv``, ``.jsonl``,
    ``.json`` or ``.parquet`` file, gzipped or not, a folder, a DataFrame, a list of dicts, a ``datasets.Dataset``)
    with ``schema`` (a dict or a ``schema.json`` path) unless the rows or the folder carry their questions, read as
    ``reading`` says (``workflow``, ``state_columns``, ``text_column``, ``id_column``, ``ignore_columns``,
    ``delimiter``: ``rows.Reading``); a project scenario as ``"scenario:NAME"``; a loaded ``Decisions``; or None, the
    preset's own dataset. ``out``: a new folder, an empty one or an earlier model's (``run_folder.check_out``: any
    other folder is refused before anything trains, and into an earlier model only the run's own files are replaced).
    ``preset``: a name or a ``Preset`` (default: the main job's hybrid). ``zero_shot``: also score the zero-shot
    baseline on that many validation cases per workflow. ``route=False`` skips the router (a pass over every train
    case for a fine-tuned model). ``resume=False`` starts afresh where an interrupted run left its working folder
    (which only the run that made it resumes anyway: ``run_folder.prepare_work``). ``not_a_case``: (workflow, state)
    pairs that reviewers said are not cases (``loop.retrain``), checked with the off-domain set."""
    p = presets.preset(preset) if isinstance(preset, str) else preset
    out = check_out(out)
    decisions = decisions_of(p, data, schema, **reading)
    with claimed(out):
        identity = {"preset": p.to_json(), "schema": decisions.record["schema"],
                    "rows": decisions.record["rows sha256"]}
        return _train(p, decisions, out, prepare_work(out, identity, resume), zero_shot, resume, progress, route,
                      not_a_case or [])


def _train(p: Preset, decisions: Decisions, out: Path, work: Path, zero_shot: int, resume: bool, progress: bool,
           route: bool, not_a_case: list) -> Trained:
    fitted = fit_model(p, work, decisions, resume=resume, progress=progress)
    model = fitted.model  # as saved: a fine-tuning run's best step
    # the preset's own cases: every train case it may use (the router cross-fits on them), its validation cases, and
    # the test cases it is scored on (a sample for quick presets)
    splits = {**fitted.cases, "test": held_out_test(p, decisions)}
    small = not decisions.benchmark and model.backbone.frozen and model.head_recipe is not None
    if small:  # a user's few hundred rows: temperatures fitted on out-of-fold train and validation, kept if they help
        calibration = calibrate_out_of_fold(model, splits["train"], splits["validation"], splits["test"])
    else:
        calibration = calibrate(model, splits["validation"], splits["test"])
    routing = {}
    if route:
        off = with_reviewed(off_domain(splits["train"].workflows, p.off_domain_per_kind), not_a_case)
        routing = routed(model, splits, off)
    shipped = {name: answered(model, splits[name]) for name in ("validation", "test")}  # raw, and as answered
    scores = {name: found.raw for name, found in shipped.items()}
    model.save(work)
    saving.write_data(work, decisions, splits["test"])
    baselines = {f"majority per question ({len(splits['test'])} test cases)":
                 score(splits["test"], prior_predictions(splits["train"], splits["test"]))}
    if model.structured is not None:  # the hybrid's parts apart, on the same test cases
        baselines.update({f"{part} ({len(splits['test'])} test cases)": s
                          for part, s in part_scores(model, splits["test"]).items()})
    backbone, saved = model.backbone, saving.ModelConfig.of(model).backbone
    report = RunReport(
        backbone={"name": saved["name"], "source": backbone.resolved.source,
                  "weights_sha256": saved["weights_sha256"], "kind": backbone.kind},
        data_source=decisions.record["source"],
        training={"preset": p.name, "mode": p.mode, "seconds": fitted.seconds,
                  "peak_memory_gb": fitted.peak_memory_gb, "best_val_loss": fitted.best_val_loss, **fitted.extra},
        scores=scores, baselines=baselines,
        history=fitted.history,
        calibration={"method": "out of fold (train) and validation" if small else "validation",
                     "temperatures": calibration.temperatures,
                     "confidence_temperatures": calibration.confidence_temperatures,
                     "table": {f"{split}/{stage}": row for (split, stage), row in
                               calibration.table().to_dict(orient="index").items()}},
        routing=routing, data=decisions.record,
        answered={name: found.summary() for name, found in shipped.items()})
    trained = Trained(model, report, fitted, splits, decisions)
    if zero_shot:
        add_zero_shot(trained, zero_shot, progress)
    report.save(work)
    publish_run(work, out)
    fitted.out = out
    return trained


def routed(model, splits: dict, off) -> dict:
    """Fit ``model``'s router on train and validation, and say what it sends to a human: the share of the held-out
    test rows, of the off-domain inputs ``off`` (and of each kind of them), with the threshold and its settings."""
    router = fit_router(model, splits["train"], splits["validation"])
    table = evaluate_scores(model, splits["test"], off).routed()
    share = lambda g: float((g["inputs"] * g["sent to a human"]).sum() / g["inputs"].sum())  # noqa: E731
    sent = table.groupby(level="set").apply(share)
    return {"score": router.score, "threshold": router.threshold, "target share": router.rejection,
            "fitted on": router.fitted_on, "reference distance": router.reference,
            "distance scale": router.scale, "field reference": router.field_reference,
            "field scale": router.field_scale, **{f"{name} sent to a human": v for name, v in sent.items()},
            "share sent to a human by off-domain kind": table.loc[off.name, "sent to a human"].to_dict()}


def add_zero_shot(trained: Trained, per_workflow: int, progress: bool = True) -> None:
    """The zero-shot baseline on ``per_workflow`` validation cases of each workflow, added to the report. An encoder
    has no next-token head to ask: the offline causal LM is asked instead, and named."""
    sample = trained.splits["validation"].head(per_workflow)
    own = trained.model.backbone
    asked = own if own.kind == "causal" else load_backbone()
    name = "" if asked is own else f"{asked.name.split('/')[-1]}, "
    trained.report.baselines[f"zero-shot ({name}{len(sample)} validation cases)"] = score(
        sample, zero_shot_predictions(asked, sample, progress=progress))


def run_report(preset_name: str | Preset, out: str | Path, data=None, zero_shot: int = 0, resume: bool = True,
               progress: bool = True, reuse: bool = False, route: bool = True, schema=None) -> RunReport:
    """``train`` with preset ``preset_name`` (on its own dataset unless ``data`` is given), returning the report it
    saved beside the model. With ``reuse``, a folder that already holds a report is read instead of trained again
    (notebooks show saved full runs), if it was trained with the same preset settings."""
    p = presets.preset(preset_name) if isinstance(preset_name, str) else preset_name
    if reuse and (Path(out) / saving.REPORT_FILE).is_file():
        saved = json.loads((Path(out) / saving.HISTORY_FILE).read_text(encoding="utf-8"))["preset"]
        if saved != json.loads(json.dumps(p.to_json())):
            changed = sorted(k for k in saved.keys() | p.to_json().keys()
                             if saved.get(k) != json.loads(json.dumps(p.to_json().get(k))))
            raise RunError(f"{out} holds a run of preset {saved['name']!r} with other settings ({', '.join(changed)}); "
                             "delete that folder to train this preset there, or give another folder")
        return RunReport.load(out)
    return train(data, out, schema=schema, preset=p, zero_shot=zero_shot, resume=resume, progress=progress,
                 route=route).report
