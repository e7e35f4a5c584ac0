"""Load test of the System One server on loopback, batching on and off, and a batch-size sweep; writes JSON.

    .venv/bin/python benchmarks/load_serve.py --model runs/quick --out runs/load-serve
    .venv/bin/python benchmarks/load_serve.py --model runs/quick --out runs/load-serve-ray --ray   # needs .[ray]

1. ``decide_many`` timed by batch size on the same test requests: what batching can gain on this device.
2. ``decisionkit serve`` launched with ``--max-batch-size 16`` and ``1``, each load-tested at 1, 4, 16 and 64
   concurrent clients (a fixed number of requests per level, bounded in time): requests/s, p50/p95/p99, lost.
   With ``--ray``, the Ray Serve deployment (``serving/ray_app.py``) on a local Ray instance, batched, instead.
Every row records the load average: the machine may be shared, and other work slows the model as much.
The requests are test cases short enough for the model (a longer state is refused with 422, not answered).

``--log-compare`` measures the decision log's cost instead (neither of the above runs):

    .venv/bin/python benchmarks/load_serve.py --model runs/quick --out benchmarks/results --log-compare

the same load (``--log-clients`` clients, 16 by default, ``--log-requests`` requests in at most ``--log-seconds``)
on the same model, batched at 16, with the log off and on (``serve --log``, a SQLite file in a temporary folder),
the settings taking turns, off, on, off, on (``--log-rounds`` rounds), each on a fresh server warmed up first, each
request carrying its own ``X-Request-Id``. Per run: requests/s, p50/p95/p99, requests lost; with the log, once the
server has stopped on SIGTERM (which writes what was queued), the rows in ``decisionkit_decisions`` against the 200
answers the clients saw and the seen request ids missing from the log. The summary takes the median of the rounds:
requests/s and p50/p99 on over off, and whether each is within 5%. Written to ``--out``:
``load_serve_log_<cpu family>.json`` in a folder, or the path itself when it ends in ``.json``.
"""

import argparse
import gc
import json
import os
import shutil
import signal
import sqlite3
import statistics
import tempfile
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import pandas as pd

import decisionkit as dk
from decisionkit.course.latency import hardware
from decisionkit.course.serve_lab import (
    LoadComparison,
    batch_sweep,
    compare_batching,
    compute_facts,
    free_port,
    launch,
    load_test,
    requests_for,
)
from decisionkit.serving.app import ENDPOINT
from decisionkit.serving.config import Batching, Limits


def ray_levels(run: Path, bodies, clients, rounds, min_requests, seconds) -> LoadComparison:
    """The Ray Serve deployment on a local Ray instance (loopback), batched, at each number of clients."""
    import ray
    from ray import serve

    from decisionkit.serving.ray_app import ray_app

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.perf_counter()
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(ray_app([run], Batching(16)), route_prefix="/")
    startup = time.perf_counter() - started
    url = f"http://127.0.0.1:{port}{ENDPOINT}"
    try:
        load_test(url, bodies, concurrency=2, seconds=seconds, max_requests=4)  # warm-up
        rows = [{"max batch": 16, **load_test(url, bodies, n, seconds, max(min_requests, rounds * n)),
                 "load average": round(os.getloadavg()[0], 2)} for n in clients]
    finally:
        serve.shutdown()
        ray.shutdown()
    return LoadComparison(rows, {**hardware(), "ray startup s": round(startup, 1)})


LOG_WITHIN = 0.05  # the log's cost on latency and throughput the summary checks against: within 5%


