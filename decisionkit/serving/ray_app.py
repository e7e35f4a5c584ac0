"""The same System One app on Ray Serve, for when one machine is not enough: model replicas behind Ray's HTTP
proxy, each batching the requests it receives with ``@serve.batch``.

    pip install -e ".[ray]"
    python -m decisionkit.serving.ray_app runs/cpu-heads --replicas 2 --port 8000     # a local Ray instance, loopback

On a cluster, connect first (``ray.init(address="auto")``) and run ``ray_app(runs)`` with ``serve.run``, or
put ``decisionkit.serving.ray_app:ray_app`` in a Serve config file. What is shared with ``decisionkit serve``: the
routes, the request reading and its limits (``RequestLimits``, in each replica), the contract checks
(``systemone.prepare`` / ``respond``), JSON errors. What differs: Ray's proxy parses the HTTP (its 400s for malformed
framing are Ray's own), and the deployment's ``max_ongoing_requests`` / ``max_queued_requests`` bound the load
before a replica's ``RequestLimits`` sees it.
``benchmarks/load_serve.py --ray`` measures it on a local Ray instance.
"""

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Sequence

from fastapi import FastAPI
from ray import serve

from ..contract import systemone
from ..contract.systemone import Prepared, SystemOneRequest, SystemOneResponse
from ..core import settings
from ..loop.log import DecisionLog
from ..model.decision_model import load
from .app import ENDPOINT, answer_request, catalog, install
from .config import Batching, Limits
from .shutdown import graceful_sigterm

APP_NAME = "decisionkit"


def ray_app(runs: Sequence[str | Path], batching: Batching = Batching(), limits: Limits = Limits(),
            replicas: int = 1, api_key: str | None = None, log: DecisionLog | None = None):
    """A bound Ray Serve application serving the saved models in ``runs`` (pass it to ``serve.run``); with
    ``api_key``, every request must carry it as ``Authorization: Bearer``; with ``log`` (a ``DecisionLog`` on a
    database every replica reaches, PostgreSQL say), each replica keeps its answers there."""
    models = catalog(runs)
    app = FastAPI(title="decisionkit System One (Ray Serve)")
    install(app, models, limits, api_key, log)

    @serve.deployment(num_replicas=replicas, max_ongoing_requests=limits.max_in_flight,
                      max_queued_requests=limits.max_in_flight)
    @serve.ingress(app)
    class SystemOne:
        def __init__(self):
            self.models = {name: load(run) for name, run in models.items()}

        @serve.batch(max_batch_size=batching.max_batch_size, batch_wait_timeout_s=batching.timeout)
        async def answer(self, prepared: list[Prepared]) -> list[dict]:
            # in a thread: the replica keeps accepting requests (the next batch) while the model runs
            return await asyncio.to_thread(systemone.respond, self.models, prepared)

        @app.post(ENDPOINT, response_model=SystemOneResponse)
        async def system_one(self, request: SystemOneRequest):
            return await answer_request(self.models, request, self.answer)

    return SystemOne.bind()


def main(argv: list[str] | None = None) -> None:
    import ray

    parser = argparse.ArgumentParser(prog="python -m decisionkit.serving.ray_app", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="folders of saved models")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=Batching().max_batch_size)
    parser.add_argument("--batch-timeout", type=float, default=Batching().timeout,
                        help="seconds to wait for a batch to fill")
    parser.add_argument("--api-key", default=None, help=f"ask every request for it (default: ${settings.API_KEY_ENV})")
    parser.add_argument("--log", default=None, metavar="URL",
                        help="keep every answer in this decision log (a database every replica reaches)")
    args = parser.parse_args(argv)
    log = DecisionLog(args.log) if args.log else None  # checked before Ray starts: one line if it cannot be used
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    with graceful_sigterm():  # SIGTERM takes Ctrl-C's path: Serve and the local Ray instance are shut down
        try:
            serve.run(ray_app(args.runs, Batching(args.max_batch_size, args.batch_timeout), replicas=args.replicas,
                              api_key=args.api_key or settings.api_key(), log=log), route_prefix="/", name=APP_NAME)
            print(f"serving {', '.join(args.runs)} on http://127.0.0.1:{args.port}{ENDPOINT} (Ray Serve); Ctrl-C or "
                  "SIGTERM stops", flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            serve.delete(APP_NAME)  # the replicas finish the requests they hold (the proxy is still up to answer)
            serve.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
