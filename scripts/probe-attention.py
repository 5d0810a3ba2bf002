#!/usr/bin/env python3
"""What a first `scaled_dot_product_attention` call costs, and what a warm-up can pay ahead.

    python3 scripts/probe-attention.py [--dtype bfloat16] [--json OUT.json]

In one fresh process on the first GPU (or the CPU): the backend torch picks for a transformer's
causal attention, then the forward and backward times of first calls — at shape A, again at A,
at a new shape B, and at A from another thread — beside the steady time. A cost that comes back
at B is a cost per shape (a backend that builds a plan per problem); one that comes back in the
other thread is a cost per thread. Either way, a warm-up at other shapes, or in its own thread,
cannot pay it for the notebook (issue "Warm what the next cell needs", the bf16 transformer).
Last, what the warm-up does with a problem the notebook's last run noted: C built forward and
backward in a thread that then exits, then C's first call here, beside a first call at D that
nothing built.
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import torch
import torch.nn.functional as F


def qkv(b: int, h: int, t: int, d: int, dev, dtype):
    """q, k and v as a transformer makes them: one projection, split, heads moved forward."""
    x = torch.randn(b, t, 3 * h * d, device=dev, dtype=dtype, requires_grad=True)
    return x.view(b, t, 3, h, d).transpose(1, 3).unbind(2)


def call(shape, dev, dtype) -> tuple[float, float]:
    """Seconds of one forward and of its backward."""
    q, k, v = qkv(*shape, dev, dtype)
    sync(dev)
    t0 = time.perf_counter()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    sync(dev)
    t1 = time.perf_counter()
    out.float().sum().backward()
    sync(dev)
    return t1 - t0, time.perf_counter() - t1


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def backend(shape, dev, dtype) -> str:
    q, k, v = qkv(*shape, dev, dtype)
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)).name
    except Exception as exc:  # noqa: BLE001 — a private call: say what it did
        return f"unknown ({type(exc).__name__}: {exc})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    dtype = getattr(torch, args.dtype) if dev.type == "cuda" else torch.float32
    a, b = (4, 8, 64, 32), (2, 4, 128, 32)  # batch, heads, tokens, head size
    torch.zeros(1, device=dev) @ torch.zeros(1, 1, device=dev)  # the context, cuBLAS: not attention's
    rows = {"backend at A": backend(a, dev, dtype)}
    rows["first call at A"] = call(a, dev, dtype)
    rows["again at A"] = call(a, dev, dtype)
    rows["first call at B (new shape)"] = call(b, dev, dtype)
    other: list = []

    def in_another_thread():
        try:
            other.append(call(a, dev, dtype))
        except Exception as exc:  # noqa: BLE001 — shown in its row
            other.append(f"failed: {type(exc).__name__}: {exc}")

    worker = threading.Thread(target=in_another_thread)
    worker.start()
    worker.join()
    rows["at A from another thread"] = other[0]
    # What gpuctx's warm-up does with a notebook's noted problem (kernel/warm/attention.py): forward
    # and backward in its own thread, which then exits; the cells' thread's first call after that,
    # beside a first call at a shape nothing built (D), both new sequence lengths.
    c, d = (4, 8, 96, 32), (4, 8, 160, 32)
    builder = threading.Thread(target=lambda: other.append(call(c, dev, dtype)))
    builder.start()
    builder.join()
    rows["C built in an exited thread"] = other[-1]
    rows["then C here"] = call(c, dev, dtype)
    rows["first call at D, nothing built"] = call(d, dev, dtype)
    rows["steady at A"] = min(call(a, dev, dtype) for _ in range(5))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"scaled_dot_product_attention, causal, {str(dtype).split('.')[-1]}, torch {torch.__version__}, {name}")
    for key, value in rows.items():
        text = value if isinstance(value, str) else f"forward {value[0] * 1e3:7.1f} ms   backward {value[1] * 1e3:7.1f} ms"
        print(f"  {key:<30} {text}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": name, "torch": torch.__version__, "dtype": str(dtype), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
