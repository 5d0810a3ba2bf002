"""The server's way to the CUDA driver's process checkpoint API: one helper process per action.

`Checkpointer` is what the suspend logic (server/suspend.py) needs of the driver; `HelperCheckpointer`,
its implementation, runs `python -m gpuctx_jupyter.checkpoint ACTION PID …` (core/checkpoint.py)
as an asyncio subprocess, so that the event loop never waits on the driver and a driver fault or
a call that never returns costs a helper, not the server; an action that is cancelled (a restart
or shutdown of the kernel pre-empts it: lifecycle.py) kills its helper and waits for its end at
most KILL_WAIT_S: a helper inside a driver call that does not return (uninterruptible, D state)
dies only once that call returns, and a restart must not wait for that (asyncio's child watcher
reaps it whenever it ends; the log says which helper was left). On a machine without a
GPU the same helper loads the stand-in libcuda the tests build (GPUCTX_LIBCUDA), so the CPU suite
drives this code unchanged. Every outcome is a value (core.checkpoint.Outcome), never an exception.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Protocol

from ..core.checkpoint import Outcome, Support, helper_command

KILL_WAIT_S = 3.0  # a killed helper's end is awaited this long at most (one stuck in the driver outlives SIGKILL)


class NotStarted(OSError):
    """The helper process could not be started (no such Python, no memory to fork): it did nothing."""


class Checkpointer(Protocol):
    async def support(self) -> Support: ...

    async def state(self, pid: int) -> Outcome: ...

    async def suspend(self, pid: int, lock_timeout_ms: int, token: str) -> Outcome: ...

    async def resume(self, pid: int, need: dict[str, int] | None = None) -> Outcome: ...


class HelperCheckpointer:
    """Each call runs one helper process (~0.1 s to start and load the driver, measured on the H200)."""

    def __init__(self, python: str | None = None, timeout: float = 900.0, log=None):
        self.python, self.timeout = python, timeout
        self.log = log or logging.getLogger(__name__)

    async def _run(self, action: str, pid: int, *extra: str, timeout: float | None = None) -> tuple[dict, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *helper_command(action, pid, *extra, python=self.python),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)  # a signal to the server's process group is not the helper's
        except OSError as exc:
            raise NotStarted(f"could not start the checkpoint helper: {type(exc).__name__}: {exc}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout or self.timeout)
        except asyncio.TimeoutError:
            await self._kill(proc, action, pid)
            return {}, f"the checkpoint helper did not finish within {timeout or self.timeout:g} s"
        except asyncio.CancelledError:  # a restart or shutdown pre-empted the action: the helper goes with it
            await self._kill(proc, action, pid)
            raise
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        why = "" if answer else f"the checkpoint helper failed: {err.decode(errors='replace').strip()[-400:]}"
        return (answer if isinstance(answer, dict) else {}), why

    async def support(self) -> Support:
        try:
            answer, why = await self._run("support", 0, timeout=60)
        except NotStarted as exc:
            return Support(False, str(exc))
        if "available" not in answer:
            return Support(False, why or "the checkpoint helper gave no answer")
        return Support(bool(answer["available"]), str(answer.get("reason", "")), answer.get("cuda_driver_version"),
                       answer.get("display_driver"), tuple(answer.get("missing") or ()))

    async def _outcome(self, action: str, pid: int, *extra: str, timeout: float | None = None,
                       unchanged: str = "unknown") -> Outcome:
        """The helper's outcome; one that could not start leaves the process as it was (`unchanged`)."""
        try:
            answer, why = await self._run(action, pid, *extra, timeout=timeout)
        except NotStarted as exc:
            return Outcome(False, unchanged, {}, str(exc))
        if "ok" not in answer:
            return Outcome(False, "unknown", {}, why or "the checkpoint helper gave no answer")
        return Outcome(bool(answer["ok"]), str(answer.get("state", "unknown")), dict(answer.get("steps") or {}),
                       answer.get("error"), answer.get("error_name"), bool(answer.get("unwound")))

    async def state(self, pid: int) -> Outcome:
        return await self._outcome("state", pid, timeout=60)

    async def suspend(self, pid: int, lock_timeout_ms: int, token: str) -> Outcome:
        return await self._outcome("suspend", pid, "--lock-timeout-ms", str(int(lock_timeout_ms)), "--token", token,
                                   unchanged="running")  # (a suspend is asked of a running process only)

    async def resume(self, pid: int, need: dict[str, int] | None = None) -> Outcome:
        extra = [word for uuid, n in (need or {}).items() for word in ("--need", f"{uuid}={int(n)}")]
        return await self._outcome("resume", pid, *extra)

    async def _kill(self, proc, action: str, pid: int) -> None:
        """SIGKILL the helper; wait for its end KILL_WAIT_S at most, then leave it (logged)."""
        try:
            proc.kill()
        except ProcessLookupError:  # it ended meanwhile
            return
        try:
            await asyncio.wait_for(proc.wait(), KILL_WAIT_S)
        except asyncio.TimeoutError:
            self.log.warning("gpuctx: the checkpoint helper %s (%s of pid %s) has not ended %g s after SIGKILL: "
                             "it is inside a driver call that has not returned; it is left to end with that call",
                             proc.pid, action, pid, KILL_WAIT_S)
