"""Work the warm-up leaves to the thread that runs cells.

Some of what a first GPU cell pays is kept per thread (cuDNN's attention forward graphs: ~50 ms a
problem on an H200, warm/attention.py), so the warm-up's thread cannot pay it for the cells. Such
work runs on the kernel's event loop, in the cells' thread, once the warm-up's thread has exited
(its library handles back in torch's pools, for this thread to take): only while no cell runs, the
user idle a moment, and before the user's own first GPU cell; else it is skipped, saying why. One
job per turn of the loop: a cell sent meanwhile waits for the job in hand (tens of ms), never more.
"""
from __future__ import annotations

import threading
import time

GIVE_UP_S = 120.0  # a kernel busy with cells this long after the warm-up: the cells did it themselves
BETWEEN_S = 0.05  # between two jobs: a cell sent meanwhile starts first


class CellsThread:
    def __init__(self):
        self.kernel = None  # the ipykernel, set when gpuctx loads (its io_loop: once the kernel has started)
        self.idle = threading.Event()  # clear while a job runs (a suspend waits for it: Warmer.stop)
        self.idle.set()
        self._jobs: list = []  # (step, fn, ready): ready() says why not now ("": go)
        self._handed: list = []  # the steps of the jobs handed over last
        self.user_gpu = False  # a GPU cell of the user's started while jobs were pending (Warmer.cell_started)

    @property
    def pending(self) -> bool:
        """Jobs handed over and not yet run or skipped."""
        return any(step.state == "planned" for step in self._handed)

    def add(self, step, fn, ready=None) -> None:
        self._jobs.append((step, fn, ready))

    def hand_over(self, warmer, thread) -> None:
        """Called by the warm-up's thread as it ends: run the jobs it left once it has exited."""
        jobs, self._jobs = self._jobs, []
        if not jobs:
            return
        self._handed, self.user_gpu = [step for step, *_ in jobs], False
        loop = getattr(self.kernel, "io_loop", None)
        give_up = time.monotonic() + GIVE_UP_S

        def attempt():
            thread.join(1.0)
            while jobs and jobs[0][0].state != "planned":  # (skipped meanwhile: the warm-up stepped aside)
                jobs.pop(0)
            if not jobs:
                return
            with warmer._cond:
                why = _why_not(warmer, thread, give_up) or ("your own GPU cell started first" if self.user_gpu else None)
                wait = None if why is not None else _wait(warmer)
                cells = warmer._cells_started
                if why is None and not wait:
                    self.idle.clear()  # (under the lock Warmer.stop takes: a suspend sees it)
            if why is not None:
                _skip(jobs, why)
            elif wait:
                _later(loop, wait, attempt, jobs)
            else:  # one job per turn: the loop takes a request that came meanwhile before the next
                step, fn, ready = jobs.pop(0)
                try:
                    not_now = ready() if ready is not None else ""
                    if not_now:
                        step.state, step.detail = "skipped", not_now
                    else:  # (it records the step's time and state, restores the RNG)
                        warmer._run_step(step, fn, cells)
                except Exception as exc:  # noqa: BLE001 — never into the kernel's event loop
                    step.state, step.detail = "skipped", f"{type(exc).__name__}: {exc}"
                finally:
                    self.idle.set()
                if step.state == "failed":
                    _skip(jobs, "an earlier one failed")
                elif jobs:
                    _later(loop, BETWEEN_S, attempt, jobs)

        if loop is None:
            _skip(jobs, "no event loop of a kernel to run it in (not an ipykernel)")
            return
        try:  # (from this thread: add_callback wakes the loop; call_later would wait for its next event)
            loop.add_callback(attempt)
        except RuntimeError as exc:
            _skip(jobs, f"the kernel's event loop is gone ({exc})")


def _later(loop, delay: float, fn, jobs) -> None:
    try:
        loop.call_later(delay, fn)
    except RuntimeError as exc:  # the loop is closed: the kernel is shutting down
        _skip(jobs, f"the kernel's event loop is gone ({exc})")


def _why_not(warmer, thread, give_up: float) -> str | None:
    if warmer._stop_asked or warmer.held():
        return warmer._stopped or "the kernel is being suspended"
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

    # a cell running (an async one awaiting: the loop runs callbacks meanwhile), or a later warm-up's
    # thread (a plan of typed cells): its handles would be a second set
    if warmer._cells or warmer.running:
        return LIGHT_IDLE_S
    idle = LIGHT_IDLE_S if warmer._last_cell_end is None else time.monotonic() - warmer._last_cell_end
    return max(0.0, LIGHT_IDLE_S - idle)


def _skip(jobs, why: str) -> None:
    for step, *_ in jobs:
        if step.state == "planned":
            step.state, step.detail = "skipped", why
