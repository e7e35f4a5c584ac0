"""The benchmark's metrics, per decision and pooled, broken down by question type and workflow.

Per decision, with gold distribution g and predicted distribution p over the same answer keys:

- accuracy: argmax p equals argmax g, ties going to the first-listed key (the card's scorer); the stored
  ``label`` rule is reported beside it as ``accuracy_label``;
- KL(g || p) = sum_k g_k ln(g_k / p_k), terms with g_k = 0 skipped, p_k floored at 1e-12;
- Brier = sum_k (p_k - g_k)^2, summed over the answers, not averaged;
- ECE: 10 equal-width bins on the top answer's confidence against 0/1 correctness, pooled over all decisions.

The System One answer carries a separate ``confidence`` for choice and score questions (a noul answer is its
probability alone). ``ece_confidence`` is the ECE of that field over the decisions that carry it: a model may fit
its probabilities to the teacher's distribution (KL) and its confidence to correctness (this ECE) at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import binomtest, bootstrap

from .cases import Split

KL_FLOOR = 1e-12  # the strictest floor the benchmark's scorers use
ECE_BINS = 10


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS,
                     level: float = 0.95) -> pd.DataFrame:
    """Equal-width confidence bins (the last one closed): decisions, mean confidence and accuracy per bin, with the
    accuracy's Wilson score interval at ``level`` (``scipy.stats.binomtest``; within [0, 1], and not empty for a
    bin all right or all wrong). It takes the decisions as independent, so it is the narrowest honest interval: the
    questions of one case share a state."""
    confidence = np.asarray(confidence, dtype=float)
    correct = np.asarray(correct, dtype=float)
    index = np.minimum((confidence * bins).astype(int), bins - 1)
    frame = pd.DataFrame({"bin": index, "confidence": confidence, "accuracy": correct})
    table = frame.groupby("bin").agg(decisions=("bin", "size"), confidence=("confidence", "mean"),
                                     accuracy=("accuracy", "mean"))
    table.insert(0, "low", table.index / bins)
    table.insert(1, "high", (table.index + 1) / bins)
    table["accuracy low"], table["accuracy high"] = wilson_interval(table["accuracy"], table["decisions"], level)
    return table


def wilson_interval(accuracy, decisions, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The low and high ends of each accuracy's Wilson score interval at ``level`` (``scipy.stats.binomtest``),
    ``accuracy[k]`` measured on ``decisions[k]`` decisions taken as independent."""
    intervals = [binomtest(round(a * n), int(n)).proportion_ci(level, method="wilson")
                 for a, n in zip(np.asarray(accuracy, dtype=float), np.asarray(decisions))]
    return np.array([i.low for i in intervals]), np.array([i.high for i in intervals])


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Weighted mean |accuracy - confidence| over the equal-width bins of ``reliability_bins``; as the weights are
    the bins' shares of the decisions, it is the sum over bins of |correct - confidence| summed in the bin, over all
    decisions (0 for none). The one ECE of the package: every table and bootstrap calls it."""
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    if confidence.size == 0:
        return 0.0
    index = np.minimum((confidence * bins).astype(int), bins - 1)
    gap = np.bincount(index, correct - confidence, minlength=bins)
    return float(np.abs(gap).sum() / confidence.size)


@dataclass
class Scores:
    """One row per decision; ``summary()`` pools them, overall or by type / workflow / question."""

    decisions: pd.DataFrame
    ece_bins: int = ECE_BINS

    def summary(self, by: str | list[str] | None = None) -> pd.DataFrame:
        def pooled(frame: pd.DataFrame) -> pd.Series:
            return pd.Series({
                "decisions": len(frame),
                "accuracy": frame["correct"].mean(),
                "accuracy_label": frame["correct_label"].mean(),
                "kl": frame["kl"].mean(),
                "brier": frame["brier"].mean(),
                "ece": expected_calibration_error(frame["confidence"], frame["correct"], self.ece_bins),
                "ece_confidence": self.confidence_ece(frame),
            })

        if by is None:
            return pooled(self.decisions).to_frame("all").T
        return self.decisions.groupby(by).apply(pooled, include_groups=False)

    def confidence_ece(self, frame: pd.DataFrame | None = None, bins: int | None = None) -> float:
        """ECE of the answers' ``confidence`` field, over the decisions that carry one (NaN when none does)."""
        frame = self.decisions if frame is None else frame
        carried = frame.dropna(subset=["answer_confidence"])
        if carried.empty:
            return float("nan")
        return expected_calibration_error(carried["answer_confidence"], carried["correct"], bins or self.ece_bins)

    def overall(self) -> dict[str, float]:
        row = self.summary().iloc[0]
        return {k: float(v) for k, v in row.items()}


