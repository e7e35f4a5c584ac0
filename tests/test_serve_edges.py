"""Server settings test_serve.py does not start: batching off (``Batching(max_batch_size=1)``), a request timeout
the model cannot meet (LitServe's 504); and what ``decisionkit serve`` refuses before anything is served: two runs
under one name, a model whose config or files are broken (one line naming it and why), a key file without a key.
Two live servers, each started for its one test; the 500 handler is tested in process (test_contract_inprocess.py),
a model that fails in the inference worker on a live server (test_serve_lifecycle.py)."""

import json
import shutil
import threading

import httpx
import pytest

from decisionkit.cli import main
from decisionkit.contract import systemone
from decisionkit.core import precision
from decisionkit.core.precision import ANSWER_TOLERANCE
from decisionkit.core.settings import API_KEY_ENV
from decisionkit.course.serve_lab import free_port, launch
from decisionkit.model.saving import CONFIG_FILE, HEADS_FILE, ModelConfig
from decisionkit.serving.app import ENDPOINT, catalog
from decisionkit.serving.config import Batching, Limits

TIMEOUT = 300.0  # seconds for an answer on a busy 2-core machine


@pytest.fixture(scope="module")
def cases(splits, quick_model):
    """Three validation cases that fit in one window of the quick model (longer states are read in windows)."""
    _, model = quick_model
    return [c for c in splits["validation"]
            if len(model.backbone.tokenizer(c.text)["input_ids"]) <= model.spec.max_length][:3]


def request(name: str, case) -> dict:
    return {"model": name, "state": case.state, "questions": {q: x.to_json() for q, x in case.questions.items()}}


def test_with_batching_off_concurrent_requests_are_answered_as_decide(quick_model, cases, tmp_path):
    path, model = quick_model
    answers: dict[int, httpx.Response] = {}

    def ask(server, i: int) -> None:
        answers[i] = httpx.post(server.url + ENDPOINT, json=request(path.name, cases[i % len(cases)]), timeout=TIMEOUT)

    with launch([path], batching=Batching(max_batch_size=1), log=tmp_path / "serve.log") as server:
        asking = [threading.Thread(target=ask, args=(server, i)) for i in range(2 * len(cases))]
        for t in asking:  # more requests at once than one forward pass takes: they queue, one per pass
            t.start()
        for t in asking:
            t.join()
    tolerance = ANSWER_TOLERANCE[precision.choose().dtype]
    for i, response in sorted(answers.items()):
        case = cases[i % len(cases)]
        assert response.status_code == 200, response.text
        local = model.decide(case.state, request(path.name, case)["questions"])
        assert systemone.disagreements(response.json()["answers"], local, tolerance) == [], i
    assert len(answers) == 2 * len(cases)


def test_a_request_the_model_cannot_answer_in_time_gets_a_json_504(quick_model, cases, tmp_path):
    """``Limits.request_timeout`` is how long a request may wait for the inference worker; a microsecond is less
    than the hop between LitServe's processes takes, so every request waits too long. (LitServe wants the batch
    timeout below it: 0 with batching off.)"""
    path, _ = quick_model
    with launch([path], batching=Batching(max_batch_size=1, timeout=0.0), limits=Limits(request_timeout=1e-6),
                log=tmp_path / "serve.log") as server:
        late = httpx.post(server.url + ENDPOINT, json=request(path.name, cases[0]), timeout=TIMEOUT)
        health = httpx.get(server.url + "/health", timeout=TIMEOUT)
    assert late.status_code == 504 and late.headers["content-type"] == "application/json", late.text
    assert late.json() == {"detail": "Request timed out"}
    assert health.status_code == 200  # the HTTP side still answers what needs no model


def test_two_runs_with_one_name_are_refused_at_start(quick_model, tmp_path, capsys):
    path, _ = quick_model
    runs = [shutil.copytree(path, tmp_path / folder) for folder in ("a/run", "b/run", "c/other")]
    served = catalog([runs[0], runs[2]])
    assert served == {"run": runs[0], "other": runs[2]}
    assert served.configs["run"] == ModelConfig.read(path)  # read once, at start: /health answers from it
    runs = runs[:2]
    with pytest.raises(ValueError) as refused:
        catalog(runs)
    assert str(runs[0]) in str(refused.value) and str(runs[1]) in str(refused.value)
    # the command says it and serves nothing (were it serving, main would not return)
    assert main(["serve", *map(str, runs), "--port", str(free_port())]) == 2
    error = capsys.readouterr().err
    assert error.startswith("decisionkit: error: two models are named 'run'") and "Traceback" not in error
    assert str(runs[0]) in error and str(runs[1]) in error


def test_a_model_with_a_broken_config_or_file_is_refused_before_anything_starts(quick_model, tmp_path, capsys):
    """Each served model's config is read and checked, and the files it names looked for, in the command's own
    process before LitServe starts a worker: one line names the model and why, status 2."""
    path, _ = quick_model
    config = json.loads((path / CONFIG_FILE).read_text())
    breaks = {"not JSON": lambda run: (run / CONFIG_FILE).write_text("{"),
              "another format": lambda run: (run / CONFIG_FILE).write_text(json.dumps({**config, "format": 99})),
              "features cut": lambda run: (run / CONFIG_FILE).write_text(json.dumps({**config, "features": {}})),
              "no heads": lambda run: (run / HEADS_FILE).unlink()}
    why = {}
    for label, broken in breaks.items():
        run = shutil.copytree(path, tmp_path / label.replace(" ", "-"))
        broken(run)
        assert main(["serve", str(run), "--port", str(free_port())]) == 2, label
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"decisionkit: error: model {run.name!r} ({run}) cannot be served: "), line
        why[label] = line.split(" cannot be served: ")[1]
    assert why["not JSON"].startswith("JSONDecodeError: ") and "format 99" in why["another format"]
    assert why["features cut"].startswith("KeyError: ") and why["no heads"].startswith(
        f"FileNotFoundError: {HEADS_FILE} not found")


def test_the_key_comes_from_a_file_or_the_environment_and_is_never_printed(tmp_path, capsys, monkeypatch):
    """A key file without a key on its first line is refused (serving without one would be a surprise); a file
    every user may read, or a key on the command line, is warned about; the key itself is never printed. (The run
    named is not a model, so nothing is served.)"""
    key, run = "k-3f9a", str(tmp_path / "nothing")
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    empty = tmp_path / "empty"
    empty.write_text("\nk-3f9a\n")
    assert main(["serve", run, "--api-key-file", str(empty)]) == 2
    assert capsys.readouterr().err == f"decisionkit: error: {empty} holds no API key: its first line is empty\n"
    shared = tmp_path / "shared"
    shared.write_text(key)
    shared.chmod(0o644)
    for args in (["--api-key-file", str(shared)], ["--api-key", key]):
        assert main(["serve", run, *args]) == 2
        printed = capsys.readouterr()
        assert printed.err.startswith("warning: ") and "API key required" in printed.out
        assert key not in printed.out + printed.err, args
    shared.chmod(0o600)
    monkeypatch.setenv(API_KEY_ENV, key)
    for args in (["--api-key-file", str(shared)], []):
        assert main(["serve", run, *args]) == 2
        printed = capsys.readouterr()
        assert "warning" not in printed.err and "API key required" in printed.out
