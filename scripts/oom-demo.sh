#!/usr/bin/env bash
# "Who holds my GPU" on a GPU machine, through a real jupyter_server (issue #18): two idle notebooks
# hold the GPU (one as live tensors, one as torch's cache), a third runs out of memory; its
# explanation must name both and rank "release the cache" first; the release action then lets the
# failed cell succeed. Prints a table and writes JSON; under 4 minutes on any GPU with >= 40 GiB.
#
#   scripts/oom-demo.sh [OUT.json]     # default $OUT/oom_demo.json, else benchmarks/results/oom_demo.json
#
# Needs torch with CUDA and NVML; gpuctx and the Jupyter packages as for scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh  # py, results, PYTHONPATH
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv || true
timeout 300 "$py" benchmarks/oom_demo.py --json "${1:-$results/oom_demo.json}" 2>&1 | tee "$results/oom_demo.log"
status=${PIPESTATUS[0]}
nvidia-smi --query-gpu=index,memory.used --format=csv || true
exit "$status"
