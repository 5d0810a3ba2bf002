"""Suspending an idle notebook's GPU (issue #28): its GPU memory moves into the kernel's host
memory and comes back before its next request, variables intact.

`SuspendManager` holds the server's side; the driver is reached through a `Checkpointer`
(server/checkpointer.py; its implementation runs the helper process of core/checkpoint.py), the
kernel through its control channel (contract.SUSPEND_*: its side is kernel/suspend.py).

Suspend and resume are actions of the lifecycle (lifecycle.py, `Actions`): they take turns with
restart, shutdown and interrupt, one action per kernel at a time, and `run` is how everything asks
for one (the routes in routes/suspend.py, culling, the pressure release): a second suspend, or a
resume racing a restart, is answered 409 rather than run. Suspend:
1. refusals, each one line with what to do (`Refused`: HTTP status and message): suspend
   unavailable here (the driver's reason), an unknown kernel, a warm-pool standby, a kernel not on
   this machine or another user's, one that is dead, busy, already suspended or that holds no GPU
   memory, a host (or the kernel's container) that cannot take the memory;
2. the kernel's consent (SUSPEND_PREPARE with a token): refused while a cell runs or its warm-up
   does; from then on the kernel restores itself before any request of the user's;
3. the helper locks (with a timeout: a kernel inside a CUDA call is refused, not waited for) and
   checkpoints; on any failure it unwinds (core.checkpoint.suspend), and should the process still
   not be running the server resumes it — never a half-suspended kernel;
4. the kernel is told the outcome (SUSPEND_DONE), and the answer says what moved per GPU (NVML
   before and after), the host memory it now takes, and each step's time.

Resume (POST …/resume, the Resume button) asks the kernel to restore itself (RESUME), and falls
back to the helper when the kernel cannot answer (asked first whether it answers at all, within
kernel_query_timeout: its reply to RESUME comes only after the restore). A restart or shutdown of
the kernel pre-empts a suspend or resume in flight (lifecycle.py): its callers get a 409 that
says so. A kernel that resumed itself for a cell is noticed by `watch` (activity since the
suspend, then the kernel's own answer), which forgets it.
A suspended kernel is shut down or restarted at once (the lifecycle asks `is_suspended`): its
process would otherwise be asked to exit politely and wait, checkpointed, for the CUDA teardown —
and nothing in it is lost that the polite way would keep (a restart does not restore first).

Where suspended kernels show: `annotate` adds them to the GPU API's snapshot (and so the stream,
/metrics and the panel), `info` to the holders file (the out-of-memory explanation).
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from jupyter_server._tz import utcnow

from .. import contract
from ..contract.holders import suspended_text
from ..core import checkpoint, host_memory
from ..core.checkpoint import CANCELLED, Outcome, Support
from ..core.inventory import Inventory
from ..core.procs import owner
from . import attribution, kernel_client, kernel_query
from .checkpointer import Checkpointer
from .kernel_client import kernel_pid
from .lifecycle import Busy, Gone, Preempted
from .snapshot import session_paths

GIB = 2**30
ACTIONS = {"suspend": "suspend_kernel", "resume": "resume_kernel"}  # route -> the lifecycle's action
WARMUP_WAIT_S = 30.0  # a kernel whose warm-up is mid-step (it says `retry`) is asked again for this long
# What a consent may take beyond an ordinary question: the kernel waits up to 0.5 s for a cell
# that has just ended, 1 s for a warm-up step under way and 2 s for a sampler read
# (kernel/suspend.py), then gives its cache back; a loaded machine's scheduling on top
CONSENT_SLACK_S = 8.0
SETTLE_S = 1.0  # NVML may list a suspended process's memory for a moment: read again this long
WATCH_INTERVAL_S = 2.0  # how often suspended kernels are checked for having resumed themselves


class Refused(Exception):
    """A suspend or resume that cannot be done: `status` (HTTP) and a one-line `message`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Suspended:
    """A kernel the server suspended, while it stays so."""

    kernel_id: str
    pid: int  # the process the driver acted on (the kernel's own report)
    local_pid: int  # the process the server launched: a restart changes it
    since: float
    before: dict[int, int]  # CUDA ordinal -> bytes NVML listed for the kernel before
    after: dict[int, int]
    need: dict[str, int]  # GPU UUID -> bytes a restore puts back there
    seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    rss_before: int | None = None
    rss_after: int | None = None
    by: str = "api"  # api | culling | pressure
    paths: tuple[str, ...] = ()
    name: str = ""
    cache_returned: int = 0  # bytes of allocator cache the kernel gave back to the GPU on consent

    @property
    def moved(self) -> dict[int, int]:
        return {o: max(0, b - self.after.get(o, 0)) for o, b in self.before.items()}

    @property
    def moved_total(self) -> int:
        return sum(self.moved.values())

    def text(self) -> str:
        return suspended_text(self.moved_total, self.since)

    def as_dict(self) -> dict:
        return {"kernel_id": self.kernel_id, "name": self.name, "paths": list(self.paths), "pid": self.pid,
                "since": self.since, "moved": {str(o): b for o, b in self.moved.items()},
                "moved_mib": {str(o): round(b / 2**20, 1) for o, b in self.moved.items()},
                "moved_total": self.moved_total, "nvml_before": {str(o): b for o, b in self.before.items()},
                "nvml_after": {str(o): b for o, b in self.after.items()}, "seconds": round(self.seconds, 4),
                "steps": self.steps, "host_rss": {"before": self.rss_before, "after": self.rss_after},
                "by": self.by, "cache_returned": self.cache_returned, "text": self.text()}

    def holder_info(self) -> dict:
        """What the holders file says of it (contract.Holder.suspended)."""
        return {"since": self.since, "moved": {str(o): b for o, b in self.moved.items()},
                "moved_total": self.moved_total}


