"""Which of this server's kernels a GPU process belongs to.

NVML lists the processes on a GPU by host PID. A kernel's GPU memory may sit in its own process
or in processes it started (DataLoader workers, multiprocessing pools), and inside a container
the PID NVML reports is not the one the server knows. So a kernel is matched by its own PID, its
descendants' PIDs, each of those PIDs' outer aliases from /proc/<pid>/status NSpid, and the PID
the kernel itself reported over its control channel. The mapping is plain data in, plain data
out; the /proc and psutil reads are small functions beside it, so tests can point them elsewhere.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..core.devices import GpuProcess
from ..core import procs
from ..core.procs import PROC, ns_pids, process_name

try:
    import psutil
except ImportError:  # psutil comes with ipykernel, but the server side must not depend on it
    psutil = None

@dataclass(frozen=True)
class KernelInfo:
    """One kernel of this server, as the GPU API names it, and every PID NVML may list it under."""

    id: str
    name: str
    execution_state: str | None
    paths: tuple[str, ...] = ()  # notebook paths of the sessions using it
    pids: frozenset[int] = frozenset()

    def as_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "execution_state": self.execution_state,
                "paths": list(self.paths)}


def child_table() -> Callable[[int], Iterable[int]]:
    """A function from a PID to its direct children's PIDs.

    With psutil, the process table is read once here and shared by every kernel of a snapshot
    (psutil's own `children()` rescans the whole table on every call); without it,
    /proc/<pid>/task/*/children is read per PID on demand.
    """
    if psutil is None:
        return proc_children
    table = _read_table()
    return lambda pid: table.get(pid, ())


def _read_table() -> dict[int, list[int]]:
    table: dict[int, list[int]] = defaultdict(list)
    for p in psutil.process_iter(["ppid"]):
        if p.info["ppid"] is not None:
            table[p.info["ppid"]].append(p.pid)
    return table


class RecentChildren:
    """child_table() for the event loop's rounds (every stream tick, the holders round): reading the
    whole process table takes ~100 ms on a host of 1,500 processes, so it is read in a thread of its
    own once it is older than `ttl` s, and the last one is used meanwhile (a kernel's own PID never
    comes from it: only its children's, seconds late at worst). The first read is made at once."""

    def __init__(self, ttl: float = 1.0):
        self.ttl = ttl
        self._lock = threading.Lock()
        self._table: dict[int, list[int]] | None = None
        self._at = 0.0
        self._reading = False

    def __call__(self) -> Callable[[int], Iterable[int]]:
        if psutil is None:
            return proc_children
        with self._lock:
            table, stale = self._table, time.monotonic() - self._at >= self.ttl
            refresh = table is not None and stale and not self._reading
            self._reading = self._reading or refresh
        if table is None:
            table = _read_table()
            self._store(table)
        elif refresh:  # (this call answers from the table it found, whenever the thread ends)
            threading.Thread(target=self._refresh, name="gpuctx-process-table", daemon=True).start()
        return lambda pid: table.get(pid, ())

    def _refresh(self) -> None:
        try:
            self._store(_read_table())
        except Exception:  # noqa: BLE001 — the last table stays; the next round tries again
            with self._lock:
                self._reading = False

    def _store(self, table: dict[int, list[int]]) -> None:
        with self._lock:
            self._table, self._at, self._reading = table, time.monotonic(), False


recent_children = RecentChildren()


def proc_children(pid: int, proc: str = PROC) -> list[int]:
    return procs.children(pid, proc)


def host_pid(pid: int, root: int, children: Callable[[int], Iterable[int]], proc: str = PROC) -> int | None:
    """`pid` as this server's PID namespace knows it, where it is `root` or one of its descendants —
    given in ours, or in the kernel's own namespace (NSpid) — else None. What a kernel says its PID
    is decides nothing on its own: the process a checkpoint helper acts on comes from here."""
    tree, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo.extend(children(p))
    if pid in tree:
        return pid
    return next((p for p in sorted(tree) if pid in ns_pids(p, proc)), None)


def kernel_pids(pid: int | None, reported: int | None, children: Callable[[int], Iterable[int]],
                proc: str = PROC) -> frozenset[int]:
    """Every PID under which NVML may list a kernel's GPU memory.

    `pid` is the kernel process as this server launched it (None for a kernel it did not launch,
    e.g. behind a gateway); `reported` is the PID the kernel gave itself, which lives in the
    kernel's own PID namespace and so is taken as it is, never looked up in our /proc.
    """
    tree: set[int] = set()
    todo = [pid] if pid else []
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo.extend(children(p))
    pids = tree | {alias for p in tree for alias in ns_pids(p, proc)}
    if reported:
        pids.add(reported)
    return frozenset(pids)


def owners(kernels: Iterable[KernelInfo]) -> dict[int, KernelInfo]:
    """PID → kernel; a PID claimed by two kernels (a recycled reported PID) goes to the first."""
    table: dict[int, KernelInfo] = {}
    for kernel in kernels:
        for pid in kernel.pids:
            table.setdefault(pid, kernel)
    return table


def describe(process: GpuProcess, by_pid: Mapping[int, KernelInfo],
             name_of: Callable[[int], str | None] = process_name) -> dict:
    """A GPU process for the API: its kernel where it is one of ours, else its name if /proc has it."""
    entry = {"pid": process.pid, "used_memory": process.used_memory, "kind": process.kind}
    kernel = by_pid.get(process.pid)
    if kernel is not None:
        entry["kernel"] = kernel.as_dict()
    else:
        name = name_of(process.pid)
        if name:
            entry["name"] = name
    return entry
