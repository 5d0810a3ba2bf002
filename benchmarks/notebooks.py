"""Real notebooks played as a user plays them, cold against warmed by their own plan, through a real jupyter_server.

    python benchmarks/notebooks.py [--notebooks mlp_adamw,cnn_sgd] [--cases cold,idle,runall,restart,cpu,typed]
                                   [--repeat 1] [--until SECONDS] [--idle 10] [--typed-lead 9] [--memory-history]
                                   [--json benchmarks/results/notebooks.json]
    python benchmarks/notebooks.py --merge a.json b.json [--json merged.json]   # runs of several, one table

`--until` starts no further notebook once that many seconds have passed (a GPU machine's command
limit); `--merge` pools the runs of earlier results (other machines of the same kind, or GPUs of
one machine run side by side with CUDA_VISIBLE_DEVICES) and prints medians over all of them.

Three servers on one root holding every notebook: warming off (`--GpuctxServer.warm_policy=never`),
the defaults (policy auto, the `notebook` recipe, the import-warm standby: its import profile has
read every notebook of the root, as a server that has seen them), and the defaults without the
imports standby (GPUCTX_SERVER_IMPORT_STANDBYS=0: each kernel's own warm-up only). Before a play
on the defaults the imports standby is ready (a refill after the last play; the wait is reported),
as on a server up for a while, and no server's standby is starting while another plays (they share
this machine's CPUs). Each notebook of benchmarks/notebooks/ is opened through a session,
as JupyterLab opens one (so the kernel's JPY_SESSION_NAME names it), and its code cells are sent
over the kernel websocket. Cases:

  cold      warming off; the cells one after another, as soon as the kernel is ready
  idle      defaults; the user waits --idle seconds after ready, then runs the cells one by one (a
            notebook never run before: nothing it noted on a run, such as its attention's shapes)
  reopen    defaults; as idle, for a notebook run before (Run All, then closed): what its last run
            noted (its attention's shapes, gpuctx_jupyter/kernel/warm/attention.py) is warmed too
  runall    warming off, the defaults, and without the imports standby: every cell sent at once
            as soon as the kernel is ready (Run All)
  restart   off and on: the notebook is run (Run All), then — once the server's automatic warm
            reserve holds a GPU-ready standby for it, as it does a few seconds after a GPU
            notebook starts (the wait is reported) — restarted, then Run All at once; "restart →
            first GPU cell" runs from the restart request to the first GPU cell's result
  cpu       off, the defaults, and without the imports standby: a CPU-bound pure-Python cell sent
            the moment the kernel is ready, while the warm-up imports (does the warm-up slow a
            first cell that does not need it?); each play lists the warm-up steps beside the cell,
            the CPU it ran on, its own CPU time (less than its time: it waited for a core) and the
            CPU time used beside it by the kernel's other threads and by the rest of the host (a
            standby starting on another core)
  typed     a new notebook written cell by cell (issue #25): an empty, saved notebook is opened
            (its file stays empty: nothing is saved), then each of the notebook's code cells in
            turn is typed at the start of a slot of --idle seconds, its cells so far are sent a
            second later as JupyterLab sends them (PUT /gpuctx/api/kernels/<id>/cells, its 1 s
            debounce) and the cell is run --typed-lead seconds after that (default: the rest of
            the slot). Three plays side by side: warming off, the defaults without the cells
            sent (what the kernel knew before: the empty file), and the defaults with them; the
            first GPU cell's and the first training cell's times are reported.

Each repeat plays every case's servers in turn, in the reverse order on odd repeats, so that
neither side of a pair (cold against ours) always plays first.

Per case: ready (POST /api/sessions -> kernel_info_reply), each cell's first time (in Run All:
from the previous cell's reply, or the send, to its own) and steady time (the same cell run again
in the same kernel), and the GPU memory the kernel holds at the end (NVML, through
gpuctx_jupyter.core.inventory inside the kernel). In the JSON also: what torch's caching allocator
reserves of it, dynamo's compile time per phase, the server's standbys as the cells start and end,
torch's allocator's largest segments (with --memory-history the code that made each), each cell's
time inside the kernel (ipykernel's `started` to its reply: the rest is the trip through the
server and the kernel's queue; in every case, Run All's and the typed plays' cells included), and
in the cold and idle cases Python's full garbage collections from ready on (the reading time, the
warm-up and the cells) with each one's pause (`gc_full_ms`; "steady" marks where the steady runs
begin) and how many objects gc had frozen (`gc_frozen`).
Before the first play and after the last, what the defaults' standbys hold (host memory
against their budget, GPU memory, CPU). A notebook that needs what this machine lacks
(two GPUs, a library) is skipped with the reason. Prints a table (medians) and writes JSON.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuctx_jupyter.core import inventory  # noqa: E402
from tests.harness.server import KernelSocket, Server, as_installed, in_kernel  # noqa: E402

NOTEBOOKS = os.path.join(ROOT, "benchmarks", "notebooks")
SLOW_MODULE = "gpuctx_bench_slow"  # an installed package whose import takes 2 s (cpu_imports.ipynb)
CASES = ("cold", "idle", "reopen", "runall", "restart", "cpu", "typed")
TYPED = {"warming off": False, "no cells sent": False, "cells sent": True}  # typed plays: do they send?
DEBOUNCE_S = 1.0  # JupyterLab sends the cells this long after typing stops (labextension/src/cells.ts)
EMPTY = {"cells": [], "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
         "nbformat": 4, "nbformat_minor": 5}
CPU_CELL = "t = sum(i * i for i in range(1_500_000))"
# The same, recording when it ran on the kernel's clock, to place it beside the warm-up's steps
# (OVERLAP), and, read just before and after it (outside its kernel time, not outside the client's:
# the same reads off and on), its own CPU time and the CPU that ran beside it: the kernel's other
# threads' (schedstat, ns) and the rest of the host's (/proc/stat less both: a standby starting on
# another core; in 10 ms ticks, so ±10 ms).
CPU_CELL_TIMED = ("import os as _os, threading as _th, time as _tm\n"
                  "def _busy():  # (this thread's CPU s, the kernel's other threads' s, the host's busy s, per thread ns)\n"
                  "    _me, _own, _rest, _per = str(_th.get_native_id()), 0, 0, {}\n"
                  "    for _t in _os.listdir('/proc/self/task'):\n"
                  "        try:\n"
                  "            with open(f'/proc/self/task/{_t}/schedstat') as _f:\n"
                  "                _ns = int(_f.read().split()[0])\n"
                  "        except (OSError, ValueError, IndexError):\n"
                  "            continue\n"
                  "        _own, _rest = (_own + _ns, _rest) if _t == _me else (_own, _rest + _ns)\n"
                  "        _per[_t] = _ns\n"
                  "    with open('/proc/stat') as _f:\n"
                  "        _v = [int(_x) for _x in _f.readline().split()[1:9]]\n"
                  "    return _own / 1e9, _rest / 1e9, (sum(_v) - _v[3] - _v[4]) / _os.sysconf('SC_CLK_TCK'), _per\n"
                  "def _who(_t):  # a thread's name: Python's where it is a Python thread, else the kernel's (comm)\n"
                  "    _n = {str(_x.native_id): _x.name for _x in _th.enumerate()}.get(_t)\n"
                  "    try:\n"
                  "        return _n or open(f'/proc/self/task/{_t}/comm').read().strip()\n"
                  "    except OSError:\n"
                  "        return '?'\n"
                  "_b0 = _busy()\n_w0 = _tm.monotonic()\n" + CPU_CELL + "\n_w1 = _tm.monotonic()\n_b1 = _busy()\n"
                  "with open('/proc/thread-self/stat') as _f:  # and the CPU it ran on (stat's field 39)\n"
                  "    _cpu = int(_f.read().rsplit(')', 1)[1].split()[36])\n"
                  "globals().setdefault('_cpu_windows', []).append((_w0, _w1, _cpu, round(_b1[0] - _b0[0], 4),\n"
                  "    round(_b1[1] - _b0[1], 4), round(_b1[2] - _b0[2] - (_b1[0] - _b0[0]) - (_b1[1] - _b0[1]), 3),\n"
                  "    sorted(([_who(_t), round((_n - _b0[3].get(_t, 0)) / 1e9, 4)] for _t, _n in _b1[3].items()\n"
                  "            if _t != str(_th.get_native_id()) and _n - _b0[3].get(_t, 0) >= 5e6), key=lambda _x: -_x[1])[:3]))")
# Which warm-up steps ran while the first CPU-bound cell did, for how long, and how long the
# kernel took to begin the cell after its send (the client's time less the cell's own).
OVERLAP = """import json as _j, time as _tm
_m = getattr(get_ipython(), '_gpuctx', None)
_w = globals().get('_cpu_windows') or [(0.0, 0.0, -1, None, None, None, [])]
_a, _b = _w[0][:2]
_steps = [s for s in (_m.warmer.plan.steps if _m and _m.warmer.plan else []) if s.started is not None]
from gpuctx_jupyter.kernel.warm.import_gate import GATE as _g
print(_j.dumps({'cell_in_kernel': _b - _a, 'warm_started': _m.warmer.status.started if _m else None,
                'in_kernel_and_cpu': [[round(b - a, 4), c, own] for a, b, c, own, *_ in _w],
                'beside': [{'kernel_threads': k, 'host_others': h, 'busiest': t} for *_, k, h, t in _w],
                'imports_held': _g.held(),
                'cell_began_after_warm_start': (_a - _m.warmer.status.started) if _m and _m.warmer.status.started else None,
                'overlaps': [[s.name, round(min(_b, _e) - max(_a, s.started), 4)] for s in _steps
                             if s.started < _b and (_e := s.started + s.seconds if s.seconds is not None
                                                    else _tm.monotonic()) > _a]}))"""
GPU_CELL = re.compile(r"\.to\(\s*device\b|\.cuda\(\)|\bdevice\s*=\s*device\b")  # a cell that puts work on the GPU
TRAINING_CELL = re.compile(r"\.backward\(|\.step\(|\.fit\(")  # a cell that trains
# Python's full collections in the kernel from here on, each one's pause in ms (a "steady" mark
# between the first cells and their steady runs): sent silently before the cells
GC_WATCH = """import gc as _gc, time as _time
def _watch(phase, info, _at=[0.0], _pauses=[], _clock=_time.perf_counter):
    if phase == 'start':
        _at[0] = _clock()
    elif info['generation'] == 2:
        _pauses.append(round((_clock() - _at[0]) * 1000, 1))
