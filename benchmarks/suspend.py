"""Suspending an idle notebook's GPU (issue #28), through a real jupyter_server, as a user meets it:
print a table, write JSON.

    python benchmarks/suspend.py [--sizes 10,40] [--runs 3] [--cycles 20] [--cycle-gib 2]
                                 [--no-scenario] [--until EPOCH] [--json out.json]

Kernels are started through the server's sessions API and driven over the kernel websocket as
JupyterLab drives them (the scenario's notebooks import torch, so they are warmed as usual; the
others' cells import it themselves).

1. sizes: a notebook holding N GiB of live tensors. Side by side, the three ways to give those
   N GiB back: "Release cache" (frees only what torch cached: nothing here), Suspend (POST …/suspend;
   its GPU memory in NVML after, ≤ 1% of before is the target; then the next cell, which resumes
   the kernel and checksums the tensors: it should return within the restore time + 100 ms, on
   identical data), and shutting the kernel down and starting again (the variables are lost:
   re-created here by re-running the allocation, which for real work means recomputing it).
   Medians of --runs, and seconds per GiB.
2. cycles: --cycles suspend/resume cycles of one notebook in a row; the kernel's GPU memory (NVML),
   its resident host memory, the GPU's used memory and the host's MemAvailable after each, so that
   a leak shows as growth from the first cycle to the last.
3. scenario: the three-notebook out of memory of benchmarks/oom_demo.py (two idle holders of
   min(60 GiB, 43% of the GPU), one live, one cached; a third asks for 40 GiB more than is free):
   the explanation offers suspending the live holder; suspending it lets the allocation succeed,
   and once the third notebook is done the live holder's next cell finds its tensors identical.

--until (epoch seconds) skips what would not end by then (scripts/gpu-suspend.sh gives the whole
run a time budget); skipped parts are listed as such. Without a GPU it says so and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuctx_jupyter.contract import holders as holders_file  # noqa: E402
from gpuctx_jupyter.core import host_memory, inventory  # noqa: E402
from tests.harness.notebooks import notebook  # noqa: E402
from tests.harness.server import Server  # noqa: E402

GIB, MIB = 2**30, 2**20
HOLD = ("import torch, time\n"
        "xs = [torch.randn(2**28, device='cuda', generator=torch.Generator('cuda').manual_seed(i)) for i in range({n})]\n"
        "def checksum():\n"
        "    return sum(t.sum(dtype=torch.float64).item() for t in xs)\n"
        "s0 = checksum(); torch.cuda.synchronize(); print('held', len(xs))")
CHECK = ("t = time.perf_counter(); same = checksum() == s0; took = time.perf_counter() - t\n"
         "print('check', same, took)")
NOTE = re.compile(r"gpuctx: resumed this kernel.*? in ([\d.]+) s(?: \(restore ([\d.]+) s\))?")
RATES = {"suspend": 0.6, "resume": 0.3}  # s/GiB to plan with until measured (H200, issue #28)


def median(values):
    values = [v for v in values if isinstance(v, int | float)]
    return statistics.median(values) if values else None


class Bench:
    def __init__(self, srv: Server, until: float | None):
        self.srv, self.until = srv, until
        self.rates = dict(RATES)

    def fits(self, seconds: float) -> bool:
        return self.until is None or time.time() + seconds < self.until

    def kernel(self, path: str):
        kid = self.srv.start_kernel(path=path)
        ks = self.srv.channels(kid)
        ks.wait_ready(120)
        return kid, ks

    def settled(self, kid: str, timeout: float = 120) -> dict:
        """The kernel's answer once its warm-up is over (a running warm-up refuses a suspend)."""
        deadline = time.monotonic() + timeout
        answer: dict = {}
        while time.monotonic() < deadline:
            answer = self.srv.api("GET", f"/gpuctx/api/kernels/{kid}")[1] or {}
            if (answer.get("warmup") or {}).get("state") not in ("running", "planned"):
                return answer
            time.sleep(0.5)
        return answer

    def listed(self, ks, kernel_ids: list[str], timeout: float = 60) -> bool:
        """The holders file (as `ks`'s kernel reads it) lists these kernels with their figures, and
        the suspend route."""
        path = ks.execute("import os; print(os.environ.get('GPUCTX_HOLDERS', ''))").stdout.strip()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            parsed, _ = holders_file.read_holders({holders_file.HOLDERS: path})
            if parsed and parsed.suspend_url and set(kernel_ids) <= {k.id for k in parsed.kernels if k.memory}:
                return True
            time.sleep(0.5)
        return False

    def kernel_mib(self, kid: str) -> float:
        snap = self.srv.api("GET", "/gpuctx/api/devices")[1]
        return sum((p.get("used_memory") or 0) for d in snap["devices"] for p in d["processes"]
                   if (p.get("kernel") or {}).get("id") == kid) / MIB

    def wait_listed(self, kid: str, mib: float, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.kernel_mib(kid)
            if now >= mib:
                return now
            time.sleep(0.2)
        return self.kernel_mib(kid)

    def hold(self, path: str, n: int):
        kid, ks = self.kernel(path)
        self.settled(kid)
        r = ks.execute(HOLD.format(n=n), timeout=600)
        if r.reply.get("status") != "ok":
            raise RuntimeError(f"{path}: could not allocate {n} GiB: {r.stderr[-1500:]}")
        pid = int(ks.execute("import os; print(os.getpid())").stdout)
        self.wait_listed(kid, n * 1024)
        return kid, ks, pid

    def suspend(self, kid: str) -> tuple[int, dict, float]:
        t0 = time.perf_counter()
        code, answer = self.srv.api("POST", f"/gpuctx/api/kernels/{kid}/suspend", timeout=900)
        return code, answer or {}, time.perf_counter() - t0

    def check(self, ks) -> dict:
        """The next cell: resumes the kernel (when suspended) and checksums its tensors."""
        r = ks.execute(CHECK, timeout=900)
        note = NOTE.search(r.stdout)
        words = r.stdout.strip().splitlines()[-1].split() if r.stdout.strip() else []
        same = len(words) == 3 and words[0] == "check" and words[1] == "True"
        out = {"cell_s": r.seconds, "same": same, "checksum_s": float(words[2]) if same else None,
               "resume_s": float(note.group(1)) if note else None,
               "restore_s": float(note.group(2)) if note and note.group(2) else None, "stderr": r.stderr[-800:]}
        if out["restore_s"] is not None:  # what the next cell costs beyond the restore (its checksum included)
            out["over_restore_s"] = out["cell_s"] - out["restore_s"]
            if out["checksum_s"] is not None:  # and what the resume adds to it: without the cell's own work,
                out["added_s"] = out["over_restore_s"] - out["checksum_s"]  # which a running kernel pays too
        return out

    def close(self, kid: str, ks) -> float:
        ks.close()
        t0 = time.perf_counter()
        self.srv.api("DELETE", f"/api/kernels/{kid}")
        return time.perf_counter() - t0

    # -- 1. sizes ------------------------------------------------------------------------------------
    def size(self, n: int, runs: int) -> dict:
        out: dict = {"gib": n, "runs": []}
        kid, ks, pid = self.hold(f"hold-{n}.ipynb", n)
        out["nvml_held_mib"] = self.kernel_mib(kid)
        t0 = time.perf_counter()
        code, released = self.srv.api("POST", f"/gpuctx/api/kernels/{kid}/release")
        out["release"] = {"http": code, "seconds": time.perf_counter() - t0,
                          "released_total": (released or {}).get("released_total"),
                          "nvml_after_mib": self.kernel_mib(kid)}
        for i in range(runs):
            if i and not self.fits(n * (self.rates["suspend"] + self.rates["resume"]) + 10):
                out["skipped_runs"] = runs - i
                break
            before = self.kernel_mib(kid)
            code, answer, wall = self.suspend(kid)
            run = {"http": code, "route_s": wall, "nvml_before_mib": before, "nvml_after_mib": self.kernel_mib(kid),
                   "steps": answer.get("steps"), "moved_total": answer.get("moved_total"),
                   "host_rss": answer.get("host_rss"), "error": answer.get("message")}
            run.update(self.check(ks))
            run["nvml_resumed_mib"] = self.kernel_mib(kid)
            out["runs"].append(run)
            if code == 200 and run.get("restore_s"):
                self.rates["suspend"] = (answer.get("steps") or {}).get("checkpoint", wall) / n
                self.rates["resume"] = run["restore_s"] / n
        # the baseline that loses the variables: shut down, start again, re-create the tensors
        t0 = time.perf_counter()
        out["shutdown_s"] = self.close(kid, ks)
        kid2, ks2, _ = self.hold(f"hold-{n}-again.ipynb", n)
        out["restart_and_recreate_s"] = time.perf_counter() - t0
        self.close(kid2, ks2)
        ok_runs = [r for r in out["runs"] if r["http"] == 200]
        out["median"] = {
            "suspend_s": median([(r["steps"] or {}).get("lock", 0) + (r["steps"] or {}).get("checkpoint", 0)
                                 for r in ok_runs]),
            "route_s": median([r["route_s"] for r in ok_runs]),
            "restore_s": median([r.get("restore_s") for r in ok_runs]),
            "next_cell_s": median([r["cell_s"] for r in ok_runs]),
            "over_restore_s": median([r.get("over_restore_s") for r in ok_runs]),
            "added_s": median([r.get("added_s") for r in ok_runs]),
            "nvml_after_fraction": median([r["nvml_after_mib"] / r["nvml_before_mib"] for r in ok_runs
                                           if r["nvml_before_mib"]]),
        }
        m = out["median"]
        out["per_gib"] = {"suspend_s": m["suspend_s"] / n if m["suspend_s"] else None,
                          "restore_s": m["restore_s"] / n if m["restore_s"] else None}
        out["checks"] = {
            "every suspend answered 200": len(ok_runs) == len(out["runs"]) and bool(ok_runs),
            "NVML after suspend ≤ 1% of before": all(r["nvml_after_mib"] <= 0.01 * r["nvml_before_mib"] for r in ok_runs),
            "identical data after every resume": all(r["same"] for r in out["runs"]),
            "next cell within restore + 100 ms, beyond its own checksum": bool(ok_runs) and all(
                r.get("added_s") is not None and r["added_s"] <= 0.1 for r in ok_runs),
        }
        return out

    # -- 2. cycles -----------------------------------------------------------------------------------
    def cycles(self, count: int, n: int) -> dict:
        kid, ks, pid = self.hold("cycles.ipynb", n)
        rows = []
        for i in range(count):
            if not self.fits(n * (self.rates["suspend"] + self.rates["resume"]) + 5):
                break
            code, answer, wall = self.suspend(kid)
            suspended_rss = _rss(pid)
            check = self.check(ks)
            rows.append({"cycle": i + 1, "http": code, "route_s": wall, "steps": answer.get("steps"),
                         "same": check["same"], "cell_s": check["cell_s"], "restore_s": check.get("restore_s"),
                         "kernel_nvml_mib": self.kernel_mib(kid), "rss_suspended_mib": suspended_rss,
                         "rss_mib": _rss(pid), "gpu_used_mib": _gpu_used_mib(),
                         "mem_available_mib": _available_mib()})
        self.close(kid, ks)
        first, last = (rows[0], rows[-1]) if rows else ({}, {})
        growth = {k: (last.get(k) or 0) - (first.get(k) or 0) for k in ("kernel_nvml_mib", "rss_mib", "gpu_used_mib")}
        return {"gib": n, "asked": count, "rows": rows, "growth_first_to_last": growth,
                "checks": {"every cycle ok and identical": bool(rows) and all(r["http"] == 200 and r["same"] for r in rows),
                           "all cycles ran": len(rows) == count,
                           "no GPU memory leaked (≤ 64 MiB)": abs(growth["kernel_nvml_mib"]) <= 64
                           and growth["gpu_used_mib"] <= 64,
                           "no host memory leaked (≤ 256 MiB RSS)": growth["rss_mib"] <= 256}}

    # -- 3. the three-notebook out of memory -----------------------------------------------------------
    def scenario(self) -> dict:
        record = inventory.take().by_ordinal(0).record
        hold = min(60 * GIB, int(0.43 * record.memory_total) // GIB * GIB)
        extra = min(40 * GIB, hold * 2 // 3 // GIB * GIB)
        out: dict = {"hold": hold, "extra": extra}
        live, live_ks, _ = self.hold("holder_live.ipynb", hold // GIB)
        cache, cache_ks = self.kernel("holder_cache.ipynb")
        self.settled(cache)
        r = cache_ks.execute(f"import torch\nx = torch.empty({hold}, dtype=torch.uint8, device='cuda'); x.fill_(1); del x\n"
                             "keep = 'my variable'", timeout=300)
        train, train_ks = self.kernel("train.ipynb")
        self.settled(train)
        try:
            if r.reply.get("status") != "ok":
                raise RuntimeError(f"holder_cache could not allocate: {r.stderr[-1500:]}")
            self.wait_listed(cache, hold / MIB)
            out["holders_listed"] = self.listed(train_ks, [live, cache])
            oom = train_ks.execute("import torch\nfree, total = torch.cuda.mem_get_info()\n"
                                   f"need = free + {extra}\ny = torch.empty(need, dtype=torch.uint8, device='cuda')",
                                   timeout=300)
            text = oom.stderr
            block = text[text.find("gpuctx: torch ran out of memory"):].strip() if "ran out of memory" in text else ""
            fixes = block[block.find("fixes, best first:"):].splitlines()[1:] if "fixes, best first:" in block else []
            suspend_at = next((i for i, f in enumerate(fixes) if "suspend holder_live.ipynb (" in f), None)
            shutdown_at = next((i for i, f in enumerate(fixes) if "shut down holder_live.ipynb" in f), None)
            code, answer, wall = self.suspend(live)
            retry = train_ks.execute("y = torch.empty(need, dtype=torch.uint8, device='cuda'); y.fill_(2)\n"
                                     "torch.cuda.synchronize(); print(y.numel() == need)\n"
                                     "del y; torch.cuda.empty_cache()", timeout=300)
            back = self.check(live_ks)
            kept = cache_ks.execute("print(keep)").stdout.strip()
            out.update(explanation=block, suspend={"http": code, "route_s": wall, "moved_total": answer.get("moved_total"),
                                                   "steps": answer.get("steps"), "error": answer.get("message")},
                       retry={"status": retry.reply.get("status"), "stdout": retry.stdout, "stderr": retry.stderr[-800:]},
                       resumed=back)
            out["checks"] = {
                "the holders file lists both holders": out["holders_listed"],
                "out of memory": oom.reply.get("ename") == "OutOfMemoryError",
                "suspend holder_live offered": suspend_at is not None,
                "ranked above shutting it down": suspend_at is not None and (shutdown_at is None or suspend_at < shutdown_at),
                "suspend answered 200": code == 200,
                "the allocation then succeeds": retry.reply.get("status") == "ok" and "True" in retry.stdout,
                "holder_live's tensors identical after it resumes": back["same"],
                "holder_cache's variables untouched": kept == "my variable",
            }
        finally:
            for kid, ks in ((live, live_ks), (cache, cache_ks), (train, train_ks)):
                self.close(kid, ks)
        return out


def save(out: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)


def _available_mib() -> float:
    mem = host_memory.available()
    return mem.available / MIB if mem else 0.0


def _rss(pid: int) -> float | None:
    rss = host_memory.rss(pid)
    return None if rss is None else rss / MIB


def _gpu_used_mib() -> float | None:
    device = inventory.take().by_ordinal(0)
    return device.record.memory_used / MIB if device and device.record.memory_used is not None else None


def _f(value, unit: str = "s", digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f} {unit}"


def print_tables(out: dict) -> None:
    for size in out.get("sizes", []):
        n, m = size["gib"], size["median"]
        print(f"\n{n} GiB of live tensors in one notebook (medians of {len(size['runs'])} runs):")
        print(f"  {'how the GPU memory is given back':<38}{'GPU memory after':>18}{'to free':>10}{'to get it back':>16}"
              f"  variables")
        rel = size["release"]
        print(f"  {'Release cache (baseline)':<38}{_f(rel['nvml_after_mib'] / 1024, 'GiB', 1):>18}"
              f"{_f(rel['seconds']):>10}{'–':>16}  kept")
        frac = m["nvml_after_fraction"]
        print(f"  {'Suspend (gpuctx)':<38}{(f'{frac:.2%} of before' if frac is not None else '–'):>18}"
              f"{_f(m['route_s']):>10}{_f(m['next_cell_s']):>16}  kept")
        print(f"  {'Shut down, start again (baseline)':<38}{'0':>18}{_f(size['shutdown_s']):>10}"
              f"{_f(size['restart_and_recreate_s']):>16}  lost (re-created)")
        print(f"  suspend {_f(size['per_gib']['suspend_s'], 's/GiB', 3)}, restore {_f(size['per_gib']['restore_s'], 's/GiB', 3)};"
              f" next cell − restore: {_f((m['over_restore_s'] or 0) * 1000, 'ms', 0)} (its checksum included),"
              f" {_f((m['added_s'] or 0) * 1000, 'ms', 0)} beyond its checksum")
        for name, ok in size["checks"].items():
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    cyc = out.get("cycles")
    if cyc:
        print(f"\n{len(cyc['rows'])} suspend/resume cycles of a {cyc['gib']} GiB notebook: growth first → last "
              + ", ".join(f"{k} {v:+.1f}" for k, v in cyc["growth_first_to_last"].items()))
        for name, ok in cyc["checks"].items():
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    sc = out.get("scenario")
    if sc and "checks" in sc:
        print(f"\nthree notebooks, two idle holders of {sc['hold'] / GIB:.0f} GiB, a third asks {sc['extra'] / GIB:.0f} GiB "
              f"more than is free: suspend of the live holder {_f(sc['suspend']['route_s'])}")
        for name, ok in sc["checks"].items():
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for skipped in out.get("skipped", []):
        print(f"\nskipped: {skipped}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,40", help="GiB of live tensors, comma-separated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--cycle-gib", type=int, default=2)
    ap.add_argument("--no-scenario", action="store_true", help="leave out the three-notebook out of memory")
    ap.add_argument("--until", type=float, help="epoch seconds by which to be done (what would not fit is skipped)")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "suspend.json"))
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    inv = inventory.take()
    out: dict = {"host": platform.node(), "time": time.time(), "args": vars(args), "sizes": [], "skipped": []}
    reason = inv.no_gpu_reason()
    if reason:
        out["reason"] = reason
        print(f"suspend benchmark: no GPU: {reason}")
        save(out, args.json)
        return 2
    record = inv.by_ordinal(0).record
    out.update(gpu=record.name, memory_total=record.memory_total)
    root = tempfile.mkdtemp(prefix="gpuctx-suspend-bench-")
    for name in ("holder_live", "holder_cache", "train"):  # as in benchmarks/oom_demo.py
        notebook(Path(root) / f"{name}.ipynb", ["import torch"])
    # No warm reserve: a standby's GPU memory and warm-up would be part of every figure.
    srv = Server(root, ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                        "--MappingKernelManager.default_kernel_name=python3", "--GpuctxServer.pool_size=0"])
    srv.start(timeout=120)
    bench = Bench(srv, args.until)
    t_start = time.monotonic()
    try:
        support = srv.api("GET", "/gpuctx/api/devices")[1].get("suspend")
        deadline = time.monotonic() + 60
        while support and support["reason"].startswith("asking") and time.monotonic() < deadline:
            time.sleep(0.2)
            support = srv.api("GET", "/gpuctx/api/devices")[1].get("suspend")
        out["support"] = support
        if not (support or {}).get("available"):
            print(f"suspend is not available on this server: {(support or {}).get('reason')}")
            return 1
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        # In the order that keeps the most targets when --until cuts the run short: the first size,
        # the cycles, the scenario, then the larger sizes (their repetitions go first).
        if sizes:
            out["sizes"].append(bench.size(sizes[0], args.runs))
            save(out, args.json)
        if args.cycles:
            out["cycles"] = bench.cycles(args.cycles, args.cycle_gib)
            if len(out["cycles"]["rows"]) < args.cycles:
                out["skipped"].append(f"cycles {len(out['cycles']['rows']) + 1}–{args.cycles}: not enough time left")
            save(out, args.json)
        if not args.no_scenario:
            if bench.fits(120 * (bench.rates["suspend"] + bench.rates["resume"]) / 2 + 60):
                out["scenario"] = bench.scenario()
            else:
                out["skipped"].append("the three-notebook scenario: not enough time left before --until")
            save(out, args.json)
        for n in sizes[1:]:
            if not bench.fits(n * (bench.rates["suspend"] + bench.rates["resume"]) + 30):
                out["skipped"].append(f"{n} GiB: not enough time left before --until")
                continue
            out["sizes"].append(bench.size(n, args.runs))
            save(out, args.json)
    finally:
        srv.stop()
        out["seconds"] = time.monotonic() - t_start
        save(out, args.json)
    print_tables(out)
    print(f"\nwrote {args.json} ({out['seconds']:.0f} s)")
    checks = [ok for part in (*out["sizes"], out.get("cycles") or {}, out.get("scenario") or {})
              for ok in (part.get("checks") or {}).values()]
    return 0 if checks and all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
