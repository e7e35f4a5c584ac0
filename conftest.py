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
