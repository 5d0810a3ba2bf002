#!/usr/bin/env bash
# Record the NVML trace the UI tests and the no-GPU demo replay (on a GPU machine, one command):
# a torch load that alternates busy and idle phases on every GPU while gpuctx records 90 s.
#
#   scripts/record-trace.sh [OUT]     # default tests/data/h200-trace.jsonl
#
# Needs torch with CUDA and NVML (nvidia-ml-py); gpuctx is imported from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's environment (`make setup`) when there is one, else python3; PYTHON overrides.
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
out="${1:-tests/data/h200-trace.jsonl}"
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
"$py" - <<'PY' &
import time, torch
devs = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
keep = [torch.empty(int((4 + 8 * i) * 2**30), dtype=torch.uint8, device=d) for i, d in enumerate(devs)]
x = [torch.randn(8192, 8192, device=d) for d in devs]
t0 = time.monotonic()
while time.monotonic() - t0 < 95:
    busy = int(time.monotonic() - t0) % 20 < 12  # 12 s busy, 8 s idle
    for xi in x:
        if busy:
            xi @ xi
    torch.cuda.synchronize() if busy else time.sleep(0.2)
PY
load=$!
sleep 3
"$py" -m gpuctx_jupyter.trace record --seconds 90 --interval 1 --out "$out"
wait $load || true
