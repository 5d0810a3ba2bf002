"""Opt-in culling of idle GPU holders: jupyter_server's idle culler, but only for kernels that hold
GPU memory (c.GpuctxServer.cull_idle_gpu_kernels_after, 0 = off).

Run after each holders round (Holders.consumers). A kernel of this server that NVML lists on some
GPU and that has had no user activity (gpuctx's own requests do not count) for the configured time
is shut down through the kernel manager — so through the lifecycle's Actions, one action per
kernel at a time; none while another action is in flight on it (a resume, whose memory NVML lists
again as it comes back; a restart) — with one log line naming the notebook and the memory freed (or, with
c.GpuctxServer.cull_idle_gpu_kernels_action = "suspend", suspended: `shutdown` is then suspend.py's
and `action` says so). A kernel running a cell is never culled. Each shutdown or suspend runs
as a background task of its own (`tasks.Background.spawn_once`, one per kernel at a time), so the
round goes on at once: a suspend takes about a minute for a full H200 (more if the driver hangs),
and the holders file, the API's holders and the pressure release must not wait for it. The time
each holder will be culled is kept in `cull_at` for the GPU API, which the panel shows as a
notification from cull_warning_seconds before. The clock is injected, so tests drive it.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import replace

from ..contract.holders import Holder
from ..core.inventory import Inventory
from .tasks import Background


class GpuCuller:
    def __init__(self, after: float, shutdown: Callable[[str], object], clock: Callable[[], float] = time.time,
                 log=None, warning_s: float = 600.0, action: str = "shutdown", background: Background | None = None,
                 busy: Callable[[str], object] = lambda _kernel_id: None,
                 live: Callable[[str], tuple[str | None, float | None] | None] = lambda _kernel_id: None):
        if after < 0 or warning_s < 0:
            raise ValueError("cull times must be 0 (off) or positive seconds")
        self.after, self.warning_s = after, warning_s
        self.shutdown, self.clock, self.log = shutdown, clock, log
        self.action = action  # or "suspend": what `shutdown` does, for the log and the entries
        self.background = background or Background(log)  # the extension's: awaited at server shutdown
        self.busy = busy  # the action in flight on a kernel (lifecycle.Actions.busy): none is culled then
        # A kernel's execution state and last activity now (None: unknown). The holders were read
        # before the round's other consumers, and the pressure release awaits evictions first: a
        # resume that ended meanwhile made the kernel active, which the holder does not show.
        self.live = live
        self.cull_at: dict[str, float] = {}  # kernel id -> epoch seconds it will be culled at
        self.culled: list[dict] = []  # newest last (bounded)

    @property
    def on(self) -> bool:
        return self.after > 0

    async def __call__(self, inv: Inventory, holders: list[Holder], held: dict[str, dict[int, int]]) -> list[str]:
        """Start culling the holders idle long enough; the ids of those started (the outcome is
        logged, and kept in `culled`, once each action ends)."""
        if not self.on:
            self.cull_at = {}
            return []
        now = self.clock()
        cull_at, started = {}, []
        for h in holders:
            on = held.get(h.id)
            if h.standby or not on or not sum(on.values()) or self.busy(h.id):  # (a resume, a restart: the user's)
                continue
            h = self._fresh(h)
            idle = h.idle_at(now, now)
            if idle is None:
                continue
            if h.execution_state == "busy" or idle < self.after:
                cull_at[h.id] = now + (self.after - (0.0 if h.execution_state == "busy" else idle))
                continue
            if self.background.spawn_once(h.id, lambda h=h, idle=idle, on=dict(on): self._cull(h, idle, on, now),
                                          f"culling kernel {h.id}"):
                started.append(h.id)
        self.cull_at = cull_at
        return started

    def _fresh(self, h: Holder) -> Holder:
        """`h` with its kernel's execution state and last activity as they are now."""
        now = self.live(h.id)
        if now is None:
            return h
        state, last = now
        return replace(h, execution_state=state or h.execution_state,
                       last_activity=max(last, h.last_activity or 0.0) if last is not None else h.last_activity)

    async def _cull(self, h: Holder, idle: float, on: dict[int, int], now: float) -> None:
        h = self._fresh(h)  # (its task starts a moment after the round: the user may have come back)
        if self.busy(h.id) or h.execution_state == "busy" or (h.idle_at(self.clock(), self.clock()) or 0) < self.after:
            return
        freed = sum(on.values())
        where = ", ".join(f"{_gib(v)} on cuda:{o}" for o, v in sorted(on.items()))
        try:
            result = self.shutdown(h.id)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # noqa: BLE001 — gone meanwhile, or the manager refused: say so
            self._log("warning", "gpuctx: could not %s idle kernel %s (%s): %s: %s",
                      "cull" if self.action == "shutdown" else self.action, h.id, h.label(),
                      type(exc).__name__, exc)
            return
        entry = {"kernel_id": h.id, "label": h.label(), "idle_s": round(idle), "freed": freed, "time": now,
                 "action": self.action}
        self.culled = (self.culled + [entry])[-50:]
        self._log("info", "gpuctx: %s kernel %s (%s), idle %d s, holding %s of GPU memory (%s) — "
                  "c.GpuctxServer.cull_idle_gpu_kernels_after = %g",
                  "culled" if self.action == "shutdown" else "suspended idle", h.id, h.label(), idle,
                  _gib(freed), where, self.after)

    def warnings(self) -> dict[str, float]:
        """The kernels to be culled within the warning time: id -> seconds left."""
        now = self.clock()
        return {k: max(0.0, t - now) for k, t in self.cull_at.items() if t - now <= self.warning_s}

    def _log(self, level: str, *args) -> None:
        if self.log is not None:
            getattr(self.log, level)(*args)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
