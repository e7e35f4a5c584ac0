"""Run reports: every metric of a trained model as JSON, a readable Markdown page, and a short report card; saved
runs side by side with the quoted references. ``pipeline.run_report`` makes one, end to end."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..core.atomic import write_text
from ..core.environment import environment
from ..data.metrics import Scores, accuracy_interval, paired_difference
from ..data.seed import SEED
from ..model.saving import DECISIONS_FILE, HISTORY_FILE, REPORT_FILE, REPORT_PAGE
from .answered import shown
from .comparison import comparison_lines, comparison_table

# Quoted from the course's reference run (the seed: its figures live in data.seed.SEED, the one place that holds
# them) and the benchmark's leaderboard, never recomputed here.
REFERENCES = pd.DataFrame([
    {"model": "Qwen3.5-4B 4-bit + LoRA r16 (reference run, validation)",
     "accuracy": SEED["validation accuracy"].value},
    {"model": "Qwen3.5-4B 4-bit + LoRA r16 (reference run, test)", "accuracy": SEED["test accuracy"].value},
    {"model": "Qwen3.5-4B zero-shot (reference run)", "accuracy": SEED["zero-shot accuracy"].value},
    {"model": "decider-75M", "accuracy": 0.805},
    {"model": "decider-175M", "accuracy": 0.812},
    {"model": "4B with ordinal heads", "accuracy": 0.7965, "kl": 0.082, "brier": 0.045},
    {"model": "Gemma 3 270M full fine-tune", "accuracy": 0.761},
    {"model": "prior (benchmark row)", "accuracy": 0.470},
    {"model": "uniform (benchmark row)", "kl": 0.444, "brier": 0.238},
]).set_index("model")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _metrics(scores: Scores) -> dict:
    return {
        **{k: float(v) for k, v in scores.overall().items()},
        "by_type": scores.summary("type").to_dict(orient="index"),
        "by_workflow": scores.summary("workflow").to_dict(orient="index"),
    }


@dataclass
class RunReport:
    """What a run measured, split by split, with where the backbone and data came from."""

    backbone: dict
    data_source: str
    training: dict
    scores: dict[str, Scores]  # split name -> scores of the trained model
    baselines: dict[str, Scores] = field(default_factory=dict)  # e.g. "zero-shot (validation)" -> scores
    history: pd.DataFrame = field(default_factory=pd.DataFrame)  # the training curves (held-out loss by step)
    calibration: dict = field(default_factory=dict)  # temperatures and the before/after table
    routing: dict = field(default_factory=dict)  # the threshold and the share of each set sent to a human
    data: dict = field(default_factory=dict)  # what it was trained on (``Decisions.record``: rows, splits, schema)
    answered: dict = field(default_factory=dict)  # split -> ``answered.Answered.summary``: as answered, routed share
    loop: dict = field(default_factory=dict)  # trained with reviews: what they were, the served model beside this one

    @property
    def benchmark(self) -> bool:
        """True for a run on typed-decisions (or one that recorded no data): the quoted references apply to it."""
        return bool(self.data.get("benchmark", True))

    def to_json(self) -> dict:
        return {
            "backbone": self.backbone,
            "data": {**self.data, "source": self.data_source},
            "training": self.training,
            **{split: _metrics(s) for split, s in self.scores.items()},
            "baselines": {name: _metrics(s) for name, s in self.baselines.items()},
            "calibration": self.calibration,
            "routing": self.routing,
            "answered": self.answered,
            **({"loop": self.loop} if self.loop else {}),
            "environment": environment(),
            "commit": git_commit(),
        }

    def table(self) -> pd.DataFrame:
        """Every row scored the same way: the trained model's raw answers (before the router) on each split, then
        the baselines on theirs (``answered_table``: the model as it answers)."""
        rows = {f"trained model ({split})": s.overall() for split, s in self.scores.items()}
        rows.update({name: s.overall() for name, s in self.baselines.items()})
        return pd.DataFrame(rows).T[["decisions", "accuracy", "accuracy_label", "kl", "brier", "ece",
                                     "ece_confidence"]]

    def answered_table(self) -> pd.DataFrame:
        """Per split, the trained model raw and as it answers: accuracy as answered, the share sent to a human, the
        cases it answers and their accuracy (``answered.Answered.summary``)."""
        return pd.DataFrame.from_dict(self.answered, orient="index").rename_axis("split")

    def card(self) -> str:
        lines = [f"backbone   {self.backbone['name']} ({self.backbone['source']})"]
        if self.data.get("rows"):
            sizes = ", ".join(f"{sum(self.data['rows'][s].values())} {s}" for s in self.data["rows"])
            states = self.data["states"]
            lines.append(f"data       {self.data_source}: {sizes} ({self.data['split rule']}); states "
                         f"{states['json']} JSON, {states['text']} text")
        lines.append(f"training   preset {self.training['preset']}, {self.training['seconds']:.0f} s, "
                     f"peak memory {self.training['peak_memory_gb']:.2f} GB")
        if "trees" in self.training:
            lines.append(f"trees      {self.training['trees']}")
        for name, row in self.table().iterrows():
            lines.append(f"{name:<34} accuracy {row['accuracy']:.3f}  KL {row['kl']:.3f}  "
                         f"Brier {row['brier']:.3f}  ECE {row['ece']:.3f}  ECE of confidence "
                         f"{row['ece_confidence']:.3f}")
        lines += [f"{split:<10} {shown(summary)}" for split, summary in self.answered.items()]
        if "threshold" in self.routing:
            lines.append(f"routing    {self.routing['score']} threshold {self.routing['threshold']:.3g}")
        lines += [f"routing    {k} {v:.1%}" for k, v in self.routing.items() if k.endswith("sent to a human")]
        if self.loop:
            lines += comparison_lines(self.loop)
        return "\n".join(lines)

    def markdown(self) -> str:
        parts = ["# decisionkit run report", "", "```", self.card(), "```", "",
                 "## Scores", "", "Every row scored the same way: raw answers, before the router.", "",
                 self.table().round(4).to_markdown(), ""]
        if self.answered:
            parts += ["## As answered", "", "The trained model as it answers: distance-aware, with the router's "
                      "verdict on each case.", "", self.answered_table().round(4).to_markdown(), ""]
        for split, s in self.scores.items():
            parts += [f"## {split}: by question type", "", s.summary("type").round(4).to_markdown(), "",
                      f"## {split}: by workflow", "", s.summary("workflow").round(4).to_markdown(), ""]
        if self.data.get("rows"):
            rows = pd.DataFrame(self.data["rows"]).fillna(0).astype(int)
            parts += ["## Data", "", f"Source: {self.data_source} ({self.data['rows total']} rows, SHA-256 of the rows "
                      f"{self.data['rows sha256'][:16]}...). Splits: {self.data['split rule']}. States: "
                      f"{self.data['states']['json']} read as JSON, {self.data['states']['text']} as text.", "",
                      rows.to_markdown(), ""]
        if self.loop:
            parts += ["## Reviews, and the model that served them", "", comparison_table(self.loop).to_markdown(),
                      ""]
        if self.benchmark:
            parts += ["## Quoted references (not measured here)", "", REFERENCES.to_markdown(), ""]
        return "\n".join(parts)

    def save(self, folder: str | Path) -> None:
        """``report.json`` (every metric), ``report.md`` (readable), ``decisions.csv`` (one row per decision of
        every split and baseline, so ``RunReport.load`` gives the same tables back)."""
        sets = {**{f"scores/{k}": v for k, v in self.scores.items()},
                **{f"baselines/{k}": v for k, v in self.baselines.items()}}
        rows = pd.concat([s.decisions.assign(set=name) for name, s in sets.items()], ignore_index=True)
        write_text(Path(folder) / DECISIONS_FILE, rows.to_csv(index=False))
        write_text(Path(folder) / REPORT_PAGE, self.markdown())
        write_text(Path(folder) / REPORT_FILE, json.dumps(self.to_json(), indent=2, default=str))

    @classmethod
    def load(cls, folder: str | Path) -> "RunReport":
        """The report a run saved (``pipeline.run_report`` / ``decisionkit train`` / ``benchmarks/train_preset.py``)."""
        folder = Path(folder)
        saved = json.loads((folder / REPORT_FILE).read_text(encoding="utf-8"))
        rows = pd.read_csv(folder / DECISIONS_FILE, encoding="utf-8")
        sets = {name: Scores(rows[rows["set"] == name].drop(columns="set").reset_index(drop=True))
                for name in rows["set"].unique()}  # in the order they were saved
        pick = lambda kind: {k.split("/", 1)[1]: v for k, v in sets.items() if k.startswith(kind + "/")}  # noqa: E731
        history = pd.DataFrame(json.loads((folder / HISTORY_FILE).read_text(encoding="utf-8"))["history"])
        data = {k: v for k, v in saved["data"].items() if k != "source"}
        return cls(saved["backbone"], saved["data"]["source"], saved["training"], pick("scores"), pick("baselines"),
                   history, saved.get("calibration", {}), saved.get("routing", {}), data, saved.get("answered", {}),
                   saved.get("loop", {}))

    def ladder(self, split: str = "test") -> "Ladder":
        """The baselines scored on ``split``'s cases (the majority answer per question, a hybrid's parts apart), weakest
        first, then the trained model: each row's accuracy gain over the row above with its bootstrap interval, so
        the model's row is its gain over the strongest baseline."""
        cases = set(self.scores[split].decisions["case"])
        same = {name: s for name, s in self.baselines.items() if set(s.decisions["case"]) == cases}
        ranked = sorted(same, key=lambda name: same[name].overall()["accuracy"])
        return Ladder({**{name: same[name] for name in ranked}, f"trained model ({split})": self.scores[split]})

    def figure(self):
        """The run's training curves: the heads' L2 search, then the fine-tuning steps (dev loss)."""
        from ..core.plots import training_curves

        return training_curves(self.history)


