"""Host memory and CPU beside the GPU figures: each kernel's (its process and every process it
started, as jupyter-resource-usage counts a server's) and the host's as a whole.

Read with psutil every INTERVAL_S seconds while someone watches (the process's sampler runs),
in an executor: the kernels' PIDs are looked up on the event loop, the process tree is walked
off it. CPU is the share of one core since the previous round (psutil keeps the process objects
between rounds for that), so 250 % is two and a half cores busy.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from .kernel_client import kernel_pid

try:
    import psutil
except ImportError:  # psutil comes with ipykernel, but the server side must not depend on it
    psutil = None

INTERVAL_S = 2.0


class ProcessTrees:
    """RSS and CPU of process trees, keeping psutil's process objects between reads (a CPU share
    needs two readings of the same object)."""

    def __init__(self):
        self._procs: dict[int, object] = {}

    def measure(self, roots: dict[str, int]) -> dict[str, dict]:
        """Kernel id -> {"memory": bytes (RSS of the tree), "cpu_percent", "processes"}."""
        seen: set[int] = set()
        out = {}
        for kernel, pid in roots.items():
            tree = self._tree(pid)
            if not tree:
                continue
            memory, cpu, count = 0, 0.0, 0
            for proc in tree:
                seen.add(proc.pid)
                try:
                    with proc.oneshot():
                        if proc.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped: holds nothing
                            continue
                        memory += proc.memory_info().rss
                        cpu += proc.cpu_percent(None)
                    count += 1
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            if count:
                out[kernel] = {"memory": memory, "cpu_percent": round(cpu, 1), "processes": count}
        for gone in [p for p in self._procs if p not in seen]:
            del self._procs[gone]
        return out

    def _tree(self, pid: int) -> list:
        try:
            root = self._proc(pid)
            children = root.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return []
        return [root, *(self._proc(c.pid, c) for c in children)]

    def _proc(self, pid: int, fresh=None):
        proc = self._procs.get(pid)
        if proc is None or (fresh is not None and not proc.is_running()):
            proc = fresh or psutil.Process(pid)
            self._procs[pid] = proc
        return proc


def host_figures() -> dict:
    memory = psutil.virtual_memory()
    return {"cpu_percent": psutil.cpu_percent(None), "cpu_count": psutil.cpu_count(),
            "memory_used": memory.total - memory.available, "memory_total": memory.total}


class HostUsage:
    """The latest round's figures (`annotate` puts them into snapshots), each round also into
    the history."""

    def __init__(self, serverapp, history, watched: Callable[[], bool], interval: float = INTERVAL_S,
                 clock=time.time):
        self.serverapp, self.history, self.watched, self.interval, self.clock = (
            serverapp, history, watched, interval, clock)
        self.trees = ProcessTrees() if psutil is not None else None
        self.kernels: dict[str, dict] = {}
        self.host: dict | None = None
        self.time: float | None = None
        self._running = False
        self._timer = None

    async def round(self) -> None:
        if self._running or self.trees is None or not self.watched():
            return
        self._running = True
        try:
            roots = self._roots()
            kernels, host = await asyncio.get_running_loop().run_in_executor(None, self._measure, roots)
        except Exception as exc:  # never take the server down; the snapshot goes without
            self.serverapp.log.debug("gpuctx: reading host usage failed: %s: %s", type(exc).__name__, exc)
            return
        finally:
            self._running = False
        self.kernels, self.host, self.time = kernels, host, self.clock()
        self.history.add_host(self.time, host, self.interval)

    def _roots(self) -> dict[str, int]:
        """Kernel id -> the PID this server launched it as (kernels behind a gateway have none)."""
        km = self.serverapp.kernel_manager
        roots = {}
        for kernel_id in km.list_kernel_ids():
            try:
                pid = kernel_pid(km.get_kernel(kernel_id))
            except KeyError:
                continue
            if pid:
                roots[kernel_id] = pid
        return roots

    def _measure(self, roots: dict[str, int]) -> tuple[dict, dict]:
        return self.trees.measure(roots), host_figures()

    def annotate(self, snap: dict) -> None:
        """`host`: the host's CPU and memory and each kernel's, from the latest round (absent
        before the first, and without psutil: then `host.reason` says why)."""
        if self.trees is None:
            snap["host"] = {"reason": "psutil is not installed where the server runs"}
            return
        if self.host is None:
            return
        snap["host"] = {**self.host, "time": self.time, "interval": self.interval, "kernels": self.kernels}

    def start(self) -> None:
        from tornado.ioloop import PeriodicCallback

        self._timer = PeriodicCallback(self.round, self.interval * 1000)
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
