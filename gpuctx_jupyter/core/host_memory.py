"""How much host memory a process may still use, and what a process holds.

Inside a container (JupyterHub's single-user servers, Kubernetes) the limit is the cgroup's, not
the machine's: a server that trusted /proc/meminfo would start standbys until the container is
killed for memory. `available()` takes the smallest of the machine's MemAvailable and the room
under each memory limit on the way from the process's cgroup up to the root (a container's, a
systemd slice's; v2, and v1's memory controller). A cgroup's usage counts its page cache, which
the kernel reclaims before it gives up: the inactive file pages (memory.stat) are not counted, as
`docker stats` and the kubelet do not, else a hub pod that has read a few large files looks full.
Suspending a notebook moves its GPU memory into
the kernel's own host memory: the server asks this of the kernel's process before it starts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"
CGROUP = "/sys/fs/cgroup"


@dataclass(frozen=True)
class HostMemory:
    available: int  # bytes the process's cgroup (or the machine) can still give
    total: int  # bytes in all, under that limit
    limit: str  # what bounds it: "machine" or "cgroup"

    @property
    def fraction(self) -> float:
        return self.available / self.total if self.total else 0.0

    @property
    def source(self) -> str:
        """What bounds it, in words."""
        return "its container's memory limit, cgroup" if self.limit == "cgroup" else "the machine's MemAvailable"


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


def _inactive_file(folder: str, key: str) -> int:
    """Bytes of inactive page cache in a cgroup's memory.stat (`key`), 0 when it does not say."""
    try:
        with open(os.path.join(folder, "memory.stat")) as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0


def _cgroup_folders(proc: str, cgroup: str, pid: int | str) -> list[tuple[str, str, str, str]]:
    """(folder, limit file, usage file, memory.stat's inactive page cache key) of the process's
    memory cgroup and each of its parents, v2 and v1; the root alone when /proc does not say
    (inside a cgroup namespace the root is the container's own cgroup)."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup")) as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = ["0::/", "0:memory:/"]
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        if controllers == "":  # v2
            base, files = cgroup, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1
            base, files = (os.path.join(cgroup, "memory"),
                           ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
        else:
            continue
        path = path.strip("/")
        while True:
            out.append((os.path.join(base, path) if path else base, *files))
            if not path:
                break
            path = os.path.dirname(path)
    return out


def _cgroup_limit(proc: str, cgroup: str, pid: int | str) -> tuple[int, int] | None:
    """(limit, usage) of the tightest memory limit over the process's cgroup and its parents (usage
    without the inactive page cache); None without a limit."""
    best = None
    for folder, limit_file, usage_file, inactive in _cgroup_folders(proc, cgroup, pid):
        limit, usage = _read_int(os.path.join(folder, limit_file)), _read_int(os.path.join(folder, usage_file))
        if limit is not None and usage is not None and limit < 2**60:  # v1 says "no limit" with a huge number
            usage = max(0, usage - _inactive_file(folder, inactive))
            if best is None or limit - usage < best[0] - best[1]:
                best = (limit, usage)
    return best


def available(proc: str = PROC, cgroup: str = CGROUP, pid: int | str = "self") -> HostMemory | None:
    """The host memory still available to process `pid` (this one by default); None when /proc
    cannot say."""
    try:
        info = _meminfo(proc)
        machine = HostMemory(info["MemAvailable"], info["MemTotal"], "machine")
    except (OSError, KeyError, ValueError):
        return None
    bounded = _cgroup_limit(proc, cgroup, pid)
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


def pss(pid: int, proc: str = PROC) -> int | None:
    """Proportional resident memory of process `pid`, bytes: its pages, each shared one divided
    among the processes that map it (processes forked from one parent, such as inductor's compile
    workers, would count their shared pages once each in RSS). RSS where the kernel shows no
    smaps_rollup; None when it is gone. A few ms a process: not for a fast loop."""
    try:
        with open(os.path.join(proc, str(pid), "smaps_rollup")) as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss(pid, proc)
