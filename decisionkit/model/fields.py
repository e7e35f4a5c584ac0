"""The state's own fields, read a second way: flattened into numbers (trees answer from them, ``trees.py``).

A typed-decisions state is JSON: numbers, flags, short categories and some free text. Mean-pooled hidden states
blur exactly the numbers and flags that decide an incident or a trace, and a linear head cannot compare two of
them; trees on the fields can, while the language model reads the free text that trees cannot. The hybrid
decision model (``decision_model.DecisionModel`` with a ``structured.StructuredPart``) averages the two in
probability space.

- ``Fields.fit(states)`` learns, per workflow on train, which columns a state has: every number and flag (by
  path; ``a.b`` in objects, ``a[].b`` inside arrays, summed over the items), each array's length, each short
  category seen ``MIN_COUNT`` times or more (one 0/1 column per value, counted inside arrays), the length of
  longer text, and for two numbers that share a name in different objects (an invoice's and an order's
  ``total_usd``) their difference and ratio. ``Fields.encode(states)`` gives the matrix: a missing field, a field
  of another type, an unseen category or a state that is a plain string gives NaN or 0, never an error.
- ``Fields.surprise(states)``: the share of a state's field checks that fail against train: a path the workflow's
  states never had, a path nearly all of them had that is missing, a category value never kept, a number (or a
  difference, ratio or text length) outside the training range. A blanked state, a contradictory one or another
  workflow's state fails many; the router lowers the heads' weight on it (``routing.Router``), which pooled
  features alone cannot do for a state that reads like the real thing.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

MIN_COUNT = 3  # a category value becomes a column once it occurs in this many train states of the workflow
MAX_CATEGORY_CHARS = 40  # longer strings are free text: the language model reads them, the fields keep the length
MAX_CATEGORIES = 30  # most frequent values kept per categorical path
EXPECTED = 0.9  # a path in this share of a workflow's train states or more is expected: its absence is a surprise


def _leaves(value: Any, path: str, out: list[tuple[str, Any]]) -> None:
    """(path, leaf) pairs of a JSON value; items of an array share the path ``name[]``; ``path#len`` is an
    array's length."""
    if isinstance(value, dict):
        for key, item in value.items():
            _leaves(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list):
        out.append((f"{path}#len", len(value)))
        for item in value:
            _leaves(item, f"{path}[]", out)
    else:
        out.append((path, value))


def leaves(state: Any) -> list[tuple[str, Any]]:
    """Every leaf of a state (a string state, or anything not JSON-like, has none)."""
    out: list[tuple[str, Any]] = []
    if isinstance(state, (dict, list)):
        _leaves(state, "", out)
    return out


