#!/usr/bin/env bash
# Execute the tour notebook top to bottom in a real kernel and keep the executed copy
# (on the GPU machine, its real outputs go to docs/tour-h200.ipynb).
#
#   scripts/execute-tour.sh [OUT]     # default build/tour-executed.ipynb
#
# Needs nbclient and ipykernel with gpuctx importable: the project's .venv has them (`make setup`).
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's environment (`make setup`) when there is one, else python3; PYTHON overrides.
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
out="${1:-build/tour-executed.ipynb}"
mkdir -p "$(dirname "$out")"
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
"$py" - "$out" <<'PY'
import sys, time
import nbformat
from nbclient import NotebookClient

nb = nbformat.read("examples/tour.ipynb", as_version=4)
t0 = time.monotonic()
NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=True,
               resources={"metadata": {"path": "examples"}}).execute()
nbformat.write(nb, sys.argv[1])
errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
print(f"tour executed in {time.monotonic() - t0:.1f} s, {len(errors)} error outputs -> {sys.argv[1]}")
sys.exit(1 if errors else 0)
PY
