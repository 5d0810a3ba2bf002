"""Pre-warming on a real GPU (marked `gpu`)."""
from __future__ import annotations

import json
import os
import time

import pytest

from .harness.kernels import control, run, start, stop, warm_up_ended
from .harness.notebooks import STATUS, kernel_config_env, notebook
from .harness.notebooks import warm_status as status
from .harness.server import Server
from .harness.waiting import wait_for

pytestmark = pytest.mark.gpu

PHASES = {"import torch", "cuda init", "alloc", "elementwise", "matmul fp32", "matmul bf16", "conv", "sync"}


def test_every_phase_completes_and_the_first_gpu_cell_finds_cuda_ready(tmp_path):
    km, kc = start(env=kernel_config_env(tmp_path))
    try:
        st = json.loads(run(kc, STATUS.format(wait=120)).stdout.strip().splitlines()[-1])
        assert st["state"] == "done", st
        assert PHASES <= set(st["phases"]), st["phases"]
        r = run(kc, "import torch\nready = torch.cuda.is_initialized()\n"
                    "y = torch.ones(512, 512, device='cuda') @ torch.ones(512, 512, device='cuda')\nprint(ready)")
        assert r.stdout.strip() == "True"  # the first GPU cell did not start CUDA itself
        r = run(kc, "%gpu status")
        assert "warm-up: done on cuda:0" in r.text
    finally:
        stop(km, kc)


def test_the_warm_up_never_returns_memory_the_users_first_cell_cached(tmp_path):
    """The warm-up leaves the allocator as a cold kernel would — but a cell of the user's that ran
    meanwhile keeps its cached blocks (the warm-up once emptied a 60 GiB cache this way)."""
    km, kc = start(env=kernel_config_env(tmp_path))
    try:
        r = run(kc, "import torch\nx = torch.empty(2**30, dtype=torch.uint8, device='cuda'); del x")
        assert r.reply["status"] == "ok", r.stderr
        st = json.loads(run(kc, STATUS.format(wait=120)).stdout.strip().splitlines()[-1])
        assert st["state"] in ("done", "skipped"), st
        r = run(kc, "print(torch.cuda.memory_reserved())")
        assert int(r.stdout) >= 2**30  # still cached: no empty_cache behind the user's back
    finally:
        stop(km, kc)


@pytest.mark.parametrize("mode", ["round-robin", "least-used"])
def test_assigned_device_is_current_and_warmed(tmp_path, mode):
    import torch

    n = torch.cuda.device_count()
    srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                 "--MappingKernelManager.default_kernel_name=python3",
                                 "--GpuctxServer.warm_policy=always", f"--GpuctxServer.assign_devices={mode}"]).start()
    try:
        seen = []
        for _ in range(min(n, 2)):
            ks = srv.channels(srv.start_kernel())
            st = status(ks, wait=120)
            r = ks.execute("import torch\nprint(torch.cuda.current_device())\n%gpu status")
            current = int(r.stdout.split()[0])
            assert st["state"] == "done" and st["device"] == current
            assert f"chosen by the server ({mode})" in r.text
            seen.append(current)
            ks.close()
        if mode == "round-robin":
            assert seen == list(range(min(n, 2)))
    finally:
        srv.stop()


# -- the notebook recipe ----------------------------------------------------------------------------
PLAN = ("import json; m = get_ipython()._gpuctx; m.warmer.wait(180)\n"
        "print(json.dumps({'status': m.warmer.status.as_dict(), 'plan': m.warmer.plan.as_dict()}))")
OWN_MEMORY = ("import json; from gpuctx_jupyter.core import inventory\n"
              "print(json.dumps(inventory.process_memory(inventory.take())))")


