"""First GPU cell after a kernel start: cold against pre-warmed, through a real jupyter_server.

    python benchmarks/first_cell.py [--runs 5] [--idle 6] [--json out.json]

Starts two real jupyter_servers (warming off / on), starts kernels through the REST API and runs
cells over the kernel websocket as JupyterLab does. Per run and case:

  ready       POST /api/kernels -> kernel_info_reply
  first cell  the first GPU cell (import torch, a matmul and a conv on the GPU; on a machine
              without a GPU: `import torch; torch.ones(3)`), sent at once or after the user idles
  steady      the same cell again
  memory      GPU memory the kernel holds after its first cell (device used, minus before start)

Prints a table (median, min, max) and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuctx_jupyter.core import inventory  # noqa: E402
from tests.harness.server import Server  # noqa: E402

GPU_CELL = """import torch
x = torch.randn(1024, 1024, device="cuda"); y = x @ x
img = torch.randn(8, 3, 64, 64, device="cuda"); w = torch.randn(16, 3, 3, 3, device="cuda")
z = torch.nn.functional.conv2d(img, w, padding=1)
torch.cuda.synchronize(); float(y.sum() + z.sum())"""
CPU_CELL = "import torch; torch.ones(3)"


def device_used() -> int | None:
    inv = inventory.take()
    return sum(d.record.memory_used or 0 for d in inv.devices) if inv.devices else None


def one_run(srv: Server, cell: str, idle: float) -> dict:
    base = device_used()
    t0 = time.perf_counter()
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    ks.wait_ready()
    ready = time.perf_counter() - t0  # POST /api/kernels (which waits for the kernel) -> kernel_info_reply
    if idle:
        time.sleep(idle)
    first = ks.execute(cell)
    result_at = time.perf_counter() - t0 - idle
    if first.reply.get("status") != "ok":
        raise RuntimeError(f"first cell failed: {first.stderr[-2000:]}")
    time.sleep(0.5)  # let NVML's memory figure settle
    used = device_used()
    steady = ks.execute(cell)
    warm = ks.execute("import json; m = getattr(get_ipython(), '_gpuctx', None)\n"
                      "print(json.dumps(m.warmer.status.as_dict() if m else {}))")
    ks.close()
    srv.api("DELETE", f"/api/kernels/{kid}")
    time.sleep(1.0)  # the process and its context are gone before the next run
    return {"ready": ready, "first": first.seconds, "steady": steady.seconds, "start_to_result": result_at,
            "memory": None if used is None or base is None else used - base,
            "warmup": json.loads(warm.stdout.strip().splitlines()[-1]) if warm.stdout.strip() else {}}


def pooled_run(srv: Server, cell: str) -> dict:
    """New kernel and restart through a server with a warm pool: request -> first cell result."""
    wait_standby(srv)
    t0 = time.perf_counter()
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    first = ks.execute(cell)
    new = time.perf_counter() - t0
    if first.reply.get("status") != "ok":
        raise RuntimeError(f"first cell failed: {first.stderr[-2000:]}")
    wait_standby(srv)
    t0 = time.perf_counter()
    srv.api("POST", f"/api/kernels/{kid}/restart")
    again = ks.execute(cell)  # the same websocket, as JupyterLab keeps it
    restart = time.perf_counter() - t0
    pooled = "from gpuctx's warm pool" in ks.execute("%gpu status").text
    ks.close()
    srv.api("DELETE", f"/api/kernels/{kid}")
    return {"new_to_result": new, "restart_to_result": restart, "served_by_pool": pooled,
            "first": first.seconds, "after_restart": again.seconds}


def wait_standby(srv: Server, timeout: float = 120) -> None:
    """Until the pool holds a warmed standby (the server's hidden kernel processes)."""
    import psutil

    deadline = time.monotonic() + timeout
    listed = lambda: len(srv.api("GET", "/api/kernels")[1])  # noqa: E731
    while time.monotonic() < deadline:
        kernels = [c for c in psutil.Process(srv.proc.pid).children(recursive=True)
                   if any("ipykernel" in a for a in _cmdline(c))]
        if len(kernels) > listed():
            time.sleep(8)  # its warm-up (import torch, CUDA, first ops) is done by then
            return
        time.sleep(0.5)
    raise TimeoutError("the pool did not fill")


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except Exception:
        return []


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle", type=float, default=6.0, help="seconds the user waits before the first cell")
    ap.add_argument("--json", default="benchmarks/results/first_cell.json")
    ap.add_argument("--pool", action="store_true", help="also measure kernels served by the warm pool")
    args = ap.parse_args()

    gpu = bool(inventory.take().devices)
    cell = GPU_CELL if gpu else CPU_CELL
    root = tempfile.mkdtemp(prefix="gpuctx-bench-")
    common = ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True", "--MappingKernelManager.default_kernel_name=python3"]
    off = Server(root, [*common, "--GpuctxServer.warm_policy=never"]).start()
    on = Server(root, [*common, "--GpuctxServer.warm_policy=always"]).start()
    runs = {"cold": [], "warm, user idle": [], "warm, user at once": []}
    try:
        for i in range(args.runs):  # interleaved, so drift hits every case alike
            runs["cold"].append(one_run(off, cell, 0))
            runs["warm, user idle"].append(one_run(on, cell, args.idle))
            runs["warm, user at once"].append(one_run(on, cell, 0))
            print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
    finally:
        off.stop()
        on.stop()
    pooled = []
    if args.pool:
        pool = Server(root, [*common, "--GpuctxServer.warm_policy=always", "--GpuctxServer.pool_size=1"]).start()
        try:
            for i in range(args.runs):
                pooled.append(pooled_run(pool, cell))
                print(f"pool run {i + 1}/{args.runs} done", file=sys.stderr)
        finally:
            pool.stop()

    table = {case: {k: stats([r[k] for r in rs]) for k in ("ready", "first", "steady", "start_to_result", "memory")}
             for case, rs in runs.items()}
    env = {"gpu": inventory.take().devices[0].record.name if gpu else "none",
           "python": platform.python_version(), "torch": _torch_version(), "runs": args.runs, "idle_s": args.idle,
           "cell": "GPU matmul + conv" if gpu else CPU_CELL}
    print(f"\nfirst cell — {env['gpu']}, torch {env['torch']}, {args.runs} runs, cell: {env['cell']}")
    print(f"{'case':<22}{'metric':<22}{'median':>10}{'min':>10}{'max':>10}")
    for case, metrics in table.items():
        for name, s in metrics.items():
            if s is None:
                continue
            unit = (lambda v: f"{v / 2**20:.0f} MiB") if name == "memory" else (lambda v: f"{v * 1000:.0f} ms")
            print(f"{case:<22}{name:<22}{unit(s['median']):>10}{unit(s['min']):>10}{unit(s['max']):>10}")
    if pooled:
        print(f"{'warm pool':<22}{'new -> result':<22}" + "".join(
            f"{v * 1000:>8.0f} ms" for v in _mmm([r["new_to_result"] for r in pooled])))
        print(f"{'warm pool':<22}{'restart -> result':<22}" + "".join(
            f"{v * 1000:>8.0f} ms" for v in _mmm([r["restart_to_result"] for r in pooled])))
        print(f"served by the pool: {sum(r['served_by_pool'] for r in pooled)}/{len(pooled)} restarts")
        cold_total = stats([r["start_to_result"] for r in runs["cold"]])
        print(f"(cold new kernel -> result, for comparison: {cold_total['median'] * 1000:.0f} ms median)")
    for case in ("warm, user idle", "warm, user at once"):
        totals = [r["warmup"].get("total") for r in runs[case] if r["warmup"].get("total")]
        if totals:
            phases = {}
            for r in runs[case]:
                for k, v in r["warmup"].get("phases", {}).items():
                    phases.setdefault(k, []).append(v)
            shown = ", ".join(f"{k} {statistics.median(v) * 1000:.0f}" for k, v in phases.items())
            print(f"warm-up ({case}): total {statistics.median(totals) * 1000:.0f} ms median; phases ms: {shown}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"env": env, "table": table, "runs": runs, "pooled": pooled,
                   "pooled_table": {k: stats([r[k] for r in pooled]) for k in ("new_to_result", "restart_to_result")}
                   if pooled else None}, fh, indent=2)


def _mmm(values):
    return statistics.median(values), min(values), max(values)


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "not installed"


if __name__ == "__main__":
    main()
