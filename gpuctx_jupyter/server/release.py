"""Giving GPU memory back without losing work: the "Release cached memory" kernel action (the
route is in routes/kernels.py), and the automatic release when a GPU runs short.

Release asks a kernel, on its control channel (contract.RELEASE_REQUEST), to run what `%gpu free`
runs: drop the references a failed cell keeps alive, collect garbage, return the frameworks'
cached blocks to the GPU. The notebook's variables (its tensors included) are never touched. The
control channel answers while a cell runs, so a busy kernel can be asked too.

Automatic release (`PressureRelease`, run after each holders round): when a GPU's free memory falls
below c.GpuctxServer.release_below_free_fraction of its total (or one of this server's kernels has
just run out of memory on it, as that kernel reports), the warm pool's standbys on it go
first (`pool.evict(ordinal)`), then the caches of this server's kernels on it that have been idle
(no user activity) for release_idle_seconds; with release_idle_after set, any kernel idle that long
has its cache released whatever the pressure. A kernel is released once per idle stretch: again
only after it has been active since. With c.GpuctxServer.pressure_action = "suspend" the idle
kernels on a GPU that runs short are suspended instead (`release_kernel` is then suspend.py's,
`action` says so); release_idle_after still only releases caches (`idle_release`). Each
release or suspend runs as a background task of its own (one per kernel at a time), so the round
goes on at once — a suspend takes about a minute for a full H200 — and one that fails (the kernel
shut down since the round began) is an answer like any other: `{"status": "error", "reason"}`,
logged once, kept in `history`, the others released all the same.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable

from ..contract import RELEASE_REPLY, RELEASE_REQUEST
from ..contract.holders import Holder
from ..core.inventory import Inventory
from . import kernel_query
from .tasks import Background


async def release(kernel, timeout: float) -> dict:
    """The kernel's release reply (`{"status": "ok", "released_total": …, …}`), or why there is
    none, as an answer (never an exception)."""
    t0 = time.perf_counter()
    content = await kernel_query.control(kernel, RELEASE_REQUEST, RELEASE_REPLY, timeout, "nothing to release")
    if content.get("status") == "ok":
        content["round_trip_s"] = round(time.perf_counter() - t0, 4)
    return content


# -- automatic release -----------------------------------------------------------------------------
EVICT_EVERY_S = 30.0  # ask the pool to evict a GPU's standbys at most this often while it stays short
Evict = Callable[[int], object]  # may return an awaitable
ReleaseKernel = Callable[[str], Awaitable[dict]]


class PressureRelease:
    """Run after each holders round (Holders.consumers): see the module's docstring."""

    def __init__(self, below_free_fraction: float, idle_seconds: float, idle_after: float,
                 release_kernel: ReleaseKernel, evict: Evict | None = None, clock=time.time, log=None,
                 min_cache: int = 64 * 2**20, recent_oom: Callable[[int], bool] | None = None,
                 action: str = "release", background: Background | None = None,
                 idle_release: ReleaseKernel | None = None):
        self.below, self.idle_seconds, self.idle_after = below_free_fraction, idle_seconds, idle_after
        self.release_kernel, self.evict, self.clock, self.log = release_kernel, evict, clock, log
        self.min_cache = min_cache
        self.recent_oom = recent_oom  # ordinal -> a kernel of this server ran out of memory there lately
        self._evicted_at: dict[int, float] = {}  # ordinal -> when standbys were last evicted there
        self.action = action  # or "suspend" (c.GpuctxServer.pressure_action): what release_kernel does
        self.idle_release = idle_release or release_kernel  # release_idle_after's: a cache release, whatever `action`
        self.released: dict[str, float | None] = {}  # kernel id -> its last_activity when released
        self.history: list[dict] = []  # what was released, newest last (bounded)
        self.background = background or Background(log)  # the extension's: awaited at server shutdown

    def _due(self, h: Holder, now: float, idle_for: float) -> bool:
        if h.standby or h.execution_state == "busy":
            return False
        idle = h.idle_at(now, now)
        if idle is None or idle < idle_for:
            return False
        if h.id in self.released and self.released[h.id] == h.last_activity:
            return False  # released in this idle stretch already
        return True

    async def __call__(self, inv: Inventory, holders: list[Holder], held: dict[str, dict[int, int]]) -> list[str]:
        """Evict standbys where a GPU runs short, then start releasing (or suspending) the kernels
        due; the ids of those started (each outcome is logged, and kept in `history`, once it ends)."""
        now = self.clock()
        short, why_short = [], {}
        for d in inv.devices:
            r = d.record
            if self.below > 0 and r.memory_total and r.memory_free is not None and r.memory_free < self.below * r.memory_total:
                short.append(d.ordinal)
                why_short[d.ordinal] = f"cuda:{d.ordinal} had less than {self.below:.0%} free"
            elif self.below > 0 and self.recent_oom is not None and self.recent_oom(d.ordinal):
                short.append(d.ordinal)
                why_short[d.ordinal] = f"a notebook ran out of memory on cuda:{d.ordinal}"
        for ordinal in short:
            if now - self._evicted_at.get(ordinal, -EVICT_EVERY_S) < EVICT_EVERY_S:
                continue
            self._evicted_at[ordinal] = now
            if self.evict is not None:
                try:
                    result = self.evict(ordinal)
                    if inspect.isawaitable(result):
                        await result
                except Exception as exc:  # noqa: BLE001
                    self._log("warning", "gpuctx: evicting standbys from cuda:%s failed: %s", ordinal, exc)
        reasons: dict[str, tuple[str, str]] = {}  # kernel id -> (why, what is done: release or suspend)
        for h in holders:
            on = held.get(h.id, {})
            if not on:
                continue
            pressured = [o for o in on if o in short]
            if pressured and self._due(h, now, self.idle_seconds):
                reasons[h.id] = (why_short[pressured[0]], self.action)
            elif self.idle_after > 0 and self._due(h, now, self.idle_after):
                reasons[h.id] = (f"idle longer than release_idle_after={self.idle_after:g} s", "release")
        started = []
        for h in holders:
            if h.id not in reasons:
                continue
            why, action = reasons[h.id]
            cached = [c for c in (h.cached(o) for o in held.get(h.id, {})) if c is not None]
            if action == "release" and cached and sum(cached) < self.min_cache:
                self.released[h.id] = h.last_activity  # nothing worth asking for until it is active again
                continue
            if self.background.spawn_once(h.id, lambda h=h, why=why, act=action: self._release(h, why, now, act),
                                          f"{action} of kernel {h.id}"):
                self.released[h.id] = h.last_activity
                started.append(h.id)
        live = {h.id for h in holders}
        for gone in [k for k in self.released if k not in live]:
            del self.released[gone]
        return started

    async def _release(self, h: Holder, why: str, now: float, action: str) -> None:
        try:
            answer = await (self.release_kernel if action == self.action else self.idle_release)(h.id)
        except Exception as exc:  # noqa: BLE001 — e.g. shut down since the round began: an answer, logged below
            answer = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
        entry = {"kernel_id": h.id, "label": h.label(), "why": why, "time": now,
                 "idle_s": h.idle_at(now, now), "action": action,
                 **{k: answer.get(k) for k in ("status", "released_total", "reason")}}
        self.history = (self.history + [entry])[-50:]
        what = "of cached GPU memory in" if action == "release" else "of GPU memory by suspending"
        if answer.get("status") == "ok":
            self._log("info", "gpuctx: released %s %s %s (kernel %s, idle %s s): %s",
                      gib(answer.get("released_total")), what, h.label(), h.id, int(entry["idle_s"] or 0), why)
        else:
            self._log("warning", "gpuctx: could not %s %s (kernel %s): %s",
                      "release the cache of" if action == "release" else "suspend", h.label(), h.id,
                      answer.get("reason"))

    def _log(self, level: str, *args) -> None:
        if self.log is not None:
            getattr(self.log, level)(*args)


def gib(n) -> str:
    return f"{(n or 0) / 2**30:.2f} GiB"
