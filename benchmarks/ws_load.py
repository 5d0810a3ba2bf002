"""Load on a real jupyter_server from GPU-stream clients: 1 client, then many, then none.

    python benchmarks/ws_load.py [--seconds 60] [--clients 100] [--interval 1.0] [--json out.json]

Starts one real jupyter_server with gpuctx (loopback only), connects websocket clients to
/gpuctx/api/stream as the GPU panel does, and measures per phase the server process's CPU
(utime + stime over wall time), its RSS and thread count, and per client the snapshots received
against the count the asked rate allows (the first comes at once, then one per interval).
Phases: idle (baseline), 1 client, N clients, idle after they leave, then N clients and idle
once more: whether threads (the shared sampler's) go back to where they were, and whether memory
does, or at least stops growing from one round to the next.

Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time

import psutil
import websocket

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuctx_jupyter.core import inventory  # noqa: E402
from tests.harness.server import Server  # noqa: E402

MAX_CLIENTS = 500  # bounded: this is a load check, not a stress test


class Client(threading.Thread):
    """One stream client: counts the snapshots it receives until told to stop."""

    def __init__(self, srv: Server, interval: float, stop: threading.Event):
        super().__init__(daemon=True)
        self.srv, self.interval, self.stop = srv, interval, stop
        self.snapshots, self.hello, self.error = 0, None, None
        self.connected = threading.Event()

    def run(self):
        try:
            ws = websocket.create_connection(
                f"ws://127.0.0.1:{self.srv.port}/gpuctx/api/stream?interval={self.interval}",
                header=[f"Authorization: token {self.srv.token}"], timeout=30)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.connected.set()
            return
        self.connected.set()
        ws.settimeout(0.5)
        try:
            while not self.stop.is_set():
                try:
                    msg = json.loads(ws.recv())
                except websocket.WebSocketTimeoutException:
                    continue
                if msg["type"] == "hello":
                    self.hello = msg
                else:
                    self.snapshots += 1
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            ws.close()


def measure(proc: psutil.Process, seconds: float) -> dict:
    """Server CPU % over `seconds`, and its RSS and threads at the end."""
    c0, t0 = proc.cpu_times(), time.monotonic()
    time.sleep(seconds)
    c1, t1 = proc.cpu_times(), time.monotonic()
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    return {"seconds": round(t1 - t0, 2), "cpu_percent": round(100 * cpu / (t1 - t0), 2),
            "rss_mib": round(proc.memory_info().rss / 2**20, 1), "threads": proc.num_threads()}


def clients_phase(srv: Server, proc: psutil.Process, n: int, interval: float, seconds: float) -> dict:
    stop = threading.Event()
    clients = [Client(srv, interval, stop) for _ in range(n)]
    for c in clients:
        c.start()
    for c in clients:
        c.connected.wait(60)
    result = measure(proc, seconds)
    stop.set()
    for c in clients:
        c.join(10)
    counts = [c.snapshots for c in clients if not c.error]
    expected = int(seconds / interval) + 1  # one at once, then one per interval
    result.update({
        "clients": n, "errors": [c.error for c in clients if c.error][:5],
        "expected_per_client": expected,
        "per_client": {"min": min(counts, default=0), "median": statistics.median(counts) if counts else 0,
                       "max": max(counts, default=0)},
        "lost_per_client_max": max((expected - c for c in counts), default=expected),
    })
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each client phase (default 60)")
    ap.add_argument("--clients", type=int, default=100, help=f"clients in the many-client phase (at most {MAX_CLIENTS})")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between snapshots each client asks for")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "ws_load.json"))
    args = ap.parse_args()
    if not 1 <= args.clients <= MAX_CLIENTS:
        ap.error(f"--clients must be between 1 and {MAX_CLIENTS}")

    settle = min(10.0, args.seconds)
    with tempfile.TemporaryDirectory() as root:
        srv = Server(root, ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                            "--GpuctxServer.warm_policy=never"]).start()
        try:
            proc = psutil.Process(srv.proc.pid)
            srv.api("GET", "/gpuctx/api/devices")  # load everything a first request loads
            phases = {"idle before": measure(proc, settle)}
            phases["1 client"] = clients_phase(srv, proc, 1, args.interval, args.seconds)
            for round_ in ("", " again"):  # twice: memory kept once (allocator, caches) is no leak
                phases[f"{args.clients} clients{round_}"] = clients_phase(srv, proc, args.clients, args.interval, args.seconds)
                time.sleep(2)  # let the server notice the closed sockets
                phases[f"idle after{round_}"] = measure(proc, settle)
        finally:
            srv.stop()

    inv = inventory.take()
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "gpus": len(inv.devices), "no_gpu_reason": inv.no_gpu_reason()},
        "interval": args.interval, "seconds": args.seconds, "phases": phases,
    }
    rss = [phases[p]["rss_mib"] for p in ("idle before", "idle after", "idle after again")]
    result["rss_growth_mib"] = {"first round": round(rss[1] - rss[0], 1), "second round": round(rss[2] - rss[1], 1)}
    print_table(result)
    print(f"\nRSS after the clients left, over the one before: first round {result['rss_growth_mib']['first round']:+.1f} MiB, "
          f"second round {result['rss_growth_mib']['second round']:+.1f} MiB")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"\nwrote {args.json}")


def print_table(result: dict) -> None:
    phases = result["phases"]
    names = list(phases)
    rows = [
        ("server CPU", lambda p: f"{p['cpu_percent']:.2f} %"),
        ("server RSS", lambda p: f"{p['rss_mib']:.1f} MiB"),
        ("server threads", lambda p: str(p["threads"])),
        ("snapshots per client (min / median / max)",
         lambda p: f"{p['per_client']['min']} / {p['per_client']['median']:g} / {p['per_client']['max']}" if "clients" in p else "–"),
        ("expected per client", lambda p: str(p["expected_per_client"]) if "clients" in p else "–"),
        ("most lost by one client", lambda p: str(p["lost_per_client_max"]) if "clients" in p else "–"),
        ("client errors", lambda p: str(len(p["errors"])) if "clients" in p else "–"),
    ]
    m = result["machine"]
    print(f"GPU stream load: {result['seconds']:g} s per phase, interval {result['interval']:g} s, "
          f"{m['cpus']} CPUs, {m['gpus']} GPUs{' (' + m['no_gpu_reason'] + ')' if m['no_gpu_reason'] else ''}\n")
    table = [["", *names], *([label, *(cell(phases[n]) for n in names)] for label, cell in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for i, row in enumerate(table):
        print("| " + " | ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]) + " |")
        if i == 0:
            print("| " + " | ".join("-" * w for w in widths) + " |")

if __name__ == "__main__":
    main()
