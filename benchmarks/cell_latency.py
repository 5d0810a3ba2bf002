"""What a short cell's round trip costs through a real jupyter_server: the kernels' websockets as
jupyter_server leaves them (Nagle's algorithm on) against gpuctx's default (TCP_NODELAY,
`c.GpuctxServer.kernel_websocket_nodelay`), side by side in one run.

    python benchmarks/cell_latency.py [--cells 20] [--repeat 5] [--pause 1.0] [--json out.json]

Two servers with gpuctx loaded (warming and the pool off: nothing but the websocket differs), one
kernel each, driven over the kernel websocket as JupyterLab drives it. Per server and repeat:
- back to back: `x = 1` sent as soon as the previous cell's idle came (Shift+Enter in a row);
- after a pause: the same cell, `--pause` s after the previous one (a cell run by hand);
- a 30 ms cell back to back (work that takes time of its own);
- Run All: `--cells` short cells sent at once, the time to the last one's idle.
Each cell's time at the client (send → its idle status) and inside the kernel (ipykernel's
`started` to its reply). Servers alternate which plays first. Prints a table of medians and
writes JSON. No GPU needed: what is measured is the server's socket.
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
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.harness.server import KernelSocket, Server  # noqa: E402

SHORT, TIMED = "x = 1", "import time; time.sleep(0.03)"
CASES = ("back to back", "after a pause", "30 ms cell, back to back", "Run All")


def run_all(ks: KernelSocket, cells: int) -> float:
    """Send `cells` short cells at once; seconds until the last one's idle status."""
    t0 = time.perf_counter()
    ids = [ks.send("execute_request", {"code": SHORT, "silent": False, "store_history": True, "user_expressions": {},
                                       "allow_stdin": False, "stop_on_error": True}) for _ in range(cells)]
    last, deadline = ids[-1], time.monotonic() + 120
    while time.monotonic() < deadline:
        msg = json.loads(ks.ws.recv())
        if (msg.get("parent_header", {}).get("msg_id") == last and msg["msg_type"] == "status"
                and msg["content"].get("execution_state") == "idle"):
            return time.perf_counter() - t0
    raise TimeoutError("Run All did not finish")


def play(ks: KernelSocket, cells: int, pause: float) -> dict:
    def times(code, n, wait=0.0):
        out = []
        for _ in range(n):
            time.sleep(wait)
            r = ks.execute(code)
            out.append((r.seconds, r.in_kernel))
        return out
    return {"back to back": times(SHORT, cells), "after a pause": times(SHORT, max(3, cells // 4), pause),
            "30 ms cell, back to back": times(TIMED, max(3, cells // 4)), "Run All": [(run_all(ks, cells), None)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "cell_latency.json"))
    args = ap.parse_args()
    common = ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True", "--GpuctxServer.warm_policy=never",
              "--GpuctxServer.pool_size=0"]
    root = tempfile.mkdtemp(prefix="gpuctx-latency-")
    names = {"Nagle on (jupyter_server's websockets)": False, "TCP_NODELAY (gpuctx's default)": True}
    servers = {name: Server(root, [*common, f"--GpuctxServer.kernel_websocket_nodelay={on}"]).start()
               for name, on in names.items()}
    runs: dict[str, dict[str, list]] = {name: {case: [] for case in CASES} for name in names}
    try:
        sockets = {}
        for name, srv in servers.items():
            ks = KernelSocket(srv, srv.start_kernel())
            ks.wait_ready()
            ks.execute(SHORT)  # the kernel's first cell aside
            sockets[name] = ks
        for rep in range(args.repeat):
            order = list(servers) if rep % 2 == 0 else list(servers)[::-1]
            for name in order:
                for case, values in play(sockets[name], args.cells, args.pause).items():
                    runs[name][case] += values
            print(f"repeat {rep + 1}/{args.repeat} done", file=sys.stderr)
        for ks in sockets.values():
            ks.close()
    finally:
        for srv in servers.values():
            srv.stop()
    report(runs, args)


def ms(v):
    return "—" if v is None else f"{v * 1000:.1f}"


def report(runs: dict, args) -> None:
    table = {name: {case: {"client_ms": statistics.median(c for c, _ in vals) * 1000,
                           "in_kernel_ms": (statistics.median(k for _, k in vals if k is not None) * 1000
                                            if any(k is not None for _, k in vals) else None),
                           "n": len(vals)} for case, vals in cases.items()} for name, cases in runs.items()}
    print(f"\ncell latency through jupyter_server — {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"medians in ms (client: send → idle; in the kernel: started → reply)")
    print(f"{'case':<28}" + "".join(f"{name:>42}" for name in runs))
    for case in CASES:
        cells = []
        for name in runs:
            t = table[name][case]
            inner = "" if t["in_kernel_ms"] is None else f" (kernel {t['in_kernel_ms']:.1f})"
            label = f"{t['client_ms']:.1f}{inner}" + (f", {args.cells} cells" if case == "Run All" else "")
            cells.append(f"{label:>42}")
        print(f"{case:<28}" + "".join(cells))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"env": {"cpus": os.cpu_count(), "python": platform.python_version(), "cells": args.cells,
                           "repeat": args.repeat, "pause_s": args.pause, "id": uuid.uuid4().hex[:8],
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                   "table": table, "runs": runs}, fh, indent=2)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
