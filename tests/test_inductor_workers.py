"""inductor's compile workers after the warm-up (kernel/warm/recipes/inductor.py), on a real pool of
torch's: the warm-up waits for them to take jobs, and keeps them longer than torch's 60 s — for as
long as a standby waits, 10 minutes once a notebook has it. (The compile through them needs Triton,
which exists only where there is a GPU: the GPU test checks it, and that no worker starts CUDA.)"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

CODE = """
import json, math
from torch._inductor.async_compile import AsyncCompile, get_compile_threads
from gpuctx_jupyter.kernel.warm.recipes import inductor
AsyncCompile.warm_pool()  # torch starts none here (no Triton) unless asked
waited = inductor.wait_ready(lambda: False, timeout=120)
holds = []
for step in (lambda: inductor.hold(standby=False), lambda: inductor.hold(standby=True), inductor.after_adoption):
    step()
    d = AsyncCompile.process_pool().timer.duration
    holds.append(None if math.isinf(d) else d)
print(json.dumps({"waited": waited, "n": get_compile_threads(), "holds": holds}))
"""


def test_the_warm_up_waits_for_the_compile_workers_and_keeps_them():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["n"] <= 1:
        pytest.skip("one CPU: inductor compiles in the kernel's own process, no workers")
    assert res["waited"] is None, res  # ready: they take jobs
    assert res["holds"] == [600.0, None, 600.0], res  # 10 min; a standby's for as long as it waits; 10 min again


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
