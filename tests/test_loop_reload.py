"""A promoted model taken on SIGHUP by a live server, without dropping a request: clients post the whole time; the
server started with run ``live`` answers with run ``next`` once ``promoted.json`` in ``live`` names it and SIGHUP
arrives (``SystemOneAPI.reload``: loaded beside the answering model, then put in its place). Every request is
answered 200, each by one of the two versions, the new one from some point on; ``X-Decisionkit-Model-Version`` says
which."""

import json
import os
import signal
import threading
import time

import httpx
import torch

from decisionkit import load
from decisionkit.course.serve_lab import launch
from decisionkit.loop.promotion import PROMOTED_FILE
from decisionkit.serving.app import ENDPOINT
from decisionkit.serving.decision_logging import VERSION

TIMEOUT = 300.0
RELOAD_S = 180  # the new model loaded in the inference worker beside the old one, on 2 busy cores


def test_sighup_takes_a_promoted_model_without_dropping_a_request(quick_model, splits, tmp_path):
    path, _ = quick_model
    live, following = tmp_path / "live", tmp_path / "next"
    model = load(path)
    model.save(live)
    with torch.no_grad():
        model.feature_mean += 0.05  # another model: other answers, another version
    model.save(following)
    old, new = load(live).version, load(following).version
    assert old != new
    case = splits["validation"][0]
    body = {"model": "live", "state": case.state, "questions": {q: x.to_json() for q, x in case.questions.items()}}
    seen, stop = [], threading.Event()

    def client(server):
        with httpx.Client(timeout=TIMEOUT) as http:
            while not stop.is_set():
                response = http.post(server.url + ENDPOINT, json=body)
                seen.append((response.status_code, response.headers.get(VERSION)))

    with launch([live], log=tmp_path / "serve.txt") as server:
        clients = [threading.Thread(target=client, args=(server,)) for _ in range(2)]
        for t in clients:
            t.start()
        while len(seen) < 4:
            time.sleep(0.1)
        (live / PROMOTED_FILE).write_text(json.dumps({"run": str(following)}))
        os.kill(server.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_S
        while time.monotonic() < deadline and not any(v == new for _, v in seen[-2:]):
            time.sleep(0.2)
        time.sleep(1.0)
        stop.set()
        for t in clients:
            t.join()
        assert server.process.poll() is None, "SIGHUP must not stop the server"
    assert {status for status, _ in seen} == {200}, seen
    versions = [v for _, v in seen]
    assert set(versions) == {old, new}, set(versions)
    switched = versions.index(new)
    assert all(v == new for v in versions[switched + 2:]), "after the swap every answer comes from the new model"
    assert f"now {following}" in (tmp_path / "serve.txt").read_text()
