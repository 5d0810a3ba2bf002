"""What gpuctx's thread hook adds to starting a thread: `threading.Thread.start` as Python has it
against the same start with the hook installed, in one run.

    python benchmarks/thread_start.py [--threads 2000] [--out build/benchmarks/thread_start.json]

Each case starts and joins the same no-op thread N times, plainly and with the hook, in
alternating batches so drift hits both. Two figures per thread: `start()` (what the starting
thread waits for) and start + join (the whole life of a no-op thread, which includes the switch
the hook makes inside the new thread). The cases:

- no GPU framework imported, no device chosen: the hook must pass straight through;
- no GPU framework imported, a device chosen: the thread is tracked for `%gpu status`, nothing
  is switched;
- torch imported, a device chosen, the thread never touches torch: on a CPU-only build torch is
  not a GPU framework here, so nothing is switched; on a GPU, `torch.cuda.set_device` runs in
  every new thread;
- a stand-in framework whose switch does nothing: the hook's own bookkeeping with one framework to
  switch (labelled as such: it is not a real framework).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time

from gpuctx_jupyter.core.frameworks import Framework
from gpuctx_jupyter.kernel.switching import Choice, Switcher


class NoOpFramework(Framework):
    """A loaded framework with a GPU, whose per-thread switch costs nothing."""

    name = "stand-in"
    module = package = "gpuctx_bench_stand_in"

    def loaded(self):
        return True

    def initialized(self):
        return True

    def set_current(self, ordinal):
        pass


def noop():
    pass


def one_batch(n: int) -> tuple[list[float], list[float]]:
    """Start and join `n` threads one after another; µs for start() and for start + join."""
    starts, lives = [], []
    clock = time.perf_counter
    for _ in range(n):
        t = threading.Thread(target=noop)
        t0 = clock()
        t.start()
        t1 = clock()
        t.join()
        t2 = clock()
        starts.append((t1 - t0) * 1e6)
        lives.append((t2 - t0) * 1e6)
    return starts, lives


def measure(switcher: Switcher, n: int, batch: int) -> dict[str, dict[str, list[float]]]:
    out = {side: {"start": [], "life": []} for side in ("baseline", "gpuctx")}
    one_batch(min(200, n))  # warm the interpreter's thread machinery
    done = 0
    while done < n:
        k = min(batch, n - done)
        for side in ("baseline", "gpuctx"):
            if side == "gpuctx":
                switcher.threads.install()
            try:
                starts, lives = one_batch(k)
            finally:
                switcher.threads.remove()
            out[side]["start"] += starts
            out[side]["life"] += lives
        done += k
    assert threading.Thread.start.__qualname__ == "Thread.start"  # the hook is out again
    return out


def summarise(case: str, times) -> dict:
    row = {"case": case}
    for side in ("baseline", "gpuctx"):
        for what in ("start", "life"):
            ts = times[side][what]
            row[f"{side}_{what}_median_us"] = round(statistics.median(ts), 2)
            row[f"{side}_{what}_p90_us"] = round(statistics.quantiles(ts, n=10)[-1], 2)
    for what in ("start", "life"):
        row[f"added_{what}_us"] = round(row[f"gpuctx_{what}_median_us"] - row[f"baseline_{what}_median_us"], 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2000, help="threads per case and side (default 2000)")
    ap.add_argument("--batch", type=int, default=100, help="threads per alternating batch (default 100)")
    ap.add_argument("--out", "--json", dest="out", default="build/benchmarks/thread_start.json", help="where to write the JSON")
    ap.add_argument("--no-torch", action="store_true", help="skip the case that imports torch")
    args = ap.parse_args()

    rows = []
    sw = Switcher()  # the real framework adapters: torch, CuPy, Numba, JAX
    assert not any(fw.loaded() for fw in sw.frameworks), "run this in a fresh process"
    rows.append(summarise("no GPU framework, no device chosen", measure(sw, args.threads, args.batch)))
    sw.use(Choice(0))
    rows.append(summarise("no GPU framework, cuda:0 chosen", measure(sw, args.threads, args.batch)))
    torch_info = None
    if not args.no_torch:
        import torch

        gpu = torch.cuda.is_available()
        if gpu:
            torch.ones(1, device="cuda")  # CUDA started: new threads get torch.cuda.set_device
        sw.use(Choice(0))
        torch_info = {"version": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu,
                      "device": torch.cuda.get_device_name(0) if gpu else None}
        label = "torch (CUDA) imported" if gpu else "torch (CPU-only build) imported"
        rows.append(summarise(f"{label}, cuda:0 chosen; thread never touches torch",
                              measure(sw, args.threads, args.batch)))
    fake = Switcher(frameworks=(NoOpFramework(),))
    fake.use(Choice(0))
    rows.append(summarise("stand-in framework (no-op switch), cuda:0 chosen", measure(fake, args.threads, args.batch)))

    head = f"{'case':<72} {'start() µs':>22} {'start+join µs':>22}"
    print(f"thread start, {args.threads} threads per case and side, median (baseline → gpuctx, added)")
    print(head)
    print("-" * len(head))
    for r in rows:
        s = f"{r['baseline_start_median_us']:.1f} → {r['gpuctx_start_median_us']:.1f} ({r['added_start_us']:+.1f})"
        life = f"{r['baseline_life_median_us']:.1f} → {r['gpuctx_life_median_us']:.1f} ({r['added_life_us']:+.1f})"
        print(f"{r['case']:<72} {s:>22} {life:>22}")
    result = {
        "benchmark": "thread_start",
        "threads": args.threads,
        "batch": args.batch,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch_info,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
