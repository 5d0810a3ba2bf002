"""The warm-up loads torch's libraries without the GIL (core/preload.py): the kernel's own thread
runs meanwhile, and the libraries are the very ones torch's import loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LIBRARIES = r'''
def libraries():  # torch's and CUDA's shared objects mapped into this process
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if ".so" in line and ("torch" in line or "nvidia" in line)})
'''

PRELOADED = LIBRARIES + r'''
import json, sys, threading, time
from gpuctx_jupyter.core import preload
box, wakes = {}, []
def load():
    box["t0"] = time.monotonic()
    box["loaded"] = preload.libraries("torch")
    box["t1"] = time.monotonic()
thread = threading.Thread(target=load)
thread.start()
while thread.is_alive():  # the kernel's own thread: wakes only when it gets the GIL
    time.sleep(0.001)
    wakes.append(time.monotonic())
import torch
torch.ones(2) + 1
print(json.dumps({"loaded": box["loaded"], "libraries": libraries(), "again": preload.libraries("torch"),
                  "wakes_during": sum(box["t0"] < w < box["t1"] for w in wakes)}))
'''

PLAIN = LIBRARIES + r'''
import json
import torch
print(json.dumps({"libraries": libraries()}))
'''


def child(code: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loader's files and flags are Linux's")
def test_torchs_libraries_load_without_the_gil_and_are_those_its_import_loads(tmp_path):
    env = {"LD_LIBRARY_PATH": ""}
    pre, plain = child(PRELOADED, **env), child(PLAIN, **env)
    assert pre["loaded"] == ["libtorch_global_deps.so", "libtorch.so"]
    assert pre["again"] == []  # once per process
    assert pre["libraries"] == plain["libraries"]  # not one library more, none from elsewhere
    assert pre["wakes_during"] >= 5, pre  # the other thread ran while the loader worked


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loader's files and flags are Linux's")
def test_nothing_is_preloaded_where_ld_library_path_holds_cuda_libraries_of_its_own(tmp_path):
    """There the loader could pick other files than torch's import picks: the import does it all."""
    (tmp_path / "libcudart.so.12").write_bytes(b"")
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"")
    assert child(PRELOADED, LD_LIBRARY_PATH=f"{driver}:{tmp_path}")["loaded"] == []
    assert child(PRELOADED, LD_LIBRARY_PATH=str(driver))["loaded"] == ["libtorch_global_deps.so", "libtorch.so"]


CUDA_START = r'''
import json, threading, time
import torch
from gpuctx_jupyter.core import cuda_driver
box, wakes = {}, []
def start():
    box["t0"] = time.monotonic()
    box["started"] = cuda_driver.start(0)
    box["t1"] = time.monotonic()
    torch.cuda.init()
    torch.cuda.set_device(0)
    box["sum"] = float((torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")).sum())
thread = threading.Thread(target=start)
thread.start()
while thread.is_alive():
    time.sleep(0.001)
    wakes.append(time.monotonic())
print(json.dumps({"started": box["started"], "sum": box.get("sum"), "seconds": box["t1"] - box["t0"],
                  "wakes_during": sum(box["t0"] < w < box["t1"] for w in wakes)}))
'''


def test_without_a_driver_cuda_is_not_started_and_nothing_raises():
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    from gpuctx_jupyter.core import cuda_driver

    assert cuda_driver.start(0) is False
    assert cuda_driver.touched() == ""


@pytest.mark.gpu
def test_cuda_starts_while_the_kernels_own_thread_runs_and_torch_uses_that_context():
    """The warm-up's first GPU step (recipes/torch.py): driver and context through ctypes, without
    the GIL; torch's own start then finds them and computes on them."""
    out = child(CUDA_START)
    assert out["started"] is True and out["sum"] == 64 * 64 * 64, out
    assert out["wakes_during"] >= max(5, int(out["seconds"] * 1000) // 10), out  # a wake every ~1 ms, not none
