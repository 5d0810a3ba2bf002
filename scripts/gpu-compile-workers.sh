#!/usr/bin/env bash
# inductor's compile workers warmed by the warm-up (kernel/warm/recipes/inductor.py), on a GPU
# machine, in one command of under 10 minutes on an H200:
#
#   scripts/gpu-compile-workers.sh [UNTIL_S]   # from the repository root; results in $OUT (else benchmarks/results/)
#
# 1. the warm-up's GPU tests (tests/test_gpu_warmup.py, those matching $TESTS_K where it is set: a
#    compile through the workers, an imports standby's workers ready ahead, no CUDA in them);
# 2. compile_fresh's compile cell in a fresh process 15 s after the warm-up (scripts/probe-first-cell.py),
#    once per name in $PROBES: warm15-* the warm-up as it is, nojobs-* without the workers' first
#    jobs, fresh-* then 3 more graphs never compiled before (the floor of a new graph's compile in
#    a warm process), profile-* the same under cProfile (what the first of them still pays beyond
#    the last), cold without a warm-up (default: warm15-1 warm15-2 warm15-3 nojobs-1 nojobs-2);
# 3. benchmarks/notebooks.py on compile_fresh (cold, idle, restart; repeated until UNTIL_S, default
#    240 s; 0 leaves it out).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh  # py, results, PYTHONPATH
status=0
"$py" -m pytest -m gpu -p no:cacheprovider -o addopts="" ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu_warmup.py 2>&1 \
  | tee "$results/gpu-tests-warmup.log" | tail -15 || status=1
nb=benchmarks/notebooks/compile_fresh.ipynb
for name in ${PROBES:-warm15-1 warm15-2 warm15-3 nojobs-1 nojobs-2}; do
  profile=(--no-profile)
  case "$name" in
    cold) args=(--no-warm) ;;
    nojobs*) args=(--wait 15 --no-first-jobs) ;;
    fresh*) args=(--wait 15 --fresh 3) ;;
    profile*) args=(--wait 15 --fresh 3 --top 40); profile=() ;;
    *) args=(--wait 15) ;;
  esac
  "$py" scripts/probe-first-cell.py "$nb" "${profile[@]}" --memory --json "$results/probe-compile-$name.json" "${args[@]}" \
    > "$results/probe-compile-$name.log" 2>&1 || { status=1; tail -5 "$results/probe-compile-$name.log"; }
  echo "== $name"; grep -E '^warm-up:|inductor.s workers|^after|^first run|never compiled' "$results/probe-compile-$name.log"
done
[ "${1:-240}" = 0 ] || "$py" benchmarks/notebooks.py --notebooks compile_fresh --cases cold,idle,restart --repeat 5 \
  --until "${1:-240}" --json "$results/notebooks-compile-fresh.json" 2>&1 | tail -25 || status=1
exit $status
