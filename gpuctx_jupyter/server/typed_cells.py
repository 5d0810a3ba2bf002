"""The cells a notebook's frontend holds as they are typed, on their way to its kernel (issue #25).

JupyterLab sends them a second after typing stops; several pages on one notebook, or a slow kernel,
can make them arrive faster than a kernel answers. Per kernel, at most one message is in flight and
only the latest cells wait behind it: cells superseded before they were sent are dropped (the newer
ones say everything they said), and every request that was waiting gets the answer of the message
that carried its cells or newer ones. Nothing piles up, whatever the number of requests.

The server holds a kernel's cells only until they are sent and never logs them (counts and sizes at
most): they are the user's unsaved work.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..contract import CELLS_REPLY, CELLS_REQUEST
from . import kernel_query
from .tasks import Background


@dataclass
class _Slot:
    """One kernel's typed cells: the latest not yet sent, and the requests waiting for an answer."""

    cells: list[str] | None = None
    asked: int = 0  # numbered in arrival order
    sent: int = 0  # the newest number a message to the kernel carried
    waiting: list[tuple[int, asyncio.Future]] = field(default_factory=list)
    sending: asyncio.Task | None = None


class TypedCells:
    def __init__(self, timeout: float, background: Background):
        self.timeout, self.background = timeout, background
        self._slots: dict[str, _Slot] = {}

    async def send(self, kernel_id: str, kernel, cells: list[str]) -> dict:
        """The kernel's answer to these cells, or to newer ones that superseded them before they
        were sent: {"status": "ok", …} as the kernel replies, or why not ("refused", "no-answer", …)."""
        slot = self._slots.setdefault(kernel_id, _Slot())
        slot.asked += 1
        slot.cells = cells
        answer = asyncio.get_running_loop().create_future()
        slot.waiting.append((slot.asked, answer))
        if slot.sending is None or slot.sending.done():
            slot.sending = self.background.spawn(self._drain(kernel_id, kernel, slot),
                                                 f"sending typed cells to kernel {kernel_id}")
        return await answer

    def in_flight(self) -> int:
        """Kernels with typed cells on their way (for tests and diagnostics)."""
        return len(self._slots)

    async def _drain(self, kernel_id: str, kernel, slot: _Slot) -> None:
        try:
            while slot.sent < slot.asked:
                number, cells = slot.asked, slot.cells
                slot.cells = None  # held no longer than needed
                try:
                    answer = await kernel_query.control(kernel, CELLS_REQUEST, CELLS_REPLY, self.timeout,
                                                        "restart the kernel", content={"cells": cells})
                except Exception as exc:  # noqa: BLE001 — every waiting request gets an answer
                    answer = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
                slot.sent = number
                for entry in [w for w in slot.waiting if w[0] <= number]:
                    slot.waiting.remove(entry)
                    if not entry[1].done():
                        entry[1].set_result(answer)
        finally:
            for _number, waiter in slot.waiting:  # cancelled (shutdown): nobody waits forever
                if not waiter.done():
                    waiter.set_result({"status": "error", "reason": "the server is shutting down"})
            slot.waiting.clear()
            if self._slots.get(kernel_id) is slot:
                del self._slots[kernel_id]
