"""Out of GPU memory in real kernels on a real GPU (marked `gpu`): the explanation under the
traceback names the device, this kernel's allocator figures and the other notebook holding the
GPU (through a holders file naming that kernel's real PID, as the server writes it); releasing the
other kernel's cache over its control channel lets the failed allocation succeed."""
from __future__ import annotations

import json
import os
import time

import pytest

from gpuctx_jupyter import contract
from gpuctx_jupyter.contract import holders as hf

from .harness.kernels import reply_to, run, start, stop

pytestmark = pytest.mark.gpu
GIB = 2**30
FIGURES = ("import os, json, torch\nfrom gpuctx_jupyter.core import frameworks as _f\n"
           "print(json.dumps({'pid': os.getpid(), 'memory': [f.as_dict() for f in _f.allocator_figures()]}))")


@pytest.fixture
def kernels():
    started = []

    def make(env=None):
        km, kc = start(env)
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        started.append((km, kc))
        return km, kc

    yield make
    for km, kc in started:
        stop(km, kc)


def test_a_real_torch_oom_names_the_device_and_this_kernels_figures(kernels):
    _, kc = kernels()
    r = run(kc, "import torch\nheld = torch.empty(2**30, dtype=torch.uint8, device='cuda')\n"
                "free, total = torch.cuda.mem_get_info()\n"
                "too_big = torch.empty(total + 2**30, dtype=torch.uint8, device='cuda')", timeout=120)
    assert r.reply["status"] == "error" and r.reply["ename"] == "OutOfMemoryError"
    block = r.stderr[r.stderr.index("gpuctx: torch ran out of memory on cuda:0"):]
    lines = block.strip().splitlines()
    assert len(lines) <= 12, block
    assert "(nvidia-smi " in lines[0] and "free of" in lines[0] and "asked for" in lines[0]
    assert lines[1].startswith("  this kernel (pid ") and "torch 1.00 GiB allocated" in lines[1] and "NVML:" in lines[1]
    assert "fixes, best first:" in block and "a smaller batch or model" in lines[-1]


def test_the_other_notebook_is_named_and_releasing_its_cache_lets_the_cell_succeed(kernels, tmp_path):
    path = tmp_path / "gpuctx-holders-test.json"
    _, other = kernels()
    r = run(other, "import torch\nx = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda')\ndel x\n" + FIGURES)
    assert r.reply["status"] == "ok", r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    holder = hf.Holder("other-kernel-id", "python3", ("other.ipynb",), frozenset({seen["pid"]}), "idle",
                             time.time() - 900, 900, memory=tuple(seen["memory"]), memory_time=time.time())
    path.write_text(hf.HoldersFile(os.getpid(), time.time(), (holder,),
                                         "/gpuctx/api/kernels/{id}/release").to_json())
    _, kc = kernels({hf.HOLDERS: str(path)})
    cell = ("import torch\nfree, total = torch.cuda.mem_get_info()\n"
            "need = free + 4 * 2**30\ny = torch.empty(need, dtype=torch.uint8, device='cuda')")
    r = run(kc, cell, timeout=120)
    assert r.reply["status"] == "error" and r.reply["ename"] == "OutOfMemoryError"
    block = r.stderr[r.stderr.index("gpuctx: torch ran out of memory"):]
    assert "other.ipynb" in block and "8.00 GiB cached" in block and "idle 15 min" in block
    first_fix = block[block.index("fixes, best first:"):].splitlines()[1]
    assert first_fix.startswith("   1. release the cache of other.ipynb (8.00 GiB"), block
    msg = other.session.msg(contract.RELEASE_REQUEST, {})
    t0 = time.perf_counter()
    other.control_channel.send(msg)
    reply = reply_to(other, msg["header"]["msg_id"], 60, channel="control")["content"]
    assert reply["status"] == "ok" and reply["released"]["torch"] >= 8 * GIB, reply
    assert time.perf_counter() - t0 < 10
    again = run(kc, "y = torch.empty(need, dtype=torch.uint8, device='cuda'); print(y.numel() == need)", timeout=120)
    assert again.reply["status"] == "ok" and again.stdout.strip() == "True", again.stderr


def test_the_contexts_this_kernel_keeps_on_other_gpus_are_named(kernels):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    _, kc = kernels()
    r = run(kc, "%%on_gpu 1\nimport torch\nz = torch.ones(1, device='cuda')")
    assert r.reply["status"] == "ok", r.stderr
    r = run(kc, "free, total = torch.cuda.mem_get_info(0)\n"
                "too_big = torch.empty(total + 2**30, dtype=torch.uint8, device='cuda:0')", timeout=120)
    block = r.stderr[r.stderr.index("gpuctx: torch ran out of memory on cuda:0"):]
    this_kernel = block.splitlines()[1]
    assert "on cuda:1" in this_kernel and "a context stays on each GPU it touched until restart" in this_kernel
    assert "`%gpu use 1`" not in block  # cuda:1 cannot take more than the whole of cuda:0 either