def logged_ids(db: Path) -> list[str]:
    """The request ids in a stopped server's SQLite log, read through a read-only connection."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
        return [row[0] for row in conn.execute("SELECT request_id FROM decisionkit_decisions")]


def log_run(run: Path, bodies, clients: int, requests: int, seconds: float, limits: Limits, round_: int,
            db: Path | None, serve_log: Path) -> dict:
    """One measured load on a fresh server, the decision log at ``db`` (None: off): a warm-up (``2 x clients``
    requests, not timed) then ``requests`` requests from ``clients`` clients in at most ``seconds``; then SIGTERM,
    and with the log, its rows and the seen request ids missing from it."""
    setting = "off" if db is None else "on"
    answered: list[tuple[str, float]] = []
    load_before = os.getloadavg()[0]
    server = launch([run], batching=Batching(16), limits=limits, log=serve_log, decision_log=db)
    try:
        url = f"{server.url}{ENDPOINT}"
        warm = load_test(url, bodies, clients, seconds, 2 * clients, answered=answered,
                         headers=lambda n: {"X-Request-Id": f"warm-{round_}-{setting}-{n:05d}"})
        result = load_test(url, bodies, clients, seconds, requests, answered=answered,
                           headers=lambda n: {"X-Request-Id": f"r{round_}-{setting}-{n:05d}"})
        health = json.loads(urllib.request.urlopen(f"{server.url}/health", timeout=60).read()).get("log")
        server.process.send_signal(signal.SIGTERM)  # a graceful stop writes what the log had queued
        server.process.wait(timeout=120)
    finally:
        server.stop()
    row = {"round": round_, "log": setting, **result, "warm-up lost": warm["lost"],
           "exit status": server.process.returncode,
           "load average before": round(load_before, 2), "load average after": round(os.getloadavg()[0], 2)}
    if db is not None:
        rows = logged_ids(db)
        seen = {rid for rid, _ in answered}
        row.update({"answers seen (200, warm-up included)": len(answered), "rows logged": len(rows),
                    "seen ids missing from the log": len(seen - set(rows)),
                    "rows logged twice": len(rows) - len(set(rows)),
                    "health before the stop": {k: health[k] for k in ("written", "pending", "failures", "dropped")}})
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return row


def log_compare(run: Path, bodies, clients: int, requests: int, seconds: float, rounds: int, limits: Limits
                ) -> tuple[list[dict], dict]:
    """``log_run`` with the log off and on in turn, ``rounds`` times each (off, on, off, on, ...): the runs and
    their summary (the median over rounds of each setting, on over off, whether within ``LOG_WITHIN``). The logs
    and the servers' output go to a temporary folder, removed once every run is done (kept, and named, if one
    fails)."""
    runs = []
    folder = Path(tempfile.mkdtemp(prefix="load-serve-log-"))
    try:
        for r in range(1, rounds + 1):
            for db in (None, folder / f"log-{r}.db"):
                runs.append(log_run(run, bodies, clients, requests, seconds, limits, r, db, folder / "serve.log"))
    except BaseException:
        print(f"the logs and the servers' output are kept in {folder}", flush=True)
        raise
    shutil.rmtree(folder)

    def median(setting: str, key: str) -> float:
        return float(statistics.median(row[key] for row in runs if row["log"] == setting))

    summary = {"clients": clients, "rounds": rounds, "requests per run": requests,
               "lost (all runs)": int(sum(row["lost"] + row["warm-up lost"] for row in runs))}
    for key in ("requests/s", "p50 ms", "p99 ms"):
        off, on = median("off", key), median("on", key)
        ratio = on / off
        summary[f"{key} off, on (median of rounds)"] = [round(off, 2), round(on, 2)]
        summary[f"{key} on/off"] = round(ratio, 3)
        # latency within 5% above, throughput within 5% below
        summary[f"{key} within 5%"] = bool(ratio >= 1 - LOG_WITHIN if key == "requests/s" else ratio <= 1 + LOG_WITHIN)
    logged = [row for row in runs if row["log"] == "on"]
    summary.update({"answers seen with the log (200)": sum(r["answers seen (200, warm-up included)"] for r in logged),
                    "rows logged": sum(r["rows logged"] for r in logged),
                    "seen ids missing from the log": sum(r["seen ids missing from the log"] for r in logged)})
    return runs, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a saved model folder")
    parser.add_argument("--out", required=True,
                        help="folder for load_serve.json (--log-compare: for load_serve_log_<cpu family>.json, or "
                             "that file's path)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--rounds", type=int, default=2, help="requests per level: this many per client ...")
    parser.add_argument("--min-requests", type=int, default=24, help="... and at least this many")
    parser.add_argument("--seconds", type=float, default=300, help="time limit per level")
    parser.add_argument("--sweep", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32],
                        help="batch sizes to time (none: skip the sweep)")
    parser.add_argument("--ray", action="store_true", help="load-test the Ray Serve deployment instead")
    parser.add_argument("--log-compare", action="store_true",
                        help="instead: the same load with the decision log off and on, in turns (see above)")
    parser.add_argument("--log-clients", type=int, default=16, help="--log-compare: concurrent clients")
    parser.add_argument("--log-requests", type=int, default=480, help="--log-compare: requests per measured run")
    parser.add_argument("--log-seconds", type=float, default=120, help="--log-compare: time limit per run")
    parser.add_argument("--log-rounds", type=int, default=2, help="--log-compare: runs of each setting")
    args = parser.parse_args()
    run, out = Path(args.model), Path(args.out)
    if args.log_compare:
        compare_log(run, out, args)
        return
    out.mkdir(parents=True, exist_ok=True)

    model = dk.load(run)
    asked, bodies = requests_for(model, run.name, dk.load_typed_decisions("test"), max([32, *args.sweep]))
    facts = compute_facts(model)
    sweep = batch_sweep(model, asked, args.sweep) if args.sweep else pd.DataFrame(index=pd.Index([], name="batch size"))
    print(sweep.round(2).to_string(), flush=True)
    del model
    gc.collect()  # the servers load their own copy

    if args.ray:
        load = ray_levels(run, bodies, args.clients, args.rounds, args.min_requests, args.seconds)
    else:
        # 2 x 64 in flight and 10 minutes to answer: the 64-client level must queue, not be refused or timed out
        # (one request at a time, 128 requests queue for a minute or more on 2 cores)
        load = compare_batching([run], bodies, args.clients, (16, 1), args.rounds, args.min_requests, args.seconds,
                                Limits(max_in_flight=128, request_timeout=600), log=out / "serve.log")
    table = load.table()
    print(table.round(1).to_string(), flush=True)
    summary = {"lost": int(table["lost"].sum())}
    if not args.ray and 16 in args.clients:
        at16 = table.xs(16, level="clients")
        summary.update({"speed-up at 16 clients": round(load.speedup(16), 2),
                        "p99 ms at 16 clients (batched, unbatched)": [round(at16.loc[16, "p99 ms"]),
                                                                      round(at16.loc[1, "p99 ms"])]})
    result = {"model": str(run), "hardware": {**load.hardware, **facts}, "requests": len(bodies),
              "sweep": sweep.reset_index().to_dict(orient="records"),
              "load": table.reset_index().to_dict(orient="records"), "summary": summary,
              "load average at end": os.getloadavg()}
    name = "load_serve_ray.json" if args.ray else "load_serve.json"
    (out / name).write_text(json.dumps(result, indent=2))
    print(json.dumps(summary), f"-> {out / name}")


def compare_log(run: Path, out: Path, args) -> None:
    """``--log-compare``: ``log_compare`` on test requests that fit the model, written with the hardware, the
    compute dtype and the load average."""
    model = dk.load(run)
    _, bodies = requests_for(model, run.name, dk.load_typed_decisions("test"), 32)
    facts = compute_facts(model)
    del model
    gc.collect()  # the servers load their own copy
    if out.suffix != ".json":
        out.mkdir(parents=True, exist_ok=True)
        out = out / f"load_serve_log_{facts['cpu_family']}.json"
    load_at_start = os.getloadavg()
    runs, summary = log_compare(run, bodies, args.log_clients, args.log_requests, args.log_seconds, args.log_rounds,
                                Limits(max_in_flight=128, request_timeout=600))
    result = {"model": str(run), "hardware": {**hardware(), **facts}, "requests": len(bodies), "max batch": 16,
              "runs": runs, "summary": summary, "load average at start": load_at_start,
              "load average at end": os.getloadavg()}
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(summary), f"-> {out}")


if __name__ == "__main__":
    main()
