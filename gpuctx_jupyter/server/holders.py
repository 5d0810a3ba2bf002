"""Who holds the GPU, as this server knows it: its kernels (with every PID NVML may list them
under, their idle time and their last allocator figures) and the warm pool's standbys.

Three uses, one collection per sample:
- the holders file (format: contract.HOLDERS), which a kernel that runs out of memory reads to
  name the notebooks holding its GPU (the kernel can ask nothing of the server): written
  atomically, mode 0600, in the Jupyter runtime dir, refreshed from the process's sampler at most
  once a second while some GPU lists processes, and only when its content changed (or every
  REWRITE_S seconds);
- the GPU API: `annotate` adds idle time, allocator figures, the idle-holder mark and the culling
  time to each kernel in the /gpuctx/api/devices snapshot;
- the consumers run after each collection (automatic release, culling: release.py, culling.py).

With `suspend` (suspend.py's SuspendManager) each suspended kernel's entry says what it moved to
host memory, and the file names the suspend route where the driver offers it, so that another
notebook's out-of-memory explanation can offer suspending an idle holder.

Allocator figures come from the kernels themselves (the control-channel question,
kernel_query.ask): a kernel that holds GPU memory is asked again only when it was active since
its last answer (or every BUSY_REASK_S while it runs a cell), so an idle notebook is asked once.
gpuctx's own requests are not user activity (the extension keeps them out of jupyter_server's
activity tracking), so asking does not make a kernel look busy.
"""
from __future__ import annotations

import asyncio
import atexit
import os
import time
from collections.abc import Awaitable, Callable, Mapping

from ..contract.holders import HOLDERS_PREFIX, Holder, HoldersFile, standby_holder_id
from ..core.inventory import Inventory
from ..core.sampler import Sample
from . import attribution, kernel_client, kernel_query, snapshot
from .kernel_client import kernel_pid

REWRITE_S = 30.0  # rewrite an unchanged file this often (its readers learn the server still writes)
BUSY_REASK_S = 10.0  # ask a kernel running a cell for its figures at most this often
ROUND_INTERVAL_S = 2.0  # how often the holders file, idle holders, pressure release and culling are updated
OOM_RECENT_S = 300.0  # the API names a GPU's last out-of-memory error this long
OOM_RELEASE_S = 60.0  # an out-of-memory error this recent counts as memory pressure on its GPU

# (inventory, holders, holdings) -> awaitable: what runs after each collection
Consumer = Callable[[Inventory, list[Holder], dict[str, dict[int, int]]], Awaitable[object]]


def holders_path(runtime_dir: str, pid: int | None = None) -> str:
    return os.path.join(runtime_dir, f"{HOLDERS_PREFIX}{os.getpid() if pid is None else pid}.json")


def holdings(inv: Inventory, holders: list[Holder]) -> dict[str, dict[int, int]]:
    """Holder id -> {CUDA ordinal: bytes NVML lists for it there}; holders holding nothing are absent."""
    by_pid: dict[int, Holder] = {}
    for h in holders:
        for pid in h.pids:
            by_pid.setdefault(pid, h)
    out: dict[str, dict[int, int]] = {}
    for d in inv.devices:
        for p in d.record.processes:
            h = by_pid.get(p.pid)
            if h is not None:
                per = out.setdefault(h.id, {})
                per[d.ordinal] = per.get(d.ordinal, 0) + (p.used_memory or 0)
    return out


def _epoch(dt) -> float | None:
    try:
        return dt.timestamp()
    except Exception:  # noqa: BLE001 — not a datetime (a kernel manager of another kind)
        return None


def live_activity(km, kernel_id: str) -> tuple[str | None, float | None] | None:
    """A kernel's execution state and last user activity (epoch s) as the kernel manager has them
    now (None: no such kernel)."""
    kernel = kernel_client.find(km, kernel_id)
    if kernel is None:
        return None
    return getattr(kernel, "execution_state", None), _epoch(getattr(kernel, "last_activity", None))


