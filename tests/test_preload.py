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
    """In this machine's environment as it is (LD_LIBRARY_PATH, ld.so.cache: a CUDA toolkit here)."""
    pre, plain = child(PRELOADED), child(PLAIN)
    assert pre["loaded"][0] == "libtorch_global_deps.so" and pre["loaded"][-1] == "libtorch.so", pre["loaded"]
    assert pre["again"] == []  # once per process
    assert pre["libraries"] == plain["libraries"]  # not one library more, none from elsewhere
    assert pre["wakes_during"] >= 5, pre  # the other thread ran while the loader worked


def test_the_libraries_preloaded_by_path_are_those_torchs_own_code_preloads(tmp_path, monkeypatch):
    """Read from torch's source, without importing it: checked against torch's own functions run
    here, which say what they would load and from which folder of sys.path."""
    import torch

    from gpuctx_jupyter.core import preload

    with open(torch.__file__, encoding="utf-8") as f:
        ours = preload.cuda_deps(f.read())
    asked = []
    monkeypatch.setattr(torch, "_preload_cuda_lib", lambda folder, pattern, required=True:
                        asked.append((folder, pattern, required)))
    torch._preload_cuda_deps()
    assert ours == asked and asked, ours

    sites = [tmp_path / "a", tmp_path / "b"]  # the first folder of sys.path that holds a library wins
    for site, folder in zip(sites, ("other", "cublas")):
        (site / "nvidia" / folder / "lib").mkdir(parents=True)
        (site / "nvidia" / folder / "lib" / "libcublas.so.13").write_bytes(b"")
    (sites[1] / "nvidia" / "cublas" / "lib" / "libcublasLt.so.13").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(s) for s in sites])
    for pattern in ("libcublas.so.*[0-9]", "libcublasLt.so.*[0-9]", "libcudnn.so.*[0-9]"):
        theirs = next((found[0] for p in sys.path if (found := torch._get_cuda_dep_paths(p, "cublas", pattern))), None)
        major = torch.version.cuda.split(".")[0] if torch.version.cuda else None
        assert preload._dep_path("cublas", pattern, major) == theirs


def test_a_torch_that_preloads_only_when_its_dependencies_fail_gets_no_preloading_of_ours():
    from gpuctx_jupyter.core import preload

    older = ("def _load_global_deps():\n    try:\n        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)\n"
             "    except OSError as err:\n        for folder, name in cuda_libs.items():\n"
             "            _preload_cuda_deps(folder, name)\n        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)\n")
    assert preload.cuda_deps(older) == []  # global dependencies, then libtorch: as that import does
    assert preload.cuda_deps("def f(:") is None  # unreadable: the import does it all
    assert preload.cuda_deps("x = 1") is None


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
