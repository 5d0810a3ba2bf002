"""Load on a real jupyter_server from GPU-stream clients: 1 client, then many, then none — the
stream without the GPU history and with it, side by side in one run.

    python benchmarks/ws_load.py [--seconds 60] [--clients 100] [--interval 1.0]
                                 [--replay tests/data/h200-trace.jsonl] [--json out.json]

Starts a real jupyter_server with gpuctx (loopback only) per configuration, connects websocket
clients to /gpuctx/api/stream as the GPU panel does, and measures per phase the server process's
CPU (utime + stime over wall time), its RSS and thread count, and per client the snapshots
received against the count the asked rate allows (the first comes at once, then one per
interval). Phases: idle (baseline), 1 client, N clients, idle after they leave, then N clients and
idle once more: whether threads (the shared sampler's) go back to where they were, and whether
memory does, or at least stops growing from one round to the next.

Configurations: "no history" (`c.GpuctxServer.history_seconds = 0`, clients ask for none: the
stream as it was before the history) and "history" (the default hour, each client asking for the
panel's 2 minutes when it connects, `?history=120`, as the panel does). With `--replay`, both
servers replay a recorded trace, so that snapshots and the history carry GPUs on a machine
without one.

Also measures the history itself, in this process: an hour of 8 GPUs with 3 notebooks each, its
memory (the preallocated arrays, and every Python allocation, by tracemalloc) and what building a
client's first message costs.

Prints tables and writes JSON.
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
    """One stream client: counts the snapshots (and history messages) it receives until told to stop."""

    def __init__(self, srv: Server, interval: float, stop: threading.Event, history: float = 0):
        super().__init__(daemon=True)
        self.srv, self.interval, self.stop, self.history = srv, interval, stop, history
        self.snapshots, self.histories, self.hello, self.error = 0, 0, None, None
        self.connected = threading.Event()

    def run(self):
        query = f"interval={self.interval}" + (f"&history={self.history:g}" if self.history else "")
        try:
            ws = websocket.create_connection(f"ws://127.0.0.1:{self.srv.port}/gpuctx/api/stream?{query}",
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
                elif msg["type"] == "history":
                    self.histories += 1
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


def clients_phase(srv: Server, proc: psutil.Process, n: int, interval: float, seconds: float,
                  history: float = 0) -> dict:
    stop = threading.Event()
    clients = [Client(srv, interval, stop, history) for _ in range(n)]
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
        "histories_per_client": max((c.histories for c in clients), default=0),
    })
    return result


def run_config(name: str, server_args: list[str], history: float, args) -> dict:
    """Every phase against one server; with history, also what the server keeps at the end."""
    settle = min(10.0, args.seconds)
    with tempfile.TemporaryDirectory() as root:
        srv = Server(root, ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                            "--GpuctxServer.warm_policy=never", *server_args]).start()
        try:
            proc = psutil.Process(srv.proc.pid)
            srv.api("GET", "/gpuctx/api/devices")  # load everything a first request loads
            phases = {"idle before": measure(proc, settle)}
            phases["1 client"] = clients_phase(srv, proc, 1, args.interval, args.seconds, history)
            for round_ in ("", " again"):  # twice: memory kept once (allocator, caches) is no leak
                phases[f"{args.clients} clients{round_}"] = clients_phase(srv, proc, args.clients, args.interval,
                                                                          args.seconds, history)
                time.sleep(2)  # let the server notice the closed sockets
                phases[f"idle after{round_}"] = measure(proc, settle)
            kept = None
            if history:
                status, body = srv.api("GET", "/gpuctx/api/history?seconds=3600")
                gpus = (body or {}).get("gpus", {})
                kept = {"status": status, "gpus": len(gpus),
                        "rows_per_gpu": max((len(g["t"]) for g in gpus.values()), default=0),
                        "message_kib": round(len(json.dumps(body)) / 1024, 1)}
        finally:
            srv.stop()
    rss = [phases[p]["rss_mib"] for p in ("idle before", "idle after", "idle after again")]
    return {"name": name, "server_args": server_args, "client_history": history, "phases": phases, "kept": kept,
            "rss_growth_mib": {"first round": round(rss[1] - rss[0], 1), "second round": round(rss[2] - rss[1], 1)}}


def history_memory(gpus: int = 8, seconds: float = 3600.0, kernels: int = 3) -> dict:
    """An hour of `gpus` GPUs at 1 Hz (fed two hours: the first is folded and dropped), each with
    `kernels` notebooks holding memory that changes every minute: what the history holds, and
    what a client's first message costs to build."""
    import tracemalloc

    from gpuctx_jupyter.server.history import GpuHistory

    start = time.time() - 2 * seconds
    clock = [start]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    history = GpuHistory(seconds, clock=lambda: clock[0])
    for s in range(int(2 * seconds)):
        clock[0] = start + s
        devices = [{"uuid": f"GPU-{i}", "ordinal": i, "utilization": (s + i) % 100, "memory_used": (10 + i) * 2**30,
                    "memory_total": 141 * 2**30, "temperature": 40 + i, "power_w": 300.0 + s % 50,
                    "processes": [{"pid": 100 + k, "used_memory": (k + 1) * 2**30 + (s // 60) * 2**20,
                                   "kernel": {"id": f"kernel-{i}-{k}", "paths": [f"notebook{k}.ipynb"]}}
                                  for k in range(kernels)]} for i in range(gpus)]
        history.add_snapshot({"gpu": True, "time": clock[0], "devices": devices}, 1.0)
        if s % 2 == 0:
            history.add_host(clock[0], {"cpu_percent": 12.0, "memory_used": 8e9, "memory_total": 64e9}, 2.0)
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    messages = {}
    for span in (120, 3600):
        t0 = time.perf_counter()
        text = history.message(span)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        history.message(span)  # the next client in the same second gets it from the cache
        messages[span] = {"build_ms": round(built * 1000, 1), "kib": round(len(text) / 1024, 1),
                          "cached_ms": round((time.perf_counter() - t0) * 1000, 3)}
    return {"gpus": gpus, "seconds": seconds, "kernels_per_gpu": kernels,
            "arrays_kib": round(history.nbytes / 1024, 1), "traced_kib": round(traced / 1024, 1),
            "rows_per_gpu": len(history.window(seconds)["gpus"]["GPU-0"]["t"]),
            "message_2min": messages[120], "message_1h": messages[3600]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each client phase (default 60)")
    ap.add_argument("--clients", type=int, default=100, help=f"clients in the many-client phase (at most {MAX_CLIENTS})")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between snapshots each client asks for")
    ap.add_argument("--replay", default=None, help="replay this recorded trace in the servers (GPUs without a GPU)")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "ws_load.json"))
    args = ap.parse_args()
    if not 1 <= args.clients <= MAX_CLIENTS:
        ap.error(f"--clients must be between 1 and {MAX_CLIENTS}")

    replay = [f"--GpuctxServer.replay_trace={os.path.abspath(args.replay)}"] if args.replay else []
    configs = [run_config("no history", [*replay, "--GpuctxServer.history_seconds=0"], 0, args),
               run_config("history", replay, 120, args)]
    inv = inventory.take()
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "gpus": len(inv.devices), "no_gpu_reason": inv.no_gpu_reason()},
        "interval": args.interval, "seconds": args.seconds, "replay": args.replay, "configs": configs,
        "history_memory": history_memory(),
    }
    busy = f"{args.clients} clients"
    base, ours = (c["phases"][busy]["cpu_percent"] + c["phases"][f"{busy} again"]["cpu_percent"] for c in configs)
    result["cpu_with_history_over_without"] = round(ours / base, 3) if base else None
    for c in configs:
        print_table(result, c)
        print(f"\nRSS after the clients left, over the one before: first round {c['rss_growth_mib']['first round']:+.1f} "
              f"MiB, second round {c['rss_growth_mib']['second round']:+.1f} MiB\n")
    ratio = result["cpu_with_history_over_without"]
    print(f"server CPU with {args.clients} clients (mean of both rounds): no history {base / 2:.2f} %, "
          f"history {ours / 2:.2f} %" + (f" ({ratio:.2f}×)" if ratio else ""))
    if configs[1]["kept"]:
        print(f"the server's history at the end: {configs[1]['kept']}")
    m = result["history_memory"]
    print(f"\nhistory of {m['gpus']} GPUs × {m['seconds'] / 3600:g} h, {m['kernels_per_gpu']} notebooks each: arrays "
          f"{m['arrays_kib']:.0f} KiB, every allocation {m['traced_kib']:.0f} KiB, {m['rows_per_gpu']} rows per GPU; "
          f"first message for 2 min {m['message_2min']['kib']:.0f} KiB built in {m['message_2min']['build_ms']:.0f} ms, "
          f"for 1 h {m['message_1h']['kib']:.0f} KiB in {m['message_1h']['build_ms']:.0f} ms (from the cache: "
          f"{m['message_1h']['cached_ms']:.3f} ms)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"\nwrote {args.json}")


def print_table(result: dict, config: dict) -> None:
    phases = config["phases"]
    names = list(phases)
    rows = [
        ("server CPU", lambda p: f"{p['cpu_percent']:.2f} %"),
        ("server RSS", lambda p: f"{p['rss_mib']:.1f} MiB"),
        ("server threads", lambda p: str(p["threads"])),
        ("snapshots per client (min / median / max)",
         lambda p: f"{p['per_client']['min']} / {p['per_client']['median']:g} / {p['per_client']['max']}" if "clients" in p else "–"),
        ("expected per client", lambda p: str(p["expected_per_client"]) if "clients" in p else "–"),
        ("most lost by one client", lambda p: str(p["lost_per_client_max"]) if "clients" in p else "–"),
        ("history messages per client", lambda p: str(p["histories_per_client"]) if "clients" in p else "–"),
        ("client errors", lambda p: str(len(p["errors"])) if "clients" in p else "–"),
    ]
    m = result["machine"]
    source = f"replaying {os.path.basename(result['replay'])}" if result.get("replay") else (
        f"{m['gpus']} GPUs" + (f" ({m['no_gpu_reason']})" if m["no_gpu_reason"] else ""))
    print(f"GPU stream load, {config['name']}: {result['seconds']:g} s per phase, interval {result['interval']:g} s, "
          f"{m['cpus']} CPUs, {source}\n")
    table = [["", *names], *([label, *(cell(phases[n]) for n in names)] for label, cell in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for i, row in enumerate(table):
        print("| " + " | ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]) + " |")
        if i == 0:
            print("| " + " | ".join("-" * w for w in widths) + " |")


if __name__ == "__main__":
    main()
