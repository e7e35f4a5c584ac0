"""Notebook 03's try-it panel in a real browser: JupyterLab in headless Chromium, driven the way a learner does.

Running all of notebook 03 takes minutes even in quick mode, so the test runs a small notebook written at test
time: notebook 03's imports cell, a cell that points its run folder at the small model the ``quick_model``
fixture trained, then notebook 03's own cells from the one that loads the model to the panel's display, read from
the ``.ipynb`` (found by content, so the test follows the notebook and breaks when those cells change). Then it
types another state into the panel, presses Decide and reads the probability bars plotly drew in the page.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

import decisionkit
from decisionkit.core.answer_fields import lowest_confidence
from decisionkit.course.serve_lab import free_port
from decisionkit.training.anomaly import fit_router

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; playwright's own browser downloads are refused here
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_training.ipynb"
# Without the background-networking flags Chromium phones home at start and those connections are refused here;
# no sandbox and no GPU in a container.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_S = 60
CELLS_RUN_S = 150  # kernel start, torch import, model load, one answer, kaleido's first PNG, on 2 shared cores
ANSWER_S = 60  # one click: an answer and a PNG
UI_S = 30  # any single page element

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")


def notebook_03_cells() -> tuple[str, list[str]]:
    """Notebook 03's imports cell, and its cells from the model load to the panel's display (the panel's cell)."""
    code = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    panel = [i for i, s in enumerate(code) if "DecisionPanel(" in s]
    shown = [i for i, s in enumerate(code) if "panel.widget()" in s]
    assert len(panel) == 1 and len(shown) == 1, "notebook 03 should build one DecisionPanel and show it in one cell"
    loads = [i for i, s in enumerate(code[:panel[0]]) if "model = dk.load(" in s]
    assert loads, "notebook 03 should load the model the panel shows before building the panel"
    assert "import" in code[0] and "DecisionPanel" in code[0], "notebook 03's first code cell should import the panel"
    return code[0], code[loads[-1]:shown[0] + 1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on loopback with a random token, rooted in a tmp dir; stopped after the module."""
    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("jupyter-home")  # config, data, runtime: none of the user's settings apply
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "DECISIONKIT_QUICK": "1", "TQDM_DISABLE": "1",
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           # the venv's kernel spec runs "python" from PATH: make that the venv's, which has decisionkit
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("DECISIONKIT_DATA", "DECISIONKIT_CACHE"):  # passed through, absolute: the server runs in root
        if os.environ.get(name):
            env[name] = str(Path(os.environ[name]).resolve())
    log = (root.parent / "jupyter-lab.log").open("w")
    server = subprocess.Popen(
        # --allow-root: CI containers run as root, and the server refuses to start there without it
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={home / 'settings'}",
         f"--LabApp.workspaces_dir={home / 'workspaces'}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SERVER_START_S
        while True:
            assert server.poll() is None, f"jupyter lab exited early; see {log.name}"
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"jupyter lab did not answer within {SERVER_START_S} s"
            time.sleep(0.5)
        yield url, token, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        log.close()


def bar_texts(page) -> list[list[str]]:
    """The percentages written on the bars of the panel's figure, one list per subplot (question), top to bottom
    in the figure's order."""
    return page.evaluate("""() => [...document.querySelectorAll(
        '.jp-Notebook .js-plotly-plot .barlayer g.trace.bars')].map(
        trace => [...trace.querySelectorAll('text.bartext')].map(t => t.textContent))""")


def expected_texts(answers: dict) -> list[list[float]]:
    return [list((a.get("probabilities") or {"false": 1 - a["noul"], "true": a["noul"]}).values())
            for a in answers.values()]


def assert_bars_show(shown: list[list[str]], answers: dict) -> None:
    """Every bar shows its probability to the shown precision (0.1 percentage point; a hair more for float32
    rounding at a .05 boundary, kernel against test process)."""
    expected = expected_texts(answers)
    assert [len(t) for t in shown] == [len(e) for e in expected], (shown, expected)
    for texts, probabilities in zip(shown, expected):
        for text, p in zip(texts, probabilities):
            assert text.endswith("%") and abs(float(text[:-1]) / 100 - p) <= 0.0005 + 1e-6, (shown, expected)


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def routed_model(quick_model, splits, tmp_path_factory):
    """The tests' small model with a router, saved. The router makes its answers depend on the input (the quick
    model's heads may answer every in-domain case alike; off-domain text gets the training prior), so the page can
    only show the right bars if the panel answered the text that was typed."""
    model = decisionkit.load(quick_model[0])
    # two folds, not ten: the router only has to exist and tell the typed text from a case, and this keeps it quick
    fit_router(model, splits["train"].head(10), splits["validation"].head(10), folds=2)
    return model.save(tmp_path_factory.mktemp("routed-model") / "model")


def test_notebook_03_panel_in_jupyterlab(routed_model, lab, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    path = routed_model
    model = decisionkit.load(path)  # the model the kernel loads, here to compute the answers the page must show
    imports, cells = notebook_03_cells()
    bind = f"# notebook 03's run folder reads as the small model the tests trained\nFOLDER = Path({str(path)!r})"
    url, token, root = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in (imports, bind, *cells)])
    # the kernel spec exactly as the server lists it: a mismatch opens a "Select Kernel" dialog instead of a kernel
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, root / "panel.ipynb")

    # The notebook's cell starts the panel on the first test case; the learner then types an off-domain text
    # (kept in the same workflow), whose bars must read differently, so the page can only pass with the new answer.
    first = decisionkit.load_typed_decisions("test")[0]
    first_answers = model.decide(first.state, workflow=first.workflow)
    typed = "autumn wind through golden leaves under the moon"
    answers = model.decide(typed, workflow=first.workflow)
    assert expected_texts(answers) != expected_texts(first_answers), "the typed text should change the answer"

    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = browser.new_page()
            page.set_default_timeout(UI_S * 1000)
            page.goto(f"{url}/lab/tree/panel.ipynb?token={token}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            # Run the cells one by one as a learner does: select the first, then Shift+Enter runs a cell and moves
            # to the next. Each cell's prompt must show its execution count before the next key press.
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=CELLS_RUN_S * 1000)
            prompts = page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt")
            # The indicator reads idle a moment before the session takes requests, and a key press sent then is
            # dropped: press Shift+Enter on the first cell until its prompt shows it queued ([*]) or ran ([1]).
            for _ in range(5):
                prompts.first.click()
                page.keyboard.press("Shift+Enter")
                try:
                    page.wait_for_function("el => /\\[[*0-9]/.test(el.textContent)",
                                           arg=prompts.first.element_handle(), timeout=5_000)
                    break
                except PlaywrightTimeout:
                    continue
            for k in range(prompts.count()):
                if k:
                    page.keyboard.press("Shift+Enter")
                try:
                    page.wait_for_function("el => /\\[[0-9]+\\]/.test(el.textContent)",
                                           arg=prompts.nth(k).element_handle(), timeout=CELLS_RUN_S * 1000)
                except PlaywrightTimeout:
                    page.screenshot(path=tmp_path / "not-run.png", full_page=True)
                    pytest.fail(f"cell {k + 1} did not run within {CELLS_RUN_S} s (page: {tmp_path / 'not-run.png'})")
            try:
                page.locator(".jupyter-widgets textarea").wait_for(timeout=CELLS_RUN_S * 1000)
            except PlaywrightTimeout:
                stderr = page.locator("[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
                page.screenshot(path=tmp_path / "no-panel.png", full_page=True)
                pytest.fail(f"no panel within {CELLS_RUN_S} s (page: {tmp_path / 'no-panel.png'}); the cells' "
                            "stderr:\n" + "\n".join(stderr))
            shown = wait_for(lambda: (t := bar_texts(page)) and all(t) and t, UI_S, "the first bars")
            assert_bars_show(shown, first_answers)  # the notebook's own panel.run(), drawn

            page.locator(".jupyter-widgets textarea").fill(typed)
            page.get_by_role("button", name="Decide").click()
            before = shown
            shown = wait_for(lambda: (t := bar_texts(page)) != before and all(t) and t, ANSWER_S,
                             "new bars after Decide")
            assert_bars_show(shown, answers)
            verdict = "answer" if lowest_confidence(answers) >= 0.6 else "human"  # the notebook's slider: 0.6
            shown_verdict = page.locator(".jupyter-widgets .widget-html-content").first.inner_text()
            assert f"verdict: {verdict}" in shown_verdict, shown_verdict
            assert f"lowest confidence {lowest_confidence(answers):.1%}" in shown_verdict, shown_verdict
        finally:
            browser.close()