_gc.callbacks.append(_watch)
__gc_pauses__ = _watch.__defaults__[1]
del _gc, _time, _watch"""
GC_STEADY = "if '__gc_pauses__' in globals(): __gc_pauses__.append('steady')"

# Run inside the kernel at the end: its warm-up record, its plan, the GPU memory NVML gives it and,
# where torch runs CUDA, what its caching allocator reserves of that (the rest is the context, the
# loaded kernels and the libraries' workspaces), and where dynamo compiled, its time per phase.
REPORT = """import json as _j, sys as _s
from gpuctx_jupyter.core import inventory as _inv
_m = getattr(get_ipython(), '_gpuctx', None)
def _try(f):
    try:
        return f()
    except Exception as e:  # a field that fails says why; the others still come back
        return f'{type(e).__name__}: {e}'
def _segments(t):  # the allocator's largest segments: MiB reserved, MiB in use, stream, where it was made
    if t is None or not t.cuda.is_initialized():
        return None
    out = []
    for g in sorted(t.cuda.memory_snapshot(), key=lambda g: -g['total_size'])[:16]:
        made = [f"{f['name']}@{f['filename'].rsplit('/', 1)[-1]}:{f['line']}" for f in g.get('frames') or ()
                if f['filename'].endswith('.py')][:8]  # recorded with --memory-history only
        out.append([round(g['total_size'] / 2**20, 1), round(g['allocated_size'] / 2**20, 1), g['stream'], made])
    return out
