"""The job each of inductor's compile workers runs once, before the notebook's first compile: Triton's
compiler (MLIR, LLVM, ptxas) run on a kernel of gpuctx's own, for the notebook's GPU, without CUDA.

A worker whose first job finds its kernel in Triton's cache on disk loads it and never starts the
compiler; a notebook's graph never compiled before then pays that start in its first compile (on an
H200 host, 4 kernels compiled through the workers took the next new graph's compile to 1.2 s when
Triton's cache missed, 1.6 s when it hit: docs/benchmarks.md). So the job compiles into a cache
folder of its own, removed afterwards: Triton's cache is left as it was. It imports triton:
imported by the kernel only where inductor has imported triton already (to hand `run` to the
workers), never at gpuctx's import.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import triton
import triton.language as tl


@triton.jit
def gpuctx_first_job(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n) * 2.0, mask=i < n)


def run(barrier: str, n: int, archs: tuple[int, ...], wait_s: float) -> int:
    """Compile `gpuctx_first_job` for each CUDA architecture in `archs` (90 for an H200) once every
    one of the `n` jobs has started (each waits up to `wait_s` s in the folder `barrier`, so that no
    worker runs two); returns this worker's pid."""
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + wait_s
    while len(os.listdir(barrier)) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cache = tempfile.mkdtemp(prefix="gpuctx-triton-")
    before = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
        src = ASTSource(fn=gpuctx_first_job, signature={"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 128})
        for arch in archs:
            triton.compile(src, target=GPUTarget("cuda", arch, 32))
    finally:
        if before is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = before
        shutil.rmtree(cache, ignore_errors=True)
    return os.getpid()
