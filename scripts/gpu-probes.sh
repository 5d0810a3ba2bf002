#!/usr/bin/env bash
# The warm-up's open questions on a GPU machine, in one command (about 7 minutes on an H200):
#
#   scripts/gpu-probes.sh          # from the repository root; results in $OUT (else benchmarks/results/)
#
# 1. scripts/probe-attention.py: the backend torch picks for a transformer's causal attention, and
#    whether its first-call cost comes back at a new shape or in another thread (the bf16
#    transformer's first training step: 145 ms against 144 after the warm-up, 2026-12-04).
# 2. scripts/probe-first-cell.py on compile_fresh (a graph no cache holds), unprofiled, 0, 15 and
#    100 s after the warm-up: whether inductor's compile workers — ready after a few seconds, shut
#    down after 60-90 s without a job — make the first compile slower than in-process (2.5 s
#    through the server against 1.6 s profiled right after the warm-up).
# 3. benchmarks/notebooks.py on compile_fresh, one run of cold, idle and restart: with the pool's
#    standbys as the cells start and end, dynamo's time per phase and what torch's allocator
#    reserves (idle used 6.2% more GPU memory than cold).
# Each step's whole output is in its own .log; the summary lines also go to probes.log. Exits 1
# when a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh  # py, results, PYTHONPATH
status=0
step() {  # step NAME FILTER COMMAND...: the command's output to NAME.log, FILTER's lines to probes.log
  local name="$1" filter="$2"; shift 2
  "$@" > "$results/$name.log" 2>&1 || { status=1; echo "$name failed (see $name.log):"; tail -5 "$results/$name.log"; }
  grep -E "$filter" "$results/$name.log" | tee -a "$results/probes.log"
}
step probe-attention '.' "$py" scripts/probe-attention.py --json "$results/probe-attention.json"
for wait in 0 15 100; do
  step "probe-compile-wait$wait" '^warm-up:|^after|^first run' "$py" scripts/probe-first-cell.py \
    benchmarks/notebooks/compile_fresh.ipynb --wait "$wait" --no-profile --json "$results/probe-compile-wait$wait.json"
done
step notebooks-compile-fresh '^compile_fresh|^ +restart|^notebooks —|standbys|RSS' "$py" benchmarks/notebooks.py \
  --notebooks compile_fresh --cases cold,idle,restart --repeat 1 --json "$results/notebooks-compile-fresh.json"
exit $status