_t = _s.modules.get('torch')
_d = _s.modules.get('torch._dynamo.utils')
print(_j.dumps({'memory': _inv.process_memory(_inv.take()),
                'torch_reserved': _try(lambda: {i: _t.cuda.memory_reserved(i) for i in range(_t.cuda.device_count())}
                                       if _t is not None and _t.cuda.is_initialized() else None),
                'compile_times': _try(lambda: _d.compile_times(repr='str', aggregate=True) if _d else None),
                'allocator': _try(lambda: _segments(_t)),
                'width': globals().get('width'),
                'warmup': _m.warmer.status.as_dict() if _m else None,
                'plan': _m.warmer.plan_lines() if _m else [],
                'pooled': getattr(_m, 'pooled', None) is not None,
                'gc_full_ms': globals().get('__gc_pauses__'), 'gc_frozen': __import__('gc').get_freeze_count()}))
del _j, _s, _inv, _m, _try, _t, _d, _segments"""


# --memory-history: sent silently right after the kernel is ready (the warm-up's cell hooks do not
# see it), so that the report can say which code made each of the allocator's segments. It imports
# torch and may start CUDA before the cells: a diagnosis of memory, not of time.
MEMORY_HISTORY = """import torch as _t
if _t.cuda.is_available():
    _t.cuda.memory._record_memory_history(max_entries=100000)