COMPARISON_COLUMNS = ["backbone", "mode", "accuracy", "kl", "brier", "ece", "ece_confidence", "training (min)",
                      "peak memory (GB)", "compute dtype"]


def run_row(folder: str | Path, split: str = "test") -> dict:
    """One row of a comparison from a saved run's ``report.json`` (written by ``decisionkit train``, ``demo`` and
    ``benchmarks/train_preset.py``): its scores on ``split``, training time and memory, where it ran."""
    report = json.loads((Path(folder) / REPORT_FILE).read_text(encoding="utf-8"))
    training, scores = report["training"], report[split]
    return {"backbone": report["backbone"]["name"].split("/")[-1], "mode": training["mode"],
            **{k: scores[k] for k in ("accuracy", "kl", "brier", "ece", "ece_confidence")},
            "training (min)": training["seconds"] / 60, "peak memory (GB)": training["peak_memory_gb"],
            "compute dtype": training.get("compute_dtype", "float32")}


def finetune_table(reports: dict[str, "RunReport"]) -> pd.DataFrame:
    """Per fine-tuning run: the step saved, its dev loss against stage 1's best (the saved step is never worse:
    step 0 is the stage-1 model), the training time and the compute dtype."""
    rows = {}
    for name, r in reports.items():
        stage_1 = r.history[r.history["stage"] == "heads"]["val_loss"].min()
        rows[name] = {"best step": r.training["best step"], "best dev loss": r.training["best_val_loss"],
                      "stage-1 dev loss": stage_1, "training (min)": r.training["seconds"] / 60,
                      "compute dtype": r.training["compute_dtype"]}
    return pd.DataFrame.from_dict(rows, orient="index")


