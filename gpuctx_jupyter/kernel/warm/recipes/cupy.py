"""Warming CuPy: its first array work on the device — context, allocator pool, a matmul, cuRAND's
generator, the element-wise and reduction kernels first cells use (CuPy builds and loads each on
its first call: 0.3–0.4 s of a first array cell on an H200) and NVRTC's first compile.

CuPy's global generator cannot be saved and put back (kernel/rng.py does the others), so the step
draws from a generator of its own: cuRAND and its kernels are loaded all the same, and the user's
`cupy.random.seed` or CUPY_SEED gives what it gives without gpuctx."""
from __future__ import annotations

from ..plan import Step


class CupyRecipe:
    framework = "cupy"

    def gpu(self, run, steps: list[Step], ordinal: int) -> None:
        import cupy

        def work():
            with cupy.cuda.Device(ordinal):
                a = cupy.ones((1024, 1024), dtype=cupy.float32)
                (a @ a).sum()
                rs = cupy.random.RandomState(0)  # the user's own generator is left as it is
                for dtype in (cupy.float32, cupy.float64):
                    x = rs.rand(1024, dtype=dtype)
                    y = x * 2 + 1
                    float(y.sum()), float(y.mean()), float(y.max()), float(cupy.sqrt(y).min())
                cupy.ElementwiseKernel("float32 x", "float32 y", "y = x + 1", "gpuctx_warm")(a[0])
                cupy.cuda.Device(ordinal).synchronize()

        for step in steps:
            if step.state == "planned":
                run.phase(step, work, handles=True)

    def cpu(self, run, steps: list[Step]) -> None:
        """CuPy has nothing to warm without a GPU."""


RECIPE = CupyRecipe()
