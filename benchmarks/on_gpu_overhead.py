"""What `%%on_gpu` adds to a cell: a plain cell against the same cell under the magic, in one run.

    python benchmarks/on_gpu_overhead.py [--repeat 2000] [--json out.json]

Runs a real IPython shell. Cells are interleaved (plain, magic, plain, ...) so drift hits both.
On a machine without a GPU the magic takes its no-GPU path (runs the cell, warns); the table
says which path ran.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import statistics
import time


def measure(shell, cells: dict[str, str], repeat: int) -> dict[str, list[float]]:
    times = {name: [] for name in cells}
    for _ in range(repeat):
        for name, cell in cells.items():
            t0 = time.perf_counter()
            shell.run_cell(cell, store_history=False)
            times[name].append((time.perf_counter() - t0) * 1e6)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--json", default="benchmarks/results/on_gpu_overhead.json")
    args = ap.parse_args()

    from IPython.testing.globalipapp import get_ipython

    from gpuctx_jupyter.core import inventory

    shell = get_ipython()
    shell.run_line_magic("load_ext", "gpuctx")
    inv = inventory.take()
    gpu = bool(inv.devices)
    setup = "import torch\n" + ("torch.cuda.init(); torch.ones(1, device='cuda')" if gpu else "")
    shell.run_cell(setup)
    cells = {
        "plain cell": "x = 1",
        "%%on_gpu 0": "%%on_gpu 0\nx = 1",
        "%%on_gpu 0 --default": "%%on_gpu 0 --default\nx = 1",
        "%%on_gpu cuda:0": "%%on_gpu cuda:0\nx = 1",
    }
    with contextlib.redirect_stderr(io.StringIO()):
        measure(shell, cells, 50)  # warm caches
        times = measure(shell, cells, args.repeat)
    base = statistics.median(times["plain cell"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"case": name, "median_us": round(med, 1), "p90_us": round(statistics.quantiles(ts, n=10)[-1], 1),
                     "overhead_us": round(med - base, 1)})
    env = {
        "machine": platform.node(), "python": platform.python_version(),
        "gpu": inv.devices[0].record.name if gpu else f"none ({inv.no_gpu_reason()})",
        "torch": __import__("torch").__version__, "repeat": args.repeat,
        "path": "GPU (torch CUDA initialised)" if gpu else "no-GPU fallback",
    }
    print(f"%%on_gpu overhead — {env['gpu']}, torch {env['torch']}, {args.repeat} cells each, {env['path']}")
    print(f"{'case':<24}{'median µs':>12}{'p90 µs':>10}{'overhead µs':>14}")
    for r in rows:
        print(f"{r['case']:<24}{r['median_us']:>12}{r['p90_us']:>10}{r['overhead_us']:>14}")
    import os

    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"env": env, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
