"""The Ray Serve deployment (``serving/ray_app.py``), served once on a local Ray instance bound to 127.0.0.1: a System One
request is answered as ``decide()`` answers it. Skipped without the ``ray`` extra (``pip install -e ".[dev,ray]"``,
which the Makefile installs)."""

import httpx
import pytest

from decisionkit.contract import systemone
from decisionkit.core import precision
from decisionkit.core.precision import ANSWER_TOLERANCE
from decisionkit.course.serve_lab import free_port
from decisionkit.serving.app import ENDPOINT

ray = pytest.importorskip("ray")


def test_ray_serve_answers_a_system_one_request_as_decide(quick_model, splits, monkeypatch):
    from ray import serve

    from decisionkit.serving.ray_app import ray_app

    path, model = quick_model
    case = next(c for c in splits["validation"]  # short enough for the quick model: longer states are refused
                if len(model.backbone.tokenizer(c.text)["input_ids"]) <= model.spec.max_length)
    questions = {q: x.to_json() for q, x in case.questions.items()}
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_app([path]), route_prefix="/")
        response = httpx.post(f"http://127.0.0.1:{port}{ENDPOINT}", timeout=300,
                              json={"model": path.name, "state": case.state, "questions": questions})
    finally:
        serve.shutdown()
        ray.shutdown()
    assert response.status_code == 200, response.text
    served, local = response.json(), model.decide(case.state, questions)
    assert served["model"] == path.name
    assert systemone.disagreements(served["answers"], local, ANSWER_TOLERANCE[precision.choose().dtype]) == []
