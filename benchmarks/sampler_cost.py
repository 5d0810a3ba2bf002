"""What watching the GPUs costs: gpuctx's sampler (+ one live monitor) against polling nvidia-smi.

    python benchmarks/sampler_cost.py [--seconds 30] [--interval 1.0] [--json out.json]

Ours: the process's one sampler thread reading NVML every `interval` s and feeding a GpuMonitor
widget; measured as CPU time of this process over the run, and the sampler thread's CPU time per
read. Baseline: `nvidia-smi --query-gpu=...` run every `interval` s (what a notebook cell polling
the GPU usually does), measured as its children's CPU time. Target: under 1% of one core at 1 s.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuctx_jupyter.core import inventory  # noqa: E402


def ours(seconds: float, interval: float) -> dict:
    from gpuctx_jupyter.core.sampler import Sampler
    from gpuctx_jupyter.kernel.monitor import GpuMonitor

    sampler = Sampler()
    costs = []
    token = sampler.subscribe(lambda s: costs.append(s.cost_s), interval)
    mon = GpuMonitor(interval=interval, sampler=sampler)
    cpu0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - t0
    mon.close()
    sampler.unsubscribe(token)
    return {"cpu_percent_of_one_core": 100 * cpu / wall, "samples": len(costs),
            "read_ms_median": 1000 * statistics.median(costs) if costs else None,
            "read_ms_max": 1000 * max(costs) if costs else None}


def baseline(seconds: float, interval: float) -> dict | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = "utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, check=False)
        n += 1
        time.sleep(max(0.0, interval - (time.monotonic() - t0) % interval))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_percent_of_one_core": 100 * cpu / (time.monotonic() - t0), "samples": n,
            "read_ms_median": 1000 * cpu / n if n else None, "read_ms_max": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--json", default="benchmarks/results/sampler_cost.json")
    args = ap.parse_args()
    inv = inventory.take()
    gpus = f"{len(inv.devices)} × {inv.devices[0].record.name}" if inv.devices else f"none ({inv.no_gpu_reason()})"
    rows = {"nvidia-smi every interval (baseline)": baseline(args.seconds, args.interval),
            "gpuctx sampler + monitor": ours(args.seconds, args.interval)}
    print(f"GPU sampling cost — GPUs: {gpus}; every {args.interval:g} s for {args.seconds:g} s")
    print(f"{'case':<40}{'% of one core':>15}{'samples':>9}{'ms/read':>10}{'max ms':>9}")
    for name, r in rows.items():
        if r is None:
            print(f"{name:<40}{'n/a (no nvidia-smi)':>15}")
            continue
        fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"{name:<40}{r['cpu_percent_of_one_core']:>15.3f}{r['samples']:>9}{fmt(r['read_ms_median']):>10}"
              f"{fmt(r['read_ms_max']):>9}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"gpus": gpus, "interval": args.interval, "seconds": args.seconds, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
