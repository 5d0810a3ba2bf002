"""Reliability under load and faults, against real jupyter_servers and real kernels (loopback only).

    python benchmarks/stress.py [--queries 2000] [--clients 50] [--restarts 20] [--rounds 200]
                                [--baseline DIR] [--only SCENARIO …] [--json out.json]

Each scenario starts a fresh server with gpuctx and counts what went wrong:
- queries: `--queries` GET /gpuctx/api/kernels/<id> of one idle kernel from `--clients`
  concurrent clients; replies other than "ok" are lost (target 0), with latencies;
- restarts: `--restarts` simultaneous POST /gpuctx/api/kernels/<id>/restart, without and with the
  warm pool: HTTP statuses, "Address already in use" in the log, and kernel processes left
  beyond the listed kernels and the pool's standbys once things settle;
- broken kernelspec: a pool kernelspec whose kernel exits at once, for 20 s: launches, and
  connection files left behind;
- stop with no kernel open: standby processes and connection files left after SIGTERM;
- activity: whether one GET /gpuctx/api/kernels/<id> of an idle kernel moves its last_activity;
- malformed trace: whether the server loads, and the statuses of /gpuctx/api/devices and /metrics;
- churn: `--rounds` sessions opened one after another while the pool's standbys are recycled every
  few seconds (pool_max_age), so that sessions meet standbys booting, ready and stopping: each
  session's first cell must run; dead kernels, HTTP 500s (gpuctx paths and jupyter_server's) and
  kernel processes left untracked once things settle (targets 0).

`--baseline DIR` runs every scenario a second time against another copy of the package (e.g.
`git archive <rev> gpuctx_jupyter gpuctx.py | tar -x -C DIR`), side by side. Every wait is
bounded. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.harness.server import Server  # noqa: E402

HEADER = json.dumps({"gpuctx_trace": 1, "recorded": "2026-11-30", "host": "stress", "interval": 1.0})
RECORD = {"nvml_index": 0, "uuid": "GPU-00000000-aaaa-bbbb-cccc-000000000000", "name": "NVIDIA H200",
          "pci_bus_id": "00000000:18:00.0", "compute_capability": [9, 0], "memory_total": 151397597184,
          "memory_used": 1073741824, "utilization": 0, "temperature": 30, "power_w": 100.0,
          "power_limit_w": 700.0, "processes": [], "mig_enabled": False, "mig_parent": None, "mig_index": None,
          "persistence_mode": True, "error": None}


class Run:
    """One server of one scenario, on one copy of the package, in a folder of its own."""

    def __init__(self, package: str, *args: str, env: dict | None = None):
        self.dir = tempfile.mkdtemp(prefix="gpuctx-stress-")
        self.runtime = os.path.join(self.dir, "runtime")
        env = {"PYTHONPATH": package, "JUPYTER_RUNTIME_DIR": self.runtime, **(env or {})}
        self.srv = Server(self.dir, ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                     "--MappingKernelManager.default_kernel_name=python3", *args], env=env)

    def __enter__(self) -> "Run":
        cwd = os.getcwd()
        os.chdir(self.dir)  # `python -m` puts the working folder first on sys.path: not ROOT
        try:
            self.srv.start(timeout=120)
        finally:
            os.chdir(cwd)
        return self

    def __exit__(self, *exc) -> None:
        self.srv.stop()

    def kernels(self) -> dict[int, str]:
        """Kernel processes under the server: PID -> connection file."""
        return self.srv.kernel_processes()

    def files(self) -> list[str]:
        return glob.glob(os.path.join(self.runtime, "kernel-*.json"))

    def wait(self, cond, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.2)
        return False

    def ready(self, kid: str, timeout: float = 90) -> bool:
        return self.wait(lambda: self.srv.api("GET", f"/gpuctx/api/kernels/{kid}")[1].get("status") == "ok", timeout)


def at_once(calls, workers: int) -> list:
    gate = threading.Barrier(min(len(calls), workers))

    def go(call):
        try:
            gate.wait(5)
        except threading.BrokenBarrierError:
            pass
        return call()

    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(go, calls))


def queries(package: str, n: int, clients: int) -> dict:
    with Run(package) as run:
        kid = run.srv.start_kernel()
        if not run.ready(kid):
            return {"error": "the kernel never answered"}

        def ask():
            t0 = time.perf_counter()
            try:
                code, body = run.srv.api("GET", f"/gpuctx/api/kernels/{kid}", timeout=30)
                status = body.get("status") if code == 200 else f"HTTP {code}"
            except Exception as exc:
                status = type(exc).__name__
            return status, time.perf_counter() - t0

        t0 = time.perf_counter()
        results = at_once([ask] * n, clients)
        wall = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for status, _ in results:
        counts[status] = counts.get(status, 0) + 1
    latencies = sorted(s for _, s in results)
    return {"queries": n, "clients": clients, "lost": n - counts.get("ok", 0), "statuses": counts,
            "wall_s": round(wall, 1), "per_s": round(n / wall, 1),
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p95_ms": round(1000 * latencies[int(0.95 * len(latencies)) - 1], 1)}


def pool_standbys(run) -> int:
    """Standbys the server's pool reports (the warm reserve and the imports standby): processes
    the kernel list rightly leaves out."""
    return len((run.srv.api("GET", "/gpuctx/api/devices")[1].get("pool") or {}).get("standbys") or [])


def restarts(package: str, n: int, pool: bool) -> dict:
    args = ["--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always"] if pool else []
    with Run(package, *args) as run:
        if pool and not run.wait(lambda: len(run.kernels()) >= 1, 90):
            return {"error": "no standby started"}
        kid = run.srv.start_kernel()
        run.ready(kid)
        if pool:
            run.wait(lambda: len(run.kernels()) >= 2, 90)  # the refill
        t0 = time.perf_counter()
        answers = at_once([lambda: run.srv.api("POST", f"/gpuctx/api/kernels/{kid}/restart", timeout=120)] * n, n)
        wall = time.perf_counter() - t0
        codes: dict[str, int] = {}
        for code, _ in answers:
            codes[str(code)] = codes.get(str(code), 0) + 1
        listed = lambda: len(run.srv.api("GET", "/api/kernels")[1])  # noqa: E731
        run.wait(lambda: len(run.kernels()) == listed() + pool_standbys(run), 60)
        time.sleep(2)  # and it stays so
        extra = len(run.kernels()) - listed() - pool_standbys(run)
        answers_after = run.srv.api("GET", f"/gpuctx/api/kernels/{kid}")[0]
        n_listed = listed()
        log = run.srv.log()
    return {"restarts": n, "pool": pool, "codes": codes, "wall_s": round(wall, 1), "kernels_listed": n_listed,
            "untracked_processes": extra, "address_in_use": log.count("Address already in use"),
            "kernel_query_after": answers_after}


def broken_kernelspec(package: str, seconds: float = 20) -> dict:
    data = tempfile.mkdtemp(prefix="gpuctx-stress-spec-")
    counter = os.path.join(data, "launches")
    folder = os.path.join(data, "kernels", "exits")
    os.makedirs(folder)
    with open(os.path.join(folder, "kernel.json"), "w") as fh:
        json.dump({"argv": [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('x'); sys.exit(3)",
                            counter, "ipykernel", "-f", "{connection_file}"],
                   "display_name": "exits", "language": "python"}, fh)
    with Run(package, "--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always",
             "--GpuctxServer.pool_kernelspecs=exits", env={"JUPYTER_PATH": data}) as run:
        time.sleep(seconds)
        files = len(run.files())
        snap = run.srv.api("GET", "/gpuctx/api/devices")[1]
        reason = ((snap.get("pool") or {}).get("kernelspecs") or {}).get("exits", {}).get("reason")
        warnings = sum(1 for line in run.srv.log().splitlines() if line.startswith("[W") and "pool" in line)
    launches = len(open(counter).read()) if os.path.exists(counter) else 0
    return {"seconds": seconds, "launches": launches, "connection_files_left": files,
            "pool_warning_lines": warnings, "status_reason": reason}


def stop_without_kernels(package: str) -> dict:
    with Run(package, "--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always") as run:
        run.wait(lambda: run.kernels(), 90)
        time.sleep(3)  # ready
        pids = list(run.kernels())
        run.srv.proc.send_signal(signal.SIGTERM)
        run.srv.proc.wait(30)
        time.sleep(2)
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        for pid in alive:  # do not leave them running after the measurement
            os.kill(pid, signal.SIGKILL)
        files = len(run.files())
    return {"standbys": len(pids), "processes_left": len(alive), "connection_files_left": files}


def activity(package: str) -> dict:
    with Run(package) as run:
        kid = run.srv.start_kernel()
        run.ready(kid)
        time.sleep(1.5)
        before = run.srv.api("GET", f"/api/kernels/{kid}")[1]["last_activity"]
        run.srv.api("GET", f"/gpuctx/api/kernels/{kid}")
        time.sleep(0.5)
        after = run.srv.api("GET", f"/api/kernels/{kid}")[1]["last_activity"]
    return {"last_activity_moved": before != after}


def malformed_trace(package: str) -> dict:
    folder = tempfile.mkdtemp(prefix="gpuctx-stress-trace-")
    out = {}
    kinds = {"no t": {"records": [RECORD]}, "newer field": {"t": 0.0, "records": [dict(RECORD, nvlink=1)]},
             "memory as a string": {"t": 0.0, "records": [dict(RECORD, memory_used="1 GiB")]}}
    for kind, sample in kinds.items():
        path = os.path.join(folder, kind.replace(" ", "-") + ".jsonl")
        with open(path, "w") as fh:
            fh.write(HEADER + "\n" + json.dumps({"t": 0.0, "records": [RECORD]}) + "\n" + json.dumps(sample) + "\n")
        try:
            with Run(package, f"--GpuctxServer.replay_trace={path}") as run:
                codes = [run.srv.api("GET", "/gpuctx/api/devices")[0] for _ in range(3)]
                time.sleep(1.5)  # a stream tick or two
                codes.append(run.srv.api("GET", "/gpuctx/api/devices")[0])
                try:
                    run.srv.text("/metrics")
                    metrics = 200
                except Exception as exc:
                    metrics = getattr(exc, "code", type(exc).__name__)
                log = run.srv.log()
                out[kind] = {"devices": sorted(set(codes)), "metrics": metrics,
                             "extension_loaded": "gpuctx_jupyter | extension was successfully loaded" in log,
                             "tracebacks": log.count("Traceback")}
        except Exception as exc:
            out[kind] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return out


def churn(package: str, rounds: int, max_age: float = 6.0) -> dict:
    notebook = {"cells": [{"cell_type": "code", "source": "import torch", "metadata": {}, "outputs": [],
                           "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    with Run(package, "--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always",
             f"--GpuctxServer.pool_max_age={max_age:g}") as run:
        with open(os.path.join(run.dir, "nb.ipynb"), "w") as fh:
            json.dump(notebook, fh)
        states: dict[str, int] = {}
        dead, http_500, adopted, slow = 0, 0, 0, []
        t_all = time.perf_counter()
        for i in range(rounds):
            pool = (run.srv.api("GET", "/gpuctx/api/devices")[1].get("pool") or {}).get("standbys") or []
            state = pool[0]["state"] if pool else "none"
            states[state] = states.get(state, 0) + 1
            t0 = time.perf_counter()
            code, model = run.srv.api("POST", "/api/sessions", {"path": "nb.ipynb", "type": "notebook",
                                                                "name": "nb.ipynb", "kernel": {"name": "python3"}})
            if code >= 500:
                http_500 += 1
                continue
            kid = model["kernel"]["id"]
            try:
                ks = run.srv.channels(kid)
                ok = ks.execute("1 + 1", timeout=60).text == "2"
                ks.close()
            except Exception:
                ok = False
            slow.append(time.perf_counter() - t0)
            view = run.srv.api("GET", f"/gpuctx/api/kernels/{kid}")
            http_500 += view[0] >= 500
            dead += not ok or view[1].get("status") == "dead"
            adopted += bool(view[1].get("pooled"))
            code, _ = run.srv.api("DELETE", f"/api/sessions/{model['id']}")
            http_500 += code >= 500
        wall = time.perf_counter() - t_all
        listed = lambda: len(run.srv.api("GET", "/api/kernels")[1])  # noqa: E731
        run.wait(lambda: len(run.kernels()) <= listed() + pool_standbys(run), 60)
        untracked = max(0, len(run.kernels()) - listed() - pool_standbys(run))
        log = run.srv.log()
    slow.sort()
    return {"rounds": rounds, "pool_max_age_s": max_age, "standby_state_at_open": states, "adopted": adopted,
            "dead_kernels": dead, "http_500": http_500, "untracked_processes": untracked,
            "tracebacks": log.count("Traceback"), "wall_s": round(wall, 1),
            "open_to_first_cell_p50_s": round(statistics.median(slow), 2) if slow else None,
            "open_to_first_cell_max_s": round(slow[-1], 2) if slow else None}


SCENARIOS = ("queries", "restarts", "restarts_pool", "broken_kernelspec", "stop_without_kernels", "activity",
             "malformed_trace", "churn")


def scenarios(package: str, args) -> dict:
    result = {}
    for name, run in [("queries", lambda: queries(package, args.queries, args.clients)),
                      ("restarts", lambda: restarts(package, args.restarts, pool=False)),
                      ("restarts_pool", lambda: restarts(package, args.restarts, pool=True)),
                      ("broken_kernelspec", lambda: broken_kernelspec(package)),
                      ("stop_without_kernels", lambda: stop_without_kernels(package)),
                      ("activity", lambda: activity(package)),
                      ("malformed_trace", lambda: malformed_trace(package)),
                      ("churn", lambda: churn(package, args.rounds))]:
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            result[name] = run()
        except Exception as exc:
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        result[name]["scenario_s"] = round(time.perf_counter() - t0, 1)
        print(f"  {name}: {json.dumps(result[name])}", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--restarts", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=200, help="sessions opened in the churn scenario")
    ap.add_argument("--baseline", help="a folder holding another copy of gpuctx_jupyter to compare with")
    ap.add_argument("--only", nargs="+", choices=SCENARIOS, help="run only these scenarios")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "stress.json"))
    args = ap.parse_args()
    runs = {"current": ROOT}
    if args.baseline:
        runs["baseline"] = os.path.abspath(args.baseline)
    result = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(), "runs": {}}
    for label, package in runs.items():
        print(f"{label} ({package}):", flush=True)
        result["runs"][label] = scenarios(package, args)
    print()
    print(f"{'scenario':<22} {'measure':<28} " + " ".join(f"{label:>14}" for label in runs))
    for scenario, measures in [("queries", ["lost", "p50_ms", "p95_ms", "per_s"]),
                               ("restarts", ["codes", "untracked_processes", "address_in_use"]),
                               ("restarts_pool", ["codes", "untracked_processes", "address_in_use"]),
                               ("broken_kernelspec", ["launches", "connection_files_left"]),
                               ("stop_without_kernels", ["processes_left", "connection_files_left"]),
                               ("activity", ["last_activity_moved"]),
                               ("churn", ["dead_kernels", "http_500", "untracked_processes", "adopted", "tracebacks"])]:
        for measure in measures:
            cells = [str(result["runs"][label].get(scenario, {}).get(measure, "—")) for label in runs]
            print(f"{scenario:<22} {measure:<28} " + " ".join(f"{c:>14}" for c in cells))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
