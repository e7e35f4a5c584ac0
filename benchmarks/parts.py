"""Beside the trees, which reading of the state's text? The trunk's mean-pooled heads against lexical heads (TF-IDF
of the rendered state) and heads on each free-text item embedded alone (field-aware pooling), alone and mixed.

    .venv/bin/python benchmarks/parts.py --out benchmarks/results --trunk sentence-transformers/all-MiniLM-L6-v2

The hybrid's heads read one mean-pooled vector of the whole rendered state. Two other readings of the same text,
each cheap on a CPU, are set beside it as parts of the hybrid (``fitting.mix_out_of_fold``: every part and the trees
re-fitted on five folds of train; the weights per question chosen on those out-of-fold answers; then all fitted on
train and scored on test):

- **pooled heads**: linear heads on the trunk's mean over tokens at the presets' layers (what the demo reads);
- **lexical heads**: linear heads on TF-IDF of the rendered state (words and digit runs, one- and two-word
  n-grams, fitted on the train texts), reduced to ``LEXICAL_DIMS`` dimensions by a truncated SVD;
- **pooled + lexical heads**: one linear head per question on both, concatenated;
- **item heads**: each free-text item of a state (an object holding a string over ``fields.MAX_CATEGORY_CHARS``
  characters, a message of a thread say, rendered with its path and sibling fields) embedded alone by the trunk
  (last layer's mean, unit length, as a sentence encoder is trained); heads read the mean, the first and the last
  of a state's items (a state with none reads its whole text as one item).

Each head's L2 and steps are picked on the dev slice, as training picks them. Rows: each part alone, with the trees,
and all together; accuracy and KL out of fold on train (at weights chosen on the same answers: slightly optimistic,
alike for every row) and on test, and each row's test difference from the demo's pair (pooled heads + trees) with a
bootstrap interval over test cases (``metrics.paired_difference``). Writes ``parts_<cpu family>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import decisionkit as dk
from decisionkit.core.precision import kernels
from decisionkit.data.cases import dev_slice
from decisionkit.data.metrics import paired_difference, score
from decisionkit.model.features import FeatureSpec, encode, extract_features
from decisionkit.model.fields import MAX_CATEGORY_CHARS
from decisionkit.model.fitting import choose_recipe, heads_answers, mix_out_of_fold
from decisionkit.model.pooling import pool

LEXICAL_DIMS = 512  # 256 scored 0.011 lower on the dev slice (MiniLM's run, 2026-12-05)
ITEM_TOKENS = 256  # a thread's message or an alert's description fits


def lexical(train: dk.Split, cases: dk.Split) -> dict[str, np.ndarray]:
    """Case id -> the TF-IDF vector of its rendered state, fitted on ``train``'s texts, SVD-reduced."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, token_pattern=r"[A-Za-z_]+|\d+")
    fitted = vectorizer.fit_transform(train.texts)
    svd = TruncatedSVD(LEXICAL_DIMS, random_state=0).fit(fitted)
    return dict(zip(cases.ids, svd.transform(vectorizer.transform(cases.texts)).astype(np.float32)))


def free_text_items(value: Any, path: str = "") -> list[str]:
    """The objects of a state that hold free text, each rendered with its path and its plain sibling fields."""
    out: list[str] = []
    if isinstance(value, dict):
        if any(isinstance(v, str) and len(v) > MAX_CATEGORY_CHARS for v in value.values()):
            plain = "; ".join(f"{k}: {v}" for k, v in value.items() if not isinstance(v, (dict, list)))
            out.append(f"{path}: {plain}")
        for key, item in value.items():
            out += free_text_items(item, f"{path}.{key}" if path else str(key)) if isinstance(item, (dict, list)) else []
    elif isinstance(value, list):
        for item in value:
            out += ([f"{path}: {item}"] if isinstance(item, str) and len(item) > MAX_CATEGORY_CHARS
                    else free_text_items(item, f"{path}[]"))
    return out