def _gib(n: int | float | None) -> str:
    return f"{(n or 0) / GIB:.2f} GiB"


async def run(actions, action: str, kernel_id: str, by: str = "api") -> dict:
    """Suspend or resume (`action`) through the lifecycle's `actions`, one action per kernel at a
    time: another in flight is a 409, never a wait."""
    try:
        return await actions.run(ACTIONS[action], kernel_id, by, wait=False)
    except (Busy, Preempted) as exc:  # another action in flight; a restart or shutdown stopped it
        raise Refused(409, str(exc)) from None
    except Gone:
        raise Refused(404, f"kernel {kernel_id!r} was shut down meanwhile") from None


class SuspendManager:
    def __init__(self, serverapp, cfg, checkpointer: Checkpointer, take: Callable[[], Inventory],
                 reported: dict | None = None, log=None, clock: Callable[[], float] = time.time):
        self.serverapp, self.cfg, self.checkpointer = serverapp, cfg, checkpointer
        self.take, self.clock = take, clock  # take(): one read of the GPUs (NVML, or the replayed trace)
        self.reported = reported if reported is not None else {}  # kernel id -> (local pid, own pid)
        self.log = log or serverapp.log
        self.suspended: dict[str, Suspended] = {}
        self.resumed: list[dict] = []  # the latest resumes, newest last (bounded): for the log and the API
        self._support: Support | None = None
        self._detecting: asyncio.Future | None = None
        self._watch = None  # the PeriodicCallback of `watch`

    async def read_inventory(self) -> Inventory:
        """The GPUs now, read off the event loop (a failed read is an inventory that says why)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.take)
        except Exception as exc:  # noqa: BLE001 — as the sampler does: no figures, the reason
            return Inventory(nvml_error=f"reading the GPUs failed: {type(exc).__name__}: {exc}")

    # -- running on the event loop ----------------------------------------------------------------
    def start(self, background) -> None:
        """Ask the driver what it offers (once, in the background: GET /gpuctx/api/devices says it
        under "suspend", the panel by its button), and watch suspended kernels for having resumed."""
        from tornado.ioloop import PeriodicCallback

        background.spawn(self._detect(), "asking the CUDA driver whether it can suspend kernels")

        async def watch():
            if self.suspended:
                await self.watch()

        self._watch = PeriodicCallback(watch, WATCH_INTERVAL_S * 1000)
        self._watch.start()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    async def _detect(self) -> None:
        support = await self.support()
        self.log.debug("gpuctx: suspend %s", f"available: {support.reason}" if support.available
                       else f"not available: {support.reason}")

    # -- feature detection --------------------------------------------------------------------------
    @property
    def offered(self) -> bool:
        """The driver has answered that it can suspend kernels here."""
        return bool(self._support and self._support.available)

    async def support(self) -> Support:
        """The driver's answer, asked once (the helper loads libcuda; ~0.1 s)."""
        if self._support is None:
            if not getattr(self.cfg, "suspend_enabled", True):
                self._support = Support(False, "suspend is turned off on this server (c.GpuctxServer.suspend_enabled "
                                               "= False)")
                return self._support
            if self._detecting is None:
                self._detecting = asyncio.ensure_future(self.checkpointer.support())
            try:
                self._support = await asyncio.shield(self._detecting)
            except Exception as exc:  # noqa: BLE001 — unavailable, with the reason
                self._support = Support(False, f"could not ask the driver: {type(exc).__name__}: {exc}")
        return self._support

    # -- the two actions (run by the lifecycle's Actions: ask for them with `run`) ---------------------
    def _known(self, kernel_id: str):
        if kernel_id.startswith("standby-"):
            raise Refused(409, f"{kernel_id} is a warm-pool standby: it holds no notebook's work (the pool stops "
                               "standbys itself when a GPU runs short)")
        km = self.serverapp.kernel_manager
        if kernel_id not in km:
            raise Refused(404, f"no kernel {kernel_id!r} on this server (GET /api/kernels lists them)")
        return km.get_kernel(kernel_id)

    async def _target(self, kernel_id: str) -> tuple[object, int, Suspended | None]:
        """The kernel, its process on this machine and its suspend record — or the refusal (an
        unknown kernel, a standby, suspend unavailable here, its process ended or not ours)."""
        kernel = self._known(kernel_id)
        support = await self.support()
        if not support.available:
            raise Refused(409, f"suspend is not available on this server: {support.reason}")
        local = await self._local_pid(kernel)
        return kernel, local, self.suspended.get(kernel_id)

    async def suspend(self, kernel_id: str, by: str = "api") -> dict:
        kernel, local, record = await self._target(kernel_id)
        resumed = record is None or record.local_pid != local or await self._resumed_itself(kernel_id, kernel, record)
        if not resumed:  # a cell since may have resumed it: asked, not read from the watch's last round
            raise Refused(409, f"it is {record.text()}: it resumes on its next cell, or with POST …/resume")
        for _ in range(10):  # a cell that has just ended: its idle may still be on its way here
            if getattr(kernel, "execution_state", None) != "busy":
                break
            await asyncio.sleep(0.1)
        else:
            raise Refused(409, "it is running a cell: suspend it once it is idle")
        inv = await self.read_inventory()
        pids = attribution.kernel_pids(local, self._own_pid(kernel_id, local), attribution.child_table())
        before = held_by(inv, pids)
        total = sum(before.values())
        if not total:
            raise Refused(409, "it holds no GPU memory: there is nothing to suspend")
        self._check_host(local, total)
        token = uuid.uuid4().hex
        pid, released = await self._consent(kernel, token, local, pids)
        try:  # read again: its cache went back on consent, a warm-up step it waited for may have added
            inv = await self.read_inventory()
            before = held_by(inv, pids) or before
            self._check_host(local, sum(before.values()))
        except BaseException:
            await self._tell(kernel, {"token": token, "ok": False})  # it consented: not suspending after all
            raise
        rss_before = host_memory.rss(pid)
        t0, since = time.perf_counter(), self.clock()  # a request from here on resumes it: activity after `since`
        try:
            outcome = await self.checkpointer.suspend(pid, int(self.cfg.suspend_lock_timeout * 1000), token)
        except Exception as exc:  # noqa: BLE001 — the helper could not run: what it did is unknown
            outcome = Outcome(False, "unknown", {}, f"could not run the checkpoint helper: {type(exc).__name__}: {exc}")
        if not outcome.ok:  # put back first: the kernel is told it runs only once it does
            refusal = await self._failed(pid, outcome)
            await self._tell(kernel, {"token": token, "ok": False, "message": refusal.message,
                                      **({"running": False} if refusal.status == 500 else {})})
            raise refusal
        after = await self._settled(pids, before)
        record = Suspended(kernel_id, pid, local, since, before, after, _uuids(inv, before),
                           time.perf_counter() - t0, outcome.steps, rss_before, host_memory.rss(pid), by,
                           *self._names(kernel_id, kernel))
        record.cache_returned = released
        self.suspended[kernel_id] = record
        told = await self._tell(kernel, {"token": token, "ok": True, "since": since,
                                         "moved": {str(o): b for o, b in record.moved.items()}, "need": record.need})
        if told is not None and (told.get("stale") or told.get("state") in ("running", "resuming")):
            if self.suspended.get(kernel_id) is record:  # a request came during the checkpoint and restored it
                del self.suspended[kernel_id]
            raise Refused(409, "not suspended: the notebook sent a request during the suspend and resumed itself; "
                               "it runs as before")
        self.log.info("gpuctx: suspended kernel %s (%s, asked by %s): %s of GPU memory moved to host memory in %.2f s "
                      "(%s)", kernel_id, ", ".join(record.paths) or record.name, by, _gib(record.moved_total),
                      record.seconds, ", ".join(f"{_gib(b)} from cuda:{o}" for o, b in sorted(record.moved.items())))
        return {"status": "ok", **record.as_dict()}

    async def _local_pid(self, kernel) -> int:
        if getattr(kernel, "execution_state", None) == "dead" or not await _alive(kernel):
            raise Refused(409, "its process has ended: restart the kernel")
        local = kernel_pid(kernel)
        if local is None:
            raise Refused(409, "its process is not on this machine (a gateway's or a remote kernel): the driver can "
                               "only suspend processes of this machine")
        uid = owner(local)
        if uid is not None and os.getuid() != 0 and uid != os.getuid():
            raise Refused(409, "it runs as another user: the server may not checkpoint its process")
        return local

    def _own_pid(self, kernel_id: str, local: int) -> int | None:
        answered_as, own = self.reported.get(kernel_id, (None, None))
        return own if answered_as == local else None

    def _check_host(self, pid: int, total: int) -> None:
        room = host_memory.available(pid=pid)
        reserve = int(self.cfg.suspend_host_reserve_gib * GIB)
        if room is not None and total + reserve > room.available:
            raise Refused(409, f"the host cannot take it: {_gib(total)} of GPU memory would move into host memory, "
                               f"{_gib(room.available)} is free for it ({room.source}) and {_gib(reserve)} is kept free "
                               "(c.GpuctxServer.suspend_host_reserve_gib): free host memory, or suspend a notebook "
                               "that holds less")

    async def _consent(self, kernel, token: str, local: int, pids: frozenset[int]) -> tuple[int, int]:
        """The kernel's consent: its pid in this server's namespace (the process the server launched or
        one of its descendants: never one the kernel merely names), and the bytes of allocator cache
        it gave back first."""
        timeout, until = self.cfg.kernel_query_timeout + CONSENT_SLACK_S, time.monotonic() + WARMUP_WAIT_S
        try:
            while True:  # a warm-up's step or import under way ends within seconds: the suspend waits
                reply = await kernel_client.request(kernel, "control", contract.SUSPEND_PREPARE_REQUEST,
                                                    {"token": token}, timeout)
                if not (reply.get("content") or {}).get("retry") or time.monotonic() > until:
                    break
                await asyncio.sleep(0.5)
        except kernel_client.NoReply:  # a late consent must not leave it suspending (sent, not waited for)
            await self._tell(kernel, {"token": token, "ok": False}, timeout=2.0, quiet=True)
            raise Refused(409, f"the kernel did not answer within {timeout:g} s (is gpuctx loaded in it? "
                               "%load_ext gpuctx): without gpuctx it could not resume itself before its next "
                               "cell") from None
        except Exception as exc:  # noqa: BLE001
            raise Refused(409, f"could not reach the kernel: {type(exc).__name__}: {exc}") from None
        content = reply.get("content") or {}
        if reply.get("msg_type") != contract.SUSPEND_PREPARE_REPLY:
            raise Refused(409, "this kernel's gpuctx is older than the server's and cannot resume itself: restart it")
        if content.get("status") != "ok":
            raise Refused(409, f"not now: {content.get('message') or 'the kernel refused'}")
        said = content.get("pid")
        pid = attribution.host_pid(said, local, attribution.child_table()) if isinstance(said, int) else None
        why = None
        if pid is None:
            why = (f"the kernel reports pid {said}, which is not among this kernel's processes "
                   f"({', '.join(map(str, sorted(pids)))}): not suspended")
        elif said != pid:
            why = ("it runs in a PID namespace of its own (a container): it and the checkpoint helper could not take "
                   "turns on its process, so a cell could run as it is checkpointed; not suspended")
        elif "locks" in content and content["locks"] != checkpoint.folder_id():
            why = ("its temporary folder is not the server's (a TMPDIR of its own, or another container): it and the "
                   "checkpoint helper could not take turns on its process; not suspended")
        if why:
            await self._tell(kernel, {"token": token, "ok": False})
            raise Refused(409, why)
        released = content.get("released_cache")
        return pid, released if isinstance(released, int) and released > 0 else 0

    async def _tell(self, kernel, content: dict, timeout: float | None = None, quiet: bool = False) -> dict | None:
        """Tell the kernel how its suspend ended; its answer (None: none came)."""
        try:
            reply = await kernel_client.request(kernel, "control", contract.SUSPEND_DONE_REQUEST, content,
                                                timeout or self.cfg.kernel_query_timeout)
        except Exception as exc:  # noqa: BLE001 — the kernel copes without (it resumes from what it finds)
            if not quiet:
                self.log.warning("gpuctx: could not tell the kernel how its suspend ended: %s: %s",
                                 type(exc).__name__, exc)
            return None
        return reply.get("content") or {}

    async def _failed(self, pid: int, outcome: Outcome) -> Refused:
        """The refusal for a suspend that failed, once the process runs again (or a 500 saying it does not)."""
        if outcome.error_name == CANCELLED or outcome.state == "running" or outcome.unwound:
            return Refused(409, f"not suspended: {outcome.error}; the kernel runs as before")
        try:  # the helper could not unwind: try once more
            back = await self.checkpointer.resume(pid)
        except Exception as exc:  # noqa: BLE001
            back = Outcome(False, "unknown", {}, f"could not run the checkpoint helper: {type(exc).__name__}: {exc}")
        if back.ok:
            return Refused(409, f"not suspended: {outcome.error}; the kernel runs as before")
        self.log.error("gpuctx: a failed suspend of pid %s could not be undone: %s; then %s", pid, outcome.error,
                       back.error)
        return Refused(500, f"the suspend failed ({outcome.error}) and the kernel could not be put back ({back.error}): "
                            "its next cell, or Resume, tries again; restart it if that fails")

    async def _settled(self, pids: frozenset[int], before: dict[int, int]) -> dict[int, int]:
        """NVML's figures for the kernel after the checkpoint, once they have dropped (or after SETTLE_S)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            after = held_by(await self.read_inventory(), pids)
            if sum(after.values()) <= 0.01 * sum(before.values()) or time.monotonic() > deadline:
                return after
            await asyncio.sleep(0.1)

    def _names(self, kernel_id: str, kernel) -> tuple[tuple[str, ...], str]:
        paths = tuple(session_paths(self.serverapp.session_manager).get(kernel_id, ()))
        return paths, getattr(kernel, "kernel_name", "")

    async def resume(self, kernel_id: str, by: str = "api") -> dict:
        kernel, local, record = await self._target(kernel_id)
        if record is not None and record.local_pid != local:  # restarted since: nothing of it is left
            self.suspended.pop(kernel_id, None)
            record = None
        t0 = time.perf_counter()
        answer = await self._ask_kernel_to_resume(kernel)
        if answer is None:  # the kernel cannot answer: the helper restores it directly
            outcome = await self.checkpointer.resume(record.pid if record else local, record.need if record else None)
            if not outcome.ok:
                raise Refused(409, f"could not resume it: {outcome.error}")
            answer = {"status": "ok", "resumed": "restore" in outcome.steps, "steps": outcome.steps}
        if answer.get("status") != "ok":
            raise Refused(409, f"could not resume it: {answer.get('message')}; it stays suspended, its variables "
                               "safe in host memory")
        if not answer.get("resumed") and record is None:
            raise Refused(409, "it is not suspended: nothing to resume")
        self.suspended.pop(kernel_id, None)
        kernel.last_activity = utcnow()  # the user's doing: idle culling and release count from now
        seconds = time.perf_counter() - t0
        self._remember_resume(kernel_id, record, by, seconds)
        return {"status": "ok", "kernel_id": kernel_id, "resumed": True, "seconds": round(seconds, 4),
                "steps": answer.get("steps") or {}, "moved_back": {str(o): b for o, b in (record.moved if record
                                                                                          else {}).items()}}

    async def _ask_kernel_to_resume(self, kernel) -> dict | None:
        """The kernel's own resume, or None when it cannot answer (then the helper restores it).
        The kernel answers RESUME only once it has restored itself (a minute for a full H200), so
        whether it answers at all is asked first, within kernel_query_timeout: a kernel whose
        control thread is stuck, or that lacks gpuctx, is not given suspend_timeout to say nothing."""
        if (await kernel_query.ask(kernel, self.cfg.kernel_query_timeout)).get("status") != "ok":
            return None
        try:
            reply = await kernel_client.request(kernel, "control", contract.RESUME_REQUEST, {},
                                                self.cfg.suspend_timeout)
        except Exception:  # noqa: BLE001 — no answer: the caller restores through the helper
            return None
        if reply.get("msg_type") != contract.RESUME_REPLY:
            return None
        return reply.get("content") or {}

    def _remember_resume(self, kernel_id: str, record: Suspended | None, by: str, seconds: float | None) -> None:
        entry = {"kernel_id": kernel_id, "by": by, "time": self.clock(), "seconds": seconds,
                 "moved_total": record.moved_total if record else None,
                 "paths": list(record.paths) if record else []}
        self.resumed = (self.resumed + [entry])[-50:]
        self.log.info("gpuctx: kernel %s (%s) resumed by %s%s", kernel_id,
                      ", ".join(entry["paths"]) or "?", by, f" in {seconds:.2f} s" if seconds is not None else "")

    # -- keeping the table true ----------------------------------------------------------------------
    async def watch(self) -> None:
        """Forget kernels that ended, restarted, or resumed themselves (activity since the suspend,
        and then their own answer says they run: a late message that counts as activity costs one
        question)."""
        km = self.serverapp.kernel_manager
        for kernel_id, record in list(self.suspended.items()):
            if kernel_id not in km:
                self.suspended.pop(kernel_id, None)
                continue
            kernel = km.get_kernel(kernel_id)
            if kernel_pid(kernel) != record.local_pid:
                self.suspended.pop(kernel_id, None)
                continue
            await self._resumed_itself(kernel_id, kernel, record)

    async def _resumed_itself(self, kernel_id: str, kernel, record: Suspended) -> bool:
        """Whether the kernel has restored itself for a request since its suspend (then it is
        forgotten here): asked of the kernel only when there was activity since."""
        last = getattr(kernel, "last_activity", None)  # gpuctx's own messages are not activity
        if last is None or getattr(last, "timestamp", lambda: 0.0)() <= record.since:
            return False
        try:
            reply = await kernel_client.request(kernel, "control", contract.REQUEST, {},
                                                self.cfg.kernel_query_timeout)
        except Exception:  # noqa: BLE001 — try again next round
            return False
        state = ((reply.get("content") or {}).get("suspend") or {}).get("state", "running")
        if state != "running":
            return False
        if self.suspended.get(kernel_id) is record:
            self.suspended.pop(kernel_id, None)
            self._remember_resume(kernel_id, record, "the notebook (its next request)", None)
        return True

    def is_suspended(self, kernel_id: str) -> bool:
        return kernel_id in self.suspended

    def forget(self, kernel_id: str) -> None:
        self.suspended.pop(kernel_id, None)

    # -- where suspended kernels show ------------------------------------------------------------------
    def info(self, kernel_id: str) -> dict | None:
        """What the holders file says of a suspended kernel (contract.holders.Holder.suspended)."""
        record = self.suspended.get(kernel_id)
        return record.holder_info() if record else None

    def annotate(self, snap: dict) -> dict:
        """Add "suspend", "suspended" and each device's "suspended" to a /gpuctx/api/devices snapshot."""
        support = self._support
        snap["suspend"] = {"available": bool(support and support.available),
                           "reason": support.reason if support else "asking the CUDA driver what it offers…",
                           "lock_timeout_s": self.cfg.suspend_lock_timeout}
        records = list(self.suspended.values())
        snap["suspended"] = [r.as_dict() for r in records]
        for device in snap.get("devices", []):
            ordinal = device.get("ordinal")
            device["suspended"] = [
                {"kernel": {"id": r.kernel_id, "name": r.name, "paths": list(r.paths)}, "bytes": r.moved[ordinal],
                 "since": r.since, "text": suspended_text(r.moved[ordinal], r.since)}
                for r in records if r.moved.get(ordinal)]
        if isinstance(snap.get("holders"), dict):
            snap["holders"]["resumed"] = self.resumed[-5:]
        return snap


