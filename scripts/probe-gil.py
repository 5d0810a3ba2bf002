#!/usr/bin/env python3
"""How long the kernel's own thread waits for the GIL while the warm-up imports torch.

    python3 scripts/probe-gil.py [--repeat N] [--json OUT.json]

Why: a kernel answers kernel_info (and runs a cell sent at once) in its main thread while the
warm-up imports torch in another. Loading an extension module holds the GIL, including the
dynamic loader's work on torch's shared libraries (relocations and static initialisers: hundreds
of ms for a CUDA build), so the main thread waits behind it. Each repeat, in a fresh Python: a
thread imports torch as the warm-up does — `plain` (importlib), `preloaded` (its libraries
loaded first without the GIL, core/preload.py), or `global-deps` (only those torch loads first) —
while the main thread sleeps 1 ms at a time and records how late it wakes. With --cuda, the same
for CUDA's start in a process that has imported torch (`cuda`: torch's own; `cuda-driver-first`:
core/cuda_driver.start first, which lets go of the GIL; `cuda-as-warmed`: the warm-up's order,
cuda_driver.init and torch.cuda.is_available() before that). Prints a table (with what `preloaded`
loaded) and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r'''
import json, sys, threading, time
mode = sys.argv[1]
done, spans = threading.Event(), {}
from gpuctx_jupyter.core import cuda_driver, preload  # (outside the timed part: ours to import either way)
if mode.startswith("cuda"):
    import torch
t0 = time.perf_counter()
def cuda_work():
    if mode == "cuda-as-warmed":  # the warm-up's order: the scheduler starts the driver, then asks torch
        cuda_driver.init()
        torch.cuda.is_available()
    if mode in ("cuda-driver-first", "cuda-as-warmed"):
        spans["preloaded"] = cuda_driver.start(0)
    spans["preload_s"] = time.perf_counter() - t0
    torch.cuda.init()
    torch.cuda.set_device(0)
    x = torch.randn(1024, 1024, device="cuda")
    (x @ x).sum().item()
    spans["import_s"] = time.perf_counter() - t0
    done.set()
def work():
    if mode.startswith("cuda"):
        try:
            return cuda_work()
        except Exception as exc:  # no GPU here: said in the table
            spans["error"] = f"{type(exc).__name__}: {exc}"
            return done.set()
    if mode == "preloaded":
        spans["preloaded"] = preload.libraries("torch")
    elif mode == "global-deps":  # only the libraries torch loads first (CUDA's, in a CUDA build)
        import importlib.util, os
        lib = os.path.join(os.path.dirname(importlib.util.find_spec("torch").origin), "lib")
        spans["preloaded"] = preload.dlopen(os.path.join(lib, "libtorch_global_deps.so").encode(),
                                            os.RTLD_GLOBAL | os.RTLD_NOW)
    spans["preload_s"] = time.perf_counter() - t0
    if mode == "calls":  # which C calls of the import take over 20 ms (where the main thread waits)
        calls, starts = [], {}
        def hook(frame, event, arg):
            if event == "c_call":
                starts[id(frame)] = time.perf_counter()
            elif event in ("c_return", "c_exception") and id(frame) in starts:
                took = time.perf_counter() - starts.pop(id(frame))
                if took > 0.02 and getattr(arg, "__name__", "") not in ("exec", "__import__"):  # leaves only
                    calls.append([round(time.perf_counter() - t0 - took, 3), round(took, 3),
                                  getattr(arg, "__qualname__", str(arg)), f"{frame.f_code.co_filename}:{frame.f_lineno}"])
        sys.setprofile(hook)
    import torch
    sys.setprofile(None)
    if mode == "calls":
        spans["calls"] = calls
    spans["import_s"] = time.perf_counter() - t0
    done.set()
threading.Thread(target=work).start()
gaps, last = [], time.perf_counter()
while not done.is_set():
    time.sleep(0.001)
    now = time.perf_counter()
    gaps.append((now - last, now - t0))
    last = now
late = [g for g, _ in gaps if g > 0.02]
import os
maps = open("/proc/self/maps").read()
libs = sorted({l.split()[-1] for l in maps.splitlines() if ".so" in l and ("cu" in l or "torch" in l or "nv" in l)})
print(json.dumps({**spans, "libs": libs, "worst_wait_s": max((g for g, _ in gaps), default=0.0),
                  "late_waits_s": sum(late), "late_count": len(late),
                  "late": [[round(at - g, 3), round(g, 3)] for g, at in gaps if g > 0.02]}))
'''


def play(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=300)
    if out.returncode:
        return {"error": out.stderr[-800:]}
    return json.loads(out.stdout.strip().splitlines()[-1])  # (with "error" where CUDA could not start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--calls", action="store_true", help="also once with the import's long C calls listed")
    ap.add_argument("--cuda", action="store_true", help="also CUDA's start after the import (the warm-up's first GPU "
                    "step: torch.cuda.init, set_device, a matmul), as torch does it and with the driver started first")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"plain": [], "global-deps": [], "preloaded": []}
    if args.cuda:
        runs.update({"cuda": [], "cuda-driver-first": [], "cuda-as-warmed": []})
    for _ in range(args.repeat):  # interleaved, so both sides see the same page cache and load
        for mode in runs:
            runs[mode].append(play(mode))
    print(f"{'torch (cuda: start)':<18}{'import ms':>10}{'worst wait ms':>15}{'waits > 20 ms, Σ ms':>22}")
    for mode, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            print(f"{mode:<18} failed: {rs[0].get('error', '')[-300:]}")
            continue
        med = {k: statistics.median(r[k] for r in ok) * 1000 for k in ("import_s", "worst_wait_s", "late_waits_s")}
        print(f"{mode:<18}{med['import_s']:>10.0f}{med['worst_wait_s']:>15.0f}{med['late_waits_s']:>22.0f}")
        if mode == "preloaded":
            print(f"  loaded without the GIL: {', '.join(ok[0].get('preloaded') or []) or 'nothing'}")
    if args.calls:
        r = play("calls")
        runs["calls"] = [r]
        for at, took, fn, where in r.get("calls", []):
            print(f"  at {at * 1000:6.0f} ms: {took * 1000:5.0f} ms in {fn} ({where})")
        print("  main thread late:", ", ".join(f"{g * 1000:.0f} ms at {at * 1000:.0f}" for at, g in r.get("late", [])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
