"""Two models on the same cases: is the new one worse than the one it would replace?

``compare(new, old, sets)`` scores both on each named set of cases (``answered.answered``: raw accuracy, the share
sent to a human, the ECE of the top probability) and the new minus the old with a 95% paired bootstrap interval over
cases (``metrics.paired_difference``; the routed share's by the same resampling). The new model is *worse* on a set
when the interval lies wholly on the wrong side of 0: accuracy lower, more cases sent to a human, or a higher ECE.
``decisionkit promote`` refuses a model worse on any set; ``comparison_table`` and ``comparison_lines`` are how a
run report shows it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..data.cases import Split
from ..data.metrics import case_interval, paired_difference
from .answered import answered

METRICS = {"accuracy": "higher", "sent to a human": "lower", "ece": "lower"}  # which way is better


def _routed_difference(cases: Split, old_human: list[str], new_human: list[str]) -> list[float]:
    ids = cases.ids
    delta = np.array([(i in new_human) - (i in old_human) for i in ids], dtype=float)
    rows = [np.array([k]) for k in range(len(ids))]
    low, high = case_interval(rows, lambda picked: float(delta[picked].mean()))
    return [float(delta.mean()), low, high]


def compare(new, old, sets: dict[str, Split]) -> dict[str, dict]:
    """``new`` and ``old`` (loaded DecisionModels) on each non-empty set of ``sets``: each model's accuracy (raw),
    share sent to a human and ECE, the difference (new - old) with its interval, and which metrics are worse."""
    found = {}
    for name, cases in sets.items():
        if not len(cases):
            continue
        a, b = answered(old, cases), answered(new, cases)
        difference = {metric: list(paired_difference(a.raw, b.raw, metric)) for metric in ("accuracy", "ece")}
        difference["sent to a human"] = _routed_difference(cases, a.human, b.human)
        worse = [m for m, (_, low, high) in difference.items()
                 if (METRICS[m] == "higher" and high < 0) or (METRICS[m] == "lower" and low > 0)]
        found[name] = {"cases": len(cases), "decisions": len(a.raw.decisions),
                       "old": _row(a), "new": _row(b), "difference": difference, "worse": worse}
    return found


def _row(found) -> dict:
    overall = found.raw.overall()
    return {"accuracy": overall["accuracy"], "sent to a human": len(found.human) / found.cases, "ece": overall["ece"]}


def worse_sets(comparison: dict[str, dict]) -> dict[str, list[str]]:
    """Set -> the metrics on which the new model is worse beyond the interval (sets where it is not are left out)."""
    return {name: row["worse"] for name, row in comparison.items() if row["worse"]}


def comparison_table(loop: dict) -> pd.DataFrame:
    """A report's ``loop`` section as a table: per set and metric, the served model, the new one, the difference
    and its interval."""
    rows = []
    for name, row in loop["comparison"].items():
        for metric in METRICS:
            d, low, high = row["difference"][metric]
            rows.append({"set": f"{name} ({row['cases']} cases)", "metric": metric, "served": row["old"][metric],
                         "new": row["new"][metric], "new - served": d, "95% interval": f"[{low:+.3f}, {high:+.3f}]",
                         "worse": metric in row["worse"]})
    return pd.DataFrame(rows).set_index(["set", "metric"]).round(4)


def comparison_lines(loop: dict) -> list[str]:
    """The card's lines for a run trained with reviews: what they added, and the served model beside this one."""
    counts = loop["reviews"]
    lines = [f"reviews    {counts['train']} reviewed cases trained on, {counts['review test']} in the review test, "
             f"{counts['audit']} audited, {counts['not a case']} not a case; served model {loop['served']['model']} "
             f"version {loop['served']['version']}"]
    for name, row in loop["comparison"].items():
        d, low, high = row["difference"]["accuracy"]
        lines.append(f"{'vs served':<10} {name}: accuracy {row['old']['accuracy']:.3f} -> {row['new']['accuracy']:.3f} "
                     f"({d:+.3f} [{low:+.3f}, {high:+.3f}]), sent to a human {row['old']['sent to a human']:.1%} -> "
                     f"{row['new']['sent to a human']:.1%}, ECE {row['old']['ece']:.3f} -> {row['new']['ece']:.3f}"
                     + (f"; worse on {', '.join(row['worse'])}" if row["worse"] else ""))
    return lines
