"""Waiting on conditions, never on fixed sleeps: tests pass on a loaded 2-core machine."""
from __future__ import annotations

import asyncio
import time


def wait_for(cond, timeout: float = 60.0, every: float = 0.05):
    """Poll `cond()` until it returns something true (returned) or `timeout` s pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {getattr(cond, '__name__', cond)}")
        time.sleep(every)


async def wait_until(predicate, timeout: float = 10.0, every: float = 0.05) -> bool:
    """The asyncio form: True once `predicate()` is true, False after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every)
    return True
