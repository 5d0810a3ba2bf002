#!/usr/bin/env bash
# The notebooks benchmark (benchmarks/notebooks.py) on a GPU machine: one stream per GPU side by
# side (stream i sees only GPU i, through CUDA_VISIBLE_DEVICES), each within a time limit, then one
# table of medians over every stream's runs and any earlier results named in $MERGE_WITH.
#
#   scripts/gpu-notebooks.sh UNTIL_S "notebooks of GPU 0" ["notebooks of GPU 1" ...]
#   e.g. scripts/gpu-notebooks.sh 300 mlp_adamw,transformer_bf16,heavy_imports
#
# No notebook starts after UNTIL_S; each stream is stopped at UNTIL_S + 120 s (a notebook's five
# plays take up to ~100 s on an H200) and keeps every notebook it finished (its JSON is written
# after each one), so the whole script ends by about UNTIL_S + 150 s: give a 10-minute command
# UNTIL_S <= 400. Streams side by side share the host's CPUs and disk: their runs are slower
# than one stream's (seen on 2 x H200), so compare like with like.
#
# Cases: $CASES (default cold,idle,runall,restart; `typed` plays a new notebook typed cell by cell,
# warming off / defaults / defaults with the cells sent as JupyterLab sends them: ~40 s per play
# of a 3-cell notebook, so ~2 min per notebook and repeat). Results: $OUT (else benchmarks/results/):
# notebooks-<stamp>-gpu<i>.json per stream and notebooks-merged.json. Set up as scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh  # py, results, PYTHONPATH
until_s="$1"; shift
stamp="$(date +%H%M%S)"
files=()
i=0
for notebooks in "$@"; do
  out="$results/notebooks-$stamp-gpu$i.json"
  CUDA_VISIBLE_DEVICES=$i timeout $((until_s + 120)) "$py" benchmarks/notebooks.py --notebooks "$notebooks" --cases "${CASES:-cold,idle,runall,restart}" \
    --repeat 10 --until "$until_s" --json "$out" > "$results/notebooks-$stamp-gpu$i.log" 2>&1 &
  files+=("$out")
  i=$((i + 1))
done
wait
for f in "${files[@]}"; do [ -f "$f" ] || echo "missing: $f (see its .log)"; done
existing=()
for f in "${files[@]}" ${MERGE_WITH:-}; do [ -f "$f" ] && existing+=("$f"); done
"$py" benchmarks/notebooks.py --merge "${existing[@]}" --json "$results/notebooks-merged.json"
