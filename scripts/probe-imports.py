#!/usr/bin/env python3
"""Which imports start the CUDA driver, and what each costs, each in a fresh process.

    python3 scripts/probe-imports.py [--json OUT.json] [MODULE[,MODULE...] ...]

For the import-warm standby (docs/warm-plan.md): a standby may import ahead of time only what
leaves CUDA untouched — no context (nothing in nvidia-smi, 0 GPU memory) and, so that a notebook's
CUDA_VISIBLE_DEVICES still applies when it adopts the standby, not even the driver started
(cuInit). Per group of imports, in a fresh Python: seconds per import, whether the driver was
started afterwards (cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED until cuInit), whether
NVML lists the process on a GPU, its GPU memory and its RSS. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

GROUPS = ["torch", "torch,torch._dynamo,torch.optim", "torch,transformers", "torch,lightning",
          "torch,torch_geometric", "torch,timm", "torch,accelerate", "jax", "jax,jax.numpy", "cupy", "numba,numba.cuda"]

CHILD = r'''
import ctypes, json, os, sys, time
out = {"imports": {}}
for name in sys.argv[1].split(","):
    t0 = time.perf_counter()
    try:
        __import__(name)
        out["imports"][name] = round(time.perf_counter() - t0, 3)
    except Exception as exc:
        out["imports"][name] = f"{type(exc).__name__}: {exc}"
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int(0)
    code = cuda.cuDeviceGetCount(ctypes.byref(n))
    out["driver_started"] = code == 0  # 3: CUDA_ERROR_NOT_INITIALIZED
    out["cuDeviceGetCount"] = code
except OSError as exc:
    out["driver_started"] = None
    out["libcuda"] = str(exc)
try:
    import pynvml
    pynvml.nvmlInit()
    used = 0
    listed = False
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                listed = True
                used += p.usedGpuMemory or 0
    out["nvml_listed"], out["gpu_mib"] = listed, round(used / 2**20)
except Exception as exc:
    out["nvml"] = f"{type(exc).__name__}: {exc}"
with open(f"/proc/{os.getpid()}/status") as fh:
    rss = next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:"))
out["rss_mib"] = round(rss / 1024)
print(json.dumps(out))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("groups", nargs="*", default=GROUPS)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"{'imports':<36} {'seconds':>8} {'driver started':>15} {'in nvidia-smi':>14} {'GPU MiB':>8} {'RSS MiB':>8}")
    for group in args.groups:
        try:
            run = subprocess.run([sys.executable, "-c", CHILD, group], capture_output=True, text=True, timeout=180)
            row = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {"error": run.stderr[-400:]}
        except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            row = {"error": f"{type(exc).__name__}: {exc}"}
        row["group"] = group
        rows.append(row)
        secs = sum(v for v in row.get("imports", {}).values() if isinstance(v, float))
        failed = [k for k, v in row.get("imports", {}).items() if not isinstance(v, float)]
        print(f"{group:<36} {secs:>8.2f} {str(row.get('driver_started')):>15} {str(row.get('nvml_listed')):>14} "
              f"{str(row.get('gpu_mib')):>8} {str(row.get('rss_mib')):>8}"
              + (f"  not importable: {', '.join(failed)}" if failed else "") + (f"  {row['error']}" if "error" in row else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
