#!/usr/bin/env python3
"""Where a warmed kernel's first run of a cell still spends its time, beside the second run.

    python3 scripts/probe-first-cell.py NOTEBOOK [--cell N] [--wait S] [--no-profile] [--top 25] [--json OUT.json]

In one fresh process: the warm-up the notebook's plan asks for runs to its end (kernel/warm/, as
in a server-started kernel), then the notebook's cells before cell N (default: the last code cell),
then cell N twice under cProfile. Prints both times and the functions whose cumulative time
differs most between the first run and the second: what the warm-up leaves for the first run
(for #24, lightning's first Trainer.fit). `--wait S` sleeps S seconds between the warm-up's end and
the cells, as a user reading (inductor's compile workers, for one, are shut down after 60-90 s
without a job and come back cold); `--no-profile` times both runs without cProfile, whose overhead
inflates Python-heavy work such as a compile; `--warm-workers N`, once the warm-up is done, waits for
inductor's compile workers and compiles a graph of N kernels through them (does a worker's first job
cost the first compile its time?); `--memory` prints torch's allocator (allocated, reserved) after
the warm-up, after freeing cuBLAS's workspaces, and after the cells; `--no-first-jobs` leaves out
the compile workers' first jobs (recipes/triton_job.py); `--fresh N` then runs the cells N more
times, each with the notebook's `width` drawn anew (compile_fresh: a graph never compiled before,
automatic dynamic shapes off so that each is compiled static as the first was), and compares the
first of those compiles with the last: what a never-seen graph's first compile in this process
still pays beyond any later one's. Runs on a GPU machine or a CPU one.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cells(path: str) -> list[str]:
    with open(path) as fh:
        nb = json.load(fh)
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def timed(code, ns) -> tuple[float, dict]:
    t0 = time.perf_counter()
    exec(code, ns)
    sync()
    return time.perf_counter() - t0, {}


def compile_pool() -> str:
    """The state of inductor's compile workers, where torch.compile has started them."""
    mod = sys.modules.get("torch._inductor.async_compile")
    if mod is None:
        return "inductor not imported"
    ready = getattr(mod.AsyncCompile, "_ready_future", None)
    if ready is None:
        return "no compile workers started (compiles run in this process until they are)"
    pools = list(getattr(mod, "_pool_set", ()) or ())
    quiesced = any(getattr(p, "quiesce_waitcounter", None) is not None for p in pools)
    return (f"compile workers {'ready' if ready.done() else 'starting'}"
            f"{', quiesced (their processes were shut down: the next job restarts them)' if quiesced else ''}")


def warm_workers(n: int) -> float:
    """Compile a graph of n reductions over differently shaped inputs (one kernel each) once the
    compile workers are ready, so that up to n of them have done a job; returns the seconds it took."""
    import torch
    from torch._inductor.async_compile import AsyncCompile

    t0 = time.perf_counter()
    AsyncCompile.wait_pool_ready(timeout=120)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    xs = [torch.randn(3 + i, 5 + 2 * i, device=dev) for i in range(n)]

    def reductions(*ts):
        return [t.sin().sum(dim=i % 2) for i, t in enumerate(ts)]

    torch.compile(reductions)(*xs)
    sync()
    return time.perf_counter() - t0


def workers_memory() -> str:
    """The host memory of this process's descendants (inductor's sidecar and its workers): RSS, and
    what each holds alone (private pages, from smaps_rollup)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, found = [os.getpid()], []
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    rss = private = 0
    for pid in found:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    key, _, rest = line.partition(":")
                    if key == "Rss":
                        rss += int(rest.split()[0])
                    elif key in ("Private_Clean", "Private_Dirty"):
                        private += int(rest.split()[0])
        except OSError:
            continue
    return f"{len(found)} processes, RSS {rss / 2**20:.2f} GiB, private {private / 2**20:.2f} GiB"


def allocator(label: str) -> dict:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    row = {"allocated_mib": torch.cuda.memory_allocated() / 2**20, "reserved_mib": torch.cuda.memory_reserved() / 2**20}
    print(f"memory {label}: allocated {row['allocated_mib']:.1f} MiB, reserved {row['reserved_mib']:.1f} MiB")
    return row


def profiled(code, ns) -> tuple[float, dict]:
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    exec(code, ns)
    prof.disable()
    took = time.perf_counter() - t0
    sync()
    stats = pstats.Stats(prof)
    return took, {f"{os.path.basename(k[0])}:{k[1]}({k[2]})": v[3] for k, v in stats.stats.items()}


def fresh_runs(n: int, before, code, ns, run, times: list) -> tuple[float, dict]:
    """The cells again n times, each with a new `width` (a graph no cache holds), compiled static;
    returns the last run's time and profile, and appends each time to `times`."""
    import torch._dynamo

    torch._dynamo.config.automatic_dynamic_shapes = False
    last = (0.0, {})
    for _ in range(n):
        ns.pop("width", None)
        for src in before:
            exec(compile(src, "<cell>", "exec"), ns)
        sync()
        last = run(code, ns)
        times.append(last[0])
    return last


def sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebook")
    ap.add_argument("--cell", type=int, default=-1, help="index among the code cells (default: the last)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-warm", action="store_true", help="skip the warm-up (the cold first run)")
    ap.add_argument("--wait", type=float, default=0.0, help="seconds between the warm-up's end and the cells")
    ap.add_argument("--no-profile", action="store_true", help="time the runs without cProfile")
    ap.add_argument("--warm-workers", type=int, default=0, metavar="N")
    ap.add_argument("--warm-workers-in", choices=("main", "thread"), default="main")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--no-first-jobs", action="store_true", help="the warm-up without its compile workers' first jobs")
    ap.add_argument("--fresh", type=int, default=0, metavar="N", help="N more runs, each a graph never compiled before")
    ap.add_argument("--json")
    args = ap.parse_args()
    memory = {}
    sources = cells(args.notebook)
    target = sources[args.cell]
    before = sources[:args.cell % len(sources)]
    ns = {"__name__": "__main__"}
    t0 = time.perf_counter()
    warm_s = 0.0
    if not args.no_warm:
        from gpuctx_jupyter.kernel.warm import plan as plans
        from gpuctx_jupyter.kernel.warm.scheduler import Warmer

        if args.no_first_jobs:
            from gpuctx_jupyter.kernel.warm.recipes import inductor

            inductor.first_jobs = lambda archs: "first jobs off (probe)"
        warmer = Warmer()
        warmer.start_plan(lambda: plans.derive(os.path.abspath(args.notebook)), source="probe")
        state = warmer.wait(timeout=300)
        warm_s = time.perf_counter() - t0
        print(f"warm-up: {state.state} in {warm_s:.2f} s")
        for line in warmer.plan_lines():
            print("  ", line)
    if args.memory:
        memory["after the warm-up"] = allocator("after the warm-up")
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()
            memory["cuBLAS workspaces freed"] = allocator("with cuBLAS workspaces freed")
    if args.warm_workers:
        took = {}
        if args.warm_workers_in == "thread":  # as a warm-up step would run it
            t = threading.Thread(target=lambda: took.setdefault("s", warm_workers(args.warm_workers)))
            t.start()
            t.join()
        else:
            took["s"] = warm_workers(args.warm_workers)
        print(f"warmed the compile workers with {args.warm_workers} kernels in the {args.warm_workers_in} thread "
              f"in {took.get('s', float('nan')):.2f} s")
    time.sleep(args.wait)
    for src in before:
        exec(compile(src, "<cell>", "exec"), ns)
    sync()
    code = compile(target, "<cell>", "exec")
    pool = compile_pool()  # as the cell starts
    print(f"after {args.wait:g} s: {pool}; descendants: {workers_memory()}")
    run = timed if args.no_profile else profiled
    first_s, first = run(code, ns)
    second_s, second = run(code, ns)
    how = "" if args.no_profile else " (profiled)"
    print(f"first run {first_s * 1e3:.0f} ms{how}, second {second_s * 1e3:.0f} ms")
    if args.memory:
        memory["after the cells"] = allocator("after the cells")
    fresh_s = []
    if args.fresh:
        second_s, second = fresh_runs(args.fresh, before, code, ns, run, fresh_s)
        print(f"{args.fresh} more graphs never compiled before: {', '.join(f'{s * 1e3:.0f}' for s in fresh_s)} ms")
    label = "first - last new" if args.fresh else "first - second"
    diff = sorted(((first[k] - second.get(k, 0.0), k, first[k]) for k in first), reverse=True)[:args.top]
    print(f"{label + ' (ms)':>20} {'first (ms)':>10}  function")
    for d, k, f in diff:
        print(f"{d * 1e3:20.1f} {f * 1e3:10.1f}  {k}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"notebook": args.notebook, "warm_s": warm_s, "wait_s": args.wait, "profiled": not args.no_profile,
                       "compile_pool": pool, "warm_workers": args.warm_workers, "first_jobs": not args.no_first_jobs, "memory": memory, "first_s": first_s, "second_s": second_s, "fresh_s": fresh_s,
                       "diff": [{"ms": d * 1e3, "function": k, "first_ms": f * 1e3} for d, k, f in diff]}, fh, indent=1)


if __name__ == "__main__":
    main()
