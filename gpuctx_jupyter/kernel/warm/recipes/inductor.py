"""inductor's compile workers, started and used once before the notebook's first torch.compile.

torch.compile hands each Triton kernel it generates to a pool of worker processes (one per core,
up to 32); until they are ready it compiles in the kernel's own process. The warm-up's tiny
compile runs before they are ready, so the user's first compile was the first to go through them,
and paid for that path: a graph never compiled before took ~1.8 s on an H200 host 15 s after the
warm-up, 1.5-2.0 s once this module's compile had gone through the workers (1.15-1.2 s after a
graph new to every cache, Triton's included, had: docs/benchmarks.md). Hence, where the notebook
compiles:

- the pool is started first (`start_pool`), by a thread of normal priority: a standby's warm-up
  runs at the lowest, and the workers it started would keep it for the notebook's compiles;
- after the tiny compile, once the pool is ready (`wait_ready`), every worker runs Triton's
  compiler once on a kernel of its own (`first_jobs`, recipes/triton_job.py), and a second
  function of gpuctx's own is compiled, whose kernels the workers compile (`through_workers`);
- torch shuts the workers down after 60 s without a job, and the next compile starts them cold:
  they are kept HOLD_S after their last job instead, and for as long as a standby of the warm pool
  waits (`hold`; adoption gives the notebook HOLD_S from then, `after_adoption`).
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
import time

from ....contract import STANDBY

HOLD_S = 600.0  # workers are kept this long after their last job (torch's own: 60 s)
READY_S = 60.0  # at most this long for the pool to start
FIRST_JOBS_S = 30.0  # at most this long for every worker's first job
_first_jobs_done: dict[int, set[int]] = {}  # id of torch's pool (kept alive by torch) -> architectures done


def why_not(torch) -> str | None:
    """Why this kernel's compiles use no worker processes (None: they do)."""
    from torch._inductor import async_compile

    if not async_compile.has_triton_package():
        return "no Triton: inductor compiles for the CPU in the kernel's own process"
    if async_compile.get_compile_threads() <= 1:
        return "inductor compiles in the kernel's own process (compile_threads = 1)"
    if os.environ.get("TORCH_WARM_POOL", "1") != "1":
        return "TORCH_WARM_POOL is off: inductor starts no compile workers ahead"
    return None


def start_pool() -> None:
    """Start inductor's worker pool now (torch does this on the first compile)."""
    from torch._inductor.async_compile import maybe_warm_pool

    maybe_warm_pool()


def wait_ready(give_up, timeout: float = READY_S, gave_up: str = "your own GPU cell started first") -> str | None:
    """Until the pool's workers take jobs; the reason when they did not in `timeout` s or
    `give_up()` came true first (checked every 0.1 s; then `gave_up`). Time this process spent
    stopped (a standby paused while a notebook's cell ran) does not count."""
    from torch._inductor.async_compile import AsyncCompile

    waited, last = 0.0, time.monotonic()
    while not AsyncCompile.use_process_pool():
        if give_up():
            return gave_up
        if waited >= timeout:
            return f"the compile workers were not ready after {timeout:g} s"
        time.sleep(0.1)
        now = time.monotonic()
        waited += min(now - last, 1.0)  # a longer gap was a stop, not a wait
        last = now
    return None


def arch_of(torch, dev) -> int | None:
    """The CUDA architecture Triton compiles `dev`'s kernels for (90 for an H200); None on ROCm."""
    if torch.version.hip:
        return None
    major, minor = torch.cuda.get_device_capability(dev)
    return major * 10 + minor


def visible_archs() -> set[int]:
    """The architectures of the GPUs this process may use, from NVML: no CUDA (a standby's)."""
    from ....core import inventory

    return {cc[0] * 10 + cc[1] for cc in (d.record.compute_capability for d in inventory.take().devices) if cc}


def first_jobs(archs) -> str:
    """Every worker runs Triton's compiler once for each of `archs` (recipes/triton_job.py: no
    CUDA, Triton's cache untouched), unless this pool's workers did already; says what was done."""
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    archs = tuple(sorted(a for a in archs if a))
    if not archs:
        return "no first jobs: no NVIDIA GPU's architecture is known"
    pool = AsyncCompile.process_pool()
    if set(archs) <= _first_jobs_done.get(id(pool), set()):
        return "every worker had run Triton's compiler already (a standby's workers)"
    n = get_compile_threads()
    from . import triton_job

    with tempfile.TemporaryDirectory(prefix="gpuctx-first-jobs-", ignore_cleanup_errors=True) as barrier:
        jobs = [pool.submit(triton_job.run, barrier, n, archs, 5.0) for _ in range(n)]
        deadline = time.monotonic() + FIRST_JOBS_S
        pids = {job.result(timeout=max(0.0, deadline - time.monotonic())) for job in jobs}
    if len(pids) == n:  # (else the notebook's warm-up gives the rest theirs)
        _first_jobs_done.setdefault(id(pool), set()).update(archs)
    return f"{len(pids)} of {n} workers ran Triton's compiler"


def through_workers(torch, dev) -> None:
    """Compile a function of gpuctx's own (four kernels, forward only) through the ready workers —
    past inductor's caches on disk, which would hand back the graph without a job for the workers
    from the second time on (and then the notebook's compile was as slow as without this step)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config

    xs = [torch.randn(3 + i, 5 + 2 * i, device=dev) for i in range(4)]
    with config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        outs = torch.compile(_four_kernels)(*xs)
    for out in outs:
        float(out.sum())


def hold(standby: bool) -> None:
    """Keep the workers HOLD_S after their last job (a standby: while it waits)."""
    from torch._inductor import config

    timer = _timer()
    if timer is not None:
        timer.duration = math.inf if standby else max(HOLD_S, config.quiesce_async_compile_time)
        if standby and not os.environ.get(STANDBY):  # handed to a notebook meanwhile (adoption.py
            after_adoption()  # removes the variable, then calls after_adoption): not forever, then


def after_adoption() -> None:
    """A standby became a notebook's kernel: its workers are kept HOLD_S from now, not forever."""
    timer = _timer()
    if timer is not None and timer.duration == math.inf:
        timer.duration = HOLD_S
        timer.record_call()


def _timer():
    """The quiescing timer of the pool this kernel started, if any (torch's SubprocPool)."""
    mod = sys.modules.get("torch._inductor.async_compile")
    if mod is None or not mod.AsyncCompile.process_pool.cache_info().currsize:
        return None
    return getattr(mod.AsyncCompile.process_pool(), "timer", None)


def _four_kernels(a, b, c, d):
    """What through_workers compiles: a code object of gpuctx's alone (see compile_tiny in torch.py), one
    kernel per input (each of its own shape)."""
    return [a.sin().sum(dim=0), b.cos().amax(dim=1), (c * 2 + 1).relu().mean(dim=0), d.exp().sum(dim=1)]
