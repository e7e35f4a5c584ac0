"""Decoding under bfloat16 autocast with the frozen weights cast at every call or once per request, against float32.

    .venv/bin/python benchmarks/decode_cast.py --model notebooks/runs/notebook-03-cpu-best \
        --out benchmarks/results/decode_cast_avx512_bf16.json

Autocast casts a weight that needs no gradient again at every call: a decoding loop pays a cast of every weight per
generated token. ``generate_json`` casts them once per request (``Precision.frozen_weights_cast``). On the saved
model's backbone, the same test cases are decoded greedily (free JSON) and decided in three settings, taking turns
round by round so that a drift in the machine's speed falls on each alike: float32; bfloat16 with the weights cast
at every call (autocast alone); bfloat16 with them cast once per request. It writes the median time to the first
token, per later token and per ``decide`` call of each, whether the replies are the same text, and the CPU's
kernels. ``decide`` follows the same setting: in the last, it reads the copies kept since the first call (it casts
nothing); ``decide_latency.py`` times it apart.
"""

import argparse
import json
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import numpy as np

import decisionkit as dk
from decisionkit.core.atomic import write_text
from decisionkit.core.precision import Precision
from decisionkit.course.generative import generate_json
from decisionkit.course.latency import hardware, time_calls

SETTINGS = {"float32": ("float32", True), "bfloat16, cast at every call": ("bfloat16", False),
            "bfloat16, cast once per request": ("bfloat16", True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a saved decision model folder")
    parser.add_argument("--cases", type=int, default=4, help="test cases (the first of each workflow, in turn)")
    parser.add_argument("--tokens", type=int, default=48, help="free JSON budget per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    model = dk.load(args.model)
    backbone, chosen = model.backbone, model.backbone.precision
    cases = list(dk.load_typed_decisions("test").head(max(1, args.cases // 4)))[:args.cases]
    rows = {name: {"first_token_ms": [], "ms_per_token": [], "decide_ms": [], "texts": []} for name in SETTINGS}
    for _ in range(args.rounds):
        for name, (dtype, cast_once) in SETTINGS.items():
            backbone.precision = Precision(chosen.device, dtype, "set by decode_cast.py")
            patch = nullcontext() if cast_once else mock.patch.object(
                Precision, "frozen_weights_cast", lambda self, module: nullcontext())
            with patch:
                generate_json(backbone, cases[0], 4)  # warm-up
                for case in cases:
                    g = generate_json(backbone, case, args.tokens)
                    rows[name]["first_token_ms"].append(g.first_token_ms)
                    rows[name]["ms_per_token"].append((g.latency_ms - g.first_token_ms) / max(1, g.output_tokens - 1))
                    rows[name]["texts"].append(g.text)
            timing = time_calls("decide", lambda c: model.decide(c.state, workflow=c.workflow), cases)
            rows[name]["decide_ms"].extend(timing.samples_ms.tolist())
    backbone.precision = chosen
    reference = rows["bfloat16, cast at every call"]["texts"]
    result = {name: {"first token ms (median)": float(np.median(r["first_token_ms"])),
                     "ms per later token (median)": float(np.median(r["ms_per_token"])),
                     "decide ms (median)": float(np.median(r["decide_ms"])), "requests": len(r["texts"]),
                     "same replies as autocast alone": r["texts"] == reference} for name, r in rows.items()}
    for name, r in result.items():
        print(f"{name:34s} " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    write_text(Path(args.out), json.dumps({"model": Path(args.model).name, "backbone": backbone.resolved.name,
                                           "tokens": args.tokens, "rounds": args.rounds, "hardware": hardware(),
                                           "chosen dtype": chosen.describe(), "settings": result}, indent=2))


if __name__ == "__main__":
    main()
