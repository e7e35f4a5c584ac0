"""Your own data at a user's scale: batch prediction against one ``decide`` a row, reading and splitting a log of
100,000 rows, and (``--train-shapes``) the training command on the expenses export in each of its shapes.

    .venv/bin/python benchmarks/own_data.py --run runs/expenses --out benchmarks/results/own_data_avx2.json
    .venv/bin/python benchmarks/own_data.py --run runs/expenses --train-shapes --out runs/own-data.json

1. **predict**: the expenses model (``--run``: a run trained on the scenario's ``claims.csv``; trained with the main
   job's preset into that folder when it is missing) answers the export's rows without their labels, as
   ``decisionkit.predict`` (batched: padded batches of similar length, ``decide_checked``) and as one ``route`` call a
   row, the order of the two taking turns over ``--rounds`` rounds; rows per second each and their ratio, beside the
   arithmetic floor of the encoder's forward passes over these rows (``speed.forward_flops`` at the float32 matmul
   rate ``speed.matmul_rate`` this CPU reaches): when a call a row already runs at that floor, batching has nothing
   left to win.
2. **read and split**: the expenses generator scaled to ``--rows`` claims (``scripts/make_expense_claims.py``), read by
   ``load_decisions`` with the scenario's schema in a fresh process: seconds, and its peak resident memory
   (``VmHWM``) beside the same process's peak before reading.
3. **each shape** (``--train-shapes``): the scenario written in every shape of ``data.exports.SHAPES`` and trained by
   ``decisionkit train`` from each, one process each: wall seconds and test accuracy (the features of a shape whose
   rendered states another shape rendered the same are read from the cache).

The JSON keeps the CPU (``latency.hardware``), the compute dtype with the CPU's kernels, and the load average.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # the JSON is the record; no bars on stderr
import decisionkit as dk  # noqa: E402
from decisionkit.core.atomic import write_text
from decisionkit.course.latency import hardware
from decisionkit.course.speed import forward_flops, matmul_rate
from decisionkit.data.exports import write_shapes
from decisionkit.data.scenarios import DATA_DIR

ROOT = Path(__file__).resolve().parents[1]
EXPENSES = DATA_DIR / "expenses"
# VmHWM, this process's own peak (ru_maxrss keeps the parent's peak across fork and exec on Linux)
READ = """
import json, sys, time
def peak_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
from decisionkit.data.decisions import load_decisions
imported = peak_kib()
started = time.perf_counter()
data = load_decisions(sys.argv[1], sys.argv[2])
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_rss_kib": peak_kib(), "rss_after_import_kib": imported,
                  "rows": {s: len(data[s]) for s in ("train", "validation", "test")}, "summary": data.summary()}))
