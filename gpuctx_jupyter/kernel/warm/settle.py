"""A standby's imports settled before a notebook takes it.

Importing torch, torch._dynamo and a notebook's libraries leaves a few hundred thousand objects
that live for the whole process. Python's cyclic garbage collector looks at every one of them in
each full collection (0.1–0.5 s with torch imported; a kernel that imports during its first cell
pays those inside that cell). A standby has time to spare: once its warm-up is over it collects
what the warm-up left and freezes everything still alive (`gc.freeze`), so that the notebook's
collections leave those objects out for good. Frozen objects are still freed by reference
counting; only the cyclic collector, and `gc.get_objects`/`gc.get_referrers`, pass them by.

Only in a standby that no notebook has taken: nothing of a user's may be frozen (a cycle of the
user's holding a GPU tensor would be kept). The hand-over (kernel/adoption.py) holds LOCK and
calls handed_over(); the freeze happens under LOCK only if neither has happened. The collection
before it runs outside LOCK, at the kernel's own CPU priority (the warm-up hands it to its
unniced thread): a hand-over never waits for it longer than the collection takes.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time

from ...contract import STANDBY

log = logging.getLogger("gpuctx")
LOCK = threading.Lock()  # held by the hand-over and by the freeze: a notebook takes a settled standby or an unsettled one
_over = threading.Event()  # settled, or handed over: no freeze from now on


def handed_over() -> None:
    """A notebook takes this kernel (called under LOCK): from now on nothing is frozen."""
    _over.set()


def settle() -> int | None:
    """In a standby not yet handed over: collect, then freeze what is alive. The number of objects
    gc holds frozen then, or None where nothing was done (not a standby, taken, settled before)."""
    if not os.environ.get(STANDBY) or _over.is_set():
        return None
    try:
        t0 = time.perf_counter()
        gc.collect()  # (garbage frozen would never be collected: a warm-up tensor in a cycle kept)
        with LOCK:
            if not os.environ.get(STANDBY) or _over.is_set():
                return None
            gc.freeze()
            _over.set()
            frozen = gc.get_freeze_count()
        log.info("gpuctx: the standby's objects settled in %.0f ms (gc.freeze, %d frozen): the notebook's "
                 "collections leave them out", (time.perf_counter() - t0) * 1000, frozen)
        return frozen
    except Exception as exc:  # noqa: BLE001 — an optimisation: the standby serves without it
        log.warning("gpuctx: settling the standby's objects failed: %s: %s", type(exc).__name__, exc)
        return None