def notebook_kernel(tmp_path, cells, policy="auto", env=None):
    """A kernel as the server's hook starts one for a notebook: --ext=gpuctx, GPUCTX_WARM, JPY_SESSION_NAME."""
    (tmp_path / "work").mkdir(parents=True, exist_ok=True)
    nb = tmp_path / "work" / "nb.ipynb"
    notebook(nb, cells)
    return start(env={"JPY_SESSION_NAME": str(nb), "GPUCTX_WARM": policy, "GPUCTX_WARM_SOURCE": "server hook",
                      **(env or {})}, extra_arguments=["--ext=gpuctx"], cwd=str(nb.parent))


def warmed(kc) -> dict:
    r = run(kc, PLAN, timeout=240)
    assert r.reply["status"] == "ok", r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_cupy_only_notebook_gets_cupy_warmed_and_no_torch_context(tmp_path):
    km, kc = notebook_kernel(tmp_path, ["import cupy as cp", "x = cp.ones((1024, 1024)) @ cp.ones((1024, 1024))"])
    try:
        out = warmed(kc)
        assert out["status"]["state"] == "done", out
        assert out["plan"]["frameworks"] == ["cupy"]
        assert {s["name"]: s["state"] for s in out["plan"]["steps"]}["cupy ops"] == "done"
        r = run(kc, "import sys; print('torch' in sys.modules)")
        assert r.stdout.strip() == "False"  # no torch import, so no torch context
    finally:
        stop(km, kc)


def test_a_numba_notebook_gets_its_context_and_a_tiny_kernel_and_its_own_kernel_runs(tmp_path):
    pytest.importorskip("numba")
    kernel = ("import numpy as np\nfrom numba import cuda\n@cuda.jit\ndef twice(a):\n    i = cuda.grid(1)\n"
              "    if i < a.size:\n        a[i] *= 2\n")
    km, kc = notebook_kernel(tmp_path, [kernel, "d = cuda.to_device(np.ones(64, dtype=np.float32))\ntwice[1, 64](d)\n"
                                                "print(float(d.copy_to_host().sum()))"])
    try:
        out = warmed(kc)
        assert run(kc, kernel).reply["status"] == "ok"
        r = run(kc, "d = cuda.to_device(np.ones(64, dtype=np.float32))\ntwice[1, 64](d)\nprint(float(d.copy_to_host().sum()))")
        if r.reply["status"] != "ok" and out["status"]["state"] == "failed" and r.reply["ename"] in out["status"]["detail"]:
            # this Numba cannot compile a kernel at all (on the GPU machine: a Numba older than its
            # NumPy, "module 'numpy' has no attribute 'row_stack'"); the warm-up said so and went on
            pytest.skip(f"this Numba compiles no CUDA kernel: {r.reply['ename']}: {r.reply['evalue']}")
        assert r.stdout.strip() == "128.0", r.text
        assert out["status"]["state"] == "done", out
        steps = {s["name"]: s["state"] for s in out["plan"]["steps"]}
        assert steps["Numba's context and a tiny @cuda.jit kernel on cuda:0"] == "done", steps
        assert "torch" not in out["plan"]["frameworks"]
    finally:
        stop(km, kc)


def test_a_training_notebook_gets_backward_and_optimizer_steps_warmed(tmp_path):
    km, kc = notebook_kernel(tmp_path, [
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F",
        ("model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()\n"
         "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
         "x = torch.randn(256, 64, device='cuda'); y = torch.randint(0, 10, (256,), device='cuda')\n"
         "for _ in range(3):\n    loss = F.cross_entropy(model(x), y)\n    opt.zero_grad(); loss.backward(); opt.step()\n"
         "torch.cuda.synchronize()")])
    try:
        out = warmed(kc)
        steps = {s["name"]: s for s in out["plan"]["steps"]}
        assert out["status"]["state"] == "done", out["status"]
        for name in ("cuda init", "backward", "import torch._dynamo", "optimizer step (AdamW)"):
            assert steps[name]["state"] == "done", (name, steps[name])
        assert steps["optimizer step (AdamW)"]["where"] == "cell 2, line 2"
    finally:
        stop(km, kc)


