"""Standby kernels, started and warmed ahead of time, so that a new or restarted notebook gets a
GPU-ready kernel at once.

Two modes. The automatic reserve (the default, `pool_size` unset) keeps one warmed standby for
each kernelspec that a running GPU notebook uses, and none while no such notebook runs: warmed
with the plan of the notebook it is most likely to replace (the one used last) on that notebook's
device, started once that notebook's kernel has run `pool_reserve_after` s, never holding a GPU
below `pool_min_free_fraction` free or host memory below reserve.HOST_FLOOR, and within
`pool_gpu_budget_mib` (reserve.py decides these). `pool_size` = N keeps N standbys per
`pool_kernelspecs` entry regardless (0: no pool).

A standby is a process the pool launched through a kernel manager of its own (never the
server's: it is in no kernel list, out of the culler's reach, and with no restarter to revive it
when it dies). It is taken by the provisioner (`provisioner.py`) when a kernel of its kernelspec
is launched — a new session or a restart — and handed over on its control channel; the process
then belongs to the server's kernel manager. Each standby has one state, changed only on the event
loop: booting → ready → taken (handed over: the pool no longer touches it), or → stopping. A
kernel that is stopping or has died is never handed out.

A kernelspec whose standbys cannot start (missing, bogus argv, exits at once) is retried with
exponential backoff up to RETRY_MAX_S, logged once per change of state, and `status()` says why
its reserve is empty. Every process the pool starts is stopped, its connection file removed,
when the server exits.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import time
import weakref
from dataclasses import dataclass

from jupyter_core.utils import ensure_async

from ..contract import ADOPT_REPLY, ADOPT_REQUEST, DEVICE, REQUEST, SESSION, WarmSettings, opted_out
from . import jupyter_internals as internals
from . import kernel_client
from .launch import Launcher
from .reserve import RESERVE, WARMED_KERNEL_MIB, Reserve
from .tasks import Background

# Read once, when CUDA (or the framework) starts: a standby started with other values cannot
# serve a kernel that should have had these.
CUDA_STARTUP_VARS = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "LD_LIBRARY_PATH",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
)
EVICT_PAUSE_S = 300.0  # after a GPU ran short of memory, no standby is started there for this long
RETRY_FIRST_S, RETRY_MAX_S = 2.0, 300.0  # backoff after a standby failed to start: 2, 4, 8 … 300 s
REFILL_IDLE_S = 2.0  # an adopted kernel idle this long after its first request: refill now
HEALTHY_AFTER_S = 30.0  # a standby alive this long (or adopted) clears its kernelspec's failures
READY_TIMEOUT_S = 60.0  # a standby that does not answer kernel_info by then is given up
WARM_TIMEOUT_S = 120.0  # a standby still warming up by then counts as ready anyway
HAND_OVER_TIMEOUT_S = 10.0


# The log of the standbys' own kernel managers: what they would say (a failed launch's traceback, each
# time it is retried) the pool says itself, in one line per change of state.
QUIET = logging.getLogger("gpuctx.pool.standby")
QUIET.propagate = False
QUIET.addHandler(logging.NullHandler())


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
    km: object  # the jupyter_client KernelManager that launched it (the pool's own)
    kernel_name: str
    env: dict  # the environment it was launched with
    started: float  # time.monotonic()
    state: str = "booting"  # booting | ready | taken | stopping
    notebook: str | None = None  # the notebook whose warm plan it ran (automatic reserve)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def pid(self) -> int | None:
        return kernel_client.kernel_pid(self.km)

    def alive(self) -> bool:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return process is not None and process.poll() is None

    @property
    def ordinal(self) -> int:
        """The GPU it was warmed on, as planned: its settings' device, else CUDA's default."""
        try:
            return int(self.env.get(DEVICE) or 0)
        except ValueError:
            return 0


def compatible(standby_env: dict, wanted_env: dict) -> list[str]:
    """The CUDA start-up variables that differ (empty: the standby can serve)."""
    return [v for v in CUDA_STARTUP_VARS if standby_env.get(v) != wanted_env.get(v)]


class Pool:
    def __init__(self, mkm, cfg, launcher: Launcher, reserve: Reserve, log, background: Background):
        self.mkm, self.cfg, self.launcher, self.reserve, self.log = mkm, cfg, launcher, reserve, log
        self.background = background  # standbys starting, taken-over processes stopping
        self.auto = cfg.pool_size is None  # the automatic reserve
        self.standbys: list[Standby] = []
        self._starting: dict[str, int] = {}
        self._task: asyncio.Task | None = None
        self._closing = False
        self._kms: weakref.WeakSet = weakref.WeakSet()  # every kernel manager the pool launched
        self._all: list[Standby] = []  # every standby not yet taken or stopped (booting ones too)
        self.adopted: dict[str, tuple[float, float]] = {}  # kernel id -> when handed out (monotonic, epoch)
        self.refused: list[str] = []  # why the last refusals happened (for status and tests)
        self.health: dict[str, SpecHealth] = {}  # kernelspec -> how starting its standbys goes
        self.unsupported: dict[str, str] = {}  # kernelspec -> why the pool keeps no standby for it
        self._paused: dict[int, float] = {}  # GPU ordinal -> no refill there before (time.monotonic())
        self._short: str | None = None  # why no standby may start now (memory), while that lasts

    # -- running -------------------------------------------------------------------------------
    def start(self) -> None:
        atexit.register(self._kill_all)
        self._task = self.background.spawn(self._maintain(), "keeping the warm pool")

    def launched_by_pool(self, km) -> bool:
        """Whether `km` is one of the pool's own kernel managers (a standby's)."""
        return km in self._kms

    def launching(self, km, env: dict) -> None:
        """A standby's process is being launched with `env` (its kernelspec's variables merged in):
        what a request's environment is compared with."""
        for s in self._all:
            if s.km is km:
                s.env = dict(env)

    def kernelspecs(self) -> list[str]:
        """The kernelspecs the pool keeps standbys for now."""
        if not self.auto:
            return list(self.cfg.pool_kernelspecs)
        return sorted(set(self.reserve.notebooks) | {s.kernel_name for s in self.standbys})

    def serves(self, kernel_name: str) -> bool:
        """Whether kernels of this kernelspec may be served from the pool."""
        return not self._closing and (self.auto or kernel_name in self.cfg.pool_kernelspecs)

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

    # -- the API's view ------------------------------------------------------------------------------
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
            standbys.append({"kernel_name": s.kernel_name, "pid": s.pid, "ready": s.ready, "state": s.state,
                             "age": round(now - s.started, 1), "notebook": s.notebook,
                             "ordinal": max(on, key=on.get) if on else (s.ordinal if self.reserve.gpus() else None),
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
        while not self._closing:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the pool must never take the server down
                self.log.warning("gpuctx pool: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(1.0)

    async def _tick(self) -> None:
        now = time.monotonic()
        if self.auto:
            await self.reserve.update(now)
        self._short = self.reserve.short()
        for s in list(self.standbys):
            if s.state not in ("booting", "ready"):
                continue
            dead = s.ready and not s.alive()
            old = self.cfg.pool_max_age and now - s.started > self.cfg.pool_max_age
            unwanted = self.auto and s.kernel_name not in self.reserve.notebooks
            if dead or old or unwanted:
                if dead:
                    self._failed(s.kernel_name, f"a standby kernel died ({_exit_status(s.km)})")
                elif unwanted:
                    self.log.info("gpuctx pool: no GPU notebook of %s runs any more: stopping its standby (pid %s)",
                                  s.kernel_name, s.pid)
                else:
                    self.log.info("gpuctx pool: recycling standby %s", s.pid)
                await self._stop(s)
            elif now - s.started > HEALTHY_AFTER_S:
                self._healthy(s.kernel_name)
        await self._keep_the_floor()
        paused = any(until > now for until in self._paused.values())
        for name in self.kernelspecs():
            have = sum(1 for s in self.standbys if s.kernel_name == name) + self._starting.get(name, 0)
            health = self.health.setdefault(name, SpecHealth())
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
            gone = list(self.standbys)
            self.log.info("gpuctx pool: %s: stopping %d standby(s)", self._short, len(gone))
            await asyncio.gather(*(self._stop(s) for s in gone))

    def _gpus_of(self, s: Standby) -> set[int]:
        """The GPUs a standby holds memory on (NVML), else the one it was planned on."""
        return set(self.reserve.held_by(s.pid)) or {s.ordinal}

    async def evict(self, ordinal: int) -> int:
        """GPU `ordinal` is short of memory: stop the standbys warmed on it (their settings' device,
        else CUDA's default 0) and refill nowhere for EVICT_PAUSE_S. Returns how many stopped."""
        gone = [s for s in self.standbys if ordinal in self._gpus_of(s)]
        self._paused[ordinal] = time.monotonic() + EVICT_PAUSE_S
        await asyncio.gather(*(self._stop(s) for s in gone))
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
        for kid, (at, epoch) in list(self.adopted.items()):
            try:
                km = self.mkm.get_kernel(kid)
            except KeyError:
                km = None
            activity = _epoch(getattr(km, "last_activity", None))
            served = km is None or (getattr(km, "execution_state", "") == "idle" and activity > epoch
                                    and time.time() - activity >= REFILL_IDLE_S)
            if served or now - at > 60:
                del self.adopted[kid]
        return bool(self.adopted)

    # -- one standby --------------------------------------------------------------------------------
    async def _spawn(self, name: str) -> None:
        standby = None
        try:
            standby = await self._launch(name)
            if standby is None:
                return
            await self._until_ready(standby)
            await self._until_warmed(standby)
            if standby.state == "booting":
                standby.state = "ready"
                self._recovered(name)
                self.log.info("gpuctx pool: standby %s kernel ready (pid %s)", name, standby.pid)
        except Exception as exc:  # StandbyFailed, or the kernel manager's own error
            if not self._closing and (standby is None or standby.state == "booting"):
                self._failed(name, str(exc) if isinstance(exc, StandbyFailed) else f"{type(exc).__name__}: {exc}")
        finally:
            self._starting[name] -= 1
            if standby is not None and standby.state == "booting":  # failed, or the server is closing
                await self._stop(standby)

    async def _launch(self, name: str) -> Standby | None:
        """Launch one standby of kernelspec `name`, warmed for the notebook it is most likely to
        serve; None when the pool keeps none of this kernelspec (its Python lacks gpuctx)."""
        notebook = self.reserve.for_kernelspec(name) if self.auto else None
        env = dict(os.environ)
        if notebook is not None and notebook.path:
            env[SESSION] = notebook.path
        settings = WarmSettings.from_env(await self.launcher.settings(name, env) or {})
        missing = self.launcher.without_gpuctx(name)
        if missing:
            self.unsupported[name] = f"{missing}: the pool keeps warmed kernels only"
            self.log.info("gpuctx pool: no standbys for %s: %s", name, missing)
            return None
        if not settings.opt_out:  # the server's own opt-out stands
            settings.policy = "always"  # a standby serves no notebook yet: warm it regardless
        if notebook is not None and notebook.device:
            settings.device, settings.device_source = notebook.device, "the notebook's kernel (warm reserve)"
        env.update(settings.to_env())
        broken = await self.launcher.unlaunchable(name)
        if broken:
            raise StandbyFailed(broken)
        try:
            km, _, _ = self.mkm.pre_start_kernel(name, {})
        except Exception as exc:
            raise StandbyFailed(f"kernelspec {name!r}: {type(exc).__name__}: {exc}") from None
        km.autorestart = False  # a standby that dies is replaced by the pool, never revived half-warm
        km.log = QUIET  # a failed launch is the pool's to report, once, in one line (not jupyter_client's traceback)
        self._kms.add(km)
        standby = Standby(km, name, env, time.monotonic(), notebook=env.get(SESSION) if notebook else None)
        self.standbys.append(standby)
        self._all.append(standby)
        try:
            await ensure_async(km.start_kernel(env=env))
        except Exception as exc:
            await self._stop(standby)
            raise StandbyFailed(f"could not launch it: {type(exc).__name__}: {exc}") from None
        return standby

    async def _until_ready(self, standby: Standby) -> None:
        """Until a new standby answers kernel_info; StandbyFailed if its process exits first,
        it never answers, or the server shuts down meanwhile. Returns early once it is taken."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._closing and standby.state == "booting":
            if not standby.alive():
                raise StandbyFailed(f"the kernel exited during start-up ({_exit_status(standby.km)})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise StandbyFailed(f"the kernel did not answer kernel_info within {READY_TIMEOUT_S:g} s")
            try:
                await kernel_client.request(standby.km, "shell", "kernel_info_request", {}, min(1.0, left))
                return
            except kernel_client.NoReply:
                continue
        if self._closing:
            raise StandbyFailed("the server is shutting down")

    async def _until_warmed(self, standby: Standby) -> None:
        """Until a standby's warm-up has ended, so that `ready` means GPU-ready (a request still
        takes one that is warming: its first cell then waits only for what is left)."""
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while not self._closing and time.monotonic() < deadline and standby.state == "booting":
            try:
                reply = await kernel_client.request(standby.km, "control", REQUEST, {}, 2.0)
            except kernel_client.NoReply:
                if not standby.alive():
                    raise StandbyFailed(f"the kernel exited while warming up ({_exit_status(standby.km)})") from None
                continue
            if (reply.get("content", {}).get("warmup") or {}).get("state") != "running":
                return
            await asyncio.sleep(0.2)
        if self._closing:
            raise StandbyFailed("the server is shutting down")

    # -- handing a standby over ---------------------------------------------------------------------
    def has_standby_for(self, kernel_name: str) -> bool:
        """Whether a standby of this kernelspec could be taken now."""
        return self.serves(kernel_name) and any(s.kernel_name == kernel_name and s.alive() for s in self.standbys)

    async def fits(self, env: dict) -> bool:
        """A warmed standby fits this launch unless it opts out of warming, or the `auto` policy
        finds no GPU framework in its notebook (such kernels must not start CUDA)."""
        if opted_out(env) or self.cfg.warm_policy == "never":
            return False
        if self.cfg.warm_policy == "always":
            return True
        return (await self.launcher.notebooks.facts(env.get(SESSION))).wants_gpu()[0]

    def take(self, kernel_name: str, env: dict) -> Standby | None:
        """A standby for this launch, no longer the pool's: a ready one first, else one still
        booting (handing it over waits for it to answer, still sooner than a cold start). Never
        one that is stopping or whose process has exited. A kernel with a device of its own (the
        server's assign_devices) takes only a standby warmed on that device."""
        if not self.serves(kernel_name):
            return None
        wanted = env.get(SESSION)
        for s in sorted(self.standbys, key=lambda s: (not s.ready, s.notebook != wanted)):
            if s.kernel_name != kernel_name or s.state not in ("booting", "ready") or not s.alive():
                continue
            differ = compatible(s.env, env)
            if env.get(DEVICE) and s.env.get(DEVICE) != env.get(DEVICE):
                differ.append(DEVICE)
            if differ:
                self.refused.append(f"{', '.join(differ)} differ from the standby's")
                self.log.info("gpuctx pool: not adopting a standby: %s differ", ", ".join(differ))
                continue
            s.state = "taken"
            self.standbys.remove(s)
            return s
        return None

    async def hand_over(self, standby: Standby, kernel_id: str, cwd: str, env: dict, connection_file: str) -> None:
        """Tell a taken standby it now serves this kernel, on its control channel: it moves into
        the notebook's folder and takes the environment and connection file a fresh kernel would
        have had. No cell runs. Raises when the standby cannot take it (then it is stopped)."""
        delta: dict[str, str | None] = {k: v for k, v in env.items()
                                        if standby.env.get(k) != v and k not in CUDA_STARTUP_VARS}
        delta.update({k: None for k in standby.env if k not in env})  # e.g. the notebook it was warmed for
        content = {"cwd": cwd, "env": delta, "pooled": str(round(time.monotonic() - standby.started, 1)),
                   "connection_file": connection_file}
        try:
            reply = await self._request_while_alive(standby, ADOPT_REQUEST, content, HAND_OVER_TIMEOUT_S)
            answer = reply.get("content", {})
            if reply.get("msg_type") != ADOPT_REPLY or answer.get("status") != "ok":
                raise RuntimeError(f"the standby did not take the notebook: "
                                   f"{answer.get('message') or reply.get('msg_type')}")
        except BaseException:
            await self._stop(standby)
            raise
        internals.close_control(standby.km)
        standby.km.cleanup_connection_file()  # the server's kernel manager writes the kernel's own
        self._all = [s for s in self._all if s is not standby]
        self.adopted[kernel_id] = (time.monotonic(), time.time())
        self._healthy(standby.kernel_name)  # adopted: the kernelspec works

    async def _request_while_alive(self, standby: Standby, msg_type: str, content: dict, timeout: float) -> dict:
        """A control request to a standby that fails at once when its process exits meanwhile."""
        request = asyncio.ensure_future(kernel_client.request(standby.km, "control", msg_type, content, timeout))
        try:
            while not request.done():
                await asyncio.wait([request], timeout=0.1)
                if not request.done() and not standby.alive():
                    raise StandbyFailed(f"the standby's process exited ({_exit_status(standby.km)})")
            return request.result()
        finally:
            if not request.done():
                request.cancel()

    # -- stopping -------------------------------------------------------------------------------------
    async def _stop(self, s: Standby) -> None:
        """Stop a standby the pool owns (never one handed over), and remove its connection file."""
        if s.state == "stopping":
            return
        s.state = "stopping"
        if s in self.standbys:
            self.standbys.remove(s)
        try:
            await ensure_async(s.km.shutdown_kernel(now=True))
        except Exception as exc:
            if s.alive():
                self.log.warning("gpuctx pool: stopping standby %s: %s: %s", s.pid, type(exc).__name__, exc)
        finally:
            _remove_connection_file(s.km)
            self._all = [x for x in self._all if x is not s]

    async def close(self) -> None:
        """Stop every process the pool started (standbys, ones still starting); the server's own
        kernels are stopped by jupyter_server after this."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        await asyncio.gather(*(self._stop(s) for s in list(self._all)), return_exceptions=True)

    def _kill_all(self) -> None:
        """Last resort at interpreter exit: no process the pool started outlives the server."""
        for s in list(self._all):
            pid = s.pid
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            _remove_connection_file(s.km)


def _epoch(when) -> float:
    try:
        return when.timestamp()
    except (AttributeError, OverflowError, OSError, ValueError):
        return 0.0


def _exit_status(km) -> str:
    process = getattr(getattr(km, "provisioner", None), "process", None)
    code = process.poll() if process is not None and hasattr(process, "poll") else None
    return "its process is gone" if code is None else f"exit code {code}"


def _remove_connection_file(km) -> None:
    try:
        km.cleanup_connection_file()
    except Exception:
        pass