del _t"""


def code_cells(path: str) -> tuple[list[str], dict]:
    with open(path) as fh:
        nb = json.load(fh)
    cells = [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
             for c in nb["cells"] if c["cell_type"] == "code"]
    return cells, nb.get("metadata", {}).get("gpuctx_benchmark", {})


def why_skip(meta: dict, gpus: int) -> str | None:
    if gpus < meta.get("gpus", 0):
        return f"needs {meta['gpus']} GPUs, this machine has {gpus}"
    missing = [m for m in meta.get("requires", []) if importlib.util.find_spec(m) is None]
    return f"{', '.join(missing)} not installed" if missing else None


class Session:
    """A notebook opened in a server: its session, kernel and websocket."""

    def __init__(self, srv: Server, path: str, history: bool = False):
        self.srv = srv
        t0 = time.perf_counter()
        status, model = srv.api("POST", "/api/sessions", {"path": path, "type": "notebook",
                                                          "name": os.path.basename(path), "kernel": {"name": "python3"}})
        assert status == 201, (status, model)
        self.id, self.kernel = model["id"], model["kernel"]["id"]
        self.ks = KernelSocket(srv, self.kernel)
        self.ks.wait_ready()
        self.ready = time.perf_counter() - t0
        if history:
            self.ks.execute(MEMORY_HISTORY, timeout=120, silent=True)

    def run(self, code: str) -> dict:
        r = self.ks.execute(code, timeout=600)
        return {"seconds": r.seconds, "in_kernel": r.in_kernel, "ok": r.reply.get("status") == "ok",
                "error": None if r.reply.get("status") == "ok" else f"{r.reply.get('ename')}: {r.reply.get('evalue')}",
                "stdout": r.stdout}

    def run_all(self, cells: list[str]) -> list[dict]:
        """Every cell sent at once; each one's time runs from the previous reply (or the send)."""
        t0 = time.perf_counter()
        ids = [self.ks.send("execute_request", {"code": c, "silent": False, "store_history": True,
                                                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
               for c in cells]
        replies: dict[str, tuple[float, dict]] = {}
        self.ks.ws.settimeout(600)
        while len(replies) < len(ids):
            msg = json.loads(self.ks.ws.recv())
            parent = msg.get("parent_header", {}).get("msg_id")
            if parent in ids and msg["msg_type"] == "execute_reply":
                replies[parent] = (time.perf_counter(), msg)
        out, last = [], t0
        for i in ids:
            at, msg = replies[i]
            content = msg["content"]
            ok = content.get("status") == "ok"
            out.append({"seconds": at - last, "in_kernel": in_kernel(msg), "ok": ok,
                        "error": None if ok else f"{content.get('ename')}: {content.get('evalue')}"})
            last = at
        return out

    def restart(self) -> float:
        t0 = time.perf_counter()
        status, _ = self.srv.api("POST", f"/api/kernels/{self.kernel}/restart")
        assert status == 200, status
        self.ks.wait_ready()
        return time.perf_counter() - t0

    def report(self) -> dict:
        """The kernel's record at the end of a play (REPORT), as the fields a play's JSON keeps."""
        r = self.ks.execute(REPORT)
        try:
            rep = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"memory": 0, "report_error": r.stderr[-500:]}
        return {"memory": sum((rep.get("memory") or {}).values()),
                "memory_by_gpu": rep.get("memory"),  # CUDA ordinal -> bytes NVML lists for the kernel
                **{k: rep.get(k) for k in ("torch_reserved", "compile_times", "warmup", "plan", "pooled",
                                           "allocator", "width", "gc_full_ms", "gc_frozen")}}

    def close(self) -> None:
        self.ks.close()
        self.srv.api("DELETE", f"/api/sessions/{self.id}")
        time.sleep(1.0)  # the kernel process and its context are gone before the next one
        deadline = time.monotonic() + 30  # and the restart reserve kept for it, so each play starts alike
        while time.monotonic() < deadline and any(st.get("kind", "gpu") == "gpu" for st in standbys(self.srv)):
            time.sleep(0.2)


def standbys(srv: Server) -> list[dict]:
    return (srv.api("GET", "/gpuctx/api/devices")[1].get("pool") or {}).get("standbys") or []


def settled(srv: Server, timeout: float = 300) -> None:
    """Until no standby of the server is starting (three servers share this machine's CPUs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool = srv.api("GET", "/gpuctx/api/devices")[1].get("pool") or {}
        starting = sum(k.get("starting", 0) for k in (pool.get("kernelspecs") or {}).values())
        if not starting and not any(st.get("state") in ("booting", "paused") for st in pool.get("standbys", [])):
            return
        time.sleep(0.5)


def imports_standby_ready(srv: Server, timeout: float = 300) -> float | None:
    """Seconds until the server's imports standby is ready with its whole import profile (None:
    the server keeps none)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        pool = srv.api("GET", "/gpuctx/api/devices")[1].get("pool") or {}
        if "import_profile" not in pool:
            return None
        want = len(pool["import_profile"]["modules"])
        if any(st.get("kind") == "imports" and st.get("ready") and st.get("imports", 0) >= want - 1
               for st in pool.get("standbys", [])):
            return time.perf_counter() - t0
        time.sleep(0.5)
    return None


def pool_states(srv: Server) -> list[str]:
    """The server's standbys as the cells start and end ("gpu booting 3.1 s"): a standby starting
    beside the user's cells shares the host's CPUs and the GPU with them."""
    return [f"{st.get('kind')} {st.get('state')} {st.get('age')} s" for st in standbys(srv)]


def standby_footprint(srv: Server, seconds: float = 5.0) -> dict:
    """What the server's standbys hold while they wait (issue "Ready before it is asked": 0 MiB on
    every GPU, host memory within the budget they share, no CPU once warm): each standby's process
    tree (a standby with its workers' imports process) — resident memory, GPU memory and presence in
    NVML's process lists, CPU time over `seconds` as a share of one core — and the pool's budget."""
    import psutil

    from gpuctx_jupyter.core import procs

    settled(srv, timeout=90)
    pool = srv.api("GET", "/gpuctx/api/devices")[1].get("pool") or {}
    trees = {st["pid"]: {st["pid"], *procs.descendants(st["pid"])} for st in pool.get("standbys", []) if st.get("pid")}

    def cpu(pids: set[int]) -> float:
        total = 0.0
        for pid in pids:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total

    before = {pid: cpu(tree) for pid, tree in trees.items()}
    time.sleep(seconds)
    inv = inventory.take()
    on_gpu = {p.pid for d in inv.devices for p in d.record.processes}
    out = []
    for st in pool.get("standbys", []):
        tree = trees.get(st.get("pid"), set())
        gpu = inventory.process_memory(inv, tree) if tree else {}
        out.append({"kind": st.get("kind"), "kernel_name": st.get("kernel_name"), "pid": st.get("pid"),
                    "processes": len(tree), "rss": st.get("rss"), "imports": st.get("imports"),
                    "cuda_driver": st.get("cuda_driver"), "gpu_memory": sum(gpu.values()),
                    "in_nvml": bool(tree & on_gpu),
                    "cpu_share": round((cpu(tree) - before.get(st.get("pid"), 0.0)) / seconds, 4) if tree else None})
    return {"host_memory": pool.get("host_memory"), "standbys": out, "seconds": seconds}


