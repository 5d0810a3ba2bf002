"""Warming CuPy: its first array work on the device (context, allocator pool, a matmul)."""
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
                cupy.cuda.Device(ordinal).synchronize()

        for step in steps:
            if step.state == "planned":
                run.phase(step, work, handles=True)

    def cpu(self, run, steps: list[Step]) -> None:
        """CuPy has nothing to warm without a GPU."""


RECIPE = CupyRecipe()
