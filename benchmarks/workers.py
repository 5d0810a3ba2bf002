"""Data-parallel training from a notebook: gpuctx's warm workers against accelerate's
notebook_launcher and torchrun, the same DDP loop in one run.

    python benchmarks/workers.py [--workers N] [--cpu] [--steps 200] [--json out.json]

The loop (`train` below, identical in all three): a 4-layer MLP in DistributedDataParallel with
AdamW on synthetic data already on the device; one step, then `--warm-steps`, then `--steps`
timed. Rank 0 reports when its first step finished and its steps/s. Cases, in this order:

  %gpu workers      a real ipykernel: `%gpu workers start all` (→ ready), then a `%%on_gpu all`
                    cell calling train (→ first step), then the same cell again
  … prepared        a kernel started as the server's hook starts it for a notebook holding the
                    line: gpuctx prepares the workers once it has read the notebook; the line
                    runs `--read` s after the kernel's start (10: the user reads; 0: Run All)
  … from the pool   a real jupyter_server with its warm pool: the notebook opened once the imports
                    standby (with the workers' imports) is ready, the line run `--pool-read` s
                    after the open (0: Run All); the workers are forked with their imports done
  notebook_launcher a real ipykernel that has imported torch (no CUDA): accelerate's
                    notebook_launcher(train, num_processes=N), twice (each call starts new processes)
  torchrun          `python -m torch.distributed.run --standalone --nproc_per_node N` on a script
                    holding the same train

Times are wall clock from the request (the cell sent, the process started) to rank 0's first
step; steps/s is rank 0's. Without a GPU (`--cpu`, or none visible) the loop is small and runs on
CPU workers with gloo. `--repeat N` runs the %gpu workers cases N times, interleaved, and shows
medians (ready's range beside it). Prints a table and writes JSON (the medians and every run).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuctx_jupyter.core import inventory  # noqa: E402
from tests.harness import kernels  # noqa: E402
from tests.harness.faults import pool_of  # noqa: E402
from tests.harness.notebooks import notebook  # noqa: E402
from tests.harness.server import Server  # noqa: E402

# The one training loop every case runs (as source: a kernel cell, a worker cell, a script).
LOOP = '''
def train(t0, steps, out, warm_steps=10, dim=4096, batch=1024):
    import json, os, socket, time
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # a launcher that runs one process in place sets nothing
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    # torchrun's and accelerate's processes see every GPU; a gpuctx worker sees its own as cuda:0
    device = torch.device("cuda", local if torch.cuda.device_count() > 1 else 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    layers = [nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim), nn.GELU(),
              nn.Linear(dim, dim)]
    model = DDP(nn.Sequential(*layers).to(device), device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, dim, device=device), torch.randn(batch, dim, device=device)

    def step():
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    step()
    sync()
    first = time.time()
    for _ in range(warm_steps):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    rate = steps / (time.perf_counter() - t)
    if dist.get_rank() == 0:
        with open(out, "w") as fh:
            json.dump({"first_step_at": first, "first_step_s": first - t0, "steps_per_s": rate,
                       "world": dist.get_world_size(), "device": str(device)}, fh)
    return rate
'''


def report(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def ok(r, what: str):
    if r.reply.get("status") != "ok":
        raise RuntimeError(f"{what} failed: {r.text[-3000:]}")
    return r


def ours(n: int, cpu: bool, steps: int, size: dict, tmp: str, read_s: float | None = None) -> list[dict]:
    """`%gpu workers start` then the loop. `read_s` None: a kernel that loads gpuctx by hand, no
    warm-up (the workers start when the line runs). Else a kernel started as the server's hook
    starts it for a notebook holding the line (gpuctx prepares the workers), the line run
    `read_s` s after the kernel is ready: the user reading first, or Run All (0)."""
    which = f"{n} --cpu" if cpu else "all" if n == len(inventory.take().devices) else str(n)
    if read_s is None:
        km, kc = kernels.start(env={"GPUCTX_WARM": "0"}, cwd=tmp)
        prefix, labels = "%gpu workers", ("first cell", "the cell again")
    else:
        folder = os.path.join(tmp, f"prepared-{read_s:g}")
        os.makedirs(folder)
        path = os.path.join(folder, "train.ipynb")
        cells = [f"%gpu workers start {which}", "import torch\nimport torch.distributed as dist",
                 "%%on_gpu all\n" + LOOP]
        notebook(pathlib.Path(path), cells)
        opened = time.time()
        km, kc = kernels.start(env={"JPY_SESSION_NAME": path, "GPUCTX_WARM": "auto",
                                    "GPUCTX_WARM_SOURCE": "server hook"}, extra_arguments=["--ext=gpuctx"], cwd=folder)
        prefix, labels = f"%gpu workers, prepared, line run {read_s:g} s after open", ("first cell",)
        time.sleep(max(0.0, opened + read_s - time.time()))  # the user reading (from the kernel's start)
    rows = []
    try:
        if read_s is None:
            ok(kernels.run(kc, "%load_ext gpuctx"), "load")
        t0 = time.time()
        start = ok(kernels.run(kc, f"%gpu workers start {which}", timeout=600), "%gpu workers start")
        ready = time.time() - t0
        print(start.stdout.strip())
        for label in labels:
            out = os.path.join(tmp, f"ours-{read_s}-{len(rows)}.json")
            sent = time.time()
            cell = "%%on_gpu all\n" + LOOP + f"\nrate = train({sent}, {steps}, {out!r}, **{size!r})"
            ok(kernels.run(kc, cell, timeout=600), label)
            r = report(out)
            row = {"case": f"{prefix}: {label}", "first_step_s": r["first_step_s"], "steps_per_s": r["steps_per_s"],
                   "world": r["world"], "device": r["device"]}
            if not rows:
                row.update(ready_s=ready, start_to_first_step_s=r["first_step_at"] - t0,
                           ready_line=start.stdout.strip().splitlines()[-1], how=how(start.stdout))
            rows.append(row)
        kernels.run(kc, "%gpu workers stop", timeout=120)
    finally:
        kernels.stop(km, kc)
    return rows


def how(stdout: str) -> str:
    """How `%gpu workers start` started them, from what it printed (a case that meant to adopt
    prepared workers but started fresh ones measures the fresh start: the table says so)."""
    if "imports done)" in stdout:
        return "adopted, forked" if "forked" in stdout else "adopted"
    if "forked with their imports done ahead" in stdout:
        return "forked"
    return "started fresh"


def zygote_ready(srv) -> bool:
    """The server's imports standby has done the workers' imports too (kernel/worker_zygote.py):
    its child `worker_entry imports SOCKET` says so in the log beside SOCKET."""
    import psutil

    for s in (pool_of(srv) or {}).get("standbys", []):
        if s["kind"] != "imports" or not s["ready"]:
            continue
        for child in psutil.Process(s["pid"]).children():
            cmd = child.cmdline()
            if cmd[-2:-1] == ["imports"]:
                try:
                    with open(os.path.join(os.path.dirname(cmd[-1]), "imports.log")) as fh:
                        return "modules imported in" in fh.read()
                except OSError:
                    return False
    return False


def pool_case(n: int, cpu: bool, steps: int, size: dict, tmp: str, read_s: float) -> list[dict]:
    """A real jupyter_server with its warm pool: the notebook opened once its imports standby is
    ready (with the workers' imports), `%gpu workers start` run `read_s` s after the open (0: Run
    All), then the loop. The workers are forked with their imports done."""
    which = f"{n} --cpu" if cpu else "all" if n == len(inventory.take().devices) else str(n)
    root = os.path.join(tmp, f"pool-{read_s:g}")
    os.makedirs(root)
    notebook(pathlib.Path(root, "train.ipynb"), [f"%gpu workers start {which}", "import torch", "%%on_gpu all\n" + LOOP])
    srv = Server(root, ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True"],
                 env={"GPUCTX_SERVER_POOL": "auto", "JUPYTER_DATA_DIR": os.path.join(root, ".jupyter-data")}).start()
    try:
        waiting = time.monotonic()
        while not zygote_ready(srv):
            if time.monotonic() - waiting > 600:
                return [{"case": f"%gpu workers, from the warm pool, line run {read_s:g} s after open",
                         "skipped": "no imports standby with the workers' imports within 600 s"}]
            time.sleep(0.5)
        opened = time.time()
        kid = srv.start_kernel(path="train.ipynb")
        ks = srv.channels(kid)
        try:
            time.sleep(max(0.0, opened + read_s - time.time()))
            t0 = time.time()
            start = ok(ks.execute(f"%gpu workers start {which}", timeout=600), "%gpu workers start")
            ready = time.time() - t0
            line = start.stdout.strip().splitlines()[-1]
            print(line)
            out = os.path.join(tmp, f"pool-{read_s:g}.json")
            sent = time.time()
            cell = "%%on_gpu all\n" + LOOP + f"\nrate = train({sent}, {steps}, {out!r}, **{size!r})"
            ok(ks.execute(cell, timeout=600), "first cell")
            r = report(out)
        finally:
            ks.close()
    finally:
        srv.stop()
    return [{"case": f"%gpu workers, from the warm pool, line run {read_s:g} s after open: first cell",
             "first_step_s": r["first_step_s"], "steps_per_s": r["steps_per_s"], "world": r["world"],
             "device": r["device"], "ready_s": ready, "start_to_first_step_s": r["first_step_at"] - t0,
             "open_to_ready_s": t0 + ready - opened, "how": how(start.stdout), "ready_line": line}]


def accelerate_case(n: int, steps: int, size: dict, tmp: str) -> list[dict]:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return [{"case": "notebook_launcher", "skipped": "accelerate is not installed"}]
    km, kc = kernels.start(env={"GPUCTX_WARM": "0"}, cwd=tmp)
    rows = []
    try:
        ok(kernels.run(kc, "import torch\nfrom accelerate import notebook_launcher\n" + LOOP), "imports")
        for label in ("notebook_launcher: first call", "notebook_launcher: called again"):
            out = os.path.join(tmp, f"accelerate-{len(rows)}.json")
            sent = time.time()
            ok(kernels.run(kc, f"notebook_launcher(train, args=({sent}, {steps}, {out!r}, 10, {size['dim']}, "
                               f"{size['batch']}), num_processes={n}, use_port='{free_port()}')", timeout=600), label)
            r = report(out)
            rows.append({"case": label, "first_step_s": r["first_step_s"], "steps_per_s": r["steps_per_s"],
                         "world": r["world"], "device": r["device"]})
    finally:
        kernels.stop(km, kc)
    return rows


def torchrun_case(n: int, steps: int, size: dict, tmp: str) -> list[dict]:
    script = os.path.join(tmp, "train_ddp.py")
    with open(script, "w") as fh:
        fh.write(LOOP + "\nif __name__ == '__main__':\n    import sys\n"
                 f"    train(float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], 10, {size['dim']}, {size['batch']})\n")
    out = os.path.join(tmp, "torchrun.json")
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                           script, str(t0), str(steps), out], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if done.returncode != 0:
        raise RuntimeError(f"torchrun failed: {done.stderr[-3000:]}")
    r = report(out)
    return [{"case": "torchrun", "first_step_s": r["first_step_s"], "steps_per_s": r["steps_per_s"],
             "world": r["world"], "device": r["device"]}]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> dict:
    inv = inventory.take()
    import torch

    return {"gpus": [d.record.name for d in inv.devices], "no_gpu": inv.no_gpu_reason(), "python": platform.python_version(),
            "torch": torch.__version__, "host": platform.node(), "date": time.strftime("%Y-%m-%d")}


def medians(runs: list[dict]) -> list[dict]:
    """One row per case: the median of each figure over its runs, with the range of `ready` and
    how the workers were started in each run."""
    import statistics

    cases: dict[str, list[dict]] = {}
    for r in runs:
        cases.setdefault(r["case"], []).append(r)
    rows = []
    for case, rs in cases.items():
        done = [r for r in rs if "skipped" not in r]
        if not done:
            rows.append(rs[0])
            continue
        row = {"case": case, "runs": len(done), "world": done[0]["world"], "device": done[0]["device"]}
        for key in ("ready_s", "first_step_s", "start_to_first_step_s", "steps_per_s", "open_to_ready_s"):
            values = [r[key] for r in done if key in r]
            if values:
                row[key] = statistics.median(values)
                row[key.removesuffix("_s") + "_all"] = values
        hows = sorted({r["how"] for r in done if "how" in r})
        if hows:
            row["how"] = ", ".join(hows)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ["case", "ready", "first step", "start → first step", "steps/s", "workers"]
    lines = ["| " + " | ".join(head) + " |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['case']} | – | – | – | skipped: {r['skipped']} | |")
            continue
        ready = f"{r['ready_s']:.2f} s" if "ready_s" in r else "–"
        if len(r.get("ready_all", [])) > 1:
            ready += f" ({min(r['ready_all']):.2f}–{max(r['ready_all']):.2f}, {len(r['ready_all'])} runs)"
        total = f"{r['start_to_first_step_s']:.2f} s" if "start_to_first_step_s" in r else f"{r['first_step_s']:.2f} s"
        lines.append(f"| {r['case']} | {ready} | {r['first_step_s']:.2f} s | {total} | {r['steps_per_s']:.1f} | "
                     f"{r.get('how', '')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, help="number of ranks (default: every visible GPU; 2 on the CPU)")
    parser.add_argument("--cpu", action="store_true", help="CPU workers with gloo, also where GPUs are visible")
    parser.add_argument("--steps", type=int, help="timed steps (default 200 on GPUs, 30 on the CPU)")
    parser.add_argument("--read", type=float, nargs="*", default=[10.0, 0.0],
                        help="prepared cases: seconds from the kernel's start to the line (default 10 and 0)")
    parser.add_argument("--pool-read", type=float, nargs="*", default=[0.0],
                        help="warm-pool cases: seconds from the notebook's open to the line (default 0: Run All)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the %%gpu workers cases (medians shown)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    gpus = len(inventory.take().devices)
    cpu = args.cpu or gpus == 0
    n = args.workers or (2 if cpu else gpus)
    steps = args.steps or (30 if cpu else 200)
    size = {"dim": 256, "batch": 64} if cpu else {"dim": 4096, "batch": 1024}
    env_cpu = {"CUDA_VISIBLE_DEVICES": ""} if cpu and gpus else {}
    os.environ.update(env_cpu)  # torchrun's and accelerate's processes on the CPU too
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuctx-bench-workers-") as tmp:
        for rep in range(args.repeat):  # interleaved: drift of the host hits every case alike
            sub = os.path.join(tmp, f"run{rep}")
            os.makedirs(sub)
            rows += ours(n, cpu, steps, size, sub)
            for read_s in args.read:
                rows += ours(n, cpu, steps, size, sub, read_s=read_s)
            for read_s in args.pool_read:
                rows += pool_case(n, cpu, steps, size, sub, read_s)
        runs = rows
        rows = medians(rows)
        rows += accelerate_case(n, steps, size, tmp)
        rows += torchrun_case(n, steps, size, tmp)
    info = machine()
    where = f"{n} × {info['gpus'][0]}" if not cpu else f"{n} CPU workers (gloo)"
    print(f"\n{where}, torch {info['torch']}, {steps} steps of a {size['dim']}-wide 4-layer MLP, batch {size['batch']} "
          "per rank")
    print(table(rows))
    torchrun = next((r for r in rows if r["case"] == "torchrun"), None)
    if torchrun:
        for r in (x for x in rows if "ready_s" in x):
            print(f"\n{r['case'].rsplit(':', 1)[0]}: ready {r['ready_s']:.2f} s, first DDP step {r['first_step_s']:.2f} s "
                  f"after the cell was sent; steps/s {r['steps_per_s'] / torchrun['steps_per_s']:.1%} of torchrun's")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": info, "workers": n, "cpu": cpu, "steps": steps, "size": size, "repeat": args.repeat,
                       "rows": rows, "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