"""


def predict_rates(run: Path, rounds: int, sample: int) -> dict:
    """Rows per second of ``predict`` (every row, batched) and of one ``route`` call a row (a sample of rows)."""
    model = dk.load(run)
    rows = dk.load_decisions(EXPENSES / "claims.csv", EXPENSES / "schema.json", labelled=False, carve=False,
                             workflow=next(iter(model.schema))).rows
    unlabelled = [{"id": c.id, "state": c.state} for c in rows]
    every = np.random.default_rng(0).permutation(len(rows))[:sample]
    batched, single = [], []
    dk.predict(model, unlabelled[:32], progress=False)  # warm-up: the first calls set up the kernels
    for round_ in range(rounds):
        for kind in (("batched", "single") if round_ % 2 == 0 else ("single", "batched")):
            started = time.perf_counter()
            if kind == "batched":
                frame = dk.predict(model, unlabelled, progress=False)
                batched.append(len(frame) / (time.perf_counter() - started))
            else:
                for i in every:
                    model.route(rows[int(i)].state)
                single.append(len(every) / (time.perf_counter() - started))
    windows = model.windows_of([c.text for c in rows])
    tokens = [sum(len(w) for w in found[:model.spec.max_windows]) for found in windows]
    flops = sum(forward_flops(model.backbone, t) for t in tokens)
    rate = matmul_rate("float32")
    return {"run": str(run), "rows": len(rows), "route calls timed a round": len(every), "rounds": rounds,
            "batch size": 16, "tokens per row (mean)": float(np.mean(tokens)),
            "predict rows/s": float(np.median(batched)), "route rows/s (one call a row)": float(np.median(single)),
            "predict / route": float(np.median(batched) / np.median(single)),
            "every round (predict, route)": [list(map(float, batched)), list(map(float, single))],
            "float32 matmul GFLOP/s": rate,
            "floor rows/s (forward passes at that rate)": len(rows) / (flops / (rate * 1e9)),
            "compute dtype": model.backbone.precision.describe()}


def read_split(rows: int, folder: Path) -> dict:
    """Write ``rows`` claims and read them in a fresh process: time and memory."""
    path = folder / f"claims-{rows}.csv"
    started = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_expense_claims.py"), "--claims", str(rows), "--out",
                    str(path)], check=True, capture_output=True)
    written = time.perf_counter() - started
    done = subprocess.run([sys.executable, "-c", READ, str(path), str(EXPENSES / "schema.json")], check=True,
                          capture_output=True, text=True)
    read = json.loads(done.stdout.strip().splitlines()[-1])
    return {"rows": rows, "file MB": path.stat().st_size / 1e6, "seconds to write it": written,
            "seconds to read and split": read["seconds"], "peak memory GB (whole process)": read["peak_rss_kib"] / 2**20,
            "memory GB after imports, before reading": read["rss_after_import_kib"] / 2**20,
            "splits": read["rows"], "summary": read["summary"]}


def train_shapes(folder: Path, out: Path) -> dict:
    """``decisionkit train`` on the scenario in each shape: the command, its wall time and test accuracy."""
    results = {}
    for shape, path in {"the scenario's own CSV (JSON cells)": EXPENSES / "claims.csv",
                        **write_shapes("expenses", folder)}.items():
        target = out / f"shape-{shape.split()[0].replace('.', '-')}"
        command = [str(Path(sys.executable).with_name("decisionkit")), "train", "--data", str(path), "--schema",
                   str(EXPENSES / "schema.json"), "--out", str(target), "--quiet"]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, text=True)
        report = json.loads((target / "report.json").read_text(encoding="utf-8"))
        results[shape] = {"command": " ".join(["decisionkit", *command[1:]]), "wall seconds": time.perf_counter() - started,
                          "test accuracy": report["test"]["accuracy"], "rows sha256": report["data"]["rows sha256"],
                          "feature extraction (s)": report["training"]["feature extraction (s)"]}
        print(f"{shape}: {results[shape]['wall seconds']:.0f} s, test {results[shape]['test accuracy']:.3f}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/expenses"), help="a model trained on the expenses CSV")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", type=int, default=100, help="rows timed one route call a row, each round")
    parser.add_argument("--rows", type=int, default=100_000, help="the scaled export read and split")
    parser.add_argument("--train-shapes", action="store_true", help="also train from the export in every shape")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    if not (args.run / "decisionkit.json").is_file():
        print(f"training {args.run} on the expenses export (the main job's preset)")
        dk.train(EXPENSES / "claims.csv", args.run, schema=EXPENSES / "schema.json", progress=False)
    load_before = os.getloadavg()[0]
    result = {"hardware": hardware(), "predict": predict_rates(args.run, args.rounds, args.sample)}
    p = result["predict"]
    print(f"predict {p['predict rows/s']:.1f} rows/s, one route call a row {p['route rows/s (one call a row)']:.1f} "
          f"rows/s ({p['predict / route']:.2f}x); floor {p['floor rows/s (forward passes at that rate)']:.1f} rows/s")
    with tempfile.TemporaryDirectory() as scratch:
        result["read and split"] = read_split(args.rows, Path(scratch))
        r = result["read and split"]
        print(f"{r['rows']:,} rows ({r['file MB']:.0f} MB): read and split in {r['seconds to read and split']:.1f} s, "
              f"peak {r['peak memory GB (whole process)']:.2f} GB")
        if args.train_shapes:
            result["train from each shape"] = train_shapes(Path(scratch), args.run.parent)
    result["load average (1 min) before and after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    result["max rss of this process (GB)"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    write_text(Path(args.out), json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
