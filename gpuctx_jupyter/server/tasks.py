"""The server extension's background work, owned in one place.

The kernel hook (gateway warm-up requests) and the warm pool (standbys starting, replaced kernels
stopping) start tasks that outlive the request that caused them. They all go into the one
`Background` of the extension, so that server shutdown awaits every one of them and a task that
fails is logged, not lost.
"""
from __future__ import annotations

import asyncio


class Background:
    def __init__(self, log):
        self.log = log
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro, what: str) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, what))
        return task

    def _done(self, task: asyncio.Task, what: str) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.log.warning("gpuctx: %s failed: %s: %s", what, type(exc).__name__, exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait for every task, including those started while waiting."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
