"""A standby's imports settled before a notebook takes it.

Importing torch, torch._dynamo and a notebook's libraries leaves a few hundred thousand objects
that live for the whole process. Python's cyclic garbage collector looks at every one of them in
each full collection, and the first one after the imports comes whenever the notebook's own
allocations trigger it: a pause of 0.1–0.5 s inside one of its first cells, which a kernel that
imported during its own first cell pays inside that (long) cell instead. A standby has time to
spare: once its warm-up is over it collects what the warm-up left and freezes everything still
alive (`gc.freeze`), so that the notebook's collections leave those objects out for good — no
pause in the first cells, and shorter full collections for as long as the notebook runs.

Only in a standby that no notebook has taken yet: nothing of a user's may be frozen (a frozen
object is never collected, and a cycle of the user's holding a GPU tensor would keep it). The
hand-over (kernel/adoption.py) holds LOCK, so the two never overlap.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time

from ...contract import STANDBY

log = logging.getLogger("gpuctx")
LOCK = threading.Lock()  # held by the hand-over and by settle(): a notebook takes a settled standby or an unsettled one
_done = threading.Event()  # settled (gc's freeze count cannot tell: a kernel may freeze a few objects of its own)


def settle() -> int | None:
    """In a standby not yet handed over: collect, then freeze what is alive. The number of objects
    frozen, or None where nothing was done (not a standby, taken, settled before)."""
    try:
        with LOCK:
            if not os.environ.get(STANDBY) or _done.is_set():
                return None
            t0 = time.perf_counter()
            gc.collect()
            gc.freeze()
            frozen = gc.get_freeze_count()
            _done.set()
        log.info("gpuctx: the standby's %d objects settled in %.0f ms (gc.freeze): the notebook's "
                 "collections leave them out", frozen, (time.perf_counter() - t0) * 1000)
        return frozen
    except Exception as exc:  # noqa: BLE001 — an optimisation: the standby serves without it
        log.warning("gpuctx: settling the standby's objects failed: %s: %s", type(exc).__name__, exc)
        return None
