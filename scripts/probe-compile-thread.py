#!/usr/bin/env python3
"""Does the thread that ran the warm-up's tiny compile matter to the user's first compile?

    python3 scripts/probe-compile-thread.py --warm-in thread|main|none [--json OUT.json]

In one fresh process: gpuctx's tiny compile (kernel/warm/recipes/torch.py) in a thread of its own
(as the warm-up runs it), in the main thread, or not at all; then, in the main thread, the first
compile and fwd/bwd of a model no cache holds (a width drawn per run, as benchmarks/notebooks/
compile_fresh.ipynb). On an H200 (2026-12-04) a compile the main thread had done before brought
that first compile to 0.9 s, against 1.4-2.6 s after the warm-up's compile in its own thread.
Runs on a GPU machine (cuda:0) or a CPU one.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm-in", choices=("thread", "main", "none"), default="thread")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from gpuctx_jupyter.kernel.warm.recipes.torch import compile_tiny

    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    t0 = time.perf_counter()
    if args.warm_in == "thread":
        worker = threading.Thread(target=compile_tiny, args=(torch, dev))
        worker.start()
        worker.join()
    elif args.warm_in == "main":
        compile_tiny(torch, dev)
    warm_s = time.perf_counter() - t0
    width = random.randrange(200, 400)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, 10)).to(dev)
    x = torch.randn(32, 64, device=dev)
    t0 = time.perf_counter()
    compiled = torch.compile(model)
    compiled(x).sum().backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    print(f"warm-up compile in {args.warm_in}: {warm_s:.2f} s; first compile of a new graph (width {width}) "
          f"in the main thread: {first_s * 1e3:.0f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"warm_in": args.warm_in, "warm_s": warm_s, "first_s": first_s, "width": width,
                       "device": str(dev), "torch": torch.__version__}, fh, indent=1)


if __name__ == "__main__":
    main()
