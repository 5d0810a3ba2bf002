"""Warming CuPy: its first array work on the device — context, allocator pool, a matmul, cuRAND's
generator, the element-wise and reduction kernels first cells use (CuPy builds and loads each on
its first call: 0.3–0.4 s of a first array cell on an H200) and NVRTC's first compile.

CuPy's global generator cannot be saved and put back (kernel/rng.py does the others): the step draws
from the device's own only while the user has not, and then drops it, so that the user's first draw
makes it anew, seeded as without gpuctx (CUPY_SEED, or at random); else from a generator of its own."""
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
                cells = run.cells_started
                states = getattr(getattr(cupy.random, "_generator", None), "_random_states", None)
                fresh = states is not None and ordinal not in states  # no draw of the user's yet
                rs = cupy.random.get_random_state() if fresh else cupy.random.RandomState(0)
                for dtype in (cupy.float32, cupy.float64):
                    x = rs.rand(1024, dtype=dtype)
                    y = x * 2 + 1
                    float(y.sum()), float(y.mean()), float(y.max()), float(cupy.sqrt(y).min())
                cupy.ElementwiseKernel("float32 x", "float32 y", "y = x + 1", "gpuctx_warm")(a[0])
                cupy.cuda.Device(ordinal).synchronize()
                if fresh:  # the user's first draw makes the device's generator anew, seeded as without gpuctx
                    run.unless_cells_since(cells, lambda: states.pop(ordinal, None))

        for step in steps:
            if step.state == "planned":
                run.phase(step, work, handles=True)

    def cpu(self, run, steps: list[Step]) -> None:
        """CuPy has nothing to warm without a GPU."""


RECIPE = CupyRecipe()
