#!/usr/bin/env bash
# Suspend / resume of a notebook's GPU (issue #28) on a GPU machine, in one command:
#
#   scripts/gpu-suspend.sh [all|probe|tests|benchmark] [args for that part]   # from the repository root
#
#   probe      what the driver's checkpoint API does here (scripts/checkpoint_probe.py; needs only
#              torch with CUDA and nvidia-ml-py); `all` runs the checks the first H200 run left open
#              (--only follow-up --gib 2, ~2 min), `probe` alone all of them (~4 min)
#   tests      the GPU-marked suspend tests, through a real server (tests/test_gpu_suspend.py, ~2 min)
#   benchmark  benchmarks/suspend.py: 10 / 40 GiB × 3 runs beside Release and a restart, 20 cycles,
#              the three-notebook out of memory
#
# `all` gives the whole run a budget, SUSPEND_BUDGET_S seconds (default 450, ~7.5 min in all on
# an H200): the benchmark starts nothing that would not end by then — the 40 GiB repetitions go
# first — and lists what it skipped; SUSPEND_BUDGET_S=540 leaves room for all three 40 GiB runs. Results go to $OUT when set, else
# benchmarks/results/. scripts/gpu-check.sh runs the tests too (they are GPU-marked).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:-all}"
case "$part" in all|probe|tests|benchmark) shift || true ;; *) part=all ;; esac
start=$(date +%s)
if [ "$part" = probe ]; then  # no Jupyter packages needed
  py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
  results="${OUT:-benchmarks/results}"
  mkdir -p "$results"
  PYTHONPATH="$PWD" "$py" scripts/checkpoint_probe.py --json "$results/checkpoint-probe.json" "$@" 2>&1 \
    | tee "$results/checkpoint-probe.log"
  exit "${PIPESTATUS[0]}"
fi
. scripts/gpu-env.sh
status=0
extra=("$@")  # for the one part named
if [ "$part" = all ]; then
  "$py" scripts/checkpoint_probe.py --only follow-up --gib 2 --json "$results/checkpoint-probe.json" 2>&1 \
    | tee "$results/checkpoint-probe.log" || status=1
fi
if [ "$part" = all ] || [ "$part" = tests ]; then
  args=(); [ "$part" = tests ] && args=("${extra[@]}")
  "$py" -m pytest -m gpu -v -s -p no:cacheprovider -o addopts="" tests/test_gpu_suspend.py "${args[@]}" 2>&1 \
    | tee "$results/gpu-suspend-tests.log" || status=1
fi
if [ "$part" = all ] || [ "$part" = benchmark ]; then
  args=(--until $((start + ${SUSPEND_BUDGET_S:-450})))
  [ "$part" = benchmark ] && args=("${extra[@]}")
  "$py" benchmarks/suspend.py --json "$results/suspend.json" "${args[@]}" 2>&1 | tee "$results/suspend.log" \
    || status=1
fi
echo "gpu-suspend.sh $part: $(( $(date +%s) - start )) s"
exit $status
