"""Warming Numba: its CUDA context on the notebook's device and one tiny `@cuda.jit` kernel, where
the notebook writes CUDA kernels. A first kernel pays for NVVM and libdevice being loaded, once per
process, besides compiling itself; the warm-up pays the first part, the notebook's kernels still
compile on their first launch."""
from __future__ import annotations

from ..plan import Step


class NumbaRecipe:
    framework = "numba"

    def gpu(self, run, steps: list[Step], ordinal: int) -> None:
        for step in steps:
            if step.state == "planned" and step.op == "numba_jit":
                if not step.name.endswith(f" on cuda:{ordinal}"):
                    step.name = f"{step.name} on cuda:{ordinal}"
                run.phase(step, lambda: jit_tiny(ordinal), heavy=True)

    def cpu(self, run, steps: list[Step]) -> None:
        """Numba's CUDA kernels need a GPU: nothing of this helps on the CPU."""
        for step in steps:
            if step.state == "planned" and step.op == "numba_jit":
                step.state, step.detail = "skipped", "Numba's CUDA kernels need a GPU"


RECIPE = NumbaRecipe()


def jit_tiny(ordinal: int) -> None:
    import numpy as np
    from numba import cuda

    with cuda.gpus[ordinal]:
        @cuda.jit
        def bump(a):
            i = cuda.grid(1)
            if i < a.size:
                a[i] += 1.0

        d = cuda.device_array(32, dtype=np.float32)
        bump[1, 32](d)
        cuda.synchronize()
