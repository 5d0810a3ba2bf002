"""inductor's compile workers after the warm-up (kernel/warm/recipes/inductor.py), on a real pool of
torch's: the warm-up waits for them to take jobs, and keeps them longer than torch's 60 s — for as
long as a standby waits, 10 minutes once a notebook has it. (The compile through them needs Triton,
which exists only where there is a GPU: the GPU test checks it, and that no worker starts CUDA.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

CODE = """
import json, math, os
from torch._inductor.async_compile import AsyncCompile, get_compile_threads
from gpuctx_jupyter.kernel.warm.recipes import inductor
AsyncCompile.warm_pool()  # torch starts none here (no Triton) unless asked
waited = inductor.wait_ready(lambda: False, timeout=120)
holds = []
def adopted_meanwhile():  # the hand-over removes the variable between a standby's check and its hold
    os.environ.pop("GPUCTX_STANDBY")
    inductor.hold(standby=True)
for step in (lambda: inductor.hold(standby=False), lambda: inductor.hold(standby=True), inductor.after_adoption,
             lambda: inductor.hold(standby=True), adopted_meanwhile):
    step()
    d = AsyncCompile.process_pool().timer.duration
    holds.append(None if math.isinf(d) else d)
print(json.dumps({"waited": waited, "n": get_compile_threads(), "holds": holds}))
"""


def test_the_warm_up_waits_for_the_compile_workers_and_keeps_them():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "GPUCTX_STANDBY": "1"})  # a standby's, until the hand-over
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["n"] <= 1:
        pytest.skip("one CPU: inductor compiles in the kernel's own process, no workers")
    assert res["waited"] is None, res  # ready: they take jobs
    # 10 min; a standby's for as long as it waits; 10 min from the hand-over; and when the hand-over
    # came between a standby's check and its hold
    assert res["holds"] == [600.0, None, 600.0, None, 600.0], res


def test_a_gpu_cell_of_the_users_ends_the_wait_for_workers_still_starting():
    code = ("from gpuctx_jupyter.kernel.warm.recipes import inductor\n"
            "from torch._inductor.async_compile import AsyncCompile\n"
            "AsyncCompile.warm_pool()\n"  # its workers take seconds to start
            "print(inductor.wait_ready(lambda: True))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "your own GPU cell started first", out.stdout


def test_processes_started_through_the_unniced_thread_keep_the_kernels_priority():
    """A standby's warm-up thread runs at nice 19, and what it starts inherits that for good (an
    unprivileged process cannot raise it again): inductor's workers, which serve the notebook's
    compiles after adoption, are started through a thread made before the warm-up lowered its own."""
    import os
    import threading

    from gpuctx_jupyter.kernel.warm import side_threads

    seen = {}

    def warm_up():
        unniced = side_threads.Unniced()  # as Warmer._run does, before lowering its priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        start = lambda: subprocess.Popen([sys.executable, "-c", "import os; print(os.nice(0))"],  # noqa: E731
                                         stdout=subprocess.PIPE, text=True)
        seen["unniced"] = unniced.run(start).communicate(timeout=60)[0].strip()
        seen["own"] = start().communicate(timeout=60)[0].strip()
        unniced.close()

    base = os.nice(0)
    t = threading.Thread(target=warm_up)
    t.start()
    t.join(120)
    assert seen == {"unniced": str(base), "own": str(max(base, 19))}, seen


STANDBY = """
import json
from gpuctx_jupyter.contract import INDUCTOR_MODULE
from gpuctx_jupyter.kernel.warm import plan as plans
from gpuctx_jupyter.kernel.warm.scheduler import Warmer
w = Warmer()
w.start_plan(lambda: plans.imports_only(["torch", INDUCTOR_MODULE, "torch.optim"]), source="test")
st = w.wait(timeout=240)
print(json.dumps({"state": st.state, "detail": st.detail, "steps": [[s.name, s.state, s.detail] for s in w.plan.steps]}))
"""


def test_a_standby_that_imports_torch_compiles_module_starts_the_workers_after_its_imports_or_says_why_not():
    """An imports standby whose profile has torch.compile's import starts inductor's compile
    workers once its imports are done (they take 5-10 s to be ready: a notebook read for 10 s
    compiled before they were). Without Triton, as here on the CPU, the step says why not, and the
    standby's warm-up is done as one that imports only."""
    import importlib.util

    from gpuctx_jupyter.contract import INDUCTOR_MODULE

    from gpuctx_jupyter.contract import STANDBY as STANDBY_ENV

    out = subprocess.run([sys.executable, "-c", STANDBY], capture_output=True, text=True, timeout=300,
                         env={**os.environ, STANDBY_ENV: "1"})  # as the pool starts a standby
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    names = [name for name, _, _ in res["steps"]]
    assert names == ["import torch", f"import {INDUCTOR_MODULE}", "import torch.optim", "start inductor's compile workers"]
    assert [state for _, state, _ in res["steps"][:3]] == ["done"] * 3
    assert res["state"] == "done" and res["detail"].startswith("imported only"), res
    _, state, detail = res["steps"][-1]
    if importlib.util.find_spec("triton") is None:
        assert (state, detail) == ("skipped", "no Triton: inductor compiles for the CPU in the kernel's own process")
    else:  # a GPU machine's torch
        assert state == "done" and "workers ran Triton's compiler" in detail, res


def test_a_standbys_workers_compile_for_the_gpus_it_may_use_known_from_nvml(nvml_records, monkeypatch):
    """A standby starts no CUDA: the architectures its workers' first jobs compile for come from
    NVML, for the GPUs CUDA will show this kernel (an A100 is 80, an H100 90)."""
    from gpuctx_jupyter.core.nvml import GpuRecord
    from gpuctx_jupyter.kernel.warm.recipes import inductor

    nvml_records([GpuRecord(0, "GPU-a100a100-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB",
                            "00000000:07:00.0", (8, 0), 80 * 2**30, 0),
                  GpuRecord(1, "GPU-91009100-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3",
                            "00000000:B3:00.0", (9, 0), 80 * 2**30, 0)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert inductor.visible_archs() == {80, 90}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9100")
    assert inductor.visible_archs() == {90}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert inductor.visible_archs() == set()
