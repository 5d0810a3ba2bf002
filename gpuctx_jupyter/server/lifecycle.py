"""The one place that changes the server's kernel manager methods: an explicit, ordered chain.

How a kernel is launched is the provisioner's (`provisioner.py`). What a provisioner cannot see
is here, wrapped once, in this order, around jupyter_server's own methods:

  interrupt / restart / shutdown   1. one action per kernel at a time (below)
                                   2. a suspended kernel (suspend.py), or one whose suspend or
                                      resume was pre-empted, is restarted or shut down at once
                                      (now=True), and forgotten as suspended
                                   3. gateway kernels: the warm-up request after a (re)start
  start                            2. gateway kernels: the warm-up request after the start
  shutdown_all                     (once; also when no kernel is open: jupyter_internals.py)
                                   the warm pool's processes first, then the holders round and
                                   the notebook reader stop, suspends and resumes in flight are
                                   pre-empted and their kernels, with the suspended ones, shut
                                   down at once (jupyter_server's shutdown_all would ask each
                                   politely), every background task is awaited, then
                                   jupyter_server's own shutdown of the other kernels

One action at a time per kernel: jupyter_client restarts a kernel by stopping its process and
starting a new one on the same ports: two restarts at once both stop the same process, and the
second start finds its ports taken ("Address already in use"), leaving a process that no one
tracks. So every action on a kernel — gpuctx's routes, jupyter_server's own
/api/kernels/<id>/restart, the idle culler, a session deleted, and gpuctx's suspend and resume
(suspend.py: actions of this table, not wrappers) — goes through `Actions`:

- an action asked while the same action is in flight on that kernel joins it: both callers get
  its outcome, and the kernel is restarted (or stopped) once;
- a restart or shutdown pre-empts a suspend or resume in flight: the suspend's task is cancelled
  (its checkpoint helper killed with it) and its callers get `Preempted` (a 409 that says why),
  then the kernel's process is stopped at once (now=True: it may be locked or checkpointed, and
  its control thread may be what hangs), it is forgotten as suspended, and the log says so.
  Restart and shutdown are how a user gets out of a stuck kernel; a suspend may take minutes
  (c.GpuctxServer.suspend_timeout) when the driver or the kernel hangs. Its unwinding is waited
  for UNWIND_S at most (a helper inside a driver call that does not return outlives SIGKILL):
  then its callers get `Preempted` all the same, the restart goes on, and the log says what was
  left to unwind;
- any other action waits for the one in flight, then runs — unless that one ended the kernel: a
  restart queued behind a shutdown then does nothing, and jupyter_server answers 404 for a kernel
  that no longer exists, as it would had the restart come later;
- gpuctx's own routes do not wait: they answer 409 with a message (`Busy`) — but their restart
  and shutdown pre-empt a suspend or resume as jupyter_server's do.

A restart is in flight until the new kernel answers kernel_info (`Actions._until_answered`).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from jupyter_core.utils import ensure_async
from tornado import web

from . import kernel_client

ACTIONS = ("restart_kernel", "shutdown_kernel", "interrupt_kernel")
# what each action pre-empts (cancels) rather than waits for: the recovery actions end the long ones
PREEMPTS = {"restart_kernel": ("suspend_kernel", "resume_kernel"),
            "shutdown_kernel": ("suspend_kernel", "resume_kernel")}
UNWIND_S = 5.0  # a cancelled action's unwinding is waited for this long at most, then left to end alone


class Busy(Exception):
    """Another action on this kernel is in flight (the caller asked not to wait)."""

    def __init__(self, action: str):
        super().__init__(f"an action on this kernel is in progress ({action.replace('_kernel', '')}): "
                         "try again once it has finished")
        self.action = action


class Gone(Exception):
    """The kernel ended while this action waited for its turn."""


class Preempted(Exception):
    """This action was stopped by another that pre-empts it (a restart or shutdown of the kernel)."""

    def __init__(self, action: str, by: str):
        super().__init__(f"{_verb(action)} stopped: the kernel is being {_done(by)}")
        self.action, self.by = action, by


def _verb(action: str) -> str:
    return {"suspend_kernel": "the suspend was", "resume_kernel": "the resume was"}.get(action, f"{action} was")


def _done(action: str) -> str:
    return {"restart_kernel": "restarted", "shutdown_kernel": "shut down"}.get(action, action)


@dataclass
class _InFlight:
    method: str
    outcome: asyncio.Future  # what every caller of this action gets
    work: asyncio.Task | None = None  # the method itself, cancelled when pre-empted
    preempted_by: str | None = None
    preempted: str | None = None  # the action this one stopped before it ran
    cancelled: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Actions:
    """One action per kernel at a time (see the module's docstring)."""

    def __init__(self, mkm, methods: dict, preempts: dict | None = None, log=None):
        self.mkm, self.log = mkm, log
        self._next = methods  # method name -> the wrapped kernel manager's own method
        self._preempts = preempts or {}  # method name -> the methods in flight it cancels
        self._inflight: dict[str, _InFlight] = {}  # kernel id -> the action in flight

    def busy(self, kernel_id: str) -> str | None:
        """The method in flight on this kernel, if any."""
        current = self._inflight.get(kernel_id)
        return current.method if current else None

    def preempted(self, kernel_id: str) -> str | None:
        """The action that the one now running on this kernel stopped, if any."""
        current = self._inflight.get(kernel_id)
        return current.preempted if current else None

    async def run(self, method: str, kernel_id: str, *args, wait: bool = True, **kwargs):
        """Run `method` on the kernel once no other action is in flight on it (pre-empting one it
        stops, wait or not); with wait=False, raise Busy instead of waiting. Gone when the kernel ended
        while this one waited; Preempted when another action stopped this one."""
        waited, stopped = False, None
        while (current := self._inflight.get(kernel_id)) is not None:
            if self._stop(current, method):
                stopped = current.method  # not a wait: it ends as soon as its cancellation has unwound
            elif not wait:
                raise Busy(current.method)
            elif current.method == method:
                return await asyncio.shield(current.outcome)
            await asyncio.wait([current.outcome])  # its outcome is its own callers'; then our turn
            waited = True
        if waited and kernel_id not in self.mkm:
            raise Gone(kernel_id)
        entry = _InFlight(method, asyncio.get_running_loop().create_future(), preempted=stopped)
        self._inflight[kernel_id] = entry
        if stopped and self.log is not None:
            self.log.warning("gpuctx: kernel %s: %s stopped its %s in flight; its process is stopped at once",
                             kernel_id, method.replace("_kernel", ""), stopped.replace("_kernel", ""))
        try:
            entry.work = asyncio.ensure_future(ensure_async(self._next[method](kernel_id, *args, **kwargs)))
            try:
                await asyncio.wait([entry.work, entry.cancelled], return_when=asyncio.FIRST_COMPLETED)
                await self._unwound(kernel_id, entry)
            except asyncio.CancelledError:  # our caller gave up: so does the method, before the next action
                self._cancel(entry)
                await self._unwound(kernel_id, entry)
                raise
            if entry.work.cancelled() or not entry.work.done():
                raise Preempted(method, entry.preempted_by or "stopped")
            result = entry.work.result()
            if isinstance(result, asyncio.Future) and not result.done():
                await self._until_answered(kernel_id, result)
        except asyncio.CancelledError:
            entry.outcome.cancel()
            raise
        except BaseException as exc:
            entry.outcome.set_exception(exc)
            entry.outcome.exception()  # retrieved: a failure nobody joined is not "never retrieved"
            raise
        else:
            entry.outcome.set_result(result)
            return result
        finally:
            if self._inflight.get(kernel_id) is entry:
                del self._inflight[kernel_id]

    def _stop(self, entry: _InFlight, by: str) -> bool:
        """Cancel `entry` if `by` pre-empts it (once); whether it does."""
        if entry.method not in self._preempts.get(by, ()) or entry.work is None:
            return False
        if entry.preempted_by is None:
            entry.preempted_by = by
            self._cancel(entry)
        return True

    @staticmethod
    def _cancel(entry: _InFlight) -> None:
        entry.work.cancel()
        if not entry.cancelled.done():
            entry.cancelled.set_result(None)

    async def _unwound(self, kernel_id: str, entry: _InFlight) -> None:
        """Once its method is cancelled, until it has unwound, UNWIND_S at most: then it is left to
        end on its own (a helper stuck in a driver call outlives SIGKILL), and the log says so."""
        if entry.work.done():
            return
        await asyncio.wait([entry.work], timeout=UNWIND_S)
        if entry.work.done():
            return
        entry.work.add_done_callback(lambda t: t.cancelled() or t.exception())  # its end is no one's to read
        if self.log is not None:
            self.log.warning("gpuctx: kernel %s: its %s, stopped, had not ended %g s later (a call that does "
                             "not return, such as a driver call); left to end on its own", kernel_id,
                             entry.method.replace("_kernel", ""), UNWIND_S)

    def stop_all(self, by: str) -> list[str]:
        """Pre-empt every action in flight that `by` pre-empts (the server's shutdown, before it
        awaits its background tasks: a hung suspend must not hold it up); their kernels' ids."""
        return [kernel_id for kernel_id, entry in list(self._inflight.items()) if self._stop(entry, by)]

    async def _until_answered(self, kernel_id: str, restarted: asyncio.Future) -> None:
        """A restart is in flight until the new kernel answers kernel_info. jupyter_server's restart
        returns a future for that, which a restart onto new ports (a standby's, or the restarter's
        newports) never resolves: jupyter_server's stop_watching_activity cleans its wait up. So
        the kernel is asked here too, on a client of our own (tries that wait longer each time: a
        loaded kernel may answer each in over a second); whichever answers first."""
        timeout = float(getattr(self.mkm, "kernel_info_timeout", 60.0))
        kernel = kernel_client.find(self.mkm, kernel_id)
        if kernel is None:
            return

        asked = asyncio.ensure_future(kernel_client.answered(kernel, "shell", "kernel_info_request", {}, timeout))
        asked.add_done_callback(lambda t: t.cancelled() or t.exception())  # (no answer: the wait's timeout says it)
        try:
            await asyncio.wait([restarted, asked], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.cancel()


class Lifecycle:
    """Installs the chain (see the module's docstring) on the server's kernel manager, once."""

    def __init__(self, mkm, launcher, background, pool=None, gateway: bool = False, on_shutdown=(), suspend=None):
        self.mkm, self.launcher, self.background, self.pool, self.gateway = mkm, launcher, background, pool, gateway
        self.suspend = suspend  # suspend.SuspendManager: its suspend and resume are actions too
        self.on_shutdown = list(on_shutdown)  # called after the pool is closed, before the tasks are awaited
        self._shut_down = False
        self._own = {name: getattr(mkm, name) for name in (*ACTIONS, "start_kernel", "shutdown_all")}
        methods = {"interrupt_kernel": self._own["interrupt_kernel"], "restart_kernel": self._restart,
                   "shutdown_kernel": self._shutdown}
        if suspend is not None:
            methods.update(suspend_kernel=suspend.suspend, resume_kernel=suspend.resume)
        self.actions = Actions(mkm, methods, PREEMPTS if suspend is not None else None, log=getattr(mkm, "log", None))

    def install(self) -> None:
        mkm = self.mkm
        mkm.start_kernel = self.start_kernel
        mkm.restart_kernel = self.restart_kernel
        mkm.shutdown_kernel = self.shutdown_kernel
        mkm.interrupt_kernel = self.interrupt_kernel
        mkm.shutdown_all = self.shutdown_all

    async def start_kernel(self, *args, **kwargs):
        kernel_id = await ensure_async(self._own["start_kernel"](*args, **kwargs))
        if self.gateway:
            name = kwargs.get("kernel_name") or getattr(self.mkm, "default_kernel_name", "python3")
            await self.launcher.gateway_started(kernel_id, name, kwargs.get("env"))
        return kernel_id

    async def restart_kernel(self, kernel_id, *args, **kwargs):
        try:
            return await self.actions.run("restart_kernel", kernel_id, *args, **kwargs)
        except Gone:  # jupyter_server then answers 404 ("Kernel does not exist"), not 500
            return None

    async def _restart(self, kernel_id, *args, **kwargs):
        result = await self._at_once_if_suspended("restart_kernel", kernel_id, *args, **kwargs)
        if self.gateway:
            self.launcher.warm_remote(kernel_id)
        return result

    async def _shutdown(self, kernel_id, *args, **kwargs):
        return await self._at_once_if_suspended("shutdown_kernel", kernel_id, *args, **kwargs)

    async def _at_once_if_suspended(self, method: str, kernel_id, *args, **kwargs):
        """A suspended kernel's process is stopped at once: asked to exit politely it would wait,
        checkpointed, for the CUDA teardown (and a restart must not restore it first). So is one
        whose suspend or resume this action pre-empted: it may be locked or checkpointed, and its
        control thread may be what hung."""
        at_once = self.suspend is not None and (self.suspend.is_suspended(kernel_id)
                                                or self.actions.preempted(kernel_id) is not None)
        if at_once and not args:
            kwargs["now"] = True
        result = await ensure_async(self._own[method](kernel_id, *args, **kwargs))
        if at_once:
            self.suspend.forget(kernel_id)
        return result

    async def shutdown_kernel(self, kernel_id, *args, **kwargs):
        try:
            return await self.actions.run("shutdown_kernel", kernel_id, *args, **kwargs)
        except Gone:
            return None

    async def interrupt_kernel(self, kernel_id, *args, **kwargs):
        try:
            return await self.actions.run("interrupt_kernel", kernel_id, *args, **kwargs)
        except Gone:
            raise web.HTTPError(404, f"Kernel does not exist: {kernel_id}") from None

    async def shutdown_all(self, *args, **kwargs):
        if not self._shut_down:  # gpuctx's part once (the server's stop may ask twice: jupyter_internals)
            self._shut_down = True
            if self.pool is not None:
                await self.pool.close()
            for stop in self.on_shutdown:
                stop()
            await self._shutdown_at_once()
            await self.background.drain()
        return await ensure_async(self._own["shutdown_all"](*args, **kwargs))

    async def _shutdown_at_once(self) -> None:
        """Kernels whose suspend or resume is in flight (pre-empted here) and suspended ones are shut
        down at once (now=True), before jupyter_server's shutdown_all: it calls its own shutdown
        of each, not this chain, and would ask them politely (a wait of shutdown_wait_time each)."""
        if self.suspend is None:
            return
        stopping = self.actions.stop_all("shutdown_kernel")
        suspended = {kid for kid in self.mkm.list_kernel_ids() if self.suspend.is_suspended(kid)}
        at_once = sorted(set(stopping) | suspended)
        results = await asyncio.gather(*(self.shutdown_kernel(kid, now=True) for kid in at_once),
                                       return_exceptions=True)
        log = getattr(self.mkm, "log", None)
        for kid, result in zip(at_once, results):
            if isinstance(result, Exception) and log is not None:
                log.warning("gpuctx: kernel %s could not be shut down at once: %s: %s", kid,
                            type(result).__name__, result)
