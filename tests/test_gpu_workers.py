"""`%gpu workers` on real GPUs (marked `gpu`; scripts/gpu-check.sh runs them): one worker per GPU,
each seeing only its GPU (by UUID), warmed, in an NCCL process group; their memory counted as the
notebook's by the kernel and by a real server; a GPU another process holds refused; an
out-of-memory error on a worker explained under its rank."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from gpuctx_jupyter.kernel.render import gib

from .harness import kernels
from .harness.kernels import run
from .harness.server import Server
from .harness.waiting import wait_for
from .harness.workers import gpus, nvml_pids

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
pytest.importorskip("ipyparallel")
GIB = 1024**3


def who(r) -> list[dict]:
    return sorted((json.loads(line.split("WHO ", 1)[1]) for d in r.data for line in d.get("text/plain", "").splitlines()
                   if line.startswith("WHO ")), key=lambda w: w["rank"])


@pytest.fixture(scope="module")
def gpu_workers(tmp_path_factory):
    km, kc = kernels.start(env={"GPUCTX_WARM": "0"}, cwd=str(tmp_path_factory.mktemp("gpu-workers")))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        r = run(kc, "%gpu workers start all", timeout=600)
        assert r.reply["status"] == "ok", r.text
        yield km, kc, r
    finally:
        kernels.stop(km, kc)


def test_one_worker_per_gpu_sees_only_its_gpu_and_joins_nccl(gpu_workers):
    _, kc, started = gpu_workers
    uuids = gpus()
    assert f"{len(uuids)} worker" in started.stdout and f"torch.distributed nccl, world size {len(uuids)}" in started.stdout
    r = run(kc, "%%on_gpu all\nimport json, os, torch, torch.distributed as dist\n"
                "t = torch.full((1024,), float(dist.get_rank() + 1), device='cuda')\ndist.all_reduce(t)\n"
                "print('WHO ' + json.dumps({'rank': dist.get_rank(), 'count': torch.cuda.device_count(), "
                "'uuid': 'GPU-' + str(torch.cuda.get_device_properties(0).uuid), 'backend': dist.get_backend(), "
                "'sum': t[0].item(), 'cvd': os.environ['CUDA_VISIBLE_DEVICES'], 'local_rank': os.environ['LOCAL_RANK']}))")
    assert r.reply["status"] == "ok", r.text
    ranks = who(r)
    n = len(uuids)
    assert [w["rank"] for w in ranks] == list(range(n)) and {w["count"] for w in ranks} == {1}
    assert [w["uuid"] for w in ranks] == uuids and [w["cvd"] for w in ranks] == uuids  # rank r on cuda:r, by UUID
    assert {w["backend"] for w in ranks} == {"nccl"} and {w["sum"] for w in ranks} == {n * (n + 1) / 2}
    assert [w["local_rank"] for w in ranks] == [str(i) for i in range(n)]
    r = run(kc, "%%on_gpu all\nfrom gpuctx_jupyter.kernel import worker_side\nw = worker_side._warmer\n"
                "[s.name for s in w.plan.steps if s.state == 'done'], w.status.state")
    assert r.reply["status"] == "ok", r.text
    done, state = eval(r.data[-1]["text/plain"])  # no notebook here: the basic recipe and the training steps
    assert state == "done" and "cuda init" in done and any(name.startswith("optimizer step") for name in done)


def test_the_workers_memory_is_the_notebooks_in_status_and_the_listing(gpu_workers):
    _, kc, _ = gpu_workers
    # torch's allocated figure also counts what torch keeps for itself once matmuls have run (the
    # warm-up's, the DDP step's): a cuBLAS workspace per cuBLAS handle and stream, 32 MiB each on
    # Hopper, one for the cells' thread and one for autograd's. So the cell's 1 GiB is a difference,
    # and the listing must show each rank's own torch figure.
    r = run(kc, "%%on_gpu all\nimport torch\nbefore = torch.cuda.memory_allocated()\n"
                "keep = torch.ones(2**28, device='cuda')  # 1 GiB on each GPU\n"
                "torch.cuda.memory_allocated() - before, torch.cuda.memory_allocated()")
    assert r.reply["status"] == "ok", r.text
    ranks = json.loads(run(kc, "import json\nprint(json.dumps(_ranks))").stdout)  # [added, allocated] per rank
    assert [added for added, _ in ranks] == [GIB] * len(gpus())
    r = run(kc, "from gpuctx_jupyter.core import inventory\nprint(sum(inventory.process_memory(inventory.take()).values()))")
    assert int(r.stdout) >= len(gpus()) * GIB  # NVML's figure for this kernel's processes: the workers' 1 GiB each
    r = run(kc, "%gpu status")
    assert "NVML (whole process)" in r.text and "this notebook's workers" in r.text
    listing = run(kc, "%gpu workers").data[0]["text/plain"].splitlines()
    for row, (_, allocated) in zip(listing[3:3 + len(gpus())], ranks, strict=True):
        assert f"GiB (torch {gib(allocated)} allocated" in row, row  # NVML's figure, then the rank's torch figure


def test_more_workers_than_gpus_and_a_gpu_another_process_holds_are_refused(gpu_workers, tmp_path):
    _, kc, _ = gpu_workers
    run(kc, "%gpu workers stop", timeout=120)
    n = len(gpus())
    r = run(kc, f"%gpu workers start {n + 1}")
    assert r.reply["ename"] == "UsageError" and r.reply["evalue"].startswith(f"{n + 1} workers asked for, but this "
                                                                           f"kernel sees {n} GPU")
    ready = tmp_path / "holding"
    holder = subprocess.Popen([sys.executable, "-c", "import pathlib, sys, time, torch\n"
                               "x = torch.ones(2**28, device='cuda')\ntorch.cuda.synchronize()\n"
                               f"pathlib.Path({str(ready)!r}).touch()\ntime.sleep(600)"],
                              env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpus()[0]))
    try:
        wait_for(ready.exists, timeout=120)
        wait_for(lambda: holder.pid in nvml_pids(), timeout=30)  # NVML lists it a moment after the allocation
        before = {p.pid for p in psutil.Process(kernels_pid(kc)).children(recursive=True)}
        r = run(kc, "%gpu workers start all")
        assert r.reply["ename"] == "UsageError", r.text
        assert r.reply["evalue"].startswith("cuda:0 (") and f"is in use by another process, pid {holder.pid}" in \
            r.reply["evalue"] and "\n" not in r.reply["evalue"]
        assert {p.pid for p in psutil.Process(kernels_pid(kc)).children(recursive=True)} <= before
    finally:
        holder.kill()
        holder.wait()
    r = run(kc, "%gpu workers start all", timeout=600)  # for the tests after this one
    assert r.reply["status"] == "ok", r.text


def kernels_pid(kc) -> int:
    return int(run(kc, "import os; print(os.getpid())").stdout)


def test_out_of_memory_on_a_worker_is_explained_under_its_rank(gpu_workers):
    _, kc, _ = gpu_workers
    r = run(kc, "%%on_gpu all\nimport torch\nhuge = torch.empty(2**40, device='cuda')")
    assert r.reply["ename"] == "RanksFailed" and "OutOfMemoryError" in r.reply["evalue"]
    shown = r.data[0]["text/plain"]
    assert "gpuctx: torch ran out of memory on cuda:0" in shown and "fixes, best first:" in shown
    r = run(kc, "%%on_gpu all\n1")
    assert r.reply["status"] == "ok"


def test_a_server_attributes_the_workers_gpu_memory_to_the_notebook(tmp_path):
    srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                 "--MappingKernelManager.default_kernel_name=python3"]).start(timeout=120)
    try:
        with open(tmp_path / "ddp.ipynb", "w") as fh:
            json.dump({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, fh)
        kid = srv.start_kernel(path="ddp.ipynb")
        ks = srv.channels(kid)
        ks.wait_ready(120)
        # --share: the module's other kernel keeps its workers on these GPUs meanwhile
        r = ks.execute("%load_ext gpuctx\n%gpu workers start all --share", timeout=600)
        assert r.reply["status"] == "ok", r.text
        r = ks.execute("import json\nprint(json.dumps([w.pid for w in get_ipython()._gpuctx.workers.ranks]))")
        workers = set(json.loads(r.stdout))

        def attributed():
            status, snap = srv.api("GET", "/gpuctx/api/devices")
            found = {p["pid"] for d in snap["devices"] for p in d["processes"]
                     if p.get("kernel", {}).get("id") == kid and p.get("kernel", {}).get("paths") == ["ddp.ipynb"]}
            return workers <= found

        wait_for(attributed, timeout=60)  # each worker's context, under the notebook's name
        ks.close()
        below = psutil.Process(srv.kernel_pid(kid)).children(recursive=True)
        assert srv.api("DELETE", f"/api/kernels/{kid}")[0] == 204
        wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in below), timeout=60)
    finally:
        srv.stop()

