"""The server's GPU history: the last hour of every GPU, its links and the host, so that a page
that connects (a reload, a second tab, the GPU dashboard) draws the last minutes at once.

Nothing samples for it. It keeps what the process's one sampler reads for the stream's clients
(one row per sample, at most one per FINE_STEP_S), the link counters a GPU dashboard asks for
(links.py) and the host usage rounds (usage.py). So it covers the time someone watched; time when
no page did, an outage or a server restart is a gap, sent as a row with a time and no values, and
drawn as a gap.

Bounded: per series the last FINE_ROWS rows at full resolution, then COARSE_STEP_S buckets (the
mean; memory at its maximum within the bucket) back to `seconds`, in fixed-size arrays of floats
(an hour of 8 GPUs: 630 KiB of arrays, 1.7 MiB in all with three notebooks each; measured by
benchmarks/ws_load.py, bounded by tests/test_history.py).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from array import array
from collections.abc import Iterator, Mapping, Sequence

from tornado import web


FINE_STEP_S = 1.0  # at most one GPU row per second, whatever rate the clients ask
FINE_ROWS = 600  # rows at full resolution: ten minutes at 1 Hz (longer at a slower rate)
COARSE_STEP_S = 10.0  # beyond those, one row per ten seconds
GAP_MIN_S = 3.0  # two rows further apart than this (and than 2.5 sampling intervals) have a gap between
MAX_KERNELS_PER_ROW = 12  # the largest holders of a GPU kept per row; the rest count as other processes
MAX_SERIES = 64  # GPUs (and their links) remembered at most; the stalest go first
NAN = float("nan")
_SECONDS = re.compile(r"[0-9]*\.?[0-9]+", re.ASCII)

GPU_FIELDS = ("utilization", "memory_used", "memory_total", "temperature", "power_w")
LINK_FIELDS = ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")
HOST_FIELDS = ("cpu_percent", "memory_used", "memory_total")
PEAKS = ("memory_used", "memory_total")  # a coarse bucket keeps their maximum, not their mean


def gap_after(interval: float | None) -> float:
    """Seconds between two rows beyond which no sample is known between them."""
    return max(GAP_MIN_S, 2.5 * (interval or FINE_STEP_S))


class _Ring:
    """A fixed number of rows of floats (NaN: no value), one array per column, and one object
    per row beside them (the per-kernel memory of a GPU row)."""

    def __init__(self, width: int, capacity: int):
        self.capacity = capacity
        self.columns = [array("d", bytes(8 * capacity)) for _ in range(width)]
        self.objects: list = [None] * capacity
        self.start = self.size = 0

    def push(self, row: Sequence[float], obj=None) -> tuple[tuple[float, ...], object] | None:
        """Append a row; the oldest one, when the ring was full (it is dropped here)."""
        evicted = None
        if self.size == self.capacity:
            evicted = self.row(0)
            self.start = (self.start + 1) % self.capacity
            self.size -= 1
        i = (self.start + self.size) % self.capacity
        for column, value in zip(self.columns, row):
            column[i] = value
        self.objects[i] = obj
        self.size += 1
        return evicted

    def row(self, n: int) -> tuple[tuple[float, ...], object]:
        i = (self.start + n) % self.capacity
        return tuple(c[i] for c in self.columns), self.objects[i]

    def __iter__(self) -> Iterator[tuple[tuple[float, ...], object]]:
        return (self.row(n) for n in range(self.size))

    def last_t(self) -> float | None:
        return self.columns[0][(self.start + self.size - 1) % self.capacity] if self.size else None

    @property
    def nbytes(self) -> int:
        return sum(c.itemsize * len(c) for c in self.columns) + 8 * self.capacity


class _Bucket:
    """Rows folded into one coarse row: the mean of each value (the maximum for PEAKS), the
    largest memory each kernel held; a bucket of gap rows only is a gap."""

    def __init__(self, index: int, width: int, peaks: Sequence[int]):
        self.index, self.peaks = index, set(peaks)
        self.sums = [0.0] * width
        self.counts = [0] * width
        self.t_sum, self.t_rows = 0.0, 0  # over the rows that hold a value
        self.kernels: dict[str, float] = {}

    def add(self, row: Sequence[float], kernels) -> None:
        held = False
        for i in range(1, len(row)):
            value = row[i]
            if math.isnan(value):
                continue
            held = True
            if i in self.peaks:
                self.sums[i] = value if self.counts[i] == 0 else max(self.sums[i], value)
            else:
                self.sums[i] += value
            self.counts[i] += 1
        if held:
            self.t_sum += row[0]
            self.t_rows += 1
        for kernel, used in kernels or ():
            self.kernels[kernel] = max(self.kernels.get(kernel, 0.0), used)

    def row(self, step: float) -> tuple[tuple[float, ...], tuple]:
        t = self.t_sum / self.t_rows if self.t_rows else self.index * step
        values = [NAN if n == 0 else total if i in self.peaks else total / n
                  for i, (total, n) in enumerate(zip(self.sums, self.counts)) if i > 0]
        return (t, *values), tuple(sorted(self.kernels.items(), key=lambda kv: -kv[1]))


class Series:
    """One quantity over time (a GPU, its links, the host): FINE_ROWS rows as they came, then
    coarse buckets back to `seconds`."""

    def __init__(self, fields: Sequence[str], seconds: float, fine_rows: int = FINE_ROWS,
                 min_spacing: float = FINE_STEP_S, coarse_step: float = COARSE_STEP_S):
        self.fields = ("t", *fields)
        self.seconds, self.min_spacing, self.coarse_step = seconds, min_spacing, coarse_step
        width = len(self.fields)
        self.fine = _Ring(width, max(2, fine_rows))
        # every bucket of the hour, and room for the gap rows between them
        self.coarse = _Ring(width, max(2, int(seconds / coarse_step) + 1) * 2)
        self._peaks = [i for i, f in enumerate(self.fields) if f in PEAKS]
        self._bucket: _Bucket | None = None
        self._last_bucket: int | None = None
        self._kernels: tuple | None = None  # the last row's
        self._coarse_kernels: tuple | None = None  # the last coarse row's

    def add(self, t: float, values: Mapping[str, float | None], kernels=None, interval: float | None = None) -> bool:
        """A row at time `t` (seconds since the epoch); False when it comes too soon after the
        last one (another client's faster rate) or before it."""
        last = self._last_t()
        if last is not None:
            if t - last < 0.95 * self.min_spacing:
                return False
            if t - last > gap_after(interval):
                self._push((last + min(interval or self.min_spacing, (t - last) / 2),) + (NAN,) * (len(self.fields) - 1))
        row = (t,) + tuple(_num(values.get(f)) for f in self.fields[1:])
        kernels = tuple(kernels) if kernels else None
        if kernels == self._kernels:  # memory rarely changes: rows share one tuple until it does
            kernels = self._kernels
        self._kernels = kernels
        self._push(row, kernels)
        return True

    def _last_t(self) -> float | None:
        last = self.fine.last_t()
        if last is None and self._bucket is not None:
            return self._bucket.row(self.coarse_step)[0][0]
        return last if last is not None else self.coarse.last_t()

    def _push(self, row, kernels=None) -> None:
        evicted = self.fine.push(row, kernels)
        if evicted is not None:
            self._fold(*evicted)

    def _fold(self, row: tuple[float, ...], kernels) -> None:
        index = int(row[0] // self.coarse_step)
        if self._bucket is not None and index != self._bucket.index:
            self._flush()
        if self._bucket is None:
            self._bucket = _Bucket(index, len(self.fields), self._peaks)
        self._bucket.add(row, kernels)

    def _flush(self) -> None:
        bucket, self._bucket = self._bucket, None
        if self._last_bucket is not None and bucket.index > self._last_bucket + 1:  # nobody sampled then
            self.coarse.push(((self._last_bucket + 1) * self.coarse_step,) + (NAN,) * (len(self.fields) - 1))
        row, kernels = bucket.row(self.coarse_step)
        kernels = kernels or None
        if kernels == self._coarse_kernels:
            kernels = self._coarse_kernels
        self._coarse_kernels = kernels
        self.coarse.push(row, kernels)
        self._last_bucket = bucket.index

    def rows(self, since: float) -> list[tuple[tuple[float, ...], object]]:
        """Every row from `since` on, oldest first: coarse buckets, the one being filled, then
        the rows at full resolution."""
        out = [r for r in self.coarse if r[0][0] >= since]
        if self._bucket is not None:
            row = self._bucket.row(self.coarse_step)
            if row[0][0] >= since:
                out.append(row)
        out.extend(r for r in self.fine if r[0][0] >= since)
        return out

    def columns(self, since: float) -> dict:
        """The rows from `since` as JSON columns: "t" and one list per field (null: no value),
        and for GPU rows "kernels": {kernel id: [bytes or null per row]}."""
        columns: list[list[float]] = [[] for _ in self.fields]
        objects: list = []
        partial = self._bucket.row(self.coarse_step) if self._bucket is not None else None
        for ring, extra in ((self.coarse, partial), (self.fine, None)):
            t = ring.columns[0]
            indices = [i for i in _ring_indices(ring) if t[i] >= since]
            for out, column in zip(columns, ring.columns):
                out.extend(column[i] for i in indices)
            objects.extend(ring.objects[i] for i in indices)
            if extra is not None and extra[0][0] >= since:
                for out, value in zip(columns, extra[0]):
                    out.append(value)
                objects.append(extra[1])
        out = {f: _json_column(values, f) for f, values in zip(self.fields, columns)}
        if any(objects):
            kernels: dict[str, list] = {}
            for n, obj in enumerate(objects):
                for kernel, used in obj or ():
                    kernels.setdefault(kernel, [None] * len(objects))[n] = int(used)
            out["kernels"] = kernels
        return out

    def newest(self) -> float | None:
        return self._last_t()

    @property
    def nbytes(self) -> int:
        return self.fine.nbytes + self.coarse.nbytes


def _num(value) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        else NAN


def _ring_indices(ring: _Ring) -> range | list[int]:
    end = ring.start + ring.size
    if end <= ring.capacity:
        return range(ring.start, end)
    return [*range(ring.start, ring.capacity), *range(0, end - ring.capacity)]


_WHOLE = {"memory_used", "memory_total", "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"}


def _json_column(values: list[float], field: str) -> list:
    """NaN as null; times to the millisecond, bytes whole, the rest to one decimal."""
    if field == "t":
        return [round(v, 3) for v in values]
    if field in _WHOLE:
        return [None if v != v else int(v) for v in values]
    return [None if v != v else round(v, 1) for v in values]


def kernel_label(kernel: Mapping) -> str:
    """What the charts call a kernel: its notebooks' file names, else "python3 kernel 1a2b3c4d"."""
    paths = [p for p in kernel.get("paths") or () if isinstance(p, str)]
    if paths:
        return ", ".join(os.path.basename(p) for p in paths)
    return f"{kernel.get('name') or 'kernel'} kernel {str(kernel.get('id', ''))[:8]}"


class GpuHistory:
    """Every GPU's series (keyed by UUID), their links', the host's, and the names of the kernels
    that held memory in them."""

    def __init__(self, seconds: float = 3600.0, clock=time.time):
        self.seconds, self.clock = float(seconds), clock
        self.gpus: dict[str, Series] = {}
        self.links: dict[str, Series] = {}
        self.host = Series(HOST_FIELDS, self.seconds, min_spacing=FINE_STEP_S)
        self.labels: dict[str, str] = {}
        self._seen: dict[str, float] = {}  # kernel id -> when a row last named it
        self.version = 0  # changes with every row added: what the cached messages are keyed on
        self._messages: dict[int, tuple[int, str]] = {}

    # -- what comes in ------------------------------------------------------------------------
    def add_snapshot(self, snap: Mapping, interval: float | None = None) -> bool:
        """One row per GPU of a /devices snapshot (the sampler's sample, as the stream sends it)."""
        t = snap.get("time")
        if not isinstance(t, int | float) or not snap.get("gpu"):
            return False
        added = False
        for device in snap.get("devices") or ():
            uuid = device.get("uuid") or f"cuda:{device.get('ordinal')}"
            series = self.gpus.get(uuid)
            if series is None:
                series = self.gpus[uuid] = Series(GPU_FIELDS, self.seconds)
                _forget_stalest(self.gpus)
            added |= series.add(t, device, self._kernels(device), interval)
        if added:
            self.version += 1
        return added

    def _kernels(self, device: Mapping) -> tuple[tuple[str, float], ...]:
        held: dict[str, float] = {}
        for proc in device.get("processes") or ():
            kernel = proc.get("kernel")
            used = proc.get("used_memory")
            if isinstance(kernel, dict) and kernel.get("id") and isinstance(used, int | float):
                held[kernel["id"]] = held.get(kernel["id"], 0.0) + used
                self.labels[kernel["id"]] = kernel_label(kernel)
                self._seen[kernel["id"]] = self.clock()
        return tuple(sorted(held.items(), key=lambda kv: -kv[1])[:MAX_KERNELS_PER_ROW])

    def add_links(self, t: float, rates: Mapping[str, Mapping[str, float | None]], interval: float) -> None:
        """Link throughput per GPU UUID, bytes/s (links.py, while a dashboard is open)."""
        for uuid, values in rates.items():
            series = self.links.get(uuid)
            if series is None:
                series = self.links[uuid] = Series(LINK_FIELDS, self.seconds, min_spacing=interval * 0.5)
                _forget_stalest(self.links)
            if series.add(t, values, interval=interval):
                self.version += 1

    def add_host(self, t: float, values: Mapping[str, float | None], interval: float) -> None:
        if self.host.add(t, values, interval=interval):
            self.version += 1

    # -- what goes out ------------------------------------------------------------------------
    def window(self, seconds: float) -> dict:
        """The last `seconds` (at most the history's length) of everything, as JSON."""
        seconds = max(0.0, min(float(seconds), self.seconds))
        now = self.clock()
        since = now - seconds
        gpus = {uuid: s.columns(since) for uuid, s in self.gpus.items()}
        links = {uuid: s.columns(since) for uuid, s in self.links.items()}
        gpus = {k: v for k, v in gpus.items() if v["t"]}
        links = {k: v for k, v in links.items() if v["t"]}
        held = {k for g in gpus.values() for k in g.get("kernels", {})}
        for gone in [k for k, t in self._seen.items() if t < now - self.seconds]:  # out of every row
            del self._seen[gone]
            self.labels.pop(gone, None)
        return {"type": "history", "time": now, "seconds": seconds, "keeps": self.seconds,
                "fine_step": FINE_STEP_S, "coarse_step": COARSE_STEP_S, "gpus": gpus, "links": links,
                "host": self.host.columns(since), "labels": {k: self.labels[k] for k in held if k in self.labels}}

    def message(self, seconds: float) -> str:
        """`window(seconds)` serialised, once per change whatever the number of clients asking."""
        key = int(max(0.0, min(float(seconds), self.seconds)))
        cached = self._messages.get(key)
        if cached is None or cached[0] != self.version:
            cached = (self.version, json.dumps(self.window(key), separators=(",", ":")))
            self._messages[key] = cached
            if len(self._messages) > 16:  # clients asking many different spans: keep the latest
                self._messages = {key: cached}
        return cached[1]

    @property
    def nbytes(self) -> int:
        """The arrays' size: what the history holds, whatever it holds (it is preallocated)."""
        return sum(s.nbytes for s in (*self.gpus.values(), *self.links.values(), self.host))


def _forget_stalest(series: dict[str, Series]) -> None:
    """Past MAX_SERIES, the series sampled longest ago go (the one just made, which has no row yet
    and is what is being sampled now, is never one of them: MIG instances made again get new UUIDs)."""
    newest = next(reversed(series))
    while len(series) > MAX_SERIES:
        stalest = min((k for k in series if k != newest), key=lambda k: series[k].newest() or 0.0)
        del series[stalest]


# -- the routes -----------------------------------------------------------------------------------
def asked_seconds(raw: str | None, keeps: float, name: str = "history") -> float:
    """The history a client asked for (`?history=<seconds>`), within what the server keeps;
    HTTP 400 with what to do for anything that is not a number."""
    if raw is None or raw == "":
        return 0.0
    value = float(raw) if _SECONDS.fullmatch(raw.strip()) else NAN  # ASCII digits only: never 1_0 or ٣
    if not math.isfinite(value) or value < 0:
        raise web.HTTPError(400, "%s=%r is not a number of seconds: ask for one between 0 and %g", name, raw, keeps)
    return min(value, keeps)


# -- what the stream and the API use ----------------------------------------------------------------
class StreamHistory:
    """What the stream's clients get from the history: its first message, the dashboard's link
    readings while they ask for them, and the snapshot fields of links.py and usage.py."""

    def __init__(self, history: GpuHistory, links, usage):
        self.history, self.links, self.usage = history, links, usage

    @property
    def seconds(self) -> float:
        return self.history.seconds

    def asked(self, handler) -> dict:
        """For the hello: the history this client will get (400 for a bad ?history=)."""
        return {"seconds": asked_seconds(handler.get_argument("history", None), self.history.seconds),
                "keeps": self.history.seconds}

    def connect(self, handler) -> None:
        """Right after the hello: the asked span of history, and link readings if asked for."""
        seconds = handler.hello.get("history", {}).get("seconds", 0.0)
        if seconds > 0:
            handler.write_message(self.history.message(seconds))
        if handler.get_argument("throughput", "") not in ("", "0", "false"):
            self.links.want(handler)

    def message(self, seconds: float) -> str:
        return self.history.message(seconds)

    def annotate(self, snap: dict, sample, sampler) -> None:
        """Link and host figures into a snapshot; the sampler's own samples also become a row."""
        self.links.annotate(snap)
        self.usage.annotate(snap)
        if sample is sampler.latest:  # the sampler's own sample: one row per GPU
            self.history.add_snapshot(snap, sampler.interval)

    def start(self) -> None:
        self.links.start()
        self.usage.start()

    def stop(self) -> None:
        self.links.stop()
        self.usage.stop()
