"""Standbys give way to the notebooks' running cells (pool.py): no standby's start slows a cell.

On a machine with at most `standby_pause_cores` cores, standbys that are starting are stopped
(SIGSTOP, their processes with them: standby.py) for as long as any kernel of the server runs a
cell, and none is started meanwhile. Elsewhere they are stopped for the first `standby_yield_s` s
of running cells, then go on at the lowest CPU priority. The lowest priority alone was not enough:
a standby starts inductor's compile workers at the kernel's own priority (they outlive its
warm-up), and the refill taken at an open, or the reserve started 10 s after it, did so while the
notebook's first cells ran. A cell that trains for hours must not keep the pool empty either.
"""
from __future__ import annotations

import asyncio
import os
import time

from . import kernel_client

EVERY_S = 0.2  # how often running cells are looked for
# ... while a standby is starting: a notebook's first cell often comes as its standby is taken,
# while the refill starts, and a short one would be over before a look every 0.2 s saw it
STARTING_EVERY_S = 0.02


class GivingWay:
    """Whether any kernel of the server runs a cell, and since when; stops and resumes standbys."""

    def __init__(self, mkm, cfg):
        self.mkm, self.cfg = mkm, cfg
        self.cells_running = False
        self._busy_since: float | None = None  # since when some kernel has run a cell (monotonic)

    @property
    def few_cores(self) -> bool:
        return 0 < (os.cpu_count() or 1) <= self.cfg.standby_pause_cores

    @property
    def holding_starts(self) -> bool:
        """No standby is started now (a machine with few cores, while cells run)."""
        return self.cells_running and self.few_cores

    def stop_starting(self, now: float) -> bool:
        """Whether standbys that are starting should be stopped now (looks at the kernels)."""
        busy = any(getattr(kernel_client.find(self.mkm, kid), "execution_state", "") == "busy"
                   for kid in list(self.mkm.list_kernel_ids()))
        self._busy_since = (self._busy_since or now) if busy else None
        self.cells_running = busy
        return busy and (self.few_cores or now - self._busy_since < self.cfg.standby_yield_s)

    async def run(self, standbys, closing) -> None:
        """Until `closing()`: stop the starting ones of `standbys()` while they should give way."""
        while not closing():
            stop = self.stop_starting(time.monotonic())
            starting = False
            for s in standbys():
                s.pause() if stop else s.resume()
                starting = starting or (s.state == "booting" and not s.paused)
            await asyncio.sleep(STARTING_EVERY_S if starting else EVERY_S)
