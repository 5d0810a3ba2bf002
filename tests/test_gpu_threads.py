"""The chosen GPU follows into the threads a notebook starts, in a real ipykernel on real GPUs
(marked `gpu`: run them with scripts/gpu-check.sh on a GPU machine; the two-GPU tests skip, saying
so, where fewer than two GPUs are visible)."""
from __future__ import annotations

import json

import pytest

from .harness.kernels import run, start, stop

pytestmark = pytest.mark.gpu

# Whether the kernel process holds CUDA's primary context on a device: asked of the driver, so it
# holds in a container too (NVML lists host PIDs there). Ordinals as torch numbers them.
CONTEXT_ON = """
def context_on(ordinal):
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert cu.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    assert cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
    return bool(active.value)
"""

# A thread that starts now, reports its device, waits until released, then allocates and reports.
PARKED = """
import threading, torch
class Parked:
    def __init__(self, name):
        self.seen, self.go, self.done = {}, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
    def _run(self):
        self.seen["at_start"] = torch.cuda.current_device()
        self.go.wait(120)
        self.seen["later"] = torch.cuda.current_device()
        self.seen["tensor"] = str(torch.ones(1, device="cuda").device)
        self.done.set()
    def finish(self):
        self.go.set()
        assert self.done.wait(120)
        return self.seen
"""


def last_json(r):
    assert r.reply["status"] == "ok", r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def kernel():
    km, kc = start(env={"GPUCTX_WARM": "never"})  # no warm-up: it would put a context on cuda:0
    try:
        yield kc
    finally:
        stop(km, kc)


@pytest.fixture
def two_gpus():
    torch = pytest.importorskip("torch")
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs two visible GPUs to tell cuda:0 from cuda:1; this machine shows {n}")


# -- one GPU ----------------------------------------------------------------------------------------
def test_cells_and_threads_of_a_kernel_that_imported_torch_leave_cuda_unstarted(kernel):
    """gpuctx's after-cell record and its thread hook ask torch about the GPU only once CUDA has
    started: asking earlier started CUDA's driver in the user's thread (0.1-0.3 s with the GIL
    held, paid by the first cell after `import torch` — a CPU cell sent at once took 350 ms
    against 140 ms cold on the H200)."""
    r = run(kernel, "%load_ext gpuctx\nimport torch, threading")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kernel, "t = sum(i * i for i in range(1000))\nth = threading.Thread(target=lambda: None)\n"
                    "th.start(); th.join()")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kernel, "from gpuctx_jupyter.core import cuda_driver\nprint(repr(cuda_driver.touched()))")
    assert r.stdout.strip() == "''", r.stdout + r.stderr  # neither the driver nor a context
    r = run(kernel, "torch.ones(1, device='cuda')\nprint(get_ipython()._gpuctx.cell_thread_device)")
    assert r.stdout.strip() == "None", r.stdout  # recorded by the cell after CUDA started
    r = run(kernel, "print(get_ipython()._gpuctx.cell_thread_device)")
    assert r.stdout.strip() == "(0, None)", r.stdout


def test_import_torch_after_a_device_is_chosen_leaves_cuda_unstarted_until_a_cell_uses_it(kernel):
    """The choice reaches torch at its import as a queued switch; asking torch then whether it
    can use a GPU started CUDA's driver in the import cell (0.1-0.3 s, GIL held)."""
    r = run(kernel, "%load_ext gpuctx\n%gpu use 0 --default")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kernel, "import torch\nfrom gpuctx_jupyter.core import cuda_driver\nprint(repr(cuda_driver.touched()))")
    assert r.stdout.strip() == "''", r.stdout + r.stderr
    r = run(kernel, "print(torch.ones(1).device, torch.cuda.current_device())")
    assert r.stdout.strip() == "cuda:0 0", r.stdout + r.stderr