# -- culling and the pressure release that suspend (cull_idle_gpu_kernels_action, pressure_action) -----
def culling(actions) -> Callable[[str], Awaitable[None]]:
    """What GpuCuller calls instead of shutting an idle holder down: a refusal is its failure."""
    async def suspend_idle(kernel_id: str) -> None:
        try:
            await run(actions, "suspend", kernel_id, by="culling")
        except Refused as exc:
            raise RuntimeError(exc.message) from None

    return suspend_idle


def pressure(actions) -> Callable[[str], Awaitable[dict]]:
    """What PressureRelease calls instead of releasing a kernel's cache: an answer of its shape."""
    async def suspend_under_pressure(kernel_id: str) -> dict:
        try:
            answer = await run(actions, "suspend", kernel_id, by="pressure")
        except Refused as exc:
            return {"status": "refused", "reason": exc.message}
        return {"status": "ok", "released_total": answer["moved_total"]}

    return suspend_under_pressure


def held_by(inv: Inventory, pids: frozenset[int] | set[int]) -> dict[int, int]:
    """CUDA ordinal -> bytes NVML lists for these processes."""
    out: dict[int, int] = {}
    for d in inv.devices:
        used = sum(p.used_memory or 0 for p in d.record.processes if p.pid in pids)
        if used:
            out[d.ordinal] = used
    return out


def _uuids(inv: Inventory, per_ordinal: dict[int, int]) -> dict[str, int]:
    out = {}
    for ordinal, n in per_ordinal.items():
        device = inv.by_ordinal(ordinal)
        if device is not None:
            out[device.record.uuid] = n
    return out


async def _alive(kernel) -> bool:
    try:
        alive = kernel.is_alive()
        return bool(await alive if asyncio.iscoroutine(alive) else alive)
    except Exception:  # noqa: BLE001
        return False
