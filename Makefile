# Two entry points: `make lab` (set up, then start JupyterLab with gpuctx and the tour)
# and `make test` (set up, then run the whole test suite). Both start from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gpuctx-installed
# The JupyterLab extension's build output (labextension/ → gpuctx_jupyter/labextension).
LABEXT := gpuctx_jupyter/labextension/static/style.js
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*) \
              labextension/package.json labextension/yarn.lock
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo )

.PHONY: lab test setup chromium gpu-check clean

# `pip install -e` builds the extension (Node.js, the npm registry) through the hatch
# jupyter-builder hook; its copy in the venv is then made a link to the build output, so
# that a rebuild (`jlpm build` in labextension/, or the rule below) is what JupyterLab loads.
$(STAMP): pyproject.toml Makefile labextension/package.json labextension/yarn.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch 2.13.0 is a quick CPU build on the project's machines; a GPU machine keeps its own.
	$(PY) -m pip install -q -e ".[test,lab]" "torch==2.13.0"
	rm -rf $(VENV)/share/jupyter/labextensions/gpuctx-jupyterlab
	ln -s "$(CURDIR)/gpuctx_jupyter/labextension" $(VENV)/share/jupyter/labextensions/gpuctx-jupyterlab
	touch $@

$(LABEXT): $(LABEXT_SRC) | $(STAMP)
	cd labextension && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" jlpm install && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" jlpm build
	touch $@

setup: $(STAMP) $(LABEXT)

# The browser tests drive Debian's Chromium (Playwright never downloads a browser here).
chromium:
	@command -v chromium >/dev/null || ($(SUDO)apt-get update -qq && $(SUDO)apt-get install -y -qq chromium)

test: setup chromium
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PY) -m pytest $(PYTEST_ARGS)

lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" examples/tour.ipynb $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

gpu-check:
	scripts/gpu-check.sh

clean:
	rm -rf $(VENV) build dist *.egg-info gpuctx_jupyter/labextension labextension/lib labextension/node_modules labextension/tsconfig.tsbuildinfo
