"""A run, end to end: the main job (``decisionkit demo`` / ``train``), from a preset to a saved model and its report.

``run_report(preset, out)``: train (``training.train``), calibrate on validation (``calibration.calibrate``), fit the
router (``anomaly.fit_router``, typed-decisions only), score validation and test as the saved model answers them and
the hybrid's parts apart, the zero-shot baseline if asked (``zeroshot``), then save the model and its report
(``report.RunReport``).
"""

from __future__ import annotations

from pathlib import Path

from ..data.metrics import score
from ..model import saving
from ..model.backbone import load_backbone
from ..model.decision_model import load
from .anomaly import OFF_DOMAIN_DIR, evaluate_scores, fit_router, load_inputs
from .calibration import calibrate
from .presets import Preset, preset
from .report import RunReport
from .trainer import held_out_test, part_scores, train, training_pool, training_splits
from .zeroshot import zero_shot_predictions


def run_report(preset_name: str | Preset, out: str | Path, data_dir=None, zero_shot: int = 0, resume: bool = True,
               progress: bool = True, reuse: bool = False, route: bool = True) -> RunReport:
    """A run, end to end: train preset ``preset_name`` into ``out``, calibrate on validation (probabilities to the soft
    gold, confidence to the answer), fit the router (typed-decisions), score validation and test as the saved model
    answers them (distance-aware with a router; the heads alone are in the calibration table), and
    zero-shot on ``zero_shot`` validation cases per workflow), save the model and its report. With ``reuse``, a
    folder that already holds a report is read instead of trained again (notebooks show saved full runs);
    ``route=False`` skips the routing threshold (a pass over every train case for a fine-tuned model)."""
    if reuse and (Path(out) / saving.REPORT_FILE).is_file():
        return RunReport.load(out)
    p = preset(preset_name) if isinstance(preset_name, str) else preset_name
    result = train(p, out, data_dir=data_dir, resume=resume, progress=progress)
    model = load(out)
    # the preset's own cases: every train case it may use (the router cross-fits on them), its validation cases, and
    # the test cases it is scored on (a sample for quick presets)
    splits = {"train": training_pool(p, data_dir), "validation": training_splits(p, data_dir)[2],
              "test": held_out_test(p, data_dir)}
    calibration = calibrate(model, splits["validation"], splits["test"])
    scores = {name: calibration.scores[(name, "after")] for name in ("validation", "test")}
    routing = {}
    if route and p.dataset == "typed-decisions":
        router = fit_router(model, splits["train"], splits["validation"])
        off = load_inputs(OFF_DOMAIN_DIR / "off_domain.jsonl", set(splits["train"].workflows))
        off = off.per_kind(p.off_domain_per_kind) if p.off_domain_per_kind else off  # quick presets: every kind, fewer
        sent = evaluate_scores(model, splits["test"], off).routed().groupby(level="set").apply(
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
    if zero_shot:  # an encoder has no next-token head to ask: the offline causal LM is asked instead, and named
        sample = splits["validation"].head(zero_shot)
        asked = model.backbone if model.backbone.kind == "causal" else load_backbone()
        name = "" if asked is model.backbone else f"{asked.name.split('/')[-1]}, "
        baselines[f"zero-shot ({name}{len(sample)} validation cases)"] = score(
            sample, zero_shot_predictions(asked, sample, progress=progress))
    backbone, saved = model.backbone, saving.config(model)["backbone"]
    report = RunReport(
        backbone={"name": saved["name"], "source": backbone.resolved.source,
                  "weights_sha256": saved["weights_sha256"], "kind": backbone.kind},
        data_source=splits["test"].source,
        training={"preset": p.name, "mode": p.mode, "seconds": result.seconds,
                  "peak_memory_gb": result.peak_memory_gb, "best_val_loss": result.best_val_loss, **result.extra},
        scores=scores, baselines=baselines,
        history=result.history,
        calibration={"temperatures": calibration.temperatures,
                     "confidence_temperatures": calibration.confidence_temperatures,
                     "table": {f"{split}/{stage}": row for (split, stage), row in
                               calibration.table().to_dict(orient="index").items()}},
        routing=routing)
    report.save(out)
    return report
