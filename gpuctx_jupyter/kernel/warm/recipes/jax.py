"""Warming JAX: imported only (the plan's framework step). Starting its GPU backend preallocates
75% of every GPU it sees unless the server turned preallocation off, so it is left to the notebook."""
from __future__ import annotations

from . import ImportOnly

RECIPE = ImportOnly("jax", "JAX's GPU work is left to your notebook")
