"""The hybrid's third reading of a state: as words (the ten-line baseline a user would write, inside the model).

A TF-IDF of the state's words and a linear model per (workflow, question) is what a user would fit on their own
export in ten lines of scikit-learn, and on text states it is often the stronger model: it weighs a rare word
("chargeback", "refund") as the pooled vector of a small encoder cannot. ``Lexical`` is that model, fitted on the
soft gold and kept as arrays, so it saves into the model's safetensors and JSON like the heads and the trees and
answers without scikit-learn's pickles:

- ``Vocabulary``: word 1-2-grams of the rendered state (``cases.render_state``: keys, numbers and text; letters and
  digit runs apart), and character 3-5-grams (within words) of its text: a text state's whole text, a JSON state's
  string fields. Each kept as its terms and idf (fitted by scikit-learn's ``TfidfVectorizer``); a row is their two
  sublinear, L2-normalised TF-IDF vectors side by side, the terms split by the vectorizer's own analyzer.
- ``Linear``: scikit-learn's multinomial ``LogisticRegression`` fitted on the soft gold (each case once per option
  it gives weight, weighted by it, as ``trees.Trees`` are), kept as a weight row and an intercept per option.

The vocabulary is fitted on every training case once; the folds that choose the hybrid's weights refit the linear
models on their own cases over that vocabulary (its idf has seen the held-out fold's words, not their answers).
``C`` (10) and the n-gram ranges were measured on typed-decisions and the three scenarios (words and characters at
C 10 were best on all four; benchmarks/results/choices.md#lexical).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from ..data.cases import Split, render_state
from .fields import leaves

WORDS = dict(ngram_range=(1, 2), min_df=2, sublinear_tf=True, token_pattern=r"[A-Za-z_]+|\d+")
CHARS = dict(analyzer="char_wb", ngram_range=(3, 5), min_df=2, sublinear_tf=True, max_features=20000)
LEXICAL_C = 10.0  # inverse L2 strength of every linear model
TOLERANCE = 1e-3  # L-BFGS stopping tolerance: 1e-4 doubled the time for +0.001 accuracy on typed-decisions


def state_texts(state: Any, workflow: str) -> tuple[str, str]:
    """(the rendered state, its text): the words read from the first, the characters from the second (a text
    state's text; a JSON state's string fields, one a line)."""
    if isinstance(state, (dict, list)):
        text = "\n".join(v for _, v in leaves(state) if isinstance(v, str))
    else:
        text = str(state)
    return render_state(state, workflow), text


def _vectorizer(settings: dict):
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(**settings, dtype=np.float32)


def _terms(vectorizer) -> list[str]:
    return [str(t) for t in vectorizer.get_feature_names_out()]


@dataclass
class Vocabulary:
    """The terms and idf of the words and of the characters (``WORDS``, ``CHARS``), fitted on training states."""

    words: list[str]
    word_idf: np.ndarray
    chars: list[str]
    char_idf: np.ndarray

    def __post_init__(self):
        # scikit-learn's analyzers split a text into terms; the counts, the sublinear TF-IDF and the L2 norm are
        # computed here, as TfidfVectorizer.transform computes them (the same to 1e-7; test_lexical), at a third of
        # its per-call cost on one state
        self._kinds = [(_vectorizer(WORDS).build_analyzer(), {t: i for i, t in enumerate(self.words)},
                        np.asarray(self.word_idf, np.float64), 0),
                       (_vectorizer(CHARS).build_analyzer(), {t: i for i, t in enumerate(self.chars)},
                        np.asarray(self.char_idf, np.float64), len(self.words))]

    @classmethod
    def fit(cls, texts: Sequence[tuple[str, str]]) -> "Vocabulary | None":
        """From (rendered, text) pairs (``state_texts``); None when either kind has no term seen twice (a handful
        of short states)."""
        found = []
        for settings, column in ((WORDS, 0), (CHARS, 1)):
            vectorizer = _vectorizer(settings)
            try:
                vectorizer.fit([t[column] for t in texts])
            except ValueError:  # scikit-learn: "empty vocabulary" / "max_df corresponds to < documents than min_df"
                return None
            found += [_terms(vectorizer), vectorizer.idf_.astype(np.float32)]
        return cls(*found)

    @property
    def size(self) -> int:
        return len(self.words) + len(self.chars)

    def matrix(self, texts: Sequence[tuple[str, str]]) -> sp.csr_matrix:
        """One row per (rendered, text) pair: the words' TF-IDF, then the characters'."""
        data, columns, pointers = [], [], [0]
        for pair in texts:
            for (analyzer, index, idf, offset), text in zip(self._kinds, pair):
                counts: dict[int, int] = {}
                for term in analyzer(text):
                    column = index.get(term)
                    if column is not None:
                        counts[column] = counts.get(column, 0) + 1
                found = np.fromiter(counts, np.int64, len(counts))
                values = (1 + np.log(np.fromiter(counts.values(), np.float64, len(counts)))) * idf[found]
                norm = np.sqrt((values ** 2).sum())
                data.append(values / norm if norm else values)
                columns.append(found + offset)
            pointers.append(pointers[-1] + len(columns[-1]) + len(columns[-2]))
        return sp.csr_matrix((np.concatenate(data).astype(np.float32), np.concatenate(columns), pointers),
                             shape=(len(texts), self.size))

    def to_json(self) -> dict:
        return {"words": self.words, "chars": self.chars, "words_settings": WORDS, "chars_settings": CHARS}

    def tensors(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.word_idf": self.word_idf, f"{prefix}.char_idf": self.char_idf}

    @classmethod
    def from_saved(cls, config: dict, arrays: dict[str, np.ndarray], prefix: str) -> "Vocabulary":
        return cls(list(config["words"]), arrays[f"{prefix}.word_idf"], list(config["chars"]),
                   arrays[f"{prefix}.char_idf"])


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@dataclass
class Linear:
    """A fitted linear model of one question: ``weight`` (options x terms) and ``intercept`` (options); softmax over
    the options. Options the gold never weighs keep an intercept of -30 (probability ~0, as for the trees)."""

    weight: np.ndarray
    intercept: np.ndarray

    @classmethod
    def fit(cls, x: sp.csr_matrix, gold: np.ndarray, c: float = LEXICAL_C) -> "Linear":
        from sklearn.linear_model import LogisticRegression

        options = gold.shape[1]
        rows, labels = np.nonzero(gold > 0)
        weight = np.zeros((options, x.shape[1]), np.float32)
        intercept = np.full(options, -30.0, np.float32)
        classes = np.unique(labels)
        if len(classes) < 2:  # one option ever weighed: the training prior
            intercept = np.log(np.maximum(gold.mean(axis=0), 1e-13)).astype(np.float32)
            return cls(weight, intercept)
        model = LogisticRegression(C=c, max_iter=1000, tol=TOLERANCE)
        model.fit(x[rows], labels, sample_weight=gold[rows, labels])
        if len(classes) == 2:  # one logit for classes[1] against classes[0]: softmax([0, z]) is its sigmoid
            weight[classes[1]], intercept[classes] = model.coef_[0], (0.0, model.intercept_[0])
        else:
            weight[classes], intercept[classes] = model.coef_, model.intercept_
        return cls(weight, intercept)

    def probabilities(self, x: sp.csr_matrix) -> np.ndarray:
        return _softmax(np.asarray(x @ self.weight.T, dtype=np.float64) + self.intercept)


@dataclass
class Lexical:
    """The vocabulary and a ``Linear`` model per (workflow, question)."""

    vocabulary: Vocabulary
    models: dict[str, dict[str, Linear]]
    c: float = LEXICAL_C

    @classmethod
    def fit(cls, cases: Split, vocabulary: Vocabulary | None = None, c: float = LEXICAL_C) -> "Lexical | None":
        """Fitted on ``cases`` against their soft gold; the vocabulary too unless given. None when the cases have
        too few words for one (``Vocabulary.fit``)."""
        texts = [state_texts(case.state, case.workflow) for case in cases]
        vocabulary = vocabulary or Vocabulary.fit(texts)
        if vocabulary is None:
            return None
        x = vocabulary.matrix(texts)
        models = {}
        for workflow in dict.fromkeys(cases.case_workflows):
            mine = [i for i, case in enumerate(cases) if case.workflow == workflow]
            models[workflow] = {qid: Linear.fit(x[mine], np.stack([cases[i].gold[qid].probabilities for i in mine]),
                                                c)
                                for qid in cases[mine[0]].questions}
        return cls(vocabulary, models, c)

    def refit(self, cases: Split) -> "Lexical":
        """The linear models fitted again on ``cases`` over this vocabulary (a fold of the training cases)."""
        return Lexical.fit(cases, self.vocabulary, self.c)

    def probabilities(self, states: Sequence[Any], workflow: str, questions: Sequence[str]) -> dict[str, np.ndarray]:
        """question -> (states, options) for ``states`` of ``workflow``: one TF-IDF matrix, one sparse product for
        every question's weights at once."""
        x = self.vocabulary.matrix([state_texts(s, workflow) for s in states])
        models = [self.models[workflow][qid] for qid in questions]
        logits = np.asarray(x @ np.concatenate([m.weight for m in models]).T, dtype=np.float64)
        out, start = {}, 0
        for qid, model in zip(questions, models):
            out[qid] = _softmax(logits[:, start:start + len(model.intercept)] + model.intercept)
            start += len(model.intercept)
        return out

    def tensors(self, prefix: str) -> dict[str, np.ndarray]:
        out = self.vocabulary.tensors(prefix)
        for workflow, per_question in self.models.items():
            for qid, model in per_question.items():
                out[f"{prefix}.{workflow}/{qid}.weight"] = np.ascontiguousarray(model.weight)
                out[f"{prefix}.{workflow}/{qid}.intercept"] = model.intercept
        return out

    def config(self) -> dict:
        return {"vocabulary": self.vocabulary.to_json(), "c": self.c,
                "questions": {w: list(qs) for w, qs in self.models.items()}}

    @classmethod
    def from_saved(cls, config: dict, arrays: dict[str, np.ndarray], prefix: str) -> "Lexical":
        models = {w: {q: Linear(arrays[f"{prefix}.{w}/{q}.weight"], arrays[f"{prefix}.{w}/{q}.intercept"])
                      for q in qs} for w, qs in config["questions"].items()}
        return cls(Vocabulary.from_saved(config["vocabulary"], arrays, prefix), models, config["c"])