class Holders:
    def __init__(self, serverapp, reported: dict | None = None, standbys: Callable[[], list] = list,
                 path: str | None = None, clock: Callable[[], float] = time.time, ask=kernel_query.ask,
                 query_timeout: float = 2.0, log=None, suspend=None):
        self.serverapp, self.standbys, self.log = serverapp, standbys, log or serverapp.log
        self.reported = reported if reported is not None else {}  # shared with GpuApi: id -> (local pid, own pid)
        self.path = path or holders_path(serverapp.runtime_dir)
        self.clock, self._ask, self.query_timeout = clock, ask, query_timeout
        self.figures: dict[str, tuple[float, int | None, list[dict]]] = {}  # id -> (when, local pid, memory)
        self.ooms: dict[str, dict] = {}  # kernel id -> its last out-of-memory error, as it reported it
        self.consumers: list[Consumer] = []
        self.latest: tuple[list[Holder], dict[str, dict[int, int]]] = ([], {})
        self.inventory: Inventory | None = None  # the GPUs as the last round read them
        self._written: tuple[str, float] | None = None  # (content without times, when)
        self._running = False
        base = getattr(serverapp, "base_url", "/") or "/"
        self.release_url = base.rstrip("/") + "/gpuctx/api/kernels/{id}/release"
        self.suspend = suspend  # .info(kernel id) while suspended, .offered where the driver can

    @property
    def suspend_url(self) -> str:
        """The suspend route for the holders file ("" where suspend is not offered)."""
        return self.release_url.replace("/release", "/suspend") if self.suspend and self.suspend.offered else ""

    # -- what the kernels report ----------------------------------------------------------------
    def remember(self, kernel_id: str, local_pid: int | None, answer: Mapping) -> None:
        """Keep a kernel's answer to the GPU question (GET /gpuctx/api/kernels/<id> calls this too)."""
        if answer.get("status") != "ok":
            return
        memory = [m for m in answer.get("memory") or [] if isinstance(m, dict)]
        self.figures[kernel_id] = (self.clock(), local_pid, memory)
        oom = answer.get("last_oom")
        if isinstance(oom, dict) and isinstance(oom.get("ordinal"), int) and isinstance(oom.get("time"), int | float):
            self.ooms[kernel_id] = oom
        if answer.get("pid"):
            self.reported[kernel_id] = (local_pid, answer["pid"])

    def forget(self, kernel_id: str) -> None:
        self.figures.pop(kernel_id, None)

    # -- collecting -------------------------------------------------------------------------------
    def collect(self) -> list[Holder]:
        """This server's kernels and standbys as holders (on the event loop: it reads the kernel
        manager and the session table)."""
        now = self.clock()
        km = self.serverapp.kernel_manager
        live = set(km.list_kernel_ids())
        for table in (self.figures, self.ooms):
            for gone in [k for k in table if k not in live]:
                del table[gone]
        out = []
        for info in snapshot.list_kernels(self.serverapp, self.reported):
            kernel = kernel_client.find(km, info.id)
            if kernel is None:
                continue
            last = _epoch(getattr(kernel, "last_activity", None))
            when, local_pid, memory = self.figures.get(info.id, (None, None, []))
            if when is not None and local_pid != kernel_pid(kernel):  # restarted since: not its figures
                when, memory = None, []
            out.append(Holder(id=info.id, name=info.name, paths=info.paths, pids=info.pids,
                              execution_state=info.execution_state, last_activity=last,
                              idle_s=None if last is None else max(0.0, now - last), standby=False,
                              memory=tuple(memory), memory_time=when,
                              suspended=self.suspend.info(info.id) if self.suspend else None))
        out.extend(self._standbys(now))
        return out

    def _standbys(self, now: float) -> list[Holder]:
        standbys = self.standbys()
        if not standbys:
            return []
        children = attribution.recent_children()
        mono = time.monotonic()
        out = []
        for s in standbys:
            pid = getattr(s, "pid", None)
            if not pid:
                continue
            age = max(0.0, mono - getattr(s, "started", mono))
            out.append(Holder(id=standby_holder_id(pid), name=getattr(s, "kernel_name", ""),
                              pids=attribution.kernel_pids(pid, None, children), execution_state="idle",
                              last_activity=now - age, idle_s=age, standby=True))
        return out

    # -- the holders file --------------------------------------------------------------------------
    def write(self, holders: list[Holder], force: bool = False) -> bool:
        """Write the file when its content changed (or every REWRITE_S); True when written."""
        now = self.clock()
        content = HoldersFile(os.getpid(), now, tuple(holders), self.release_url, self.suspend_url)
        key = HoldersFile(os.getpid(), 0.0, tuple(_timeless(h) for h in holders), self.release_url,
                          self.suspend_url).to_json()
        if not force and self._written and self._written[0] == key and now - self._written[1] < REWRITE_S:
            return False
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(content.to_json())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._written = (key, now)
        return True

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # -- one round: collect, write, ask, run the consumers -------------------------------------------
    async def tick(self, inv: Inventory) -> tuple[list[Holder], dict[str, dict[int, int]]]:
        self.inventory = inv  # the pool's memory floor reads it
        if not any(d.record.processes for d in inv.devices):
            self.latest = ([], {})
            return self.latest
        holders = self.collect()
        held = holdings(inv, holders)
        await self._refresh_figures(holders, held, inv)
        holders = self.collect() if self._asked_any else holders
        held = holdings(inv, holders) if self._asked_any else held
        try:
            self.write(holders)
        except OSError as exc:
            self.log.warning("gpuctx: cannot write the holders file %s: %s", self.path, exc)
        self.latest = (holders, held)
        for consumer in list(self.consumers):
            try:
                await consumer(inv, holders, held)
            except Exception as exc:  # one consumer failing must not stop the others
                self.log.warning("gpuctx: %s failed: %s: %s", getattr(consumer, "__qualname__", consumer),
                                 type(exc).__name__, exc)
        return self.latest

    async def _refresh_figures(self, holders: list[Holder], held: dict, inv: Inventory) -> None:
        """Ask the kernels whose figures are missing or stale (see the module's docstring)."""
        self._asked_any = False
        now = self.clock()
        unmatched = any(p for d in inv.devices for p in d.record.processes
                        if not any(p.pid in h.pids for h in holders))
        km = self.serverapp.kernel_manager
        due = []
        for h in holders:
            # "starting" too: jupyter_server keeps that state until a tracked message, and a kernel
            # whose warm-up alone holds GPU memory may never have run a cell
            if h.standby or h.execution_state == "dead":
                continue
            if h.id not in held and not (unmatched and h.id not in self.figures):
                continue  # holds no GPU memory (or is known not to be an unmatched process)
            when = h.memory_time
            stale = (when is None or (h.last_activity or 0) > when
                     or (h.execution_state == "busy" and now - when > BUSY_REASK_S))
            if stale:
                due.append(h.id)
        if not due:
            return

        async def ask(kid: str) -> None:
            kernel = kernel_client.find(km, kid)
            if kernel is None:
                return
            answer = await self._ask(kernel, self.query_timeout)
            if answer.get("status") == "ok":
                self.remember(kid, kernel_pid(kernel), answer)
            else:  # no answer (gpuctx not loaded, busy in C): do not ask again until it is active
                self.figures[kid] = (self.clock(), kernel_pid(kernel), list(self.figures.get(kid, (0, 0, []))[2]))

        await asyncio.gather(*(ask(k) for k in due), return_exceptions=True)
        self._asked_any = True

    # -- the GPU API -------------------------------------------------------------------------------
    def annotate(self, snap: dict, idle_after: float, cull_at: Mapping[str, float] | None = None,
                 cull_warning_s: float = 0.0) -> dict:
        """Add, for this server's kernels in a /gpuctx/api/devices snapshot, per process entry's
        "kernel": idle_s, last_activity, memory (this GPU's allocator figures), idle_holder,
        cull_at, cull_warning; standbys' process entries get "standby"; each device gets
        "idle_held" (bytes NVML lists for idle holders there)."""
        holders, _held = self.latest
        now = self.clock()
        by_id = {h.id: h for h in holders}
        by_pid = {pid: h for h in holders for pid in h.pids}
        cull_at = cull_at or {}
        for device in snap.get("devices", []):
            ordinal = device.get("ordinal")
            idle_held = 0
            for proc in device.get("processes", []):
                kernel = proc.get("kernel")
                h = by_id.get(kernel.get("id")) if isinstance(kernel, dict) else by_pid.get(proc.get("pid"))
                if h is None:
                    continue
                idle = h.idle_at(now, now)
                is_idle = bool(idle_after > 0 and idle is not None and idle >= idle_after)
                if is_idle:
                    idle_held += proc.get("used_memory") or 0
                if h.standby:
                    proc["standby"] = {"kernel_name": h.name, "age_s": round(idle or 0.0, 1)}
                    continue
                if not isinstance(kernel, dict):
                    continue
                when = cull_at.get(h.id)
                kernel.update({
                    "idle_s": None if idle is None else round(idle, 1),
                    "last_activity": h.last_activity,
                    "memory": _memory_on(h, ordinal),
                    "idle_holder": is_idle,
                    "cull_at": when,
                    "cull_warning": bool(when is not None and when - now <= cull_warning_s),
                })
            device["idle_held"] = idle_held
            device["oom"] = self._recent_oom(ordinal, now)
        return snap

    def oom_within(self, ordinal: int, seconds: float) -> bool:
        """Whether one of this server's kernels reported running out of memory on `ordinal` lately."""
        now = self.clock()
        return any(o.get("ordinal") == ordinal and now - o["time"] <= seconds for o in self.ooms.values())

    def _recent_oom(self, ordinal, now: float) -> dict | None:
        """The latest out-of-memory error on this GPU among this server's kernels, within OOM_RECENT_S."""
        recent = [(o["time"], kid, o) for kid, o in self.ooms.items()
                  if o.get("ordinal") == ordinal and now - o["time"] <= OOM_RECENT_S]
        if not recent:
            return None
        when, kid, o = max(recent, key=lambda r: r[0])
        holder = next((h for h in self.latest[0] if h.id == kid), None)
        return {"kernel_id": kid, "paths": list(holder.paths) if holder else [], "time": when,
                "framework": o.get("framework"), "requested": o.get("requested")}

    # -- running on the event loop ----------------------------------------------------------------
    def start(self, read: Callable[[], Awaitable[Sample]]) -> None:
        """Run a round every ROUND_INTERVAL_S, reading the GPUs through `read` (the API's: the
        sampler's latest sample while viewers keep it running, else one read in an executor), so
        that the server's sampler still stops when no one watches."""
        from tornado.ioloop import PeriodicCallback

        self._read = read
        self._timer = PeriodicCallback(self._on_timer, ROUND_INTERVAL_S * 1000)
        self._timer.start()
        atexit.register(self.remove)

    def stop(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.stop()
            self._timer = None
        self.remove()

    async def _on_timer(self) -> None:
        if self._running:
            return
        self._running = True
        try:
            await self.tick((await self._read()).inventory)
        except Exception as exc:  # never take the server down; say why once per kind
            self.log.warning("gpuctx: the holders round failed: %s: %s", type(exc).__name__, exc)
        finally:
            self._running = False

    _asked_any = False


def _timeless(h: Holder) -> Holder:
    """The holder without what changes every second (so that an unchanged file is not rewritten)."""
    from dataclasses import replace

    return replace(h, idle_s=None if not h.standby else 0.0, last_activity=None if h.standby else h.last_activity)


def _memory_on(h: Holder, ordinal) -> dict | None:
    rows = [m for m in h.memory if m.get("ordinal") == ordinal]
    if not rows:
        return None
    allocated = sum(int(m.get("allocated") or 0) for m in rows)
    reserved = sum(int(m.get("reserved") or 0) for m in rows)
    peaks = [int(m["peak"]) for m in rows if isinstance(m.get("peak"), int)]
    return {"allocated": allocated, "reserved": reserved, "cached": max(0, reserved - allocated),
            "peak": max(peaks) if peaks else None, "frameworks": sorted({str(m.get("framework")) for m in rows}),
            "reported_at": h.memory_time}
