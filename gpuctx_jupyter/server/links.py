"""PCIe and NVLink throughput for the GPU dashboard, read only while one is open.

NVML's PCIe query blocks ~20 ms per GPU and direction (core/nvml.py, `read_link_counters`), far
too slow for the sampler's loop: it is read here every INTERVAL_S seconds in an executor, off the
event loop, and only while some stream client asked for it (`?throughput=1`: the dashboard's page).
NVLink is a counter of data moved; its rate is the change between two reads.
"""
from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Mapping

from ..core import nvml

INTERVAL_S = 5.0


def rates(previous: Mapping[str, nvml.LinkCounters], current: list[nvml.LinkCounters]) -> dict[str, dict]:
    """Bytes/s per GPU UUID: PCIe as NVML gives it, NVLink from the counters' change since the
    previous read (None on the first read, or when a counter went back: a reset)."""
    out = {}
    for c in current:
        before = previous.get(c.uuid)
        nvl = {"nvlink_tx": None, "nvlink_rx": None}
        if before is not None and c.t > before.t:
            for name in nvl:
                now, then = getattr(c, name), getattr(before, name)
                if now is not None and then is not None and now >= then:
                    nvl[name] = (now - then) / (c.t - before.t)
        out[c.uuid] = {"pcie_tx": c.pcie_tx, "pcie_rx": c.pcie_rx, **nvl, "nvlink_links": c.nvlink_links}
    return out


class LinkReader:
    """Reads the link counters every `interval` s while a client wants them; `annotate` puts the
    latest rates into the snapshot, and each reading goes into the history."""

    def __init__(self, history, read: Callable[[], list[nvml.LinkCounters]] | None = None,
                 interval: float = INTERVAL_S, replay: bool = False, log=None, clock=time.time):
        self.history, self.interval, self.log, self.clock = history, interval, log, clock
        self._read = read or (lambda: nvml.read_link_counters())
        self.replay = replay
        self._clients: weakref.WeakSet = weakref.WeakSet()
        self._previous: dict[str, nvml.LinkCounters] = {}
        self.latest: dict[str, dict] = {}
        self.latest_t: float | None = None
        self.reason: str | None = None  # why there are no figures, in a sentence
        self.reads = 0
        self._running = False
        self._timer = None

    def want(self, handler) -> None:
        """A stream client that shows throughput: read until its socket closes."""
        self._clients.add(handler)
        if self._timer is not None and not self._running:
            asyncio.ensure_future(self.round())  # the first reading now, not an interval later

    @property
    def wanted(self) -> bool:
        for handler in list(self._clients):
            connection = getattr(handler, "ws_connection", None)
            if connection is None or connection.is_closing():
                self._clients.discard(handler)
        return bool(self._clients)

    async def round(self) -> None:
        if self._running:
            return
        if not self.wanted:
            self._previous.clear()  # rates start afresh when a dashboard opens again
            self.latest, self.latest_t = {}, None
            return
        if self.replay:
            self.reason = "a replayed trace holds no PCIe or NVLink figures"
            return
        self._running = True
        try:
            counters = await asyncio.get_running_loop().run_in_executor(None, self._read)
        except nvml.NvmlUnavailable as exc:
            self.reason = f"NVML reports: {exc}"
            return
        except Exception as exc:  # a driver reload: say why, try again next round
            self.reason = f"reading the links failed: {type(exc).__name__}: {exc}"
            return
        finally:
            self._running = False
        self.reads += 1
        self.reason = None if counters else "NVML lists no GPU"
        now = self.clock()
        self.latest = rates(self._previous, counters)
        self.latest_t = now
        self._previous = {c.uuid: c for c in counters}
        self.history.add_links(now, {u: {k: v for k, v in r.items() if k != "nvlink_links"}
                                     for u, r in self.latest.items()}, self.interval)

    def annotate(self, snap: dict) -> None:
        """While a dashboard is open: each GPU's latest rates and when they were read (`links`),
        and `links_status` (the reading interval, and why there are no figures)."""
        if not self._clients:
            return
        fresh = self.latest_t is not None and self.clock() - self.latest_t <= 3 * self.interval
        for device in snap.get("devices", ()):
            figures = self.latest.get(device.get("uuid")) if fresh else None
            if figures is not None:
                device["links"] = {**figures, "time": self.latest_t}
        snap["links_status"] = {"interval": self.interval, "reason": self.reason}

    def start(self) -> None:
        from tornado.ioloop import PeriodicCallback

        self._timer = PeriodicCallback(self.round, self.interval * 1000)
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
