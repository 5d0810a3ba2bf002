"""Who holds my GPU: out of memory in one notebook while two idle notebooks hold the GPU, through a
real jupyter_server, as a user would meet it (issue #18).

    python benchmarks/oom_demo.py [--json out.json] [--idle 15]

Three notebooks, kernels started through the server's sessions API and driven over the kernel
websocket as JupyterLab does:
  holder_live.ipynb   allocates HOLD bytes as a live tensor, then idles
  holder_cache.ipynb  allocates HOLD bytes and `del`s them without empty_cache (torch's cache), idles
  train.ipynb         allocates EXTRA bytes more than the GPU has free → out of memory
HOLD = min(60 GiB, 43% of the GPU's memory) and EXTRA = min(40 GiB, 2/3 of HOLD), so it runs on any
GPU with ≥ 40 GiB (on an H200: 60 + 60 GiB held, 40 GiB more than is left asked).

It checks that the explanation under train.ipynb's traceback names both notebooks with their memory
and idle time and ranks "release the cache of holder_cache.ipynb" first; then POSTs
/gpuctx/api/kernels/<id>/release for holder_cache.ipynb, and re-runs train.ipynb's allocation,
which must now succeed. Prints a table and writes JSON (memory before/after, time to release).

Without a GPU it says so and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuctx_jupyter.contract import holders as holders_file  # noqa: E402
from gpuctx_jupyter.core import inventory  # noqa: E402
from tests.harness.notebooks import notebook  # noqa: E402
from tests.harness.server import Server  # noqa: E402

GIB = 2**30
FIGURES = ("import json, os\nfrom gpuctx_jupyter.core import frameworks as _f\n"
           "print(json.dumps({'pid': os.getpid(), 'holders': os.environ.get('GPUCTX_HOLDERS'),"
           " 'memory': [f.as_dict() for f in _f.allocator_figures()]}))")


def gpu0():
    inv = inventory.take()
    reason = inv.no_gpu_reason()
    return (None, reason) if reason else (inv.by_ordinal(0).record, None)


def used_now() -> int:
    return gpu0()[0].memory_used


def cell(ks, code: str, timeout: float = 180):
    return ks.execute(code, timeout=timeout)


def last_json(run) -> dict:
    return json.loads(run.stdout.strip().splitlines()[-1])


def wait_for_holders(path: str, kernel_ids: list[str], timeout: float = 60) -> holders_file.HoldersFile | None:
    """The holders file once it lists every kernel with allocator figures (the server asks them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        parsed, _ = holders_file.read_holders({holders_file.HOLDERS: path})
        if parsed:
            ready = {k.id for k in parsed.kernels if k.memory_time is not None and k.memory}
            if set(kernel_ids) <= ready:
                return parsed
        time.sleep(0.5)
    return holders_file.read_holders({holders_file.HOLDERS: path})[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "oom_demo.json"))
    ap.add_argument("--idle", type=float, default=15.0, help="seconds the holders idle before the OOM")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    t_start = time.monotonic()
    record, reason = gpu0()
    out: dict = {"host": platform.node(), "time": time.time(), "gpu": record is not None}
    if record is None:
        out["reason"] = reason
        print(f"oom demo: no GPU: {reason}")
        json.dump(out, open(args.json, "w"), indent=2)
        return 2
    total = record.memory_total
    if total < 40 * GIB:
        print(f"oom demo: {record.name} has {total / GIB:.1f} GiB; the demo needs a GPU with at least 40 GiB")
        return 2
    hold = min(60 * GIB, int(0.43 * total) // GIB * GIB)
    extra = min(40 * GIB, hold * 2 // 3 // GIB * GIB)
    out.update(gpu_name=record.name, memory_total=total, hold=hold, extra=extra, used_at_start=record.memory_used)
    root = tempfile.mkdtemp(prefix="gpuctx-oom-demo-")
    from pathlib import Path

    for name in ("holder_live", "holder_cache", "train"):
        notebook(Path(root) / f"{name}.ipynb", ["import torch"])
    srv = Server(root, ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                        "--MappingKernelManager.default_kernel_name=python3"])
    srv.start(timeout=120)
    steps: dict[str, float] = {}
    try:
        socks, ids = {}, {}
        for name in ("holder_live", "holder_cache", "train"):
            ids[name] = srv.start_kernel(path=f"{name}.ipynb")
            socks[name] = srv.channels(ids[name])
            socks[name].wait_ready(120)
        t0 = time.perf_counter()
        live = cell(socks["holder_live"], "import torch\n"
                    f"x = torch.empty({hold}, dtype=torch.uint8, device='cuda'); x.fill_(1)\n" + FIGURES)
        cache = cell(socks["holder_cache"], "import torch\n"
                     f"x = torch.empty({hold}, dtype=torch.uint8, device='cuda'); x.fill_(1); del x\n"
                     "keep = 'my variable'\n" + FIGURES)
        steps["holders_allocate_s"] = time.perf_counter() - t0
        for name, r in (("holder_live", live), ("holder_cache", cache)):
            if r.reply.get("status") != "ok":
                raise RuntimeError(f"{name} failed: {r.stderr[-2000:]}")
        train_env = last_json(cell(socks["train"], "import torch; torch.cuda.init()\n" + FIGURES))
        holders_path = train_env["holders"]
        out["holders_file"] = holders_path
        if not holders_path:
            raise RuntimeError("train.ipynb's kernel has no GPUCTX_HOLDERS: the server did not wire the holders file")
        time.sleep(args.idle)  # the two holders idle, as notebooks left open do
        parsed = wait_for_holders(holders_path, [ids["holder_live"], ids["holder_cache"]])
        out["holders_listed"] = [k.as_dict() for k in parsed.kernels] if parsed else None
        used_before = used_now()
        oom = cell(socks["train"], "free, total = torch.cuda.mem_get_info()\n"
                   f"need = free + {extra}\n"
                   "y = torch.empty(need, dtype=torch.uint8, device='cuda')")
        text = oom.stderr
        block = text[text.find("gpuctx: torch ran out of memory"):] if "gpuctx: torch ran out" in text else ""
        out["oom"] = {"status": oom.reply.get("status"), "ename": oom.reply.get("ename"), "explanation": block.strip()}
        print(block.strip() or text[-3000:])
        lines = block.strip().splitlines()
        fixes = block[block.find("fixes, best first:"):].splitlines()[1:] if "fixes, best first:" in block else []
        checks = {
            "out of memory": oom.reply.get("ename") == "OutOfMemoryError",
            "at most 12 lines": 0 < len(lines) <= 12,
            "names holder_live.ipynb": "holder_live.ipynb" in block,
            "names holder_cache.ipynb": "holder_cache.ipynb" in block,
            "idle times shown": block.count("idle ") >= 2,
            "release of holder_cache ranked first": bool(fixes) and "release the cache of holder_cache.ipynb" in fixes[0],
        }
        snap_status, snap = srv.api("GET", "/gpuctx/api/devices")
        out["devices_kernels"] = [p.get("kernel") for d in (snap or {}).get("devices", []) for p in d.get("processes", [])
                                  if p.get("kernel")]
        t0 = time.perf_counter()
        status, answer = srv.api("POST", f"/gpuctx/api/kernels/{ids['holder_cache']}/release")
        steps["release_s"] = time.perf_counter() - t0
        out["release"] = {"http": status, "answer": answer}
        time.sleep(0.5)
        used_after = used_now()
        t0 = time.perf_counter()
        again = cell(socks["train"], "y = torch.empty(need, dtype=torch.uint8, device='cuda'); y.fill_(2)\n"
                     "torch.cuda.synchronize(); print(y.numel() == need)")
        steps["rerun_s"] = time.perf_counter() - t0
        checks["release answered ok"] = status == 200 and (answer or {}).get("status") == "ok"
        checks["re-run succeeds"] = again.reply.get("status") == "ok" and again.stdout.strip().endswith("True")
        kept = cell(socks["holder_cache"], "print(keep)")
        checks["holder_cache's variables untouched"] = kept.stdout.strip() == "my variable"
        alive = cell(socks["holder_live"], "print(int(x[-1]))")
        checks["holder_live's tensor untouched"] = alive.stdout.strip() == "1"
        out.update(used_before_release=used_before, used_after_release=used_after, steps=steps, checks=checks,
                   rerun={"status": again.reply.get("status"), "stderr": again.stderr[-2000:]})
    finally:
        srv.stop()
    out["seconds"] = time.monotonic() - t_start
    json.dump(out, open(args.json, "w"), indent=2)
    print()
    print(f"{'GPU':<28}{record.name} ({total / GIB:.1f} GiB)")
    print(f"{'held by each idle notebook':<28}{hold / GIB:.1f} GiB (live / cache)")
    print(f"{'train asked beyond free':<28}{extra / GIB:.1f} GiB")
    print(f"{'GPU used before release':<28}{out.get('used_before_release', 0) / GIB:.1f} GiB")
    print(f"{'GPU used after release':<28}{out.get('used_after_release', 0) / GIB:.1f} GiB")
    released = ((out.get("release") or {}).get("answer") or {}).get("released_total") or 0
    print(f"{'released (kernel says)':<28}{released / GIB:.1f} GiB")
    print(f"{'release round trip':<28}{steps.get('release_s', float('nan')) * 1000:.0f} ms")
    print(f"{'re-run of the failed cell':<28}{steps.get('rerun_s', float('nan')) * 1000:.0f} ms")
    print(f"{'whole demo':<28}{out['seconds']:.0f} s")
    for name, ok in out.get("checks", {}).items():
        print(f"  {'✓' if ok else '✗'} {name}")
    print(f"JSON: {args.json}")
    return 0 if out.get("checks") and all(out["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