def test_a_bf16_model_gets_a_bf16_training_step_and_trains_after_it(tmp_path):
    cell = ("block = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64), nn.GELU()).to(device='cuda', dtype=torch.bfloat16)\n"
            "opt = torch.optim.AdamW(block.parameters(), lr=1e-4)\n"
            "x = torch.randn(8, 64, device='cuda', dtype=torch.bfloat16)\n"
            "for _ in range(2):\n    loss = block(x).float().pow(2).mean()\n    opt.zero_grad(); loss.backward(); opt.step()\n"
            "print(next(block.parameters()).dtype, torch.isfinite(loss).item())")
    km, kc = notebook_kernel(tmp_path, ["import torch\nimport torch.nn as nn", cell])
    try:
        out = warmed(kc)
        steps = {s["name"]: s["state"] for s in out["plan"]["steps"]}
        assert steps.get("optimizer step (AdamW), also in bfloat16") == "done", steps
        r = run(kc, "import torch\nimport torch.nn as nn\n" + cell)
        assert r.reply["status"] == "ok" and r.stdout.split() == ["torch.bfloat16", "True"], r.text
    finally:
        stop(km, kc)


def test_a_notebook_that_says_gpu_use_0_warms_cuda_0(tmp_path):
    km, kc = notebook_kernel(tmp_path, ["%load_ext gpuctx\n%gpu use 0", "import torch\nx = torch.ones(4, device='cuda')"])
    try:
        out = warmed(kc)
        assert out["plan"]["devices"] == ["0"] and out["status"]["device"] == 0, out
        assert out["status"]["state"] == "done"
        memory = json.loads(run(kc, OWN_MEMORY).stdout.strip().splitlines()[-1])
        assert set(memory) == {"0"}, memory  # only the device the notebook named holds our context
    finally:
        stop(km, kc)


def test_memory_after_the_first_cell_is_within_5_percent_of_a_cold_kernel(tmp_path):
    cells = ["import torch\nimport torch.nn as nn",
             ("model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()\n"
              "y = model(torch.randn(32, 64, device='cuda')); torch.cuda.synchronize()")]
    used = {}
    for policy in ("never", "auto"):
        km, kc = notebook_kernel(tmp_path / policy, cells, policy=policy)
        try:
            if policy == "auto":
                warmed(kc)
            for cell in cells:
                assert run(kc, cell, timeout=120).reply["status"] == "ok"
            time.sleep(0.5)
            used[policy] = sum(json.loads(run(kc, OWN_MEMORY).stdout.strip().splitlines()[-1]).values())
        finally:
            stop(km, kc)
    assert used["never"] > 0
    assert abs(used["auto"] - used["never"]) <= 0.05 * used["never"], used


# -- what the next cell needs: compile, JAX (issue #25) --------------------------------------------
def test_a_torch_compile_notebook_gets_a_tiny_compile_on_its_gpu(tmp_path):
    km, kc = notebook_kernel(tmp_path, ["import torch",
                                        "net = torch.compile(torch.nn.Linear(16, 16).cuda())\ny = net(torch.randn(4, 16, device='cuda'))"])
    try:
        out = warmed(kc)
        step = next(s for s in out["plan"]["steps"] if s.get("name", "").startswith("compile a tiny model"))
        assert step["state"] == "done", step
        r = run(kc, "import torch\nprint(torch.cuda.memory_allocated())")
        assert int(r.stdout) == 0  # nothing of the warm-up's left in the allocator, cuBLAS's workspaces included
        r = run(kc, "import torch\nf = torch.compile(torch.nn.Sequential(torch.nn.Linear(32, 8)).cuda())\n"
                    "print(f(torch.randn(2, 32, device='cuda')).shape)", timeout=240)
        assert r.reply["status"] == "ok" and "torch.Size([2, 8])" in r.stdout, r.stderr
    finally:
        stop(km, kc)


