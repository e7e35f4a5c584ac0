"""Load test of the System One server on loopback, batching on and off, and a batch-size sweep; writes JSON.

    .venv/bin/python benchmarks/load_serve.py --model runs/quick --out runs/load-serve
    .venv/bin/python benchmarks/load_serve.py --model runs/quick --out runs/load-serve-ray --ray   # needs .[ray]

1. ``decide_many`` timed by batch size on the same test requests: what batching can gain on this device.
2. ``decisionkit serve`` launched with ``--max-batch-size 16`` and ``1``, each load-tested at 1, 4, 16 and 64
   concurrent clients (a fixed number of requests per level, bounded in time): requests/s, p50/p95/p99, lost.
   With ``--ray``, the Ray Serve deployment (``serving/ray_app.py``) on a local Ray instance, batched, instead.
Every row records the load average: the machine may be shared, and other work slows the model as much.
The requests are test cases short enough for the model (a longer state is refused with 422, not answered).
"""

import argparse
import gc
import json
import os
import time
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a saved model folder")
    parser.add_argument("--out", required=True, help="folder for load_serve.json")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--rounds", type=int, default=2, help="requests per level: this many per client ...")
    parser.add_argument("--min-requests", type=int, default=24, help="... and at least this many")
    parser.add_argument("--seconds", type=float, default=300, help="time limit per level")
    parser.add_argument("--sweep", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32],
                        help="batch sizes to time (none: skip the sweep)")
    parser.add_argument("--ray", action="store_true", help="load-test the Ray Serve deployment instead")
    args = parser.parse_args()
    run, out = Path(args.model), Path(args.out)
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


if __name__ == "__main__":
    main()