def footprint_lines(fp: dict) -> list[str]:
    from gpuctx_jupyter.kernel.render import gib, mib  # as every gpuctx view writes bytes

    mem = fp.get("host_memory") or {}
    lines = [f"standbys hold {gib(mem.get('standbys'))} of host memory, budget {gib(mem.get('budget'))} "
             f"(a share of the {gib(mem.get('available'))} available, bounded by the {mem.get('limit')})"]
    for st in fp.get("standbys", []):
        lines.append(f"  {st['kind']} standby ({st['kernel_name']}, {st['processes']} process(es)): "
                     f"RSS {gib(st['rss'])}, GPU {mib(st['gpu_memory'])}, in NVML: "
                     f"{'yes' if st['in_nvml'] else 'no'}, CPU {100 * (st['cpu_share'] or 0):.1f}% of a core "
                     f"over {fp['seconds']:g} s")
    return lines


def reserve_ready(srv: Server, path: str, timeout: float = 180) -> float | None:
    """Seconds until the server's warm reserve holds a ready standby warmed for `path` (None:
    the server keeps no reserve, or none came within `timeout`)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        pool = srv.api("GET", "/gpuctx/api/devices")[1].get("pool")
        if not pool or not pool.get("target"):
            return None
        if any(st.get("ready") and (st.get("notebook") or "").endswith(path) for st in pool.get("standbys", [])):
            return time.perf_counter() - t0
        time.sleep(0.2)
    return None


def first_gpu_cell(cells: list[str]) -> int:
    return next((i for i, c in enumerate(cells) if GPU_CELL.search(c)), 0)


def first_training_cell(cells: list[str]) -> int | None:
    return next((i for i, c in enumerate(cells) if TRAINING_CELL.search(c)), None)


def play_typed(srv: Server, path: str, cells: list[str], send: bool, slot: float, lead: float,
               history: bool = False) -> dict:
    """A new notebook written cell by cell (the `typed` case): each cell typed at the start of its
    slot, the cells so far sent a second later (if `send`), the cell run `lead` s after that."""
    s = Session(srv, path, history)
    try:
        out: dict = {"ready": s.ready, "sent": []}
        first = []
        for i, cell in enumerate(cells):
            typed_at = time.monotonic()
            if send:
                time.sleep(DEBOUNCE_S)
                status, answer = srv.api("PUT", f"/gpuctx/api/kernels/{s.kernel}/cells", {"cells": cells[:i + 1]})
                out["sent"].append({"status": status, "planned": (answer or {}).get("planned"),
                                    "message": (answer or {}).get("message") or (answer or {}).get("reason")})
            time.sleep(max(0.0, typed_at + DEBOUNCE_S + lead - time.monotonic()))
            first.append(s.run(cell))
        steady = [s.run(c) for c in cells]
        out.update(first=[r["seconds"] for r in first], steady=[r["seconds"] for r in steady],
                   errors=[r["error"] for r in first + steady if r["error"]],
                   first_in_kernel=[r.get("in_kernel") for r in first], steady_in_kernel=[r.get("in_kernel") for r in steady])
        gpu, train = first_gpu_cell(cells), first_training_cell(cells)
        out["first_gpu_cell"], out["first_gpu_cell_steady"] = out["first"][gpu], out["steady"][gpu]
        if train is not None:
            out["first_training_cell"], out["first_training_cell_steady"] = out["first"][train], out["steady"][train]
        out.update(s.report())
        return out
    finally:
        s.close()


def play(srv: Server, path: str, cells: list[str], case: str, idle: float, history: bool = False) -> dict:
    data = (srv.env or {}).get("JUPYTER_DATA_DIR")
    if data and case in ("idle", "reopen"):  # what earlier plays' runs noted is forgotten: idle is a first run
        shutil.rmtree(os.path.join(data, "gpuctx", "attention"), ignore_errors=True)
    if case == "reopen":
        earlier = Session(srv, path, history)
        try:
            earlier.run_all(cells)
        finally:
            earlier.close()
    wait = imports_standby_ready(srv) if case in ("idle", "reopen", "runall") else None
    s = Session(srv, path, history)
    try:
        out = {"ready": s.ready, "standby_wait": wait}
        if case == "cpu":
            out["cpu_cell"] = s.run(CPU_CELL_TIMED)["seconds"]
            # the server's standbys then: a refill starts as a standby is taken (a process importing
            # on another core beside the cell; giving_way.py pauses it once it sees the cell)
            out["standbys_after_first_cell"] = [[st.get("kind"), st.get("state")] for st in standbys(srv)]
            out["cpu_cell_steady"] = s.run(CPU_CELL_TIMED)["seconds"]
            try:
                out["cpu_overlap"] = json.loads(s.run(OVERLAP)["stdout"].strip().splitlines()[-1])
            except (ValueError, IndexError):
                out["cpu_overlap"] = None
            return out
        if case in ("cold", "idle", "reopen"):
            s.ks.execute(GC_WATCH, silent=True)
        if case in ("idle", "reopen"):
            time.sleep(idle)
        if case == "restart":
            s.run_all(cells)  # the user's work before the restart
            out["reserve_wait"] = reserve_ready(srv, path)
            out["restart"] = s.restart()
        out["pool_before_cells"] = pool_states(srv)
        first = s.run_all(cells) if case in ("runall", "restart") else [s.run(c) for c in cells]
        out["pool_after_cells"] = pool_states(srv)
        s.ks.execute(GC_STEADY, silent=True)
        if case == "restart":
            out["restart_to_gpu_cell"] = out["restart"] + sum(r["seconds"] for r in first[:first_gpu_cell(cells) + 1])
        steady = [s.run(c) for c in cells]
        out.update(first=[r["seconds"] for r in first], steady=[r["seconds"] for r in steady],
                   errors=[r["error"] for r in first + steady if r["error"]],
                   first_in_kernel=[r.get("in_kernel") for r in first], steady_in_kernel=[r.get("in_kernel") for r in steady])
        out.update(s.report())
        return out
    finally:
        s.close()


def first_cells_gc(run: dict) -> list[float]:
    """The pauses of the full collections of a play up to its first cells' end (before its steady runs)."""
    pauses = run.get("gc_full_ms") or []
    return pauses[:pauses.index("steady")] if "steady" in pauses else pauses


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict]) -> dict:
    n = max((len(r.get("first", [])) for r in runs), default=0)

    def cols(key, i):
        return median([r[key][i] for r in runs if len(r.get(key, [])) > i])

    return {"ready": median([r["ready"] for r in runs]),
            "first": [cols("first", i) for i in range(n)], "steady": [cols("steady", i) for i in range(n)],
            "first_total": median([sum(r["first"]) for r in runs if r.get("first")]),
            "memory": median([r.get("memory") for r in runs]),
            "cpu_cell": median([r.get("cpu_cell") for r in runs]),
            "cpu_cell_steady": median([r.get("cpu_cell_steady") for r in runs]),
            # each play's first against its own second: a host whose processes run at two speeds
            # (the H200's: ~90 or ~140 ms, per process, off and on alike) leaves that out
            "cpu_first_to_steady": median([r["cpu_cell"] / r["cpu_cell_steady"] for r in runs
                                           if r.get("cpu_cell") and r.get("cpu_cell_steady")]),
            "restart": median([r.get("restart") for r in runs]),
            "restart_to_gpu_cell": median([r.get("restart_to_gpu_cell") for r in runs]),
            "reserve_wait": median([r.get("reserve_wait") for r in runs]),
            "standby_wait": median([r.get("standby_wait") for r in runs]),
            "first_gpu_cell": median([r.get("first_gpu_cell") for r in runs]),
            "first_gpu_cell_steady": median([r.get("first_gpu_cell_steady") for r in runs]),
            "first_training_cell": median([r.get("first_training_cell") for r in runs]),
            "first_training_cell_steady": median([r.get("first_training_cell_steady") for r in runs]),
            "pooled": sum(1 for r in runs if r.get("pooled")),
            "errors": sorted({e for r in runs for e in r.get("errors", [])})}