def comparison(runs: dict[str, str | Path], measured: dict[str, Scores] | None = None,
               split: str = "test") -> pd.DataFrame:
    """Saved runs (name -> folder) and other measured scores (name -> Scores) side by side, then the quoted
    references, each row labelled measured or quoted."""
    rows = {f"{name} (measured)": run_row(folder, split) for name, folder in runs.items()}
    rows.update({f"{name} (measured)": s.overall() for name, s in (measured or {}).items()})
    quoted = REFERENCES.rename(index=lambda name: f"{name} (quoted)")
    return pd.concat([pd.DataFrame.from_dict(rows, orient="index").reindex(columns=COMPARISON_COLUMNS), quoted])


@dataclass
class Ladder:
    """Models scored on the same cases, in the order a learner meets them: each row's metrics, and its gain in
    accuracy over the row before with a bootstrap interval over cases (``metrics.paired_difference``): a gain
    whose interval holds 0 is not one this test set can tell from noise."""

    scores: dict[str, Scores]
    level: float = 0.95

    def table(self) -> pd.DataFrame:
        rows, previous = {}, None
        for name, s in self.scores.items():
            row = {k: s.overall()[k] for k in ("accuracy", "kl", "brier")}
            if previous is not None:
                gain, low, high = paired_difference(previous, s, level=self.level)
                row.update({"gain": gain, "gain low": low, "gain high": high})
            rows[name], previous = row, s
        table = pd.DataFrame.from_dict(rows, orient="index")
        return table.rename(columns={"gain": "accuracy gain over the row above",
                                     "gain low": f"{self.level:.0%} interval, low",
                                     "gain high": f"{self.level:.0%} interval, high"})

    def by_workflow(self) -> pd.DataFrame:
        """Accuracy per workflow, one column per model: where each part is strong."""
        return pd.DataFrame({name: s.summary("workflow")["accuracy"] for name, s in self.scores.items()})

    def workflow_intervals(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The low and high ends of each ``by_workflow`` accuracy's bootstrap interval at the ladder's level
        (``metrics.accuracy_interval`` over the workflow's cases), one pass per model and workflow."""
        ends = {name: {workflow: accuracy_interval(Scores(d, s.ece_bins), self.level)[1:]
                       for workflow, d in s.decisions.groupby("workflow")}
                for name, s in self.scores.items()}
        return tuple(pd.DataFrame({name: {w: pair[end] for w, pair in rows.items()} for name, rows in ends.items()})
                     for end in (0, 1))

    def figure(self):
        """Accuracy per workflow, a bar per model, each with its interval."""
        from ..core.plots import ladder_bars

        return ladder_bars(self.by_workflow(), *self.workflow_intervals())