def _number(value: Any) -> float | None:
    """A JSON number or boolean as a float; anything else None (a string is not read as a number)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _name(path: str) -> str:
    return path.rsplit(".", 1)[-1].removesuffix("[]")


@dataclass
class Fields:
    """The columns of one workflow's states, learned on train: ``numbers`` (paths read as numbers; within arrays,
    summed), ``categories`` (path -> values with a 0/1 column each, counted within arrays), ``texts`` (paths whose
    string length is a column) and ``pairs`` (two number paths compared by difference and ratio); for
    ``surprise``, ``presence`` (path -> share of train states that have it) and each column's train range
    (``low``, ``high``; None where train never had a value)."""

    numbers: list[str]
    categories: dict[str, list[str]]
    texts: list[str]
    pairs: list[tuple[str, str]]
    presence: dict[str, float] = field(default_factory=dict)
    low: list[float | None] = field(default_factory=list)
    high: list[float | None] = field(default_factory=list)

    @classmethod
    def fit(cls, states: Sequence[Any]) -> "Fields":
        numeric, strings, values, seen = Counter(), Counter(), {}, Counter()
        for state in states:
            for path in {path for path, _ in leaves(state)}:
                seen[path] += 1
            for path, value in leaves(state):
                if _number(value) is not None:
                    numeric[path] += 1
                elif isinstance(value, str):
                    strings[path] += 1
                    values.setdefault(path, Counter())[value] += 1
        numbers = sorted(numeric)
        categories, texts = {}, []
        for path in sorted(strings):
            if any(len(v) > MAX_CATEGORY_CHARS for v in values[path]):
                texts.append(path)
                continue
            kept = [v for v, n in values[path].most_common(MAX_CATEGORIES) if n >= MIN_COUNT]
            if kept and len(kept) < len(states):  # an id-like field (a value per state) tells nothing
                categories[path] = sorted(kept)
        scalar = [p for p in numbers if not p.endswith("#len")]
        pairs = [(a, b) for i, a in enumerate(scalar) for b in scalar[i + 1:]
                 if _name(a) == _name(b) and a.split(".")[0] != b.split(".")[0]]
        fields = cls(numbers, categories, texts, pairs, {p: n / len(states) for p, n in sorted(seen.items())})
        x = fields.encode(states)
        known = ~np.isnan(x)
        low, high = np.where(known, x, np.inf).min(axis=0), np.where(known, x, -np.inf).max(axis=0)
        fields.low = [float(v) if np.isfinite(v) else None for v in low]
        fields.high = [float(v) if np.isfinite(v) else None for v in high]
        return fields

    @property
    def columns(self) -> list[str]:
        """The name of every column ``encode`` gives, in order."""
        return (self.numbers + [f"{p}={v}" for p, vs in self.categories.items() for v in vs]
                + [f"{p}#chars" for p in self.texts]
                + [f"{a}-{b}" for a, b in self.pairs] + [f"{a}/{b}" for a, b in self.pairs])

    def encode(self, states: Sequence[Any]) -> np.ndarray:
        """One row per state, one column per ``columns``: NaN where a number is missing or not a number, 0 for a
        category value the state does not have."""
        numbers = {p: i for i, p in enumerate(self.numbers)}
        offset = len(self.numbers)
        category = {}
        for path, vs in self.categories.items():
            for v in vs:
                category[(path, v)] = offset
                offset += 1
        texts = {p: offset + i for i, p in enumerate(self.texts)}
        pairs = offset + len(self.texts)
        x = np.full((len(states), len(self.columns)), np.nan)
        for row, state in enumerate(states):
            found = leaves(state)
            if found:  # a structured state: its categories start at 0 (absent), not unknown
                x[row, len(self.numbers):pairs - len(self.texts)] = 0.0
            for path, value in found:
                number = _number(value)
                if number is not None and path in numbers:
                    column = numbers[path]
                    x[row, column] = number if np.isnan(x[row, column]) or "[]" not in path else x[row, column] + number
                elif isinstance(value, str):
                    if (path, value) in category:
                        x[row, category[(path, value)]] += 1
                    elif path in texts:
                        x[row, texts[path]] = len(value)
            for i, (a, b) in enumerate(self.pairs):
                va, vb = x[row, numbers[a]], x[row, numbers[b]]
                x[row, pairs + i] = va - vb
                x[row, pairs + len(self.pairs) + i] = va / vb if vb else np.nan
        return x

    def surprise(self, states: Sequence[Any], x: np.ndarray | None = None) -> np.ndarray:
        """Per state, the share of its field checks that fail (0: every field as in train; 1: nothing is, as for a
        plain string or another workflow's state). Checks: each path of the state (known to the workflow?), each
        expected path (present?), each category value (kept?), each number column (inside the train range?).
        A model saved before these were learned (no ``presence``) finds no surprise."""
        if not self.presence:
            return np.zeros(len(states))
        x = self.encode(states) if x is None else x  # ``x``: their ``encode``, when the caller has it already
        first_category = len(self.numbers)
        after_categories = first_category + sum(len(v) for v in self.categories.values())
        numeric = [c for c in range(x.shape[1]) if not first_category <= c < after_categories
                   and self.low[c] is not None]
        low = np.array([self.low[c] for c in numeric])
        high = np.array([self.high[c] for c in numeric])
        expected = {p for p, share in self.presence.items() if share >= EXPECTED}
        out = np.zeros(len(states))
        for row, state in enumerate(states):
            found = leaves(state)
            paths = {p for p, _ in found}
            categorical = [(p, value) for p, value in found if p in self.categories and isinstance(value, str)]
            checks = len(paths | expected) + len(categorical)
            failed = len(paths - self.presence.keys()) + len(expected - paths)
            failed += sum(value not in self.categories[p] for p, value in categorical)
            values = x[row, numeric]
            known = ~np.isnan(values)
            checks += int(known.sum())
            failed += int(((values[known] < low[known]) | (values[known] > high[known])).sum())
            out[row] = failed / checks if checks else 1.0
        return out

    def to_json(self) -> dict:
        return {"numbers": self.numbers, "categories": self.categories, "texts": self.texts,
                "pairs": [list(p) for p in self.pairs], "presence": self.presence, "low": self.low,
                "high": self.high}

    @classmethod
    def from_json(cls, obj: dict) -> "Fields":
        return cls(list(obj["numbers"]), {k: list(v) for k, v in obj["categories"].items()}, list(obj["texts"]),
                   [tuple(p) for p in obj["pairs"]], dict(obj["presence"]), list(obj["low"]), list(obj["high"]))
