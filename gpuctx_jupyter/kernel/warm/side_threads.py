"""The threads the warm-up thread hands work to: a timer, work it does not wait for, and a thread of
the kernel's own CPU priority for a warm-up that runs at the lowest."""
from __future__ import annotations

import logging
import queue
import threading
import time

log = logging.getLogger("gpuctx")


def timer(seconds: float, fn) -> threading.Timer:
    (t := threading.Timer(seconds, fn)).daemon = True
    t.start()
    return t


def in_background(step, fn, phases: dict) -> None:
    """Run `fn()` in a daemon thread, recorded as `step` (what it returns: the step's detail) and in
    `phases`; a failure is recorded and logged, never raised."""
    step.state, step.started, t0 = "running", time.monotonic(), time.perf_counter()

    def work():
        try:
            step.detail = fn() or step.detail
            step.state = "done"
        except Exception as exc:  # noqa: BLE001 — recorded and logged, never raised
            step.state, step.detail = "failed", f"{type(exc).__name__}: {exc}"
            log.warning("gpuctx warm-up failed at %s (the kernel works on): %s", step.name, step.detail)
        finally:
            step.seconds = time.perf_counter() - t0
            phases[step.name] = step.seconds

    threading.Thread(target=work, name="gpuctx-warmup-background", daemon=True).start()


class Unniced:
    """A thread started before the warm-up thread lowers its priority, which runs what it is
    handed at the priority it started with (a thread's children inherit its priority)."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="gpuctx-warmup-unniced", daemon=True).start()

    def run(self, fn):
        done, box = threading.Event(), {}
        self._jobs.put((fn, done, box))
        done.wait()
        if "exc" in box:
            raise box["exc"]
        return box.get("value")

    def close(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, done, box = job
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 — handed back to the caller
                box["exc"] = exc
            finally:
                done.set()


def raise_from(box: dict) -> None:
    """What an import raised, if anything (a BaseException as an Exception: recorded, not fatal)."""
    exc = box.get("exc")
    if exc is not None:
        raise exc if isinstance(exc, Exception) else RuntimeError(f"{type(exc).__name__}: {exc}")
