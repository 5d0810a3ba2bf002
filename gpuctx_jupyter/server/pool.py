"""A pool of standby kernels, started and warmed ahead of time, so that a new or restarted
notebook gets a GPU-ready kernel at once.

Two modes. The automatic reserve (the default, `pool_size` unset) keeps one warmed standby for
each kernelspec that a running GPU notebook uses, and none while no such notebook runs: warmed
with the plan of the notebook it is most likely to replace (the one used last) on that notebook's
device, started once that notebook's kernel has run `pool_reserve_after` s (so it never competes
with the notebook's own start), never holding a GPU below `pool_min_free_fraction` free or host
memory below reserve.HOST_FLOOR, and within `pool_gpu_budget_mib` (reserve.py decides these). `pool_size` = N keeps N standbys per
`pool_kernelspecs` entry regardless (0: no pool).

Standbys are jupyter_client KernelManagers that the server's MappingKernelManager does not list:
invisible in /api/kernels and sessions, out of the idle culler's reach. A new kernel request
adopts one (its working directory and environment set to what the server would have given a
fresh kernel), unless an environment variable that CUDA reads only at start-up differs: then a
fresh kernel starts. A restart swaps a standby in under the same kernel id and re-points the open
websockets at it. Refilling waits until the adopted kernel has served its first request.

A standby counts as ready once it answers kernel_info (a kernel that exits at once never does).
A kernelspec whose standbys cannot start (missing, bogus argv, exits at once) is retried with
exponential backoff up to RETRY_MAX_S, logged once per change of state, and `status()` says why
its reserve is empty. Every process the pool starts is tracked until the server owns it (adopted)
or it has stopped, and stopped with its connection file removed when the server exits.
"""
from __future__ import annotations

import asyncio
import atexit
import os
import signal
import time
from dataclasses import dataclass

from jupyter_server.utils import ensure_async

from ..contract import (
    ADOPT_REPLY,
    ADOPT_REQUEST,
    DEVICE,
    REQUEST,
    SESSION,
    WarmPlan,
    notebook_wants_gpu,
    opted_out,
    plan_vars,
)
from . import jupyter_internals as internals
from . import kernel_client
from .reserve import RESERVE, WARMED_KERNEL_MIB, Reserve
from .tasks import Background

# Read once, when CUDA (or the framework) starts: a standby started with other values cannot
# serve a kernel that should have had these.
CUDA_STARTUP_VARS = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "LD_LIBRARY_PATH",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
)
EVICT_PAUSE_S = 300.0  # after a GPU ran short of memory, no standby is started for this long
RETRY_FIRST_S, RETRY_MAX_S = 2.0, 300.0  # backoff after a standby failed to start: 2, 4, 8 … 300 s
REFILL_IDLE_S = 2.0  # an adopted kernel idle this long after its first request: refill now
HEALTHY_AFTER_S = 30.0  # a standby alive this long (or adopted) clears its kernelspec's failures
READY_TIMEOUT_S = 60.0  # a standby that does not answer kernel_info by then is given up
WARM_TIMEOUT_S = 120.0  # a standby still warming up by then counts as ready anyway


class StandbyFailed(Exception):
    """A standby kernel could not be started or did not come up."""


@dataclass
class SpecHealth:
    """How starting standbys of one kernelspec goes: failures in a row, and when to try next."""

    failures: int = 0
    error: str | None = None  # the last failure, while failing
    retry_at: float = 0.0  # time.monotonic()


@dataclass
class Standby:
    km: object
    kernel_name: str
    env: dict
    started: float  # time.monotonic()
    ready: bool = False
    notebook: str | None = None  # the notebook whose warm plan it ran (automatic reserve)

    @property
    def pid(self) -> int | None:
        return kernel_client.kernel_pid(self.km)


def _standby_ordinal(s: Standby) -> int:
    """The GPU a standby was warmed on, as planned: its plan's device, else CUDA's default."""
    try:
        return int(s.env.get(DEVICE) or 0)
    except ValueError:
        return 0


def compatible(standby_env: dict, wanted_env: dict) -> list[str]:
    """The CUDA start-up variables that differ (empty: the standby can serve)."""
    return [v for v in CUDA_STARTUP_VARS if standby_env.get(v) != wanted_env.get(v)]