def item_features(backbone, cases: dk.Split, batch_size: int = 32) -> dict[str, np.ndarray]:
    """Case id -> the mean, first and last of its free-text items' embeddings (the trunk's last layer, mean over
    tokens, unit length)."""
    items = [free_text_items(c.state) or [c.text] for c in cases]
    flat = [text for texts in items for text in texts]
    embedded = np.zeros((len(flat), backbone.hidden_size), np.float32)
    order = np.argsort([len(text) for text in flat], kind="stable")
    for lo in range(0, len(flat), batch_size):
        rows = order[lo:lo + batch_size]
        encoded = encode(backbone, [flat[i] for i in rows], max_length=ITEM_TOKENS)
        embedded[rows] = pool(encoded.hidden[-1], encoded.attention_mask, "mean").numpy()
    embedded /= np.linalg.norm(embedded, axis=1, keepdims=True)
    out, start = {}, 0
    for case, texts in zip(cases, items):
        own = embedded[start:start + len(texts)]
        start += len(texts)
        out[case.id] = np.concatenate([own.mean(0), own[0], own[-1]])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trunk", default="sentence-transformers/all-MiniLM-L6-v2", help="hub id or local folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", default=None, help="typed-decisions folder (default: $DECISIONKIT_DATA)")
    args = parser.parse_args(argv)
    train, test = dk.load_typed_decisions("train", args.data), dk.load_typed_decisions("test", args.data)
    fit, dev = dev_slice(train)
    everything = dk.Split("train and test", list(train) + list(test), train.source)
    backbone = dk.load_backbone(args.trunk)
    spec = FeatureSpec().resolved(backbone.num_layers)
    seconds = {}
    started = time.perf_counter()
    features = extract_features(backbone, everything, layers=spec.layers, max_length=spec.max_length, progress=False)
    pooled = dict(zip(everything.ids, np.hstack([features.get("mean", layer) for layer in spec.layers])))
    seconds["pooled features (cached after the first run)"] = time.perf_counter() - started
    started = time.perf_counter()
    words = lexical(train, everything)
    seconds["lexical features"] = time.perf_counter() - started
    started = time.perf_counter()
    items = item_features(backbone, everything)
    seconds["item features"] = time.perf_counter() - started
    readings = {"pooled heads": pooled, "lexical heads": words,
                "pooled + lexical heads": {i: np.concatenate([pooled[i], words[i]]) for i in everything.ids},
                "item heads": items}
    recipes = {name: choose_recipe(vectors, fit, dev) for name, vectors in readings.items()}
    mix = mix_out_of_fold({name: heads_answers(readings[name], recipe) for name, recipe in recipes.items()},
                          train, test)
    seconds["five folds and the final fits of every part and the trees"] = mix.seconds
    on_test, held = mix.on_scored(), mix.out_of_fold(train)
    for rows in (on_test, held):
        rows["all parts + trees"] = rows.pop("together")
    base = score(test, on_test["pooled heads + trees"])
    rows = []
    for name, answers in on_test.items():
        found, inside = score(test, answers), score(train, held[name]).overall()
        row = {"part": name, "out-of-fold accuracy": inside["accuracy"], "out-of-fold kl": inside["kl"],
               **{f"test {m}": float(found.overall()[m]) for m in ("accuracy", "kl", "brier")}}
        for metric in ("accuracy", "kl"):
            d, lo, hi = paired_difference(base, found, metric)
            row[f"test {metric} - pooled heads + trees"] = {"difference": d, "interval": [lo, hi]}
        rows.append(row)
        print(f"{name:28s} out of fold {row['out-of-fold accuracy']:.4f} / {row['out-of-fold kl']:.4f}   "
              f"test {row['test accuracy']:.4f} / {row['test kl']:.4f}", file=sys.stderr, flush=True)
    result = {"cpu": kernels(), "trunk": Path(backbone.name).name, "compute dtype": backbone.precision.dtype,
              "cases": {"train": len(train), "dev slice (recipes)": len(dev), "test": len(test)},
              "recipes": {name: vars(recipe) for name, recipe in recipes.items()}, "seconds": seconds, "rows": rows,
              "weights": {name: {w: {q: list(map(float, v)) for q, v in per.items()} for w, per in weights.items()}
                          for name, weights in mix.weights.items()}}
    path = Path(args.out) / f"parts_{kernels()['cpu_family']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
