"""Warming Numba: `numba.cuda` imported only (the plan's framework step); no context until the
notebook's first kernel."""
from __future__ import annotations

from . import ImportOnly

RECIPE = ImportOnly("numba", "Numba's first kernel is left to your notebook")