def test_threads_start_on_the_chosen_device_and_on_gpu_threads_keep_theirs(kernel):
    r = run(kernel, "%load_ext gpuctx\nimport torch, threading, json\n%gpu use 0 --default\n"
                    "torch.ones(1, device='cuda'); print('ok')")
    assert r.reply["status"] == "ok" and "ok" in r.stdout, r.stderr
    r = run(kernel, "seen = {}\n"
                    "def probe():\n"
                    "    seen['current'] = torch.cuda.current_device()\n"
                    "    seen['default'] = str(torch.ones(1).device)\n"
                    "t = threading.Thread(target=probe); t.start(); t.join()\n"
                    "print(json.dumps(seen))")
    assert last_json(r) == {"current": 0, "default": "cuda:0"}
    run(kernel, PARKED)
    r = run(kernel, "%%on_gpu 0\ninside = Parked('inside-cell')\nprint('ok')")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kernel, "print(json.dumps(inside.finish()))")  # after the cell
    assert last_json(r) == {"at_start": 0, "later": 0, "tensor": "cuda:0"}
    r = run(kernel, "print(json.dumps(get_ipython()._gpuctx.switcher.threads_report()))")
    report = last_json(r)
    assert report[0].startswith("threads: follow") and len(report) == 1, report


# -- two GPUs ----------------------------------------------------------------------------------------
def test_pool_inference_after_use_1_lands_on_cuda_1_and_leaves_cuda_0_alone(two_gpus, kernel):
    r = run(kernel, "%load_ext gpuctx\nimport torch, json, os\n%gpu use 1\n" + CONTEXT_ON +
                    "model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).cuda().eval()\n"
                    "torch.set_default_device('cuda')  # as in the issue: 'cuda' is the current device\n"
                    "print(json.dumps([str(next(model.parameters()).device), context_on(0), context_on(1)]))")
    assert last_json(r) == ["cuda:1", False, True]
    r = run(kernel, "from concurrent.futures import ThreadPoolExecutor\n"
                    "def infer(i):\n"
                    "    with torch.no_grad():\n"
                    "        y = model(torch.randn(8, 64, device='cuda'))\n"
                    "    torch.cuda.synchronize()\n"
                    "    return [str(y.device), str(torch.empty(1, device='cuda').device), torch.cuda.current_device()]\n"
                    "with ThreadPoolExecutor(4) as pool:\n"
                    "    results = list(pool.map(infer, range(32)))\n"
                    "contexts = [context_on(0), context_on(1)]  # before anything else asks about the devices\n"
                    "from gpuctx_jupyter.core import inventory\n"
                    "inv = inventory.take(); mine = inventory.own_pids()\n"
                    "nvml = {d.ordinal: bool(mine & {p.pid for p in d.record.processes}) for d in inv.devices}\n"
                    "print(json.dumps({'results': results, 'reserved0': torch.cuda.memory_reserved(0),\n"
                    "                  'contexts': contexts, 'nvml': [nvml.get(0), nvml.get(1)]}))")
    out = last_json(r)
    assert {tuple(x) for x in out["results"]} == {("cuda:1", "cuda:1", 1)}, out["results"]
    assert out["reserved0"] == 0
    assert out["contexts"] == [False, True]  # no worker touched cuda:0
    if out["nvml"][1]:  # NVML's PIDs are this kernel's (not a container with other PIDs)
        assert out["nvml"][0] is False


def test_dataloader_pin_memory_still_pins_after_use(kernel):
    """On the last visible GPU (cuda:1 with two): pinning and the pin-memory thread still work."""
    import torch

    last = torch.cuda.device_count() - 1
    r = run(kernel, f"%load_ext gpuctx\nimport torch, json\n%gpu use {last}\ntorch.ones(1, device='cuda')\n"
                    "from torch.utils.data import DataLoader, TensorDataset\n"
                    "data = TensorDataset(torch.randn(256, 16), torch.arange(256))\n"
                    "out = []\n"
                    "for workers in (0, 2):  # 2 workers: pinning runs in DataLoader's own pin-memory thread\n"
                    "    dl = DataLoader(data, batch_size=32, pin_memory=True, num_workers=workers)\n"
                    "    batches = [x for x, _ in dl]\n"
                    "    moved = batches[0].to('cuda', non_blocking=True)\n"
                    "    out.append([len(batches), all(b.is_pinned() for b in batches), str(moved.device)])\n"
                    "print(json.dumps(out))", timeout=180)
    assert last_json(r) == [[8, True, f"cuda:{last}"], [8, True, f"cuda:{last}"]]


