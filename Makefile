# Two entry points: `make lab` (set up, then start JupyterLab with gpuctx and the tour)
# and `make test` (set up, then run the whole test suite). Both start from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gpuctx-installed

.PHONY: lab test setup gpu-check clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch 2.13.0 is a quick CPU build on the project's machines; a GPU machine keeps its own.
	$(PY) -m pip install -q -e ".[test,lab]" "torch==2.13.0"
	touch $@

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" examples/tour.ipynb $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

gpu-check:
	scripts/gpu-check.sh

clean:
	rm -rf $(VENV) build dist *.egg-info
