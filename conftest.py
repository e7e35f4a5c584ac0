"""Settings shared by the unit tests and the notebook tests (nbval kernels inherit this environment)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent

os.environ.setdefault("DECISIONKIT_DATA", str(ROOT.parent / "shared" / "typed-decisions"))
os.environ.setdefault("DECISIONKIT_QUICK", "1")  # notebooks run their quick mode under test
os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars write to stderr, which nbval compares
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests exercise the offline path whatever the network

if "DECISIONKIT_DTYPE" not in os.environ:
    # One compute dtype for the session: the one this CPU gets, probed once here. The servers and notebook kernels
    # the tests start then answer in the dtype of the models they are compared with (a probe in each process could
    # land on either side of the threshold on a busy machine). Tests that cover both dtypes set them on the backbone.
    from decisionkit.core.precision import choose

    os.environ["DECISIONKIT_DTYPE"] = choose().dtype


# The suite's tiers (`pytest -m unit`, `-m integration`, `-m notebooks`; `make test` runs all three, as CI does).
# A test is an integration test when it starts another process or server, drives a browser, builds a wheel, trains
# a model (heads, probes, trees on real features, a fine-tune: the files of TRAINING_FILES) or needs a trained one (a
# fixture of INTEGRATION_FIXTURES); a notebook item is a notebook test; everything else is a unit test: mechanics on
# synthetic logits and features and the tiny random backbone, seconds each.
INTEGRATION_FILES = {"test_browser.py", "test_wheel.py", "test_serve.py", "test_serve_own_data.py",
                     "test_serve_lifecycle.py", "test_serve_edges.py", "test_cli.py", "test_checkpoint.py",
                     "test_course_run.py", "test_review_page.py", "test_loop_postgres.py"}
TRAINING_FILES = {"test_training.py", "test_probe.py", "test_token_head.py", "test_own_data.py"}
INTEGRATION_FIXTURES = {"quick_model", "ngs_qc_run", "postgres_url"}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebooks)
        elif (item.path.name in INTEGRATION_FILES | TRAINING_FILES
              or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)
