#!/usr/bin/env bash
# Where there is a network: the wheels the GPU machine lacks, into .devwheels/ (git-ignored), for
# scripts/gpu-env.sh to install there. The GPU machine has torch, accelerate and NVML's bindings
# but no Jupyter packages and no ipyparallel (`%gpu workers`).
#
#   scripts/gpu-wheels.sh [DIR]       # default .devwheels
set -euo pipefail
cd "$(dirname "$0")/.."
wheelhouse="${WHEELHOUSE:-../shared/device/wheelhouse.sh}"
[ -x "$wheelhouse" ] || { echo "no $wheelhouse (set WHEELHOUSE to the shared wheelhouse script)"; exit 1; }
"$wheelhouse" "${1:-.devwheels}" jupyter_server ipykernel ipython ipywidgets jupyter_client pytest-jupyter nbclient \
  nbformat ipyparallel
