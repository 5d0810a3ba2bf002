#!/usr/bin/env bash
# One command for a GPU machine: the GPU-marked tests, then the benchmarks.
#
#   scripts/gpu-check.sh [all|tests|benchmarks] [pytest args]   # from the repository root
#
# `tests` and `benchmarks` split the run in two (each well under 10 minutes on an H200). The
# notebooks benchmark runs on its own, within a time limit: scripts/gpu-notebooks.sh.
#
# The machine needs python3 (or the project's .venv, or $PYTHON) with torch (CUDA) and pytest;
# the Jupyter packages and ipyparallel come from .devwheels/ when present (scripts/gpu-wheels.sh
# builds it), else must be installed.
# Results (test log, benchmark JSON) go to $OUT when set, else benchmarks/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh  # py, results, PYTHONPATH (the tour and the trace below run on the same py)
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv | tee "$results/nvidia-smi.csv"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
part="${1:-all}"
case "$part" in all|tests|benchmarks) shift || true ;; *) part=all ;; esac
status=0
if [ "$part" != benchmarks ]; then
"$py" -m pytest -m gpu -v -p no:cacheprovider -o addopts="" "$@" 2>&1 | tee "$results/gpu-tests.log" || status=1
fi
[ "$part" = tests ] && exit $status
for bench in benchmarks/on_gpu_overhead.py benchmarks/sampler_cost.py "benchmarks/first_cell.py --pool" \
             benchmarks/thread_start.py benchmarks/workers.py; do
  name="$(basename "${bench%% *}" .py)"
  "$py" $bench --json "$results/$name.json" 2>&1 | tee -a "$results/benchmarks.log" || status=1
done
# Who holds my GPU: three notebooks through a real server, one runs out of memory (needs ≥ 40 GiB).
OUT="$results" scripts/oom-demo.sh 2>&1 | tee -a "$results/benchmarks.log" || status=1
# The trace the UI tests and the no-GPU demo replay (copy it to tests/data/ to use it).
scripts/record-trace.sh "$results/h200-trace.jsonl" || status=1
# The tour with real outputs (copy it to docs/tour-h200.ipynb).
scripts/execute-tour.sh "$results/tour-h200.ipynb" 2>&1 | tail -5 || status=1
exit $status