def test_a_torch_compile_notebook_compiles_through_inductors_workers_without_cuda_in_them_and_keeps_them(tmp_path):
    """After the tiny compile, every one of inductor's ready workers ran Triton's compiler once
    (leaving Triton's cache as it was) and a compile of gpuctx's own went through them (the path the
    notebook's first compile takes); none of them started CUDA, they run at the kernel's priority,
    and they are kept 10 minutes after their last job instead of torch's one."""
    import glob
    import tempfile

    import psutil

    from gpuctx_jupyter.core import inventory, procs

    km, kc = notebook_kernel(tmp_path, ["import torch", "f = torch.compile(torch.nn.Linear(16, 16).cuda())"])
    try:
        out = warmed(kc)
        step = next(s for s in out["plan"]["steps"] if s.get("name") == "compile through inductor's workers")
        assert step["state"] == "done", step
        r = run(kc, "from torch._inductor.async_compile import AsyncCompile, get_compile_threads\n"
                    "print(AsyncCompile.process_pool().timer.duration, get_compile_threads())")
        hold, n = r.stdout.split()
        assert float(hold) == 600.0, r.stdout
        assert step["detail"].startswith(f"{n} of {n} workers ran Triton's compiler"), step
        r = run(kc, "from triton import knobs; print(knobs.cache.dir)")  # where the notebook's kernels are cached
        assert not glob.glob(os.path.join(r.stdout.strip(), "*", "gpuctx_first_job*")), r.stdout
        assert not glob.glob(os.path.join(tempfile.gettempdir(), "gpuctx-triton-*"))
        pid = int(run(kc, "import os; print(os.getpid())").stdout)
        workers = psutil.Process(pid).children(recursive=True)
        assert len(workers) > int(n), workers  # the pool's process and its workers
        inv = inventory.take()
        host = {p: (procs.ns_pids(p) or [p])[0] for p in [pid, *(w.pid for w in workers)]}  # NVML's PIDs
        assert sum(inventory.process_memory(inv, {host[pid]}).values()) > 0  # NVML sees the kernel's own context
        assert not sum(inventory.process_memory(inv, {host[w.pid] for w in workers}).values()), workers
        assert {w.nice() for w in workers} == {psutil.Process(pid).nice()}
        r = run(kc, "import torch\nf = torch.compile(torch.nn.Linear(16, 16).cuda())\n"
                    "print(f(torch.randn(4, 16, device='cuda')).shape)", timeout=240)
        assert r.reply["status"] == "ok" and "torch.Size([4, 16])" in r.stdout, r.stderr
    finally:
        stop(km, kc)


