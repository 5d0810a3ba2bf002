"""Time this process stood still, which a budget of seconds (the warm-up's imports') does not count.

A server on a machine with few cores stops a starting standby (SIGSTOP) for as long as another
notebook's cell runs, minutes maybe (server/giving_way.py); a loaded machine may starve it of the
CPU for seconds. Its imports did not run meanwhile, so that time is not theirs: counted against
their budget, it left the standby half-imported ("still importing after the import budget").
Seen as a wait that returns far later than it asked to while the process used no CPU (a wait
returns late too while an import's C code holds the GIL: that time the import ran, and counts).
"""
from __future__ import annotations

import threading
import time

GAP_S = 1.0  # a wait this much later than asked, with no CPU used meanwhile: the process stood still


class StoodStill:
    """Seconds the process stood still, as the waits through `wait` saw them (one per process)."""

    def __init__(self):
        self.seconds = 0.0
        self._lock = threading.Lock()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """`event.wait(timeout)`; a return more than GAP_S late, less the CPU time the process used
        meanwhile, counts as time stood still (also when the event was set during the stop: the
        budget is the whole plan's, and the next imports' share must not pay for it)."""
        start, cpu = time.monotonic(), time.process_time()
        done = event.wait(timeout)
        still = (time.monotonic() - start - timeout) - (time.process_time() - cpu)
        if still > GAP_S:
            with self._lock:
                self.seconds += still
        return done


STOOD = StoodStill()
