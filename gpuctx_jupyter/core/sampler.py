"""One NVML sampler per process, shared by every viewer (monitor widgets in a kernel, browser
clients of a server): it samples only while someone listens, at the fastest rate asked for,
keeps a bounded history, and survives NVML errors and lost GPUs.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported on the first read: every kernel makes its sampler as gpuctx loads)
    from .devices import GpuRecord
    from .inventory import Inventory

log = logging.getLogger("gpuctx")


@dataclass
class Sample:
    """One read of every GPU: what the viewers get on each tick."""

    t: float  # time.time()
    inventory: Inventory
    cost_s: float = 0.0  # CPU time the read took in the sampler thread

    @property
    def records(self) -> list[GpuRecord]:
        return self.inventory.records


@dataclass
class Point:
    t: float
    utilization: int | None
    memory_used: int | None


@dataclass
class _Listener:
    callback: object
    interval: float
    due: float = 0.0
    failed: bool = False  # its first error was logged; later ones are not


@dataclass
class History:
    """Utilisation and memory over the last `seconds`, per GPU UUID."""

    seconds: float = 60.0
    points: dict[str, deque] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        for r in sample.records:
            dq = self.points.setdefault(r.uuid, deque())
            dq.append(Point(sample.t, r.utilization, r.memory_used))
        self.trim(sample.t)

    def trim(self, now: float) -> None:
        cutoff = now - self.seconds
        for dq in self.points.values():
            while dq and dq[0].t < cutoff:
                dq.popleft()

    def of(self, uuid: str) -> list[Point]:
        return list(self.points.get(uuid, ()))


class Sampler:
    """A daemon thread that reads NVML every `interval` seconds while anyone subscribes."""

    def __init__(self, history_seconds: float = 600.0, read=None):
        self._read = read  # None: NVML and the frameworks (inventory.take)
        self._listeners: dict[int, _Listener] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.history = History(history_seconds)
        self.latest: Sample | None = None
        self.ticks = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def set_source(self, read) -> None:
        """Read from elsewhere than NVML (an explicit, labelled trace replay; None: NVML again)."""
        self._read = read

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    @property
    def interval(self) -> float | None:
        """How often it samples now: the fastest listener's interval (None while nobody listens)."""
        with self._lock:
            return min((lis.interval for lis in self._listeners.values()), default=None)

    def subscribe(self, callback, interval: float = 1.0) -> int:
        """Call `callback(sample)` about every `interval` s from the sampler thread; returns a token."""
        with self._lock:
            token = id(callback) ^ int(time.monotonic_ns())
            self._listeners[token] = _Listener(callback, max(0.05, float(interval)))
            if not self.running:
                self._thread = threading.Thread(target=self._loop, name="gpuctx-sampler", daemon=True)
                self._thread.start()
        self._wake.set()
        return token

    def unsubscribe(self, token: int) -> None:
        with self._lock:
            self._listeners.pop(token, None)
        self._wake.set()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._listeners:
                    self._thread = None
                    return
                wait = min(lis.due for lis in self._listeners.values()) - time.monotonic()
            if wait > 0.005:  # nobody is due yet (a new listener wakes us early)
                self._wake.wait(wait)
                self._wake.clear()
                continue
            t0 = time.thread_time()
            try:
                inv = self._read() if self._read is not None else _read_gpus()
            except Exception as exc:  # a driver reload or a lost GPU: show it, keep sampling
                from .inventory import Inventory

                inv = Inventory(nvml_error=f"reading the GPUs failed: {type(exc).__name__}: {exc}")
            sample = Sample(time.time(), inv)
            sample.cost_s = time.thread_time() - t0
            self.latest = sample
            self.history.add(sample)
            self.ticks += 1
            now = time.monotonic()
            with self._lock:
                # Each listener gets its own rate: due again one interval after this read.
                due = [lis for lis in self._listeners.values() if lis.due <= now + 0.005]
                for lis in due:
                    lis.due = now + lis.interval
            for lis in due:
                try:
                    lis.callback(sample)
                except Exception:  # one broken viewer must not stop the others
                    if not lis.failed:
                        lis.failed = True
                        log.warning("gpuctx: a GPU viewer failed on a sample (later failures of it are "
                                    "not logged)", exc_info=True)


def _read_gpus() -> Inventory:
    """NVML and the frameworks, imported on the first read (not as a kernel loads gpuctx)."""
    from . import inventory

    return inventory.take()


_process_sampler: Sampler | None = None
_process_lock = threading.Lock()


def process_sampler() -> Sampler:
    """The one sampler of this process."""
    global _process_sampler
    with _process_lock:
        if _process_sampler is None:
            _process_sampler = Sampler()
        return _process_sampler
