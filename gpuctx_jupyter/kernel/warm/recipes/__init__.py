"""What warming one GPU framework does: one module per framework, each a `Recipe`.

The scheduler (`warm/scheduler.py`) decides when a step runs; a recipe says what the step does.
A recipe gets the steps of the plan that are its framework's and the device to run them on, and
runs each through `run.phase(step, work)` — which waits for its turn (no cell running, the user idle
a moment), records the step's time and state, and never lets a failure escape. Adding a framework
is one new module here and its name in RECIPES. Nothing is imported until a recipe runs.
"""
from __future__ import annotations

import importlib
from typing import Protocol

from ..plan import Plan, Step

# framework -> module (relative to this package) holding its recipe, in the order they run
RECIPES = {"torch": ".torch", "cupy": ".cupy", "jax": ".jax", "numba": ".numba"}


class Run(Protocol):
    """What a recipe may ask of the warm-up that runs it."""

    plan: Plan
    cells_started: int  # cells the user has started so far (a recipe leaves their cache alone)

    @property
    def user_gpu(self) -> bool:
        """A cell of the user's does GPU work: no more GPU work of ours."""

    def phase(self, step: Step, work, heavy: bool = False, handles: bool = False) -> bool:
        """Run `work()` as `step` when it is its turn; True when it ran. `handles`: afterwards this
        thread holds library handles (cuBLAS/cuDNN) of its own."""

    def import_module(self, step: Step) -> None:
        """Import `step.module` as an import step (bounded by the import budget)."""

    def wait_background(self) -> None:
        """Until the imports the plan runs in the background have ended."""

    def unless_cells_since(self, cells: int, fn) -> bool:
        """Run `fn()` while no cell can start; False, without running it, if one has since `cells`."""

    def unniced(self, fn):
        """`fn()` at the kernel's own CPU priority (for processes it starts that outlive the warm-up)."""

    def in_cells_thread(self, step: Step, fn, ready=None) -> None:
        """Run `fn()` as `step` (of kind "cells") in the thread that runs cells, once this warm-up's
        thread has exited and while no cell runs (what is kept per thread); skipped, saying why,
        where it cannot be, or where `ready()` then says why not."""


class Recipe(Protocol):
    framework: str

    def gpu(self, run: Run, steps: list[Step], ordinal: int) -> None:
        """Run this framework's planned GPU steps on CUDA ordinal `ordinal`."""

    def cpu(self, run: Run, steps: list[Step]) -> None:
        """No GPU is usable: what of these steps still helps on the CPU (or mark them skipped)."""


class ImportOnly:
    """A framework whose GPU work is left to the notebook: the plan imports it, and its GPU steps,
    if any were planned, are skipped with `why`."""

    def __init__(self, framework: str, why: str):
        self.framework, self.why = framework, why

    def gpu(self, run: Run, steps: list[Step], ordinal: int) -> None:
        for step in steps:
            if step.state == "planned":
                step.state, step.detail = "skipped", self.why

    cpu = gpu


def recipe(framework: str) -> Recipe | None:
    module = RECIPES.get(framework)
    return importlib.import_module(module, __name__).RECIPE if module else None
