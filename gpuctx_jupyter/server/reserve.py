"""What the warm pool may keep: the automatic reserve's choice of kernelspecs and notebooks, and
the memory floors every pool keeps.

The automatic reserve keeps RESERVE standby for each kernelspec that a running GPU notebook uses
(a kernel gpuctx warms, whose notebook uses a GPU framework, running for `pool_reserve_after` s),
warmed for the notebook used last on its device. Whatever the mode, no standby starts where it
would leave the host below HOST_FLOOR of its memory available, and no gpu standby where it would
leave a GPU below `pool_min_free_fraction` free (an imports standby holds no GPU memory); the GPUs
are read from the holders round (holders.py), never by a sampler of our own.
Which kernels are GPU notebooks' comes from what the launcher gave them and from their notebooks,
read by the one notebook reader off the event loop.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..contract import WarmSettings
from ..contract.holders import standby_holder_id
from ..core import host_memory
from . import kernel_client

RESERVE = 1  # standbys the automatic reserve keeps per kernelspec in use
HOST_FLOOR = 0.10  # no standby while the host has less than this fraction of its memory available
WARMED_KERNEL_MIB = 630  # GPU memory a kernel warmed with the basic recipe holds (H200, torch 2.11)
STANDBY_MARGIN_MIB = 1024  # what the floor check counts a new standby at (training plans hold up to ~850)


@dataclass
class GpuNotebook:
    """A running notebook that keeps its kernelspec's reserve: the standby is warmed for it."""

    kernel_id: str
    path: str | None
    device: str  # the server-assigned device of its kernel ("" when none)
    activity: object  # its last activity (the newest is the one most likely to restart)


def host_memory_available() -> float | None:
    """The fraction of the host's memory available now (the container's limit where one applies)."""
    mem = host_memory.available()
    return mem.fraction if mem is not None else None


class Reserve:
    def __init__(self, mkm, cfg, launcher, holders):
        self.mkm, self.cfg, self.launcher = mkm, cfg, launcher
        self.notebooks: dict[str, list[GpuNotebook]] = {}  # kernelspec -> its GPU notebooks, newest first
        self.holders = holders  # the latest GPU inventory and who holds what (holders.Holders)
        self._seen: dict[str, float] = {}  # kernel id -> when first seen running (time.monotonic())

    # -- which kernelspecs, for which notebook ------------------------------------------------------
    async def update(self, now: float) -> dict[str, list[GpuNotebook]]:
        """Per kernelspec, the running notebooks that keep a reserve: kernels gpuctx warms whose
        notebook uses a GPU (read off the event loop, again only when it changed on disk), once
        they have run pool_reserve_after s; the most recently active first."""
        out: dict[str, list[GpuNotebook]] = {}
        running = set()
        for kid in list(self.mkm.list_kernel_ids()):
            record = self.launcher.launched.get(kid)
            if record is None or not record.warmed or not await self._uses_gpu(record):
                continue
            km = kernel_client.find(self.mkm, kid)
            if km is None:
                continue
            running.add(kid)
            if now - self._seen.setdefault(kid, now) < self.cfg.pool_reserve_after:
                continue
            out.setdefault(record.kernel_name, []).append(
                GpuNotebook(kid, record.notebook, record.device, getattr(km, "last_activity", None)))
        for gone in set(self._seen) - running:
            del self._seen[gone]
        for notebooks in out.values():
            notebooks.sort(key=lambda nb: _timestamp(nb.activity), reverse=True)
        self.notebooks = out
        return out

    def waiting(self, now: float) -> bool:
        """A GPU notebook runs, but not yet for pool_reserve_after s."""
        return any(now - at < self.cfg.pool_reserve_after for at in self._seen.values())

    def for_kernelspec(self, name: str) -> GpuNotebook | None:
        """The notebook the next standby of `name` is warmed for: the one used last."""
        return (self.notebooks.get(name) or [None])[0]

    async def _uses_gpu(self, record) -> bool:
        """Whether a warmed kernel is a GPU notebook's: by its warm settings, else its notebook."""
        settings = WarmSettings.from_env(record.settings)
        if not settings.warms:
            return False
        if settings.policy != "auto":
            return True
        return (await self.launcher.notebooks.facts(record.notebook)).wants_gpu()[0]

    # -- memory ------------------------------------------------------------------------------------
    def gpus(self) -> list:
        """The GPUs as the holders round last read them (empty before it ran, or without a GPU)."""
        inv = getattr(self.holders, "inventory", None)
        return list(getattr(inv, "devices", None) or [])

    def held(self) -> dict[str, dict[int, int]]:
        """Holder id -> {CUDA ordinal: bytes NVML lists}, as the last holders round found."""
        return self.holders.latest[1]

    def held_by(self, standby_pid: int | None) -> dict[int, int]:
        """{CUDA ordinal: bytes} NVML lists for a standby process."""
        return self.held().get(standby_holder_id(standby_pid), {}) if standby_pid else {}

    def below_floor(self, ordinal: int, adding: int = 0) -> bool:
        """Whether GPU `ordinal` has (or, holding `adding` more bytes, would have) less free memory
        than pool_min_free_fraction of its total."""
        floor = self.cfg.pool_min_free_fraction
        for d in self.gpus():
            r = d.record
            if d.ordinal == ordinal and floor > 0 and r.memory_total and r.memory_free is not None:
                return r.memory_free - adding < floor * r.memory_total
        return False

    def short_host(self) -> str | None:
        """Why no standby of any kind may start now (the host's memory), or None. An imports standby
        holds no GPU memory: this is all that keeps it out."""
        host = host_memory_available()
        if host is not None and host < HOST_FLOOR:
            return f"the host has {host:.0%} of its memory available (the pool keeps at least {HOST_FLOOR:.0%})"
        return None

    def short_gpu(self) -> str | None:
        """Why no gpu standby may start now on the GPU the next one would use (its floor), or None."""
        if self.holders.inventory is None:
            return "reading the GPUs' memory first"
        for ordinal in self.next_ordinals():
            if self.below_floor(ordinal, STANDBY_MARGIN_MIB * 2**20):
                return (f"cuda:{ordinal} would have less than {self.cfg.pool_min_free_fraction:.0%} free with a "
                        f"standby (~{STANDBY_MARGIN_MIB} MiB): pool_min_free_fraction keeps it for notebooks")
        return None

    def next_ordinals(self) -> set[int]:
        """The GPUs the next standbys would warm on: for each notebook they are warmed for, its
        server-assigned device, else the GPUs its kernel holds memory on (where its own code put
        it), else CUDA's default 0."""
        held = self.held()
        out = set()
        for notebooks in self.notebooks.values():
            nb = notebooks[0]
            if nb.device.isdigit():
                out.add(int(nb.device))
            else:
                out |= set(held.get(nb.kernel_id) or {0})
        return out or {0}


def _timestamp(when) -> float:
    try:
        return when.timestamp()
    except (AttributeError, OverflowError, OSError, ValueError):
        return 0.0
