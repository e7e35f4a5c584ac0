"""The one training call and the run around it: from a preset to a finished, saved model and its report.

- ``train(preset, out)`` (``decisionkit.train``; the CLI's ``train`` and ``demo`` go through it): the weights
  (``trainer.fit_model``), temperatures fitted on validation (``calibration.calibrate``: probabilities to the soft
  gold, confidence to the answer), the router fitted on train and validation (``anomaly.fit_router``, any dataset;
  for typed-decisions also the share of the off-domain set it routes), validation and test scored as the saved
  model answers them and the hybrid's parts apart; the model saved in ``out``. It returns the finished model and
  its report (``Trained``); writing the report is a step of its own.
- ``run_report(preset, out)``: ``train``, the zero-shot baseline if asked (``zeroshot``), and the report written
  beside the model (``report.RunReport``); with ``reuse``, a folder that holds a report is read instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..data.cases import Split
from ..data.metrics import score
from ..model import saving
from ..model.backbone import load_backbone
from ..model.decision_model import DecisionModel
from .anomaly import OFF_DOMAIN_DIR, evaluate_scores, fit_router, load_inputs
from .calibration import calibrate
from .presets import Preset, preset
from .report import RunReport
from .trainer import TrainResult, fit_model, held_out_test, part_scores
from .zeroshot import zero_shot_predictions


@dataclass
class Trained:
    """What ``train`` returns: the finished model (calibrated, routed, saved in ``out``; ``decisionkit.load(out)``
    gives it back), its report (``report.save(out)`` writes it), and how its weights were fitted."""

    model: DecisionModel
    report: RunReport
    fitted: TrainResult
    splits: dict[str, Split]  # the preset's train pool, validation and test cases


def train(preset_name: str | Preset, out: str | Path, data_dir=None, resume: bool = True, progress: bool = True,
          route: bool = True) -> Trained:
    """Train preset ``preset_name`` into ``out`` and finish the model: calibrate it on validation, fit its router
    (``route=False`` skips the router: a pass over every train case for a fine-tuned model), score validation and
    test as it now answers (distance-aware with a router; the heads alone are in the calibration table), save it."""
    p = preset(preset_name) if isinstance(preset_name, str) else preset_name
    fitted = fit_model(p, out, data_dir=data_dir, resume=resume, progress=progress)
    model = fitted.model  # as saved: a fine-tuning run's best step
    # the preset's own cases: every train case it may use (the router cross-fits on them), its validation cases, and
    # the test cases it is scored on (a sample for quick presets)
    splits = {**fitted.cases, "test": held_out_test(p, data_dir)}
    calibration = calibrate(model, splits["validation"], splits["test"])
    scores = {name: calibration.scores[(name, "after")] for name in ("validation", "test")}
    routing = {}
    if route:
        router = fit_router(model, splits["train"], splits["validation"])
        others = []  # the project's off-domain set is written in typed-decisions' workflows
        if p.dataset == "typed-decisions":
            off = load_inputs(OFF_DOMAIN_DIR / "off_domain.jsonl", set(splits["train"].workflows))
            others.append(off.per_kind(p.off_domain_per_kind) if p.off_domain_per_kind else off)  # quick: fewer a kind
        sent = evaluate_scores(model, splits["test"], *others).routed().groupby(level="set").apply(
            lambda g: float((g["inputs"] * g["sent to a human"]).sum() / g["inputs"].sum()))
        routing = {"score": router.score, "threshold": router.threshold, "target share": router.rejection,
                   "fitted on": router.fitted_on, "reference distance": router.reference,
                   "distance scale": router.scale, "field reference": router.field_reference,
                   "field scale": router.field_scale, **{f"{name} sent to a human": share for name, share in sent.items()}}
        # What the saved model answers now: distance-aware (the heads alone stay in the calibration table).
        scores = {name: score(splits[name], *model.outputs(splits[name])) for name in ("validation", "test")}
    model.save(out)
    baselines = {}
    if model.structured is not None:  # the hybrid's parts apart, on the same test cases
        baselines.update({f"{part} ({len(splits['test'])} test cases)": s
                          for part, s in part_scores(model, splits["test"]).items()})
    backbone, saved = model.backbone, saving.ModelConfig.of(model).backbone
    report = RunReport(
        backbone={"name": saved["name"], "source": backbone.resolved.source,
                  "weights_sha256": saved["weights_sha256"], "kind": backbone.kind},
        data_source=splits["test"].source,
        training={"preset": p.name, "mode": p.mode, "seconds": fitted.seconds,
                  "peak_memory_gb": fitted.peak_memory_gb, "best_val_loss": fitted.best_val_loss, **fitted.extra},
        scores=scores, baselines=baselines,
        history=fitted.history,
        calibration={"temperatures": calibration.temperatures,
                     "confidence_temperatures": calibration.confidence_temperatures,
                     "table": {f"{split}/{stage}": row for (split, stage), row in
                               calibration.table().to_dict(orient="index").items()}},
        routing=routing)
    return Trained(model, report, fitted, splits)


def add_zero_shot(trained: Trained, per_workflow: int, progress: bool = True) -> None:
    """The zero-shot baseline on ``per_workflow`` validation cases of each workflow, added to the report. An encoder
    has no next-token head to ask: the offline causal LM is asked instead, and named."""
    sample = trained.splits["validation"].head(per_workflow)
    own = trained.model.backbone
    asked = own if own.kind == "causal" else load_backbone()
    name = "" if asked is own else f"{asked.name.split('/')[-1]}, "
    trained.report.baselines[f"zero-shot ({name}{len(sample)} validation cases)"] = score(
        sample, zero_shot_predictions(asked, sample, progress=progress))


def run_report(preset_name: str | Preset, out: str | Path, data_dir=None, zero_shot: int = 0, resume: bool = True,
               progress: bool = True, reuse: bool = False, route: bool = True) -> RunReport:
    """A run, end to end: ``train``, the zero-shot baseline on ``zero_shot`` validation cases per workflow (0:
    none), and the report written beside the model. With ``reuse``, a folder that already holds a report is read
    instead of trained again (notebooks show saved full runs), if it was trained with the same preset settings."""
    p = preset(preset_name) if isinstance(preset_name, str) else preset_name
    if reuse and (Path(out) / saving.REPORT_FILE).is_file():
        saved = json.loads((Path(out) / saving.HISTORY_FILE).read_text())["preset"]
        if saved != json.loads(json.dumps(p.to_json())):
            changed = sorted(k for k in saved.keys() | p.to_json().keys()
                             if saved.get(k) != json.loads(json.dumps(p.to_json().get(k))))
            raise ValueError(f"{out} holds a run of preset {saved['name']!r} with other settings ({', '.join(changed)}); "
                             "delete that folder to train this preset there, or give another folder")
        return RunReport.load(out)
    trained = train(p, out, data_dir=data_dir, resume=resume, progress=progress, route=route)
    if zero_shot:
        add_zero_shot(trained, zero_shot, progress)
    trained.report.save(out)
    return trained.report
