"""The server extension's background work, owned in one place.

The kernel hook (gateway warm-up requests), the warm pool (standbys starting, replaced kernels
stopping) and the holders round's consumers (the suspends, shutdowns and releases culling and the
pressure release decide on) start tasks that outlive what caused them. They all go into the one
`Background` of the extension, so that server shutdown awaits every one of them and a task that
fails is logged, not lost. `spawn_once` keeps at most one task in flight per key: the holders
round starts one action per kernel and goes on with its round, never waiting for it.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class Background:
    def __init__(self, log):
        self.log = log
        self._tasks: set[asyncio.Task] = set()
        self._keyed: dict[str, asyncio.Task] = {}

    def spawn(self, coro, what: str) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, what))
        return task

    def spawn_once(self, key: str, start: Callable[[], Awaitable], what: str) -> asyncio.Task | None:
        """`start()` as a task, unless a task spawned under `key` is still running (then None,
        and `start` is not called)."""
        if self.running(key):
            return None
        task = self.spawn(start(), what)
        self._keyed[key] = task
        task.add_done_callback(lambda t: self._keyed.pop(key) if self._keyed.get(key) is t else None)
        return task

    def running(self, key: str) -> bool:
        return key in self._keyed

    def _done(self, task: asyncio.Task, what: str) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.log is not None:
            exc = task.exception()
            self.log.warning("gpuctx: %s failed: %s: %s", what, type(exc).__name__, exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait for every task, including those started while waiting."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