def ms(v) -> str:
    return "–" if v is None else f"{v * 1000:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = sorted(f[:-6] for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb"))
    ap.add_argument("--notebooks", default=",".join(names), help=f"comma-separated, of: {', '.join(names)}")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds the user waits in the idle case, and the "
                    "slot of each cell in the typed case")
    ap.add_argument("--typed-lead", type=float, default=None, help="typed case: seconds from the cells being sent "
                    "to the cell being run (default: the rest of the slot, --idle - 1)")
    ap.add_argument("--memory-history", action="store_true", help="record which code made each of torch's "
                    "allocator segments (JSON: allocator); imports torch before the cells: for memory, not time")
    ap.add_argument("--until", type=float, default=0.0, help="start no notebook after this many seconds (0: no limit)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="print and write the medians over these results' runs")
    ap.add_argument("--json", default="benchmarks/results/notebooks.json")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, args.json)
    wanted = [n.strip() for n in args.notebooks.split(",") if n.strip()]
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in wanted if n not in names] + [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown notebook or case: {', '.join(unknown)}")

    gpus = len(inventory.take().devices)
    root = tempfile.mkdtemp(prefix="gpuctx-notebooks-")
    skipped, todo = {}, {}
    for name in wanted:
        cells, meta = code_cells(os.path.join(NOTEBOOKS, f"{name}.ipynb"))
        why = why_skip(meta, gpus)
        if why:
            skipped[name] = why
        else:
            shutil.copy(os.path.join(NOTEBOOKS, f"{name}.ipynb"), root)
            with open(os.path.join(root, f"typed_{name}.ipynb"), "w") as fh:  # the typed case's new notebook
                json.dump(EMPTY, fh)
            todo[name] = cells
    bytecode = as_installed()
    common = ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True", "--MappingKernelManager.default_kernel_name=python3"]
    site = slow_package(root)
    server_env = {"PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]), "GPUCTX_SERVER_POOL": "auto",
                  "JUPYTER_DATA_DIR": os.path.join(root, ".jupyter-data")}
    off = Server(root, [*common, "--GpuctxServer.warm_policy=never"], env=server_env).start()
    on = Server(root, common, env=server_env).start()  # the defaults: policy auto, the notebook recipe, the imports standby
    nostd = Server(root, common, env={**server_env, "GPUCTX_SERVER_IMPORT_STANDBYS": "0"}).start()
    names_of = {id(off): "warming off", id(on): "warming on", id(nostd): "no imports standby"}
    both = {"cpu": (off, on, nostd), "restart": (off, on), "runall": (off, on, nostd)}  # baselines and ours side by side
    plan = [(case, srv, "") for case in cases if case != "typed"
            for srv in (both.get(case) or ((off,) if case == "cold" else (on,)))]
    if "typed" in cases:  # the same new notebook typed with warming off, on without its cells sent, and on
        plan += [("typed", off if variant == "warming off" else on, variant) for variant in TYPED]
    lead = args.typed_lead if args.typed_lead is not None else max(0.0, args.idle - DEBOUNCE_S)
    startup = imports_standby_ready(on, timeout=600)  # the server has read the notebooks and imported them
    runs: dict[str, dict[str, list]] = {n: {} for n in todo}
    env = {"gpu": inventory.take().devices[0].record.name if gpus else "none", "gpus": gpus,
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "python": platform.python_version(), "torch": _version("torch"), "cpus": os.cpu_count(), **bytecode,
           "repeat": args.repeat, "idle_s": args.idle, "typed_lead_s": lead,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "imports_standby_first_ready_s": startup, "standbys_at_start": standby_footprint(on)}
    t0 = time.monotonic()
    try:
        for rep in range(args.repeat):  # interleaved, so drift hits every case alike
            for name, cells in todo.items():
                if args.until and time.monotonic() - t0 > args.until:
                    print(f"--until {args.until:g} s reached: stopping before {name}, repeat {rep + 1}", file=sys.stderr)
                    break
                for case, srv, variant in (plan if rep % 2 == 0 else plan[::-1]):  # neither side always first
                    key = f"typed, {variant}" if variant else case if case not in both else f"{case}, {names_of[id(srv)]}"
                    for other in (off, on, nostd):  # no server's standby starts while this one plays
                        settled(other)
                    if variant:
                        result = play_typed(srv, f"typed_{name}.ipynb", cells, TYPED[variant], args.idle, lead,
                                            args.memory_history)
                    else:
                        result = play(srv, f"{name}.ipynb", cells, case, args.idle, args.memory_history)
                    runs[name].setdefault(key, []).append(dict(result, repeat=rep))
                save(args.json, env, runs, skipped)  # a command killed at its time limit keeps what ran
                print(f"repeat {rep + 1}/{args.repeat}: {name} done", file=sys.stderr)
        env["standbys_at_end"] = standby_footprint(on)
    finally:
        for srv in (off, on, nostd):
            srv.stop()
    report(runs, skipped, env, args.json)


def slow_package(root: str) -> str:
    """A site-packages folder holding a package whose import takes 2 s (installed, not local code)."""
    site = os.path.join(root, ".site", "site-packages")
    os.makedirs(os.path.join(site, SLOW_MODULE), exist_ok=True)
    with open(os.path.join(site, SLOW_MODULE, "__init__.py"), "w") as fh:
        fh.write("import time\ntime.sleep(2)\n")
    return site


def save(path: str, env: dict, runs: dict, skipped: dict, table: dict | None = None) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"env": env, "table": table or {}, "runs": runs, "skipped": skipped}, fh, indent=2)


