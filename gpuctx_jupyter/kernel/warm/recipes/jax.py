"""Warming JAX: its backend and a tiny jit(grad), compiled on the notebook's device — the backend's
start and XLA's first compile, most of a first jit cell's time. Only while JAX does not
preallocate: starting its GPU backend otherwise takes 75% of every GPU it sees. The rest of a first
jit cell is XLA compiling the user's own function, which JAX's persistent compilation cache (on for
the server's kernels) skips when the notebook runs again."""
from __future__ import annotations

import os

from ....contract import jax_preallocation
from ..plan import Step


class JaxRecipe:
    framework = "jax"

    def gpu(self, run, steps: list[Step], ordinal: int) -> None:
        self._warm(run, steps, ordinal)

    def cpu(self, run, steps: list[Step]) -> None:
        self._warm(run, steps, None)

    @staticmethod
    def _warm(run, steps: list[Step], ordinal: int | None) -> None:
        for step in steps:
            if step.state != "planned" or step.op != "jax_jit":
                continue
            fraction = jax_preallocation(os.environ)
            if fraction is not None:
                step.state, step.detail = "skipped", (f"JAX would preallocate {fraction:.0%} of every GPU: set "
                                                      "XLA_PYTHON_CLIENT_PREALLOCATE=false to have it warmed")
                continue
            if ordinal is not None and not step.name.endswith(f" on cuda:{ordinal}"):
                step.name = f"{step.name} on cuda:{ordinal}"
            why = []
            if run.phase(step, lambda: why.append(jit_tiny(ordinal)), heavy=True, handles=ordinal is not None) \
                    and why[0]:
                step.state, step.detail = "skipped", why[0]


RECIPE = JaxRecipe()


def jit_tiny(ordinal: int | None) -> str | None:
    """A tiny jit(grad) on cuda:`ordinal` (None: the CPU); why not, where this JAX cannot."""
    import jax
    import jax.numpy as jnp

    devices = [d for d in jax.devices() if d.platform != "cpu"] if ordinal is not None else jax.devices("cpu")
    if not devices:  # a CPU-only jaxlib beside a GPU
        return "this JAX has no GPU backend (jax[cuda] installs one): its jit runs on the CPU"
    dev = devices[ordinal] if ordinal is not None and ordinal < len(devices) else devices[0]
    f = jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)))
    w, x = jax.device_put(jnp.ones((16, 16)), dev), jax.device_put(jnp.ones((8, 16)), dev)
    f(w, x).block_until_ready()
    return None
