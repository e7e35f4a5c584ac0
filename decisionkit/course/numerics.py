"""How far an answer moves with the batch it is computed in, per compute dtype: the measurement behind
``precision.ANSWER_TOLERANCE``, shared by the tests and ``benchmarks/numerics.py``.

``batch_agreement(model, requests)`` answers every request alone (``decide``) and in padded batches
(``decide_many``) under each dtype, and reports the largest gap of any probability or confidence, the largest move of
the standardized features the heads read, the choices and scores whose top option changed, and the fields beyond
the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..contract.systemone import check, disagreements
from ..core.precision import ANSWER_TOLERANCE, Precision, kernels
from ..data.cases import render_state


@dataclass
class BatchAgreement:
    """One row per compute dtype: alone against batched, on the same requests."""

    rows: list[dict]
    kernels: dict

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows).set_index("dtype")


def _gap(a: dict, b: dict) -> float:
    """The largest difference of any probability, confidence or noul between two answers to one request."""
    gaps = [0.0]
    for qid, x in a.items():
        y = b[qid]
        gaps += [abs(x[k] - y[k]) for k in ("noul", "confidence") if k in x]
        gaps += [abs(p - y["probabilities"][o]) for o, p in x.get("probabilities", {}).items()]
    return max(gaps)


def _tops(answers: dict) -> dict[str, str]:
    """The top option of every choice and score answer."""
    return {qid: max(x["probabilities"], key=x["probabilities"].get) for qid, x in answers.items()
            if "probabilities" in x}


@torch.inference_mode()
def batch_agreement(model, requests: Sequence[dict], batch_size: int = 16,
                    dtypes: Sequence[str] = ("float32", "bfloat16")) -> BatchAgreement:
    """Each request (``decide_many``'s form) answered alone and in batches of ``batch_size`` under each of ``dtypes``
    (the model's compute dtype is restored after). The features are encoded again apart from the answers, alone and
    in the same batches, to show how far the vector the heads read moved."""
    kept = model.backbone.precision
    rows = []
    try:
        for dtype in dtypes:
            model.backbone.precision = Precision(kept.device, dtype, "set by numerics.batch_agreement")
            alone = [model.decide(**r) for r in requests]
            batched = model.decide_many(requests, batch_size=batch_size)
            texts = [render_state(r["state"], check(model.schema, r.get("questions"), r.get("workflow"))[0])
                     for r in requests]
            one = torch.cat([model.encode(model.tokenize([t])) for t in texts])
            order = np.argsort([len(t) for t in texts], kind="stable")  # as decide_many forms its batches
            many = torch.empty_like(one)
            for lo in range(0, len(texts), batch_size):
                batch = order[lo:lo + batch_size]
                many[batch] = model.encode(model.tokenize([texts[i] for i in batch]))
            tolerance = ANSWER_TOLERANCE[dtype]
            rows.append({"dtype": dtype, "requests": len(requests), "batch size": batch_size,
                         "max answer gap": max(_gap(a, b) for a, b in zip(alone, batched)),
                         "max feature move (std)": float((one - many).abs().max()),
                         "top options changed": sum(_tops(a)[q] != t for a, b in zip(alone, batched)
                                                    for q, t in _tops(b).items()),
                         "tolerance": tolerance,
                         "beyond tolerance": sum(len(disagreements(b, a, tolerance)) for a, b in zip(alone, batched))})
    finally:
        model.backbone.precision = kept
    return BatchAgreement(rows, kernels())
