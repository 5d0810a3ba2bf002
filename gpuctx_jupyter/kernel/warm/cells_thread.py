"""Work the warm-up leaves to the thread that runs cells.

Some of what a first GPU cell pays is kept per thread (cuDNN's attention forward graphs: ~50 ms a
problem on an H200, warm/attention.py), so the warm-up's thread cannot pay it for the cells. Such
work runs on the kernel's event loop, in the cells' thread, once the warm-up's thread has exited
(its library handles back in torch's pools, for this thread to take): only while no cell runs, the
user idle a moment, and before the user's own first GPU cell; else it is skipped, saying why. A cell
sent meanwhile waits for the work in hand (tens of ms), never for more.
"""
from __future__ import annotations

import time

GIVE_UP_S = 120.0  # a kernel busy with cells this long after the warm-up: the cells did it themselves


class CellsThread:
    def __init__(self):
        self.kernel = None  # the ipykernel, set when gpuctx loads (its io_loop: once the kernel has started)
        self._jobs: list = []  # (step, fn)

    def add(self, step, fn) -> None:
        self._jobs.append((step, fn))

    def hand_over(self, warmer, thread) -> None:
        """Called by the warm-up's thread as it ends: run the jobs it left once it has exited."""
        jobs, self._jobs = self._jobs, []
        if not jobs:
            return
        loop = getattr(self.kernel, "io_loop", None)
        if loop is None:
            _skip(jobs, "no event loop of a kernel to run it in (not an ipykernel)")
            return
        give_up = time.monotonic() + GIVE_UP_S

        def attempt():
            thread.join(1.0)
            with warmer._cond:
                why = _why_not(warmer, thread, give_up)
                wait = None if why is not None else _wait(warmer)
                cells = warmer._cells_started
            if why is not None:
                _skip(jobs, why)
            elif wait > 0:
                loop.call_later(wait, attempt)
            else:
                for step, fn in jobs:  # (a step records its time and state, restores the RNG, never raises)
                    warmer._run_step(step, fn, cells)
                    if step.state == "failed":
                        _skip([j for j in jobs if j[0].state == "planned"], "an earlier one failed")
                        break

        loop.add_callback(attempt)


def _why_not(warmer, thread, give_up: float) -> str | None:
    if warmer._stop_asked:
        return warmer._stopped or "the warm-up was stopped"
    if warmer._user_gpu:
        return "your own GPU cell started first"
    if thread.is_alive():
        return "the warm-up's thread did not end"
    if time.monotonic() > give_up:
        return f"no idle moment within {GIVE_UP_S:g} s"
    return None


def _wait(warmer) -> float:
    """Seconds until the cells' thread may take it (0: now)."""
    from .scheduler import LIGHT_IDLE_S

    if warmer._cells:  # (an async cell awaiting: the loop runs callbacks while that cell is not over)
        return LIGHT_IDLE_S
    idle = LIGHT_IDLE_S if warmer._last_cell_end is None else time.monotonic() - warmer._last_cell_end
    return max(0.0, LIGHT_IDLE_S - idle)


def _skip(jobs, why: str) -> None:
    for step, _fn in jobs:
        if step.state == "planned":
            step.state, step.detail = "skipped", why