def test_a_jax_notebook_gets_its_backend_and_a_jit_on_its_gpu_without_preallocating(tmp_path):
    pytest.importorskip("jax")
    km, kc = notebook_kernel(tmp_path, ["import jax\nimport jax.numpy as jnp", "g = jax.jit(jax.grad(lambda w: jnp.sum(w ** 2)))"],
                             env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    try:
        out = warmed(kc)
        step = next(s for s in out["plan"]["steps"] if s.get("name", "").startswith("JAX backend"))
        assert step["state"] == "done", step
        memory = json.loads(run(kc, OWN_MEMORY).stdout.strip().splitlines()[-1])
        assert all(v < 4 * 2**30 for v in memory.values()), memory  # a context, not 75% of a GPU
    finally:
        stop(km, kc)


def test_a_notebook_on_two_gpus_gets_its_jax_jit_on_each_named_once(tmp_path):
    pytest.importorskip("jax")
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two visible GPUs; this machine shows {torch.cuda.device_count()}")
    km, kc = notebook_kernel(tmp_path, ["import torch\nimport jax\nimport jax.numpy as jnp",
                                        "a = torch.ones(4, device='cuda:0')\nb = torch.ones(4, device='cuda:1')",
                                        "g = jax.jit(jax.grad(lambda w: jnp.sum(w ** 2)))"],
                             env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    try:
        out = warmed(kc)
        jits = {s["name"]: s["state"] for s in out["plan"]["steps"] if s.get("name", "").startswith("JAX backend")}
        assert jits == {"JAX backend and a tiny jit(grad) on cuda:0": "done",
                        "JAX backend and a tiny jit(grad) on cuda:1": "done"}, out["plan"]["steps"]
    finally:
        stop(km, kc)


# -- import-warm standbys (issue #24) ---------------------------------------------------------------
def test_an_imports_standby_holds_nothing_on_any_gpu_and_an_import_making_a_context_is_dropped(server_factory, tmp_path):
    import pynvml

    from .harness.faults import pool_of
    from .harness.waiting import wait_for

    site = tmp_path / "lib" / "site-packages" / "gpuctx_grabs_gpu"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("import torch\ntorch.ones(1, device='cuda')\n")
    notebook(tmp_path / "nb.ipynb", ["import torch\nimport gpuctx_grabs_gpu"])
    env = {"GPUCTX_SERVER_POOL": "auto", "PYTHONPATH": os.pathsep.join([str(site.parent), os.environ.get("PYTHONPATH", "")])}
    srv = server_factory(env=env)
    profile = wait_for(lambda: (lambda p: p if "gpuctx_grabs_gpu" in p.get("dropped", {}) else None)(
        pool_of(srv).get("import_profile") or {}), timeout=240)
    assert "CUDA context" in profile["dropped"]["gpuctx_grabs_gpu"]
    standby = wait_for(lambda: next((s for s in pool_of(srv)["standbys"] if s["kind"] == "imports" and s["ready"]
                                     and s["imports"] >= 3), None), timeout=240)
    pynvml.nvmlInit()
    listed = {p.pid for i in range(pynvml.nvmlDeviceGetCount())
              for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}
    assert standby["pid"] not in listed and not standby["cuda_driver"]
    ks = srv.channels(srv.start_kernel(path="nb.ipynb"))
    r = ks.execute("import os, sys, torch; print(os.getpid(), 'torch._dynamo' in sys.modules); "
                   "print(torch.ones(2, device='cuda').sum().item())")
    pid, dynamo = r.stdout.split()[:2]
    assert int(pid) == standby["pid"] and dynamo == "True" and "2.0" in r.stdout
    ks.close()


def test_an_imports_standby_of_a_compiling_notebook_has_inductors_workers_ready_without_cuda(server_factory, tmp_path):
    """A notebook that calls torch.compile puts inductor into the import profile: the imports
    standby imports it and starts inductor's compile workers, each of which runs Triton's compiler
    once — none of them on a GPU (no context, 0 MiB). The notebook that adopts it compiles through them from its
    warm-up on, with no wait for them to start (5-10 s on an H200 host)."""
    import psutil
    import pynvml

    from gpuctx_jupyter.contract import INDUCTOR_MODULE
    from gpuctx_jupyter.core import procs

    from .harness.faults import pool_of
    from .harness.waiting import wait_for

    notebook(tmp_path / "nb.ipynb", ["import torch", "f = torch.compile(torch.nn.Linear(16, 16).cuda())",
                                     "print(f(torch.randn(4, 16, device='cuda')).shape)"])
    srv = server_factory(env={"GPUCTX_SERVER_POOL": "auto"})
    standby = wait_for(lambda: next((s for s in pool_of(srv)["standbys"] if s["kind"] == "imports" and s["ready"]
                                     and s["imports"] >= 4), None), timeout=300)
    assert INDUCTOR_MODULE in pool_of(srv)["import_profile"]["modules"]
    tree = psutil.Process(standby["pid"]).children(recursive=True)
    sidecar = next(p for p in tree if "compile_worker" in " ".join(p.cmdline()))  # torch's pool process
    assert sidecar.children(), tree  # its workers
    pynvml.nvmlInit()
    listed = {p.pid for i in range(pynvml.nvmlDeviceGetCount())
              for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}
    ours = {(procs.ns_pids(p) or [p])[0] for p in [standby["pid"], *(w.pid for w in tree)]}  # as NVML numbers them
    assert not listed & ours and not standby["memory"]  # no context: nothing on a GPU (inductor's import
    # starts the CUDA driver, as torch_geometric's does: the standby is marked so, import_profile.py)
    ks = srv.channels(srv.start_kernel(path="nb.ipynb"))
    try:
        r = ks.execute(PLAN, timeout=240)
        assert r.reply["status"] == "ok", r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        step = next(s for s in out["plan"]["steps"] if s.get("name") == "compile through inductor's workers")
        assert step["state"] == "done" and "had run Triton's compiler already" in step["detail"], step
        r = ks.execute("import os, torch; print(os.getpid())\n"
                       "f = torch.compile(torch.nn.Linear(16, 16).cuda()); print(f(torch.randn(4, 16, device='cuda')).shape)",
                       timeout=240)
        assert r.reply["status"] == "ok" and "torch.Size([4, 16])" in r.stdout, r.stderr
        assert int(r.stdout.split()[0]) == standby["pid"]
    finally:
        ks.close()


SEEDED = {"torch": "import torch\ntorch.manual_seed(0)", "cupy": "import cupy as cp\ncp.random.seed(0)"}
GPU_CELL = {"torch": ("model = torch.nn.Linear(64, 64).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "x = torch.randn(64, 64, device='cuda')\n"
                      "model(torch.nn.functional.dropout(x, 0.1)).sum().backward()\nopt.step()"),
            "cupy": "x = cp.random.rand(1024, dtype=cp.float32)\nprint(float(x.sum()))"}
# The next cell's draws, then the same right after seeding again: equal if nothing drew in between.
DRAWS = {"torch": ("a = (torch.randn(4, device='cuda').tolist(), torch.nn.Linear(3, 2).weight.tolist())\n"
                   "torch.manual_seed(0)\n"
                   "print(a == (torch.randn(4, device='cuda').tolist(), torch.nn.Linear(3, 2).weight.tolist()))"),
         "cupy": "a = cp.random.rand(4).tolist()\ncp.random.seed(0)\nprint(a == cp.random.rand(4).tolist())"}


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_warm_up_steps_after_a_seeding_cell_leave_the_next_cells_gpu_draws_as_seeded(tmp_path, framework):
    """The GPU steps (random inputs on the device, dropout, the backward and optimizer steps' tiny
    models, whose initial weights are drawn on the CPU; CuPy's random arrays) run after the cell
    that seeded — the cells reach the kernel as JupyterLab sends typed cells, after that cell ran —
    and the next cell draws what the seed gives, on the GPU and the CPU."""
    km, kc = notebook_kernel(tmp_path, [])
    try:
        assert run(kc, SEEDED[framework], timeout=120).reply["status"] == "ok"
        cells = [SEEDED[framework], GPU_CELL[framework], DRAWS[framework]]
        assert control(kc, "gpuctx_cells_request", {"cells": cells})["planned"] >= 1
        last = "optimizer step" if framework == "torch" else "cupy ops"  # (over the control channel: no cell)
        view = wait_for(lambda: warm_up_ended(kc, last), timeout=240, every=0.5)
        gpu_steps = [st for st in view["plan"]["steps"] if st["kind"] == "gpu"]
        assert gpu_steps and all(st["state"] == "done" and "cell started" not in st["detail"]
                                 for st in gpu_steps), view["plan"]["steps"]
        r = run(kc, DRAWS[framework], timeout=120)
        assert r.reply["status"] == "ok" and r.stdout.strip() == "True", r.text
    finally:
        stop(km, kc)