class KernelPool:
    def __init__(self, serverapp, cfg, hook, log, background: Background):
        self.mkm, self.cfg, self.hook, self.log = serverapp.kernel_manager, cfg, hook, log
        self.standbys: list[Standby] = []
        self._starting: dict[str, int] = {}
        self._task: asyncio.Task | None = None
        self.background = background  # standbys starting, replaced kernels stopping
        self._closing = False
        self._next_start = self.mkm.start_kernel
        self._next_restart = self.mkm.restart_kernel
        self._next_shutdown_all = self.mkm.shutdown_all
        self.adopted: dict[str, float] = {}  # kernel id -> when it was handed out
        self.refused: list[str] = []  # why the last refusals happened (for status and tests)
        self.health: dict[str, SpecHealth] = {}  # kernelspec -> how starting its standbys goes
        self.unsupported: dict[str, str] = {}  # kernelspec -> why the pool keeps no standby for it
        self._owned: set = set()  # kernel managers the pool started and still owns (not adopted, not stopped)
        self._paused: dict[int, float] = {}  # GPU ordinal -> no refill there before (time.monotonic())
        self.auto = cfg.pool_size is None  # the automatic reserve
        self.reserve = Reserve(self.mkm, cfg, self._serves)  # which kernelspecs, for whom; memory floors
        self._short: str | None = None  # why no standby may start now (memory), while that lasts

    # -- wiring ---------------------------------------------------------------------------------
    def install(self) -> None:
        self.mkm.start_kernel = self.start_kernel
        self.mkm.restart_kernel = self.restart_kernel
        self.mkm.shutdown_all = self.shutdown_all
        atexit.register(self._kill_all)
        self._task = asyncio.ensure_future(self._maintain())

    def kernelspecs(self) -> list[str]:
        """The kernelspecs the pool keeps standbys for now."""
        if not self.auto:
            return list(self.cfg.pool_kernelspecs)
        return sorted(set(self.reserve.notebooks) | {s.kernel_name for s in self.standbys})

    def target(self, name: str | None = None) -> int:
        """Standbys to keep for kernelspec `name` (None: per kernelspec in use), within the
        GPU-memory budget. The automatic reserve keeps RESERVE while a GPU notebook uses it."""
        if self.cfg.warm_policy == "never":  # standbys are warmed kernels
            return 0
        if self.auto:
            specs = max(1, len(self.reserve.notebooks))
            n = RESERVE if name is None or name in self.reserve.notebooks else 0
        else:
            specs = max(1, len(self.cfg.pool_kernelspecs))
            n = self.cfg.pool_size
        if self.cfg.pool_gpu_budget_mib:
            n = min(n, self.cfg.pool_gpu_budget_mib // WARMED_KERNEL_MIB // specs)
        return max(0, n)

    def status(self) -> dict:
        """The pool as the GPU API shows it: per kernelspec, its standbys and, when it has none
        ready, why (`reason`)."""
        now = time.monotonic()
        specs = {}
        for name in self.kernelspecs():
            health = self.health.get(name, SpecHealth())
            ready = sum(1 for s in self.standbys if s.kernel_name == name and s.ready)
            specs[name] = {"ready": ready, "starting": self._starting.get(name, 0), "failures": health.failures,
                           "error": health.error, "reason": None if ready else self._empty_reason(name, now)}
            if self.auto:
                specs[name]["wanted_for"] = [nb.path for nb in self.reserve.notebooks.get(name, []) if nb.path]
        standbys = []
        for s in self.standbys:
            on = self.reserve.held_by(s.pid)
            standbys.append({"kernel_name": s.kernel_name, "pid": s.pid, "ready": s.ready,
                             "age": round(now - s.started, 1), "notebook": s.notebook,
                             "ordinal": max(on, key=on.get) if on else (_standby_ordinal(s) if self.reserve.gpus() else None),
                             "memory": sum(on.values()) if on else None})
        reason = None
        if self.auto and not self.standbys and not any(self._starting.values()):
            reason = self._auto_reason(now)
        return {"mode": "auto" if self.auto else "fixed", "target": self.target(), "kernelspecs": specs,
                "standbys": standbys, "refused": self.refused[-10:], "reason": reason,
                "min_free_fraction": self.cfg.pool_min_free_fraction}

    def _auto_reason(self, now: float) -> str | None:
        """Why the automatic reserve holds nothing, in a sentence (None: it is about to start one)."""
        if self._closing:
            return "the server is shutting down"
        if self.cfg.warm_policy == "never":
            return "warm_policy is 'never': standbys are warmed kernels, so the reserve keeps none"
        if not self.reserve.notebooks:
            if self.reserve.waiting(now):
                return (f"a GPU notebook's kernel started: the reserve starts once it has run "
                        f"{self.cfg.pool_reserve_after:g} s")
            return "no GPU notebook is running: the reserve starts once one runs"
        if self._short:
            return self._short
        for name in self.reserve.notebooks:
            why = self._empty_reason(name, now)
            if why:
                return why
        return None

    def _empty_reason(self, name: str, now: float) -> str:
        """Why a kernelspec has no standby ready, in a sentence."""
        health = self.health.get(name, SpecHealth())
        if self._closing:
            return "the server is shutting down"
        if self.auto and name not in self.reserve.notebooks:
            return "no GPU notebook of this kernelspec is running"
        if self.target(name) == 0:
            if self.cfg.warm_policy == "never":
                return "warm_policy is 'never': standbys are warmed kernels, so the pool keeps none"
            return (f"pool_gpu_budget_mib={self.cfg.pool_gpu_budget_mib} leaves no room for a standby "
                    f"(~{WARMED_KERNEL_MIB} MiB each)")
        if name in self.unsupported:
            return self.unsupported[name]
        if self._short:
            return self._short
        if health.error:
            wait = max(0.0, health.retry_at - now)
            return (f"standbys fail to start ({health.failures} in a row): {health.error}; "
                    f"next try in {wait:.0f} s")
        if any(until > now for until in self._paused.values()):
            return "a GPU ran short of memory: standbys were stopped to free it, refilling later"
        if self._starting.get(name):
            return "a standby is starting"
        if self.adopted:
            return "refilling once the kernel just handed out has served its first request"
        return "a standby will start shortly"

    # -- keeping the pool full ----------------------------------------------------------------
    async def _maintain(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the pool must never take the server down
                self.log.warning("gpuctx pool: %s", exc)
            await asyncio.sleep(1.0)

    async def _tick(self) -> None:
        now = time.monotonic()
        if self.auto:
            self.reserve.update(now)
        self._short = self.reserve.short()
        for s in list(self.standbys):
            dead = s.ready and not await ensure_async(s.km.is_alive())
            old = self.cfg.pool_max_age and now - s.started > self.cfg.pool_max_age
            unwanted = self.auto and s.kernel_name not in self.reserve.notebooks
            if dead or old or unwanted:
                self.standbys.remove(s)
                if dead:
                    self._failed(s.kernel_name, f"a standby kernel died ({_exit_status(s.km)})")
                elif unwanted:
                    self.log.info("gpuctx pool: no GPU notebook of %s runs any more: stopping its standby (pid %s)",
                                  s.kernel_name, s.pid)
                else:
                    self.log.info("gpuctx pool: recycling standby %s", s.pid)
                await self._shutdown(s)
            elif now - s.started > HEALTHY_AFTER_S:
                self._healthy(s.kernel_name)
        await self._keep_the_floor()
        for name in self.kernelspecs():
            have = sum(1 for s in self.standbys if s.kernel_name == name) + self._starting.get(name, 0)
            health = self.health.setdefault(name, SpecHealth())
            paused = any(until > now for until in self._paused.values())
            if (have < self.target(name) and now >= health.retry_at and name not in self.unsupported
                    and not paused and not self._short and not self._waiting_for_first_request()):
                self._starting[name] = self._starting.get(name, 0) + 1
                self.background.spawn(self._spawn(name), f"starting a standby {name} kernel")

    async def _keep_the_floor(self) -> None:
        """Stop the standbys on a GPU whose free memory fell below the floor, and every standby
        when the host runs short of memory."""
        short_host = self._short is not None and self._short.startswith("the host")
        for ordinal in sorted({o for s in self.standbys for o in self._gpus_of(s)}):
            if self.reserve.below_floor(ordinal):
                await self.evict(ordinal)
        if short_host and self.standbys:
            gone, self.standbys = self.standbys, []
            self.log.info("gpuctx pool: %s: stopping %d standby(s)", self._short, len(gone))
            await asyncio.gather(*(self._shutdown(s) for s in gone))

    def _gpus_of(self, s: Standby) -> set[int]:
        """The GPUs a standby holds memory on (NVML), else the one it was planned on."""
        return set(self.reserve.held_by(s.pid)) or {_standby_ordinal(s)}

    async def evict(self, ordinal: int) -> int:
        """GPU `ordinal` is short of memory: stop the standbys warmed on it (their plan's device,
        else CUDA's default 0) and refill nowhere for EVICT_PAUSE_S. Returns how many stopped."""
        gone = [s for s in self.standbys if ordinal in self._gpus_of(s)]
        for s in gone:
            self.standbys.remove(s)
        self._paused[ordinal] = time.monotonic() + EVICT_PAUSE_S
        await asyncio.gather(*(self._shutdown(s) for s in gone))
        if gone:
            self.log.info("gpuctx pool: cuda:%d is short of memory: stopped %d standby(s); no refill for %g s",
                          ordinal, len(gone), EVICT_PAUSE_S)
        return len(gone)

    def _failed(self, name: str, error: str) -> None:
        """A standby of `name` failed: back off; log only when the state changes."""
        health = self.health.setdefault(name, SpecHealth())
        health.failures += 1
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (health.failures - 1))
        health.retry_at = time.monotonic() + delay
        if error != health.error:
            self.log.warning("gpuctx pool: no standby %s kernel: %s; retrying in %g s, backing off up to %g s "
                             "(the pool's status in GET /gpuctx/api/devices says so too)",
                             name, error, delay, RETRY_MAX_S)
        health.error = error

    def _recovered(self, name: str) -> None:
        """A standby of `name` came up: the error is over (the failure count stays, for the
        backoff, until one has lived HEALTHY_AFTER_S or been adopted)."""
        health = self.health.setdefault(name, SpecHealth())
        if health.error:
            self.log.info("gpuctx pool: standby %s kernels start again (after %d failures)", name, health.failures)
            health.error = None

    def _healthy(self, name: str) -> None:
        self.health[name] = SpecHealth()

    def _waiting_for_first_request(self) -> bool:
        """Refill only once adopted kernels have served their first request and stayed idle
        REFILL_IDLE_S (or a minute passed), so that starting a standby does not compete with the
        user's first cells (Run All after a restart)."""
        now = time.monotonic()
        for kid, at in list(self.adopted.items()):
            km = internals.get_registered(self.mkm, kid)
            served = km is None or (getattr(km, "execution_state", "") == "idle"
                                    and km.last_activity > getattr(km, "_gpuctx_adopted_at", km.last_activity)
                                    and (internals.utcnow() - km.last_activity).total_seconds() >= REFILL_IDLE_S)
            if served or now - at > 60:
                del self.adopted[kid]
        return bool(self.adopted)

    async def _spawn(self, name: str) -> None:
        km = None
        # The automatic reserve warms for the notebook most likely to restart next: its plan
        # (the kernel reads that notebook), on its kernel's device.
        notebook = self.reserve.for_kernelspec(name) if self.auto else None
        base = dict(os.environ)
        if notebook is not None and notebook.path:
            base[SESSION] = notebook.path
        try:
            plan = WarmPlan.from_env(await self.hook.plan(name, base) or {})
            missing = self.hook.without_gpuctx(name)
            if missing:
                self.unsupported[name] = f"{missing}: the pool keeps warmed kernels only"
                self.log.info("gpuctx pool: no standbys for %s: %s", name, missing)
                return
            if not plan.opt_out:  # the server's own opt-out stands
                plan.policy = "always"  # a standby serves no notebook yet: warm it regardless
            if notebook is not None and notebook.device:
                plan.device, plan.device_source = notebook.device, "the notebook's kernel (warm reserve)"
            env = {**base, **plan.to_env()}
            kwargs = {"env": env, "extra_arguments": ["--ext=gpuctx"]}
            try:
                km, _, sid = self.mkm.pre_start_kernel(name, kwargs)
            except Exception as exc:
                raise StandbyFailed(f"kernelspec {name!r}: {type(exc).__name__}: {exc}") from None
            self._owned.add(km)
            kwargs["kernel_id"] = sid
            standby = Standby(km, name, env, time.monotonic(), notebook=base.get(SESSION) if notebook else None)
            try:
                await ensure_async(km.start_kernel(**kwargs))
                if hasattr(km, "ready"):
                    await asyncio.wrap_future(km.ready) if not isinstance(km.ready, asyncio.Future) else await km.ready
            except Exception as exc:
                raise StandbyFailed(f"could not launch it: {type(exc).__name__}: {exc}") from None
            if self._closing:  # the server shut down while this one started: `finally` stops it
                return
            # Launched: adoptable at once (adoption's first request waits for it to answer), and
            # ready once it answers kernel_info — a kernel that exits at once never does.
            self.standbys.append(standby)
            await self._until_ready(km)
            await self._until_warmed(standby)
            if standby not in self.standbys:  # adopted (or dropped) while it booted: not ours now
                return
            standby.ready = True
            self._recovered(name)
            self.log.info("gpuctx pool: standby %s kernel ready (pid %s)", name, standby.pid)
        except StandbyFailed as exc:
            if not self._closing and self._drop(km):
                self._failed(name, str(exc))
        except Exception as exc:
            if not self._closing and self._drop(km):
                self._failed(name, f"{type(exc).__name__}: {exc}")
        finally:
            self._starting[name] -= 1
            kept = not self._closing and any(s.km is km for s in self.standbys)
            if km is not None and km in self._owned and not kept:  # failed, or the server is closing
                self.standbys = [s for s in self.standbys if s.km is not km]
                await self._stop_km(km)

    def _drop(self, km) -> bool:
        """Forget a standby that failed while it booted; False when it had been adopted meanwhile
        (then the server owns it, and its failure is the server's to see)."""
        if km is None:
            return True
        self.standbys = [s for s in self.standbys if s.km is not km]
        return km in self._owned

    async def _until_ready(self, km) -> None:
        """Wait until a new standby answers kernel_info; StandbyFailed if its process exits first,
        it never answers, or the server shuts down meanwhile."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._closing:
            if not await ensure_async(km.is_alive()):
                raise StandbyFailed(f"the kernel exited during start-up ({_exit_status(km)})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise StandbyFailed(f"the kernel did not answer kernel_info within {READY_TIMEOUT_S:g} s")
            try:
                await kernel_client.request(km, "shell", "kernel_info_request", {}, min(1.0, left))
                return
            except kernel_client.NoReply:
                continue
        raise StandbyFailed("the server is shutting down")

    async def _until_warmed(self, standby: Standby) -> None:
        """Wait until a standby's warm-up has ended, so that `ready` means GPU-ready (a request
        still takes one that is warming: its first cell then waits only for what is left)."""
        km = standby.km
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while not self._closing and time.monotonic() < deadline and standby in self.standbys:
            try:
                reply = await kernel_client.request(km, "control", REQUEST, {}, 2.0)
            except kernel_client.NoReply:
                if not await ensure_async(km.is_alive()):
                    raise StandbyFailed(f"the kernel exited while warming up ({_exit_status(km)})") from None
                continue
            if (reply.get("content", {}).get("warmup") or {}).get("state") != "running":
                return
            await asyncio.sleep(0.2)

    def _pooled(self, name: str) -> bool:
        """Whether kernels of `name` may be served from the pool: any kernelspec the automatic
        reserve keeps standbys for, else those of pool_kernelspecs."""
        return self.auto or name in self.cfg.pool_kernelspecs

    def _take(self, name: str, env: dict) -> Standby | None:
        """A standby for this request: a ready one first, else one still booting (adopting it
        waits for it to answer, still sooner than a cold start). A kernel with a device of its
        own (the server's assign_devices) takes only a standby warmed on that device."""
        wanted = env.get(SESSION)
        for s in sorted(self.standbys, key=lambda s: (not s.ready, s.notebook != wanted)):
            if s.kernel_name != name:
                continue
            differ = compatible(s.env, env)
            if env.get(DEVICE) and s.env.get(DEVICE) != env.get(DEVICE):
                differ.append(DEVICE)
            if differ:
                self.refused.append(f"{', '.join(differ)} differ from the standby's")
                self.log.info("gpuctx pool: not adopting a standby: %s differ", ", ".join(differ))
                continue
            self.standbys.remove(s)
            return s
        return None

    # -- the wrapped kernel manager methods ---------------------------------------------------
    def _serves(self, env: dict) -> bool:
        """A warmed standby fits this request unless it opts out of warming, or the `auto`
        policy finds no GPU framework in its notebook (such kernels must not start CUDA)."""
        if opted_out(env) or self.cfg.warm_policy == "never":
            return False
        return self.cfg.warm_policy == "always" or notebook_wants_gpu(env.get(SESSION))[0]

    async def start_kernel(self, *args, **kwargs):
        name = kwargs.get("kernel_name") or self.mkm.default_kernel_name
        env = kwargs.get("env") or dict(os.environ)
        if kwargs.get("kernel_id") or not self._pooled(name) or not self._serves(env):
            return await ensure_async(self._next_start(*args, **kwargs))
        if self.cfg.assign_devices != "off":  # the server picks each new kernel's GPU: start it there
            return await ensure_async(self._next_start(*args, **kwargs))
        standby = self._take(name, env)
        if standby is None:
            return await ensure_async(self._next_start(*args, **kwargs))
        kid = self.mkm.new_kernel_id()
        cwd = self.mkm.cwd_for_path(kwargs["path"], env=env) if kwargs.get("path") else self.mkm.root_dir
        try:
            await self._register(kid, standby, cwd, env)
        except Exception as exc:  # a standby that cannot be handed over is stopped; start afresh
            self.log.warning("gpuctx pool: adopting a standby failed (%s); starting a fresh kernel", exc)
            internals.unregister(self.mkm, kid)
            await self._shutdown(standby)
            return await ensure_async(self._next_start(*args, **kwargs))
        self._owned.discard(standby.km)
        self.adopted[kid] = time.monotonic()
        self._healthy(name)  # adopted: the kernelspec works
        self.log.info("gpuctx pool: kernel %s adopted from the pool (pid %s)", kid, standby.pid)
        return kid

    async def restart_kernel(self, kernel_id, *args, **kwargs):
        """Swap a standby in under `kernel_id`. Not re-entrant per kernel: KernelActions runs one
        action on a kernel at a time (a second restart joins the first)."""
        if kernel_id not in self.mkm:
            return await ensure_async(self._next_restart(kernel_id, *args, **kwargs))  # its own 404
        old = self.mkm.get_kernel(kernel_id)
        launch = internals.launch_args(old)
        env = launch.get("env") or dict(os.environ)
        fits = self._pooled(old.kernel_name) and self._serves(env)
        standby = self._take(old.kernel_name, env) if fits else None
        if standby is None:
            return await ensure_async(self._next_restart(kernel_id, *args, **kwargs))
        conns = internals.open_connections(old)
        self.mkm.stop_watching_activity(kernel_id)
        try:
            await self._register(kernel_id, standby, launch.get("cwd") or self.mkm.root_dir, env)
        except Exception as exc:
            self.log.warning("gpuctx pool: restart from the pool failed (%s); restarting normally", exc)
            internals.unregister(self.mkm, kernel_id, previous=old)
            self.mkm.start_watching_activity(kernel_id)
            await self._shutdown(standby)
            return await ensure_async(self._next_restart(kernel_id, *args, **kwargs))
        self._owned.discard(standby.km)
        self.adopted[kernel_id] = time.monotonic()
        # The notebook is on its new kernel already; the old process (a CUDA context takes a few
        # hundred ms to tear down) stops in the background, and shutdown_all waits for it.
        self.background.spawn(self._stop_old(old, kernel_id), f"stopping the replaced kernel of {kernel_id}")
        for conn, result in zip(conns, await asyncio.gather(
                *(internals.repoint(conn, standby.km) for conn in conns), return_exceptions=True)):
            if isinstance(result, Exception):  # e.g. a tab closed meanwhile: it reconnects to the new kernel
                self.log.info("gpuctx pool: re-pointing a connection of %s: %s: %s", kernel_id,
                              type(result).__name__, result)
        self.log.info("gpuctx pool: kernel %s restarted from the pool (pid %s)", kernel_id, standby.pid)

    async def _stop_old(self, old, kernel_id: str) -> None:
        try:
            await ensure_async(old.shutdown_kernel(now=True))
        except Exception as exc:
            self.log.warning("gpuctx pool: stopping the replaced kernel of %s: %s", kernel_id, exc)

    async def _register(self, kid: str, standby: Standby, cwd: str, env: dict) -> None:
        """Hand a standby to the server under `kid`, in the directory and environment that a
        freshly started kernel would have had."""
        km = standby.km
        km.kernel_id = kid
        km.execution_state, km.reason, km.last_activity = "idle", "", internals.utcnow()
        launch = internals.launch_args(km)
        # Keep the standby's gpuctx settings (device, frameworks) for a later ordinary restart,
        # under the server's own policy rather than the standby's "always".
        plan = WarmPlan.from_env(standby.env)
        plan.policy, plan.opt_out = self.cfg.warm_policy, opted_out(env)
        launch.update(env={**env, **plan_vars(standby.env), **plan.to_env()}, cwd=cwd)
        internals.set_launch_args(km, launch)  # a later ordinary restart starts like a fresh kernel would
        await self._adopt_in_kernel(km, cwd, env, standby)
        await internals.register(self.mkm, kid, km)
        km._gpuctx_adopted_at = internals.utcnow()

    async def _adopt_in_kernel(self, km, cwd: str, env: dict, standby: Standby) -> None:
        """Tell the standby it now serves this notebook, on its control channel: no cell runs, so
        neither the warm-up nor the user's first cell mistakes the hand-over for one."""
        delta = {k: v for k, v in env.items() if standby.env.get(k) != v and k not in CUDA_STARTUP_VARS}
        if SESSION in standby.env and SESSION not in env:  # warmed for a notebook; serves none
            delta[SESSION] = None
        reply = await kernel_client.request(km, "control", ADOPT_REQUEST,
                                            {"cwd": cwd, "env": delta,
                                             "pooled": str(round(time.monotonic() - standby.started, 1))},
                                            timeout=10)
        content = reply.get("content", {})
        if reply.get("msg_type") != ADOPT_REPLY or content.get("status") != "ok":
            raise RuntimeError(f"the standby did not take the notebook: {content.get('message') or reply.get('msg_type')}")

    # -- shutting down ------------------------------------------------------------------------------
    async def shutdown_all(self, *args, **kwargs):
        """Stop every process the pool started (standbys, ones still starting) before the
        server's own kernels; each one's connection file goes with it."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        await self.background.drain()  # starting standbys see _closing and give up at once
        self.standbys = []
        await asyncio.gather(*(self._stop_km(km) for km in list(self._owned)), return_exceptions=True)
        return await ensure_async(self._next_shutdown_all(*args, **kwargs))

    async def _shutdown(self, s: Standby) -> None:
        await self._stop_km(s.km)

    async def _stop_km(self, km) -> None:
        """Stop a kernel the pool owns, and remove its connection file even if stopping failed."""
        try:
            await ensure_async(km.shutdown_kernel(now=True))
        except Exception as exc:
            if await _alive(km):
                self.log.warning("gpuctx pool: stopping standby %s: %s: %s", kernel_client.kernel_pid(km),
                                 type(exc).__name__, exc)
        finally:
            _remove_connection_file(km)
            self._owned.discard(km)

    def _kill_all(self) -> None:
        """Last resort at interpreter exit: no process the pool started outlives the server."""
        for km in list(self._owned):
            pid = kernel_client.kernel_pid(km)
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            _remove_connection_file(km)


async def _alive(km) -> bool:
    try:
        return bool(await ensure_async(km.is_alive()))
    except Exception:
        return False


def _exit_status(km) -> str:
    process = getattr(getattr(km, "provisioner", None), "process", None)
    code = process.poll() if process is not None and hasattr(process, "poll") else None
    return "its process is gone" if code is None else f"exit code {code}"


def _remove_connection_file(km) -> None:
    try:
        km.cleanup_connection_file()
    except Exception:
        pass