def score(cases: Split, predictions: list[dict[str, np.ndarray]], confidences: list[dict[str, float]] | None = None,
          ece_bins: int = ECE_BINS) -> Scores:
    """Score ``predictions`` (one ``{question id: probabilities in option order}`` per case) against gold.
    ``confidences`` (one ``{question id: confidence}`` per case, choice and score questions) are the answers'
    ``confidence`` fields when they are calibrated apart from the probabilities; by default, the top probability."""
    if len(predictions) != len(cases):
        raise ValueError(f"predictions has {len(predictions)} entries; expected one per case ({len(cases)})")
    rows = []
    for index, (case, predicted) in enumerate(zip(cases, predictions)):
        for qid, question in case.questions.items():
            gold = case.gold[qid].probabilities
            if qid not in predicted:
                raise ValueError(f"case {case.id}: no prediction for question {qid!r}")
            p = np.asarray(predicted[qid], dtype=float)
            if p.shape != gold.shape:
                raise ValueError(f"case {case.id}, question {qid!r}: prediction has {p.size} probabilities; "
                                 f"expected {gold.size} ({', '.join(question.options)})")
            top = int(np.argmax(p))
            seen = gold > 0
            carried = float("nan") if question.type == "noul" else (
                float(p[top]) if confidences is None else float(confidences[index][qid]))
            rows.append({
                "case": case.id, "workflow": case.workflow, "question": qid, "type": question.type,
                "correct": top == case.gold[qid].top,
                "correct_label": question.options[top] == case.gold[qid].label,
                "kl": float(np.sum(gold[seen] * np.log(gold[seen] / np.maximum(p[seen], KL_FLOOR)))),
                "brier": float(np.sum((p - gold) ** 2)),
                "confidence": float(p[top]),
                "answer_confidence": carried,
            })
    return Scores(pd.DataFrame(rows), ece_bins)


PAIRED_METRICS = ("accuracy", "kl", "brier", "ece", "ece_confidence")  # what paired_difference compares


def case_rows(cases) -> list[np.ndarray]:
    """The positions of each case's decisions in ``cases`` (a case id per decision), one array per case in order of
    first appearance: what the bootstraps resample, since a case's questions share one state."""
    codes, _ = pd.factorize(pd.Series(cases))
    return [np.flatnonzero(codes == k) for k in range(codes.max() + 1)]


