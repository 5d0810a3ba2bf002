"""What /proc says about a process: its PIDs in every PID namespace, its children, its command
name, its owner.

NVML lists GPU processes by host PID; inside a container a process knows itself by another. The
NSpid line of /proc/<pid>/status gives both, so the kernel (recognising itself) and the server
(recognising its kernels) read it through this one function.
"""
from __future__ import annotations

import glob
import os

PROC = "/proc"


def ns_pids(pid: int | str, proc: str = PROC) -> list[int]:
    """The PIDs of `pid` ("self" for this process) in every PID namespace /proc shows,
    outermost first (NSpid); empty where /proc does not show it."""
    try:
        with open(os.path.join(proc, str(pid), "status")) as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return [int(p) for p in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def process_name(pid: int, proc: str = PROC) -> str | None:
    """The command name /proc shows for a PID, or None (another namespace, or already gone)."""
    try:
        with open(os.path.join(proc, str(pid), "comm")) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def children(pid: int, proc: str = PROC) -> list[int]:
    """The direct children of `pid` (every thread's, from /proc/<pid>/task/*/children); empty
    where /proc does not show them."""
    found = []
    for path in glob.glob(os.path.join(proc, str(pid), "task", "*", "children")):
        try:
            with open(path) as fh:
                found.extend(int(p) for p in fh.read().split())
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int, proc: str = PROC) -> set[int]:
    """Every process below `pid` (children, theirs, ...), not `pid` itself."""
    seen: set[int] = set()
    todo = children(pid, proc)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(children(p, proc))
    return seen


def owner(pid: int, proc: str = PROC) -> int | None:
    """The user id a process runs as (the owner of its /proc entry), or None when it is gone."""
    try:
        return os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError:
        return None
