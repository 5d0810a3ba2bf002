#!/usr/bin/env bash
# torch.compile's first compile of a never-seen graph after the warm-up, on a GPU machine
# (about 4 minutes on an H200):
#
#   scripts/gpu-compile-probes.sh     # from the repository root; results in $OUT (else benchmarks/results/)
#
# 15 s after the warm-up (inductor's compile workers ready), compile_fresh's compile cell: by
# default; after the compile workers did a first job (1 kernel, 16 kernels); with compiles in the
# kernel's process (TORCHINDUCTOR_COMPILE_THREADS=1); and without the warm-up — each with torch's
# allocator after the warm-up, with cuBLAS's workspaces freed, and after the cells, and the host
# memory of the compile workers. Then scripts/probe-compile-thread.py: the first compile of a new
# graph after the warm-up's tiny compile in its own thread, in the main thread, or none (twice each).
# On 2026-12-04 the cell took 1.4-1.7 s in-process after the warm-up and 1.9-2.6 s once the workers
# were ready; 0.9 s after the main thread had compiled 16 kernels through the workers.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh  # py, results, PYTHONPATH
status=0
nb=benchmarks/notebooks/compile_fresh.ipynb
probe() {  # probe NAME ARGS...: one fresh process
  local name="$1"; shift
  echo "== $name" | tee -a "$results/compile-probes.log"
  "$py" scripts/probe-first-cell.py "$nb" --no-profile --memory --json "$results/$name.json" "$@" > "$results/$name.log" 2>&1 \
    || { status=1; tail -5 "$results/$name.log"; }
  grep -E '^warm-up:|^warmed|^after|^first run|^memory' "$results/$name.log" | tee -a "$results/compile-probes.log"
}
probe compile-default --wait 15
probe compile-warm16 --wait 15 --warm-workers 16
probe compile-warm1 --wait 15 --warm-workers 1
TORCHINDUCTOR_COMPILE_THREADS=1 probe compile-inprocess --wait 15
probe compile-cold --no-warm
for n in 1 2; do
  for where in thread main none; do
    "$py" scripts/probe-compile-thread.py --warm-in "$where" --json "$results/compile-thread-$where-$n.json" 2>&1 \
      | tail -1 | tee -a "$results/compile-probes.log" || status=1
  done
done
exit $status