def case_interval(rows: list[np.ndarray], statistic, level: float = 0.95, resamples: int = 2000,
                  seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval at ``level`` of ``statistic(positions)`` with the cases resampled, each with
    all its rows (``rows``: each case's positions, ``case_rows``); NaN bounds from one case. Drawn here, not
    by ``scipy.stats.bootstrap``: a statistic equal on every draw (no reply of a method right) is its own interval."""
    if len(rows) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    drawn = [statistic(np.concatenate([rows[i] for i in rng.integers(0, len(rows), len(rows))]))
             for _ in range(resamples)]
    low, high = np.percentile(drawn, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def accuracy_interval(scores: Scores, level: float = 0.95, resamples: int = 2000,
                      seed: int = 0) -> tuple[float, float, float]:
    """The accuracy of ``scores`` and its percentile bootstrap interval at ``level``, the cases resampled with all
    their decisions (a case's questions share one state; NaN bounds from one case)."""
    correct = scores.decisions["correct"].to_numpy(float)
    rows = case_rows(scores.decisions["case"])
    accuracy = float(correct.mean())
    if len(rows) < 2:
        return accuracy, float("nan"), float("nan")
    drawn = bootstrap((np.arange(len(rows)),), lambda cases: float(correct[np.concatenate([rows[k] for k in cases])].mean()),
                      vectorized=False, n_resamples=resamples, confidence_level=level, method="percentile", rng=seed)
    return accuracy, float(drawn.confidence_interval.low), float(drawn.confidence_interval.high)


def paired_difference(before: Scores, after: Scores, metric: str = "accuracy", resamples: int = 2000,
                      level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``after`` minus ``before`` on the same decisions: the difference in ``metric`` (one of ``PAIRED_METRICS``;
    ``ece`` and ``ece_confidence``, the confidence field's over the decisions that carry one, over ``before``'s
    bins) and its percentile bootstrap interval at ``level``. Cases are resampled, the same cases for both, not
    decisions: a case's questions share one state, so they are not independent draws (``scipy.stats.bootstrap``
    over case indices; no interval, NaN, from one case)."""
    if metric not in PAIRED_METRICS:
        raise ValueError(f"metric is {metric!r}; expected one of {', '.join(PAIRED_METRICS)}")
    key = ["case", "question"]
    a, b = (s.decisions.set_index(key).sort_index() for s in (before, after))
    if not a.index.equals(b.index):
        raise ValueError("the two Scores hold different decisions: score both on the same cases")
    if metric in ("ece", "ece_confidence"):  # the top probability's, or the confidence field's where one is carried
        column = "confidence" if metric == "ece" else "answer_confidence"
        (conf_a, right_a), (conf_b, right_b) = ((d[column].to_numpy(float), d["correct"].to_numpy(float))
                                                for d in (a, b))

        def ece(confidence, correct, picked):
            kept = picked[~np.isnan(confidence[picked])]
            return expected_calibration_error(confidence[kept], correct[kept], before.ece_bins)

        def difference(picked):
            return ece(conf_b, right_b, picked) - ece(conf_a, right_a, picked)
    else:
        column = "correct" if metric == "accuracy" else metric
        delta = b[column].to_numpy(float) - a[column].to_numpy(float)

        def difference(picked):
            return float(delta[picked].mean())
    rows = case_rows(a.index.get_level_values("case"))
    if len(rows) < 2:  # one case: nothing to resample
        return difference(np.arange(len(a))), float("nan"), float("nan")
    drawn = bootstrap((np.arange(len(rows)),), lambda cases: difference(np.concatenate([rows[k] for k in cases])),
                      vectorized=False, n_resamples=resamples, confidence_level=level, method="percentile", rng=seed)
    low, high = drawn.confidence_interval
    return difference(np.arange(len(a))), float(low), float(high)


def unpaired_difference(first: Scores, second: Scores, metric: str = "accuracy", resamples: int = 2000,
                        level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``second`` minus ``first`` on different cases (two splits: a test split and tickets written by other people,
    say): the difference in ``metric`` (one of ``PAIRED_METRICS``; an ECE over ``first``'s bins) and its percentile
    bootstrap interval at ``level``. Each side's cases are resampled on their own, a case's decisions together
    (``scipy.stats.bootstrap``, unpaired, over case indices; no interval, NaN, when a side has one case)."""
    if metric not in PAIRED_METRICS:
        raise ValueError(f"metric is {metric!r}; expected one of {', '.join(PAIRED_METRICS)}")
    if first.decisions.empty or second.decisions.empty:
        raise ValueError("each Scores needs at least one decision")

    def side(scores: Scores):
        d = scores.decisions
        column = "correct" if metric in ("accuracy", "ece", "ece_confidence") else metric
        values = d[column].to_numpy(float)
        confidence = d["answer_confidence" if metric == "ece_confidence" else "confidence"].to_numpy(float)
        rows = case_rows(d["case"])

        def value(cases) -> float:
            picked = np.concatenate([rows[k] for k in cases])
            if metric in ("ece", "ece_confidence"):
                picked = picked[~np.isnan(confidence[picked])]
                return expected_calibration_error(confidence[picked], values[picked], first.ece_bins)
            return float(values[picked].mean())
        return value, len(rows)

    (value_a, n_a), (value_b, n_b) = side(first), side(second)
    gap = value_b(range(n_b)) - value_a(range(n_a))
    if min(n_a, n_b) < 2:
        return gap, float("nan"), float("nan")
    drawn = bootstrap((np.arange(n_a), np.arange(n_b)), lambda a, b: value_b(b) - value_a(a), paired=False,
                      vectorized=False, n_resamples=resamples, confidence_level=level, method="percentile", rng=seed)
    low, high = drawn.confidence_interval
    return gap, float(low), float(high)


def split_gap(model, first: Split, second: Split, metric: str = "accuracy", level: float = 0.95,
              resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per question and over all questions: ``model``'s ``metric`` on two splits (its test split and tickets
    written by other people, say), the gap (second minus first) and its bootstrap interval at ``level``
    (``unpaired_difference``). A gap whose interval holds 0 is not one these two sets can tell from noise."""
    if first.name == second.name:
        raise ValueError(f"both splits are named {first.name!r}; compare two different splits")
    a, b = (score(s, model.predict(s)) for s in (first, second))
    interval = (f"{level:.0%} interval, low", f"{level:.0%} interval, high")
    rows = {}
    for question in [*sorted(set(a.decisions["question"])), "all questions"]:
        pair = [s if question == "all questions" else Scores(s.decisions[s.decisions["question"] == question],
                                                             s.ece_bins) for s in (a, b)]
        gap, low, high = unpaired_difference(*pair, metric, resamples, level, seed)
        rows[question] = {first.name: pair[0].overall()[metric], second.name: pair[1].overall()[metric], "gap": gap,
                          interval[0]: low, interval[1]: high}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "question"
    return table


def wrong_answers(model, cases: Split, question: str, width: int = 90) -> pd.DataFrame:
    """The cases whose top answer to ``question`` is not the gold's most probable option, the most confident first:
    the start of each state on one line (``width`` characters), its length in characters, the gold option, the
    answer and the probability the model gave it. What a head gets wrong, to read beside what it gets right."""
    rows = []
    for case, predicted in zip(cases, model.predict(cases)):
        if question not in case.questions:
            raise ValueError(f"case {case.id} has no question {question!r}; it asks {list(case.questions)}")
        p = np.asarray(predicted[question], dtype=float)
        top = int(np.argmax(p))
        if top != case.gold[question].top:
            state = case.state if isinstance(case.state, str) else case.text
            line = " ".join(state.split())
            rows.append({"case": case.id, "text": line if len(line) <= width else line[:width - 1] + "…",
                         "characters": len(state), "gold": case.questions[question].options[case.gold[question].top],
                         "answer": case.questions[question].options[top], "probability": float(p[top])})
    columns = ["text", "characters", "gold", "answer", "probability"]
    if not rows:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="case"))
    return pd.DataFrame(rows).set_index("case")[columns].sort_values("probability", ascending=False)


def uniform_predictions(cases: Split) -> list[dict[str, np.ndarray]]:
    """Every option equally likely: the benchmark's "Uniform" reference row."""
    return [{qid: np.full(len(q.options), 1 / len(q.options)) for qid, q in c.questions.items()} for c in cases]


def gold_priors(train: Split) -> dict[tuple[str, str], np.ndarray]:
    """The mean gold distribution of each (workflow, question) on ``train``: what is known before reading a state."""
    sums: dict[tuple[str, str], np.ndarray] = {}
    counts: dict[tuple[str, str], int] = {}
    for case in train:
        for qid, gold in case.gold.items():
            key = (case.workflow, qid)
            sums[key] = sums.get(key, 0) + gold.probabilities
            counts[key] = counts.get(key, 0) + 1
    return {key: total / counts[key] for key, total in sums.items()}


def prior_predictions(train: Split, cases: Split) -> list[dict[str, np.ndarray]]:
    """The training prior of each (workflow, question) for every case: the benchmark's "prior" row."""
    priors = gold_priors(train)
    return [{qid: priors[(c.workflow, qid)] for qid in c.questions} for c in cases]


def against_majority(model, train: Split, test: Split) -> pd.DataFrame:
    """Per question: the model's test accuracy, KL and ECE beside always answering the most common training label
    (the majority baseline), and the gain over it."""
    scores = score(test, model.predict(test)).summary("question")
    majority = score(test, prior_predictions(train, test)).summary("question")
    table = pd.DataFrame({"test accuracy": scores["accuracy"], "majority baseline": majority["accuracy"],
                          "KL": scores["kl"], "ECE": scores["ece"]})
    table["gain"] = table["test accuracy"] - table["majority baseline"]
    return table
