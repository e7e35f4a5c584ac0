"""Settings shared by the unit tests and the notebook tests (nbval kernels inherit this environment)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent

os.environ.setdefault("DECISIONKIT_DATA", str(ROOT.parent / "shared" / "typed-decisions"))
os.environ.setdefault("DECISIONKIT_QUICK", "1")  # notebooks run their quick mode under test
os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars write to stderr, which nbval compares
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests exercise the offline path whatever the network
