"""What this process can see: NVML's GPUs numbered by CUDA ordinal, and why nothing, if nothing.

Before CUDA starts, ordinals are predicted from `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`.
Once torch has started CUDA, its device UUIDs are the truth; a disagreement means the
environment changed after start-up, which CUDA silently ignores, so we say so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import frameworks as fws
from . import nvml
from .devices import GpuRecord, Visibility, VisibleDevice, resolve_visibility
from .procs import descendants, ns_pids


@dataclass
class Inventory:
    records: list[GpuRecord] = field(default_factory=list)  # every GPU NVML reports
    visibility: Visibility | None = None
    nvml_error: str | None = None
    notes: list[str] = field(default_factory=list)
    exact: bool = False  # ordinals read from a started framework rather than predicted

    @property
    def devices(self) -> tuple[VisibleDevice, ...]:
        return self.visibility.devices if self.visibility else ()

    def by_ordinal(self, ordinal: int) -> VisibleDevice | None:
        return next((d for d in self.devices if d.ordinal == ordinal), None)

    def no_gpu_reason(self) -> str | None:
        """One line saying why no GPU is visible here, or None when one is."""
        if self.devices:
            return None
        if self.nvml_error:
            why = f"NVML reports: {self.nvml_error}"
        elif not self.records:
            why = "NVML lists no NVIDIA GPU on this machine"
        else:
            why = (self.visibility.empty_reason if self.visibility else None) or "no GPU passes CUDA_VISIBLE_DEVICES"
        torch_why = fws.TORCH.gpu_reason() if fws.TORCH.loaded() else None
        if torch_why and "CPU-only" in torch_why:
            why += f"; also, {torch_why}"
        return why


def take(env=None) -> Inventory:
    """One NVML read (a few µs per field); never starts CUDA."""
    env = os.environ if env is None else env
    inv = Inventory()
    try:
        inv.records = nvml.read_records()
    except nvml.NvmlUnavailable as exc:
        inv.nvml_error = str(exc)
        return inv
    inv.visibility = resolve_visibility(inv.records, env)
    inv.notes.extend(inv.visibility.notes)
    truth = fws.TORCH.uuids() if fws.TORCH.loaded() else None
    if truth:
        _adopt_truth(inv, truth)
    return inv


def _adopt_truth(inv: Inventory, uuids: list[str]) -> None:
    by_uuid = {r.uuid.upper(): r for r in inv.records}
    devices = []
    for ordinal, uuid in enumerate(uuids):
        record = by_uuid.get(uuid.upper())
        if record is None:
            inv.notes.append(f"torch's cuda:{ordinal} ({uuid}) is not among NVML's devices")
            continue
        devices.append(VisibleDevice(ordinal, record))
    predicted = [d.record.uuid.upper() for d in inv.visibility.devices]
    if predicted != [d.record.uuid.upper() for d in devices]:
        cvd = inv.visibility.cuda_visible_devices
        shown = "(unset)" if cvd is None else repr(cvd)
        inv.notes.append(
            f"CUDA started with a different set of GPUs than CUDA_VISIBLE_DEVICES={shown} now gives: changing it after CUDA starts has "
            "no effect; use `%gpu use N` to switch, or set it before the kernel starts and restart"
        )
    inv.visibility = Visibility(
        devices=tuple(devices),
        cuda_visible_devices=inv.visibility.cuda_visible_devices,
        device_order=inv.visibility.device_order,
        notes=inv.visibility.notes,
    )
    inv.exact = True


def own_pids() -> set[int]:
    """This process's PIDs as NVML may report them: our own, plus the outer ones from NSpid
    where /proc shows them (NVML lists host PIDs; inside a PID namespace ours differ) — and those
    of every process it started (`%gpu workers`, DataLoader workers): their GPU memory is this
    kernel's, as the server counts a kernel's descendants."""
    pids = {os.getpid()}
    pids.update(ns_pids("self"))
    for child in descendants(os.getpid()):
        pids.add(child)
        pids.update(ns_pids(child))
    return pids


class OwnPids:
    """Which NVML PIDs are this process, also inside a container, where NVML lists host PIDs
    that /proc does not show. Three rules, in order:
    1. our PID, an outer PID that /proc/self/status NSpid lists, or a process we started (and
       its aliases), read on every update;
    2. learnt: when torch's reserved memory on a GPU changes by Δ between two reads and exactly
       one unmatched NVML process on that GPU changed by the same Δ, that process is us;
    3. alone: torch holds memory on a GPU and NVML lists exactly one process there.
    """

    def __init__(self):
        self.learnt: set[int] = set()
        self._last: dict[str, tuple[int, dict[int, int]]] = {}  # uuid -> (our reserved, nvml used by pid)

    @property
    def pids(self) -> set[int]:
        """Rule 1, read now: the processes this kernel starts come and go."""
        return own_pids()

    def update(self, inv: Inventory) -> set[int]:
        own = self.pids
        known = own | self.learnt
        reserved = _torch_reserved()
        for d in inv.devices:
            procs = {p.pid: p.used_memory or 0 for p in d.record.processes}
            if known & procs.keys() or d.ordinal not in reserved:
                self._last[d.record.uuid] = (reserved.get(d.ordinal, 0), procs)
                continue
            mine = reserved[d.ordinal]
            last = self._last.get(d.record.uuid)
            if last is not None and mine != last[0]:
                delta = mine - last[0]
                moved = [pid for pid, used in procs.items() if pid in last[1] and used - last[1][pid] == delta]
                if len(moved) == 1:
                    self.learnt.add(moved[0])
            if len(procs) == 1 and mine > 0:
                self.learnt.add(next(iter(procs)))
            self._last[d.record.uuid] = (mine, procs)
        return own | self.learnt


def _torch_reserved() -> dict[int, int]:
    torch = fws.TORCH
    if not (torch.loaded() and torch.initialized()):
        return {}
    return {i: torch.mod.cuda.memory_reserved(i) for i in range(torch.device_count())}


_own = OwnPids()


def process_memory(inv: Inventory, pids: set[int] | None = None) -> dict[int, int]:
    """GPU memory NVML attributes to this process, by CUDA ordinal."""
    pids = _own.update(inv) if pids is None else pids
    out = {}
    for d in inv.devices:
        used = [p.used_memory or 0 for p in d.record.processes if p.pid in pids]
        if used:
            out[d.ordinal] = sum(used)
    return out
