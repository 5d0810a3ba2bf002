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
def libraries():  # every shared object mapped into this process
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if ".so" in line})
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


GUARD = r'''
import json, sys
from gpuctx_jupyter.core import preload
preload.LD_CACHE, preload.SYSTEM_FOLDERS = sys.argv[1], tuple(sys.argv[2:])
print(json.dumps(preload._same_files_as_import(sys.argv[1])))  # (a site folder without nvidia/ in it)
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loader's files and flags are Linux's")
def test_a_cuda_build_is_not_preloaded_where_the_loader_could_find_other_cuda_libraries(tmp_path):
    """There a library torch's import opens by path could be mapped twice: the import does it all.
    Other CUDA libraries are on LD_LIBRARY_PATH, in ld.so.cache, or in a system folder; a driver's
    folder (as containers put on LD_LIBRARY_PATH) is no reason."""
    def guard(cache=b"", system=(), ld_library_path=None):
        (tmp_path / "ld.so.cache").write_bytes(b"glibc-ld.so.cache1.1" + cache)
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        if ld_library_path is not None:
            env["LD_LIBRARY_PATH"] = ld_library_path
        out = subprocess.run([sys.executable, "-c", GUARD, str(tmp_path / "ld.so.cache"), *map(str, system)],
                             capture_output=True, text=True, timeout=60, cwd=ROOT, env={**env, "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    toolkit, driver, empty = tmp_path / "toolkit", tmp_path / "driver", tmp_path / "empty"
    for folder in (toolkit, driver, empty):
        folder.mkdir()
    (toolkit / "libnvJitLink.so.12").write_bytes(b"")
    (driver / "libcuda.so.1").write_bytes(b"")
    assert guard(system=[empty], ld_library_path=str(driver)) is True
    assert guard(system=[empty], ld_library_path=f"{driver}:{toolkit}") is False
    assert guard(cache=b"\0libcusparse.so.12\0/usr/local/cuda/lib64/libcusparse.so.12\0", system=[empty]) is False
    assert guard(system=[empty, toolkit]) is False


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
    out = child("import json\nfrom gpuctx_jupyter.core import cuda_driver\n"
                "print(json.dumps([cuda_driver.start(0), cuda_driver.touched()]))")
    assert out == [False, ""]


@pytest.mark.gpu
def test_cuda_starts_while_the_kernels_own_thread_runs_and_torch_uses_that_context():
    """The warm-up's first GPU step (recipes/torch.py): driver and context through ctypes, without
    the GIL; torch's own start then finds them and computes on them."""
    out = child(CUDA_START)
    assert out["started"] is True and out["sum"] == 64 * 64 * 64, out
    assert out["wakes_during"] >= max(5, int(out["seconds"] * 1000) // 10), out  # a wake every ~1 ms, not none
