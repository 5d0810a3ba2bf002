"""How much host memory this process may still use, and what a process holds.

Inside a container (JupyterHub's single-user servers, Kubernetes) the limit is the cgroup's, not
the machine's: a server that trusted /proc/meminfo would start standbys until the container is
killed for memory. `available()` takes the smaller of the two.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"
CGROUP = "/sys/fs/cgroup"


@dataclass(frozen=True)
class HostMemory:
    available: int  # bytes this process's cgroup (or the machine) can still give
    total: int  # bytes in all, under that limit
    limit: str  # what bounds it: "machine" or "cgroup"

    @property
    def fraction(self) -> float:
        return self.available / self.total if self.total else 0.0


def _meminfo(proc: str) -> dict[str, int]:
    with open(os.path.join(proc, "meminfo")) as fh:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in fh if ":" in line)}


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            raw = fh.read().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None  # "max": no limit


def _cgroup_limit(cgroup: str) -> tuple[int, int] | None:
    """(limit, usage) of this process's memory cgroup, v2 or v1; None without a limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit, usage = _read_int(os.path.join(cgroup, limit_file)), _read_int(os.path.join(cgroup, usage_file))
        if limit is not None and usage is not None and limit < 2**60:  # v1 says "no limit" with a huge number
            return limit, usage
    return None


def available(proc: str = PROC, cgroup: str = CGROUP) -> HostMemory | None:
    """The host memory still available to this process (None when /proc cannot say)."""
    try:
        info = _meminfo(proc)
        machine = HostMemory(info["MemAvailable"], info["MemTotal"], "machine")
    except (OSError, KeyError, ValueError):
        return None
    bounded = _cgroup_limit(cgroup)
    if bounded is None:
        return machine
    limit, usage = bounded
    left = max(0, limit - usage)
    return HostMemory(left, limit, "cgroup") if left < machine.available else machine


def rss(pid: int, proc: str = PROC) -> int | None:
    """Resident memory of process `pid`, bytes (None when it is gone)."""
    try:
        with open(os.path.join(proc, str(pid), "statm")) as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