def merge(paths: list[str], out: str) -> None:
    runs: dict[str, dict[str, list]] = {}
    skipped: dict[str, str] = {}
    envs = []
    for stream, path in enumerate(paths):
        with open(path) as fh:
            data = json.load(fh)
        envs.append(data["env"])
        skipped.update(data.get("skipped") or {})
        for name, cases in data["runs"].items():
            for case, rs in cases.items():  # (a pair is one stream's repeat: pair_lines)
                runs.setdefault(name, {}).setdefault(case, []).extend(
                    dict(r, stream=stream, repeat=r.get("repeat", i)) for i, r in enumerate(rs))
    env = dict(envs[0], merged=[dict(e, file=p) for e, p in zip(envs, paths)])
    report(runs, {k: v for k, v in skipped.items() if k not in runs}, env, out)


def report(runs: dict, skipped: dict, env: dict, path: str) -> None:
    """Print the table of medians and write everything as JSON."""
    table = {n: {case: dict(summarize(rs), runs=len(rs)) for case, rs in cs.items()} for n, cs in runs.items()}
    counts = sorted({s["runs"] for cs in table.values() for s in cs.values()})
    runs_text = "–".join(str(c) for c in (counts[0], counts[-1]) if counts) if len(set(counts)) > 1 else str(
        counts[0] if counts else 0)
    print(f"\nnotebooks — {env['gpu']} ×{env['gpus']}, torch {env['torch']}, {env['cpus']} CPUs, "
          f"{runs_text} run(s) per case, idle {env['idle_s']:g} s; medians in ms, per cell first/steady")
    print(f"{'notebook':<18}{'case':<22}{'ready':>7}  {'cells first/steady':<44}{'first Σ':>9}{'GPU MiB':>9}")
    for name, cs in table.items():
        for case, s in cs.items():
            if case.startswith("cpu"):
                cells = (f"CPU-bound cell at once {ms(s['cpu_cell'])}/{ms(s['cpu_cell_steady'])}, "
                         f"first/steady ×{s['cpu_first_to_steady'] or 0:.3f}")
                print(f"{name:<18}{case:<22}{ms(s['ready']):>7}  {cells:<44}")
                for r in runs[name][case]:  # each play's first cell, and the warm-up steps beside it
                    o = r.get("cpu_overlap") or {}
                    beside = ", ".join(f"{n} {ms(t)}" for n, t in o.get("overlaps") or ()) or "no warm-up step"
                    booting = [k for k, state in r.get("standbys_after_first_cell") or () if state in ("booting", "paused")]
                    if booting:
                        beside += f"; a standby starting ({', '.join(map(str, booting))})"
                    if o.get("imports_held"):
                        beside += f" (its imports held {ms(o['imports_held'])} ms for cells)"
                    where = " / ".join(f"{ms(t)} on CPU {c}" + (f" ({ms(own[0])} of it on the CPU)" if own else "")
                                       for t, c, *own in o.get("in_kernel_and_cpu") or ())
                    cpu_beside = " / ".join(f"{ms(b['kernel_threads'])}+{ms(b['host_others'])}"
                                            for b in o.get("beside") or () if b.get("host_others") is not None)
                    if cpu_beside:  # CPU ms beside each cell: the kernel's other threads + the host's rest
                        where += f"; CPU beside it: kernel threads+host {cpu_beside} ms"
                    busiest = ((o.get("beside") or [{}])[0].get("busiest") or ())
                    if busiest:  # which of the kernel's threads used it, beside the first cell
                        where += " (" + ", ".join(f"{n} {ms(t)}" for n, t in busiest) + ")"
                    print(f"{'':<40}{ms(r['cpu_cell'])}/{ms(r['cpu_cell_steady'])} ms (in the kernel {where}): {beside}")
                continue
            cells = "  ".join(f"{ms(a)}/{ms(b)}" for a, b in zip(s["first"], s["steady"]))
            mem = "–" if not s["memory"] else f"{s['memory'] / 2**20:.0f}"
            print(f"{name:<18}{case:<22}{ms(s['ready']):>7}  {cells:<44}{ms(s['first_total']):>9}{mem:>9}")
            if case.startswith("typed") and s["first_gpu_cell"] is not None:
                train = (f"; first training cell {ms(s['first_training_cell'])} ms "
                         f"(steady {ms(s['first_training_cell_steady'])})" if s["first_training_cell"] is not None
                         else "")
                print(f"{'':<40}first GPU cell {ms(s['first_gpu_cell'])} ms (steady {ms(s['first_gpu_cell_steady'])})"
                      f"{train}")
            if case.startswith("restart"):
                wait = "no reserve" if s["reserve_wait"] is None else f"reserve ready after {s['reserve_wait']:.1f} s"
                print(f"{'':<40}restart → first GPU cell {ms(s['restart_to_gpu_cell'])} ms "
                      f"(restart {ms(s['restart'])} ms; {wait}; {s['pooled']} of {s['runs']} from the reserve)")
            pauses = [first_cells_gc(r) for r in runs[name][case] if r.get("gc_full_ms") is not None]
            if pauses:
                print(f"{'':<40}Python's full collections from ready to the first cells' end, per play: "
                      + ", ".join(" + ".join(f"{p:g} ms" for p in ps) or "none" for ps in pauses)
                      + f" ({runs[name][case][0].get('gc_frozen') or 0} objects frozen)")
            for err in s["errors"]:
                print(f"{'':<40}error: {err}")
    for name, why in skipped.items():
        print(f"{name:<18}skipped: {why}")
    for name, cs in runs.items():
        for line in pair_lines(cs):
            print(f"{name}: {line}")
    for when in ("start", "end"):
        if env.get(f"standbys_at_{when}"):
            print(f"\nthe defaults' standbys at the {when}: " + "\n".join(footprint_lines(env[f"standbys_at_{when}"])))
    for name, cs in runs.items():
        last = (cs.get("idle") or cs.get("typed, cells sent") or cs.get("runall") or [{}])[-1]
        if last.get("plan"):
            print(f"\n{name}: " + "\n  ".join(last["plan"]))
            print(f"  warm-up: {(last.get('warmup') or {}).get('state')} — phases (s): " + ", ".join(
                f"{k} {v:.2f}" for k, v in ((last.get("warmup") or {}).get("phases") or {}).items()))
    save(path, env, runs, skipped, table)
    print(f"\nwrote {path}")


