"""The seed's published figures, quoted: the reference run this course reproduces and explains (Qwen3.5-4B in 4-bit
NF4 with LoRA r16, trained through Unsloth on one GPU) and the second seed work that distilled that teacher into
small models. Quoted, never recomputed, and held in this one place: ``training.report.REFERENCES`` reads its
reference-run rows from here, and ``course.scoreboard`` sets each figure beside this course's measurement, with the
reason each ``SeedFigure`` gives for the gap.
"""

from __future__ import annotations

from dataclasses import dataclass

_RUN = "seed reference run"
_DISTILLED = "seed distillation work"


@dataclass(frozen=True)
class SeedFigure:
    """One figure the seed published: what it measures, its value (a fraction for a %, or a (low, high) range), the
    unit it is written in, the text it is quoted as, where the seed states it, and why this course's figure differs."""

    figure: str
    value: float | tuple[float, float]
    unit: str  # "%" (value is a fraction), "ms", "min", "GB", "x" or "" (a plain number, e.g. an ECE)
    quoted: str  # exactly as the seed writes it
    source: str
    reason: str
    decimals: int = 1  # how this course's figure is shown


_SCALE = ("22.7M-parameter MiniLM-L6 encoder, frozen, against the seed's 4B model fine-tuned with QLoRA")
_CPU = "2 cores of an AVX2-only CPU in float32 against the seed's GPU"

SEED: dict[str, SeedFigure] = {s.figure: s for s in (
    SeedFigure("training time", 15.0, "min", "~15 min", f"{_RUN}: training",
               "QLoRA back-propagates through a 4B model on a GPU; the hybrid reads each case once with a "
               "frozen encoder on the CPU, then fits heads and trees on the cached features (no backward pass "
               "through the encoder)"),
    SeedFigure("training peak memory", 7.95, "GB", "7.95 GB", f"{_RUN}: training",
               "the seed's is GPU memory: 4B weights in 4-bit NF4, LoRA adapters and activations; ours is the CPU "
               "process's peak resident memory (Python, torch, the float32 encoder, the features, the trees)",
               decimals=2),
    SeedFigure("zero-shot accuracy", 0.305, "%", "30.5%", f"{_RUN}: evaluation",
               "a 135M language model (SmolLM2; MiniLM has no language-model head to ask) against the seed's 4B; "
               "ours reads lettered options, on a sample of validation cases"),
    SeedFigure("validation accuracy", 0.805, "%", "80.5%", f"{_RUN}: evaluation",
               f"heads and trees on the state's fields, on the {_SCALE}; both fit a teacher's soft answers, so both "
               "are distillation"),
    SeedFigure("test accuracy", 0.749, "%", "74.9%", f"{_RUN}: evaluation",
               f"heads and trees on the state's fields, on the {_SCALE}; both fit a teacher's soft answers, so both "
               "are distillation"),
    SeedFigure("ECE before temperature scaling", 0.187, "", "0.187", f"{_RUN}: calibration",
               "how far off a model starts depends on the model: a fine-tuned 4B language model against heads and "
               "trees fitted to the teacher's soft answers; ours is the ECE of the confidence field (10 bins), whose "
               "temperatures are fitted to the gold answer",
               decimals=3),
    SeedFigure("ECE after temperature scaling", 0.036, "", "0.036", f"{_RUN}: calibration",
               "temperatures fitted on validation in both; what is left depends on where each model started (ours: "
               "the confidence field's; the probabilities' temperatures are fitted to the teacher's spread, notebook "
               "04)",
               decimals=3),
    SeedFigure("decision latency", 191.4, "ms", "191.4 ms", f"{_RUN}: latency",
               f"{_CPU}, and a 22.7M-parameter encoder against 4B parameters"),
    SeedFigure("generated JSON latency", 3679.8, "ms", "3,679.8 ms", f"{_RUN}: latency",
               f"{_CPU}; SmolLM2-135M generates (MiniLM cannot), the seed generated with its own 4B backbone",
               decimals=0),
    SeedFigure("one more question on a shared encoding", 16.0, "ms", "~16 ms", f"{_RUN}: latency",
               "a question is a head on the one encoding in both; ours is a 384-wide head with its trees, timed "
               "beyond the encoding, on the CPU; the seed's is its 4B setup's added time per question", decimals=3),
    SeedFigure("distilled small model latency", (22.0, 28.0), "ms", "22-28 ms", f"{_DISTILLED}: latency",
               "both are small models fitted to a teacher's soft answers (our gold is a teacher's distribution); ours "
               f"is the whole decide call of the MiniLM hybrid on {_CPU.split(' against')[0]}"),
    SeedFigure("poem answered: confidence", 0.543, "%", "54.3%", f"{_RUN}: examples (presented as losing confidence)",
               "a correction, not a gap: linear heads alone answer a poem about as surely as a real case (notebook 07 "
               "measures it on the whole off-domain set), so 54.3% on one poem says little; what routes a poem is a "
               "distance-aware confidence and a threshold"),
    SeedFigure("ticket: team billing", 0.9997, "%", "99.97%", f"{_RUN}: examples",
               "another model and training set: notebook 08's calibrated heads on frozen MiniLM-L6 features (the main "
               "model's recipe), fitted to the scenario's few hundred tickets; one example's probability shows how "
               "sharp a model is, not how often it is right (notebook 08 scores the test split)", decimals=2),
    SeedFigure("ticket: priority high", 0.8931, "%", "89.31%", f"{_RUN}: examples",
               "as for the team: another model and training set; one example shows sharpness, not accuracy",
               decimals=2),
    SeedFigure("QC report: action pass", 0.0063, "%", "0.63%", f"{_RUN}: examples",
               "notebook 08's calibrated heads on frozen MiniLM-L6 features (the main model's recipe), fitted to the "
               "scenario's few hundred QC reports, against the seed's 4B fine-tune; one example shows sharpness, not "
               "accuracy", decimals=2),
    SeedFigure("QC report: action human review", 0.7721, "%", "77.21%", f"{_RUN}: examples",
               "as for pass: another model and training set; one example shows sharpness, not accuracy", decimals=2),
    SeedFigure("QC report: risk moderate", 0.847, "%", "84.7%", f"{_RUN}: examples",
               "as for the action: another model and training set; one example shows sharpness, not accuracy"),
)}
