# `make lab` (set up, then JupyterLab with gpuctx and the tour) and `make test` (set up, then the
# whole suite). `make browser` installs the Chromium the browser tests drive; `make screenshots`
# refreshes the README's pictures. `make` alone lists these. Prerequisites: README, "Before you start".
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gpuctx-installed
# The JupyterLab extension's build output (labextension/ → gpuctx_jupyter/labextension).
LABEXT := gpuctx_jupyter/labextension/static/style.js
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*) \
              labextension/package.json labextension/yarn.lock
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo )
# pytest workers: test files run in parallel, each file on one worker (its module fixtures once),
# the slowest files first (tests/conftest.py orders them by the last run's timings).
JOBS   ?= auto
# Debian's Chromium for the browser tests (Playwright downloads no browser here); Liberation
# fonts so that screenshots render JupyterLab's Arial/Helvetica text.
CHROMIUM_PKGS := chromium fonts-liberation
CHROMIUM := $(or $(GPUCTX_CHROMIUM),$(shell command -v chromium 2>/dev/null))
# Every `jlpm install` (ours and the build hook's) installs exactly what yarn.lock says and never
# rewrites it; change dependencies with `jlpm add` in labextension/.
export YARN_ENABLE_IMMUTABLE_INSTALLS := true
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.DEFAULT_GOAL := help
.PHONY: help lab test setup browser chromium screenshots gpu-check clean

help:
	@echo "make lab          set up .venv and start JupyterLab with gpuctx and the tour"
	@echo "                  (LAB_ARGS=\"--port=8899 --no-browser\" for a headless machine)"
	@echo "make test         set up .venv and run the whole suite (PYTEST_ARGS=\"-k magics\"; JOBS=0: one at a time)"
	@echo "make browser      install Debian's Chromium for the browser tests (apt; sudo unless root)"
	@echo "make screenshots  run the browser tests and write their screenshots to docs/img/"
	@echo "make clean        remove .venv, build outputs and the test caches"

# Building from a checkout needs Python ≥ 3.10 and Node.js ≥ 20: say so at once, in one line.
ifneq ($(filter lab test setup screenshots $(STAMP) $(LABEXT),$(MAKECMDGOALS)),)
ifneq ($(shell $(PYTHON) -c 'import sys; print(sys.version_info >= (3, 10))' 2>/dev/null),True)
$(error gpuctx needs Python ≥ 3.10 as `$(PYTHON)`: install it (Debian/Ubuntu: sudo apt-get install python3 python3-venv) or run make PYTHON=python3.11)
endif
NODE_MAJOR := $(shell node --version 2>/dev/null | sed -nE 's/^v([0-9]+)\..*/\1/p')
ifeq ($(NODE_MAJOR),)
$(error Node.js ≥ 20 is needed to build the JupyterLab extension and `node` was not found: install it (Debian ≥ 13: sudo apt-get install nodejs; elsewhere see README, Before you start, or https://nodejs.org/en/download))
endif
ifneq ($(shell test $(NODE_MAJOR) -ge 20 && echo ok),ok)
$(error Node.js ≥ 20 is needed to build the JupyterLab extension; `node --version` says v$(NODE_MAJOR): install a newer one (README, Before you start, or https://nodejs.org/en/download))
endif
endif

# `pip install -e` builds the extension (Node.js, the npm registry) through the hatch
# jupyter-builder hook; its copy in the venv is then made a link to the build output, so
# that a rebuild (`jlpm build` in labextension/, or the rule below) is what JupyterLab loads.
$(STAMP): pyproject.toml labextension/package.json labextension/yarn.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Re-installing into a venv set up before: its link to the build output goes first, or pip
	# writes the wheel's install.json through it into gpuctx_jupyter/labextension.
	rm -rf $(VENV)/share/jupyter/labextensions/gpuctx-jupyterlab
	# torch 2.13.0 is a quick CPU build on the project's machines; a GPU machine keeps its own.
	$(PY) -m pip install -q -e ".[test,lab]" "torch==2.13.0"
	rm -rf $(VENV)/share/jupyter/labextensions/gpuctx-jupyterlab
	ln -s "$(CURDIR)/gpuctx_jupyter/labextension" $(VENV)/share/jupyter/labextensions/gpuctx-jupyterlab
	touch $@

$(LABEXT): $(LABEXT_SRC) | $(STAMP)
	cd labextension && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" jlpm install --immutable && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" jlpm build
	touch $@

setup: $(STAMP) $(LABEXT)

# Asked for, never done behind your back: `make test` only says when Chromium is missing.
browser:
	@if [ -x "$(CHROMIUM)" ]; then echo "Chromium is here: $(CHROMIUM)"; \
	elif ! command -v apt-get >/dev/null; then \
	  echo "No apt-get here: install Chromium your system's way and point GPUCTX_CHROMIUM at it"; exit 1; \
	else \
	  echo "Installing Debian's Chromium for the browser tests (Playwright drives it; it downloads no browser):"; \
	  echo "  $(SUDO)apt-get install --no-install-recommends $(CHROMIUM_PKGS)   (about 25 packages, ~1 min)"; \
	  $(SUDO)apt-get update -qq && $(SUDO)apt-get install -y -q --no-install-recommends $(CHROMIUM_PKGS); \
	fi

chromium: browser

test: setup
	@[ -x "$(CHROMIUM)" ] || echo "No Chromium: the browser tests will be skipped; \`make browser\` installs it (apt, sudo unless root)."
	$(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The README's pictures, refreshed on purpose (make test writes them to build/screenshots/).
screenshots: setup
	GPUCTX_SCREENSHOTS="$(CURDIR)/docs/img" GPUCTX_REQUIRE_BROWSER=1 $(PY) -m pytest -n 2 --dist loadfile \
	  tests/test_browser.py tests/test_browser_replay.py $(PYTEST_ARGS)

lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" examples/tour.ipynb $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

gpu-check:
	scripts/gpu-check.sh

clean:
	rm -rf $(VENV) build dist .cache *.egg-info gpuctx_jupyter/labextension labextension/lib labextension/node_modules labextension/tsconfig.tsbuildinfo