def pair_lines(cs: dict, base: str = "runall, warming off") -> list[str]:
    """Run All pair by pair (each repeat plays every case once): every other case's total against
    warming off's in the same repeat, and warming off against its own next play — what the host's
    spread alone makes of one pair, the yardstick for "never slower than cold" in a handful of pairs."""
    def totals(case) -> dict:  # (stream, repeat) -> Σ of the first cells; older results: by position
        return {(r.get("stream", 0), r.get("repeat", i)): sum(r["first"]) for i, r in enumerate(cs.get(case) or ())
                if r.get("first") and not r.get("errors")}

    def said(diffs, what):
        slower = sorted(d for d in diffs if d > 0)
        worse = f" ({', '.join(f'+{d:.2f}' for d in slower)} s)" if slower else ""
        return f"{what}: median {statistics.median(diffs):+.2f} s, slower in {len(slower)} of {len(diffs)}{worse}"

    cold, lines = totals(base), []
    for case in cs:
        if case.startswith("runall") and case != base:
            diffs = [t - cold[k] for k, t in totals(case).items() if k in cold]
            if diffs:
                lines.append(said(diffs, f"{case} − {base}, pair by pair"))
    again = [cold[(s, r + 1)] - t for (s, r), t in sorted(cold.items()) if (s, r + 1) in cold]
    if lines and again:
        lines.append(said(again, f"{base} − its previous play (the host's own spread)"))
    return lines


def _version(module: str) -> str:
    try:
        return importlib.import_module(module).__version__
    except ImportError:
        return "not installed"


if __name__ == "__main__":
    main()
