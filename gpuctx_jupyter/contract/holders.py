"""The holders file: which notebooks hold which GPU memory, as the server last saw them.

The server writes, in its Jupyter runtime dir, one JSON file naming its kernels and the PIDs NVML
may list them under, so that a kernel that runs out of memory can name the notebooks holding the
GPU without asking the server anything. Every kernel the server starts gets the file's path in
HOLDERS; the kernel reads it only when an out-of-memory error happens. Also here: the release
request, which gives cached GPU memory back without losing work, and how a suspended notebook is
named everywhere (`suspended_text`). Standard library only.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

# Format (version 1):
#   {"version": 1, "server_pid": 123, "time": <epoch s of the write>,
#    "release_url": "/<base_url>/gpuctx/api/kernels/{id}/release",
#    "kernels": [{"id": "…", "name": "python3", "paths": ["a.ipynb"], "pids": [4242, 17],
#                 "execution_state": "idle", "last_activity": <epoch s>, "idle_s": <at "time">,
#                 "standby": false,
#                 "memory": [{"framework": "torch", "ordinal": 0, "allocated": …, "reserved": …,
#                             "peak": …}],  # the kernel's last reported allocator figures
#                 "memory_time": <epoch s of that report, or null>,
#                 "suspended": null or {"since": <epoch s>, "moved": {"<ordinal>": bytes},
#                                       "moved_total": bytes}}, …],
#    "suspend_url": "/<base_url>/gpuctx/api/kernels/{id}/suspend" (or "" where suspend is not offered)}
# Standbys of the warm pool are entries with "standby": true, an id of "standby-<pid>" and no paths.
def standby_holder_id(pid: int) -> str:
    """A warm-pool standby's id in the holders file and the server's holder tables."""
    return f"standby-{pid}"


HOLDERS = "GPUCTX_HOLDERS"
HOLDERS_PREFIX = "gpuctx-holders-"  # + "<server pid>.json"
HOLDERS_VERSION = 1
MAX_HOLDERS_BYTES = 4 * 2**20


def suspended_text(moved_total: int | float, since: float | None) -> str:
    """How a suspended notebook is named everywhere: "suspended: 60.0 GiB in host memory since 14:02"."""
    when = f" since {time.strftime('%H:%M', time.localtime(since))}" if since else ""
    return f"suspended: {moved_total / 2**30:.1f} GiB in host memory{when}"


@dataclass(frozen=True)
class Holder:
    """One kernel (or warm-pool standby) of the server, as the holders file lists it."""

    id: str
    name: str = ""
    paths: tuple[str, ...] = ()
    pids: frozenset[int] = frozenset()
    execution_state: str | None = None
    last_activity: float | None = None  # epoch seconds
    idle_s: float | None = None  # at the file's time
    standby: bool = False
    memory: tuple[dict, ...] = ()  # allocator figures as the kernel last reported them
    memory_time: float | None = None
    suspended: dict | None = None  # {"since", "moved": {"<ordinal>": bytes}, "moved_total"} while suspended

    def idle_at(self, now: float, written: float) -> float | None:
        """Seconds without user activity at `now` (None when unknown; 0 while busy)."""
        if self.execution_state == "busy":
            return 0.0
        if self.last_activity is not None:
            return max(0.0, now - self.last_activity)
        return None if self.idle_s is None else self.idle_s + max(0.0, now - written)

    def label(self) -> str:
        """How a person knows it: the notebook, else what it is."""
        if self.standby:
            return "a warm-pool standby kernel"
        return ", ".join(os.path.basename(p) or p for p in self.paths) or f"kernel {self.id[:8]}"

    def cached(self, ordinal: int) -> int | None:
        """Reserved but unallocated bytes on `ordinal` at the last report (None: no report)."""
        rows = [m for m in self.memory if m.get("ordinal") == ordinal]
        if not rows:
            return None
        return sum(max(0, int(m.get("reserved") or 0) - int(m.get("allocated") or 0)) for m in rows)

    def as_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "paths": list(self.paths), "pids": sorted(self.pids),
                "execution_state": self.execution_state, "last_activity": self.last_activity,
                "idle_s": self.idle_s, "standby": self.standby, "memory": [dict(m) for m in self.memory],
                "memory_time": self.memory_time, "suspended": self.suspended}

    def suspended_from(self, ordinal: int) -> int:
        """Bytes of cuda:`ordinal` this kernel keeps in host memory while suspended (0 if none)."""
        moved = (self.suspended or {}).get("moved")
        value = moved.get(str(ordinal)) if isinstance(moved, dict) else None
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class HoldersFile:
    server_pid: int | None
    time: float
    kernels: tuple[Holder, ...]
    release_url: str = ""  # the release route with "{id}" for the kernel id, e.g. /gpuctx/api/kernels/{id}/release
    suspend_url: str = ""  # the suspend route likewise; "" where this server cannot suspend kernels

    def to_json(self) -> str:
        return json.dumps({"version": HOLDERS_VERSION, "server_pid": self.server_pid, "time": self.time,
                           "release_url": self.release_url, "suspend_url": self.suspend_url,
                           "kernels": [k.as_dict() for k in self.kernels]}, separators=(",", ":"))

    def by_pid(self) -> dict[int, Holder]:
        table: dict[int, Holder] = {}
        for k in self.kernels:
            for pid in k.pids:
                table.setdefault(pid, k)
        return table


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _holder(raw) -> Holder | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        return None
    paths = raw.get("paths") if isinstance(raw.get("paths"), list) else []
    pids = raw.get("pids") if isinstance(raw.get("pids"), list) else []
    memory = raw.get("memory") if isinstance(raw.get("memory"), list) else []
    state = raw.get("execution_state")
    suspended = raw.get("suspended")
    return Holder(
        id=raw["id"], name=raw["name"] if isinstance(raw.get("name"), str) else "",
        paths=tuple(p for p in paths if isinstance(p, str)),
        pids=frozenset(p for p in pids if isinstance(p, int) and not isinstance(p, bool) and p > 0),
        execution_state=state if isinstance(state, str) else None,
        last_activity=_num(raw.get("last_activity")), idle_s=_num(raw.get("idle_s")),
        standby=raw.get("standby") is True,
        memory=tuple(m for m in memory if isinstance(m, dict) and isinstance(m.get("ordinal"), int)),
        memory_time=_num(raw.get("memory_time")),
        suspended=suspended if isinstance(suspended, dict) else None,
    )


def parse_holders(text: str | bytes | None) -> HoldersFile | None:
    """The holders file's content, or None when it is not one; entries that are junk are skipped."""
    try:
        raw = json.loads(text) if text else None
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("version") != HOLDERS_VERSION:
        return None
    kernels = raw.get("kernels") if isinstance(raw.get("kernels"), list) else []
    pid, url, suspend_url = raw.get("server_pid"), raw.get("release_url"), raw.get("suspend_url")
    return HoldersFile(server_pid=pid if isinstance(pid, int) else None, time=_num(raw.get("time")) or 0.0,
                       kernels=tuple(h for h in map(_holder, kernels) if h is not None),
                       release_url=url if isinstance(url, str) else "",
                       suspend_url=suspend_url if isinstance(suspend_url, str) else "")


def read_holders(env: Mapping[str, str] | None = None) -> tuple[HoldersFile | None, str]:
    """The holders file named by HOLDERS in `env`, or None and why not (a sentence)."""
    env = os.environ if env is None else env
    path = env.get(HOLDERS, "")
    if not path:
        return None, f"this kernel was not started by a gpuctx server ({HOLDERS} unset)"
    try:
        if os.path.getsize(path) > MAX_HOLDERS_BYTES:
            return None, f"the holders file {path} is too large"
        with open(path, "rb") as fh:
            text = fh.read()
    except OSError as exc:
        return None, f"cannot read the holders file {path}: {exc.strerror or exc}"
    parsed = parse_holders(text)
    return (parsed, "") if parsed else (None, f"the holders file {path} is not one gpuctx wrote")