def test_thread_started_before_use_1_keeps_its_device_and_is_reported(two_gpus, kernel):
    r = run(kernel, "%load_ext gpuctx\nimport json\n" + PARKED + "torch.ones(1, device='cuda')\n"
                    "early = Parked('early-worker')\nprint('ok')")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kernel, "%gpu use 1")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kernel, "late = Parked('late-worker')\n"
                    "report = get_ipython()._gpuctx.switcher.threads_report()\n"
                    "print(json.dumps({'report': report, 'early': early.finish(), 'late': late.finish()}))")
    out = last_json(r)
    assert out["early"] == {"at_start": 0, "later": 0, "tensor": "cuda:0"}
    assert out["late"] == {"at_start": 1, "later": 1, "tensor": "cuda:1"}
    assert "thread 'early-worker' runs on cuda:0, not cuda:1 (started before `%gpu use 1`)" in out["report"], out
    assert not any("late-worker" in line for line in out["report"])


def test_on_gpu_0_under_use_1_threads_stay_on_cuda_0_after_the_cell(two_gpus, kernel):
    r = run(kernel, "%load_ext gpuctx\nimport json\n%gpu use 1\n" + PARKED + "torch.ones(1, device='cuda')\nprint('ok')")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kernel, "%%on_gpu 0\ninside = Parked('inside-cell')\nprint(torch.cuda.current_device())")
    assert r.stdout.split()[-1] == "0", r.stderr
    r = run(kernel, "after = Parked('after-cell')\n"
                    "print(json.dumps([torch.cuda.current_device(), inside.finish(), after.finish()]))")
    main, inside, after = last_json(r)
    assert main == 1  # the cell thread is restored as before
    assert inside == {"at_start": 0, "later": 0, "tensor": "cuda:0"}
    assert after == {"at_start": 1, "later": 1, "tensor": "cuda:1"}


def test_a_thread_that_sets_its_own_device_keeps_it_and_no_threads_keeps_todays_behaviour(two_gpus, kernel):
    r = run(kernel, "%load_ext gpuctx\nimport torch, threading, json\n%gpu use 1\ntorch.ones(1, device='cuda')\n"
                    "def probe(out, own=None):\n"
                    "    if own is not None:\n"
                    "        torch.cuda.set_device(own)\n"
                    "    out.append(str(torch.empty(1, device='cuda').device))\n"
                    "def in_thread(own=None):\n"
                    "    out = []\n"
                    "    t = threading.Thread(target=probe, args=(out, own)); t.start(); t.join()\n"
                    "    return out[0]\n"
                    "sw = get_ipython()._gpuctx.switcher\n"
                    "seen = [in_thread(), in_thread(own=0)]\n"
                    "sw.follow_threads = False\n"
                    "seen.append(in_thread())\n"
                    "sw.follow_threads = True\n"
                    "print(json.dumps(seen))")
    assert last_json(r) == ["cuda:1", "cuda:0", "cuda:0"]


def test_cupy_and_numba_follow_too(two_gpus, kernel):
    pytest.importorskip("cupy")
    pytest.importorskip("numba.cuda")
    r = run(kernel, "%load_ext gpuctx\nimport torch, cupy, numba.cuda, threading, json\n%gpu use 1\n"
                    "torch.ones(1, device='cuda')\n"
                    "seen = []\n"
                    "def probe():\n"
                    "    seen.append([torch.cuda.current_device(), cupy.cuda.runtime.getDevice(),\n"
                    "                 int(cupy.ones(1).device.id), numba.cuda.get_current_device().id])\n"
                    "t = threading.Thread(target=probe); t.start(); t.join()\n"
                    "print(json.dumps(seen))", timeout=180)
    assert last_json(r) == [[1, 1, 1, 1]]
