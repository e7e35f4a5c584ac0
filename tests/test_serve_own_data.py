"""A model trained on a user's own CSV export, served by ``decisionkit serve`` and called by the official System One
client for its workflow (the path of ``decisionkit train --data ... --out DIR`` then ``decisionkit serve DIR``); a
poem, read as a claim, is routed to a human through the server too."""

import json

import httpx
import typesafe_sdk as sdk
from test_own_data import POEM, claims, write_export

import decisionkit
from decisionkit.cli import main
from decisionkit.contract import systemone
from decisionkit.core import precision
from decisionkit.core.precision import ANSWER_TOLERANCE
from decisionkit.course.serve_lab import launch
from decisionkit.model.decision_model import FeatureSpec
from decisionkit.training import presets


def test_a_model_trained_on_a_csv_export_answers_the_system_one_client(tmp_path, monkeypatch, tiny_backbone_path):
    tiny = presets.preset(presets.DEFAULT_PRESET, backbone=str(tiny_backbone_path), features=FeatureSpec(max_length=48),
                          head_steps=20, l2_grid=(1.0,), tree_rounds=20, off_domain_per_kind=2)
    monkeypatch.setitem(presets.PRESETS, presets.DEFAULT_PRESET, tiny)
    data, schema = write_export(tmp_path, claims())
    out = tmp_path / "expenses"
    assert main(["train", "--data", str(data), "--schema", str(schema), "--out", str(out), "--quiet"]) == 0
    model = decisionkit.load(out)
    asked = json.loads(schema.read_text())
    states = [row["state"] for row in claims()[:3]]
    with launch([out], log=tmp_path / "serve.log") as server:
        with sdk.TypeSafeClient(api_key="local", base_url=server.url, model="expenses", timeout=300.0,
                                retry=sdk.RetryPolicy(max_retries=0)) as client:
            assert [m.name for m in client.models.list().models] == ["expenses"]
            for state in states:
                questions = {q: getattr(sdk, x["type"].capitalize())(**x) for q, x in asked.items()}
                result = client.system_one(state=state, questions=questions)
                answers = {q: a.model_dump(exclude_none=True) for q, a in result.answers.items()}
                local = model.route(state, asked)["answers"]
                assert systemone.disagreements(answers, local, ANSWER_TOLERANCE[precision.choose().dtype]) == []
        raw = httpx.post(f"{server.url}/v1/systemone", json={"model": "expenses", "state": POEM, "questions": asked},
                         timeout=300.0)
        assert raw.status_code == 200 and raw.json()["routing"]["verdict"] == "human"  # the SDK ignores this field
