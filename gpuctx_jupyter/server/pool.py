"""A pool of standby kernels, started and warmed ahead of time, so that a new or restarted
notebook gets a GPU-ready kernel at once.

Standbys are jupyter_client KernelManagers that the server's MappingKernelManager does not list:
invisible in /api/kernels and sessions, out of the idle culler's reach. A new kernel request
adopts one (its working directory and environment set to what the server would have given a
fresh kernel), unless an environment variable that CUDA reads only at start-up differs: then a
fresh kernel starts. A restart swaps a standby in under the same kernel id and re-points the open
websockets at it. Refilling waits until the adopted kernel has served its first request.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import time
from dataclasses import dataclass

from jupyter_server.utils import ensure_async

from ..contract import (
    POOLED,
    SESSION,
    WarmPlan,
    notebook_wants_gpu,
    opted_out,
    plan_vars,
)
from . import jupyter_internals as internals
from . import kernel_client
from .tasks import Background

# Read once, when CUDA (or the framework) starts: a standby started with other values cannot
# serve a kernel that should have had these.
CUDA_STARTUP_VARS = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "LD_LIBRARY_PATH",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
)
WARMED_KERNEL_MIB = 630  # GPU memory a warmed kernel holds (H200, torch 2.11)


@dataclass
class Standby:
    km: object
    kernel_name: str
    env: dict
    started: float  # time.monotonic()
    ready: bool = False

    @property
    def pid(self) -> int | None:
        return kernel_client.kernel_pid(self.km)


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

    # -- wiring ---------------------------------------------------------------------------------
    def install(self) -> None:
        self.mkm.start_kernel = self.start_kernel
        self.mkm.restart_kernel = self.restart_kernel
        self.mkm.shutdown_all = self.shutdown_all
        atexit.register(self._kill_all)
        self._task = asyncio.ensure_future(self._maintain())

    def target(self) -> int:
        """Standbys to keep per kernelspec: the count, within the GPU-memory budget."""
        n = self.cfg.pool_size if self.cfg.warm_policy != "never" else 0  # standbys are warmed kernels
        if self.cfg.pool_gpu_budget_mib:
            n = min(n, self.cfg.pool_gpu_budget_mib // WARMED_KERNEL_MIB // max(1, len(self.cfg.pool_kernelspecs)))
        return max(0, n)

    def status(self) -> dict:
        now = time.monotonic()
        return {"target": self.target(), "kernelspecs": list(self.cfg.pool_kernelspecs),
                "standbys": [{"kernel_name": s.kernel_name, "pid": s.pid, "ready": s.ready,
                              "age": round(now - s.started, 1)} for s in self.standbys],
                "refused": self.refused[-10:]}

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
        for s in list(self.standbys):
            dead = s.ready and not await ensure_async(s.km.is_alive())
            old = self.cfg.pool_max_age and now - s.started > self.cfg.pool_max_age
            if dead or old:
                self.standbys.remove(s)
                self.log.info("gpuctx pool: %s standby %s", "replacing dead" if dead else "recycling", s.pid)
                await self._shutdown(s)
        for name in self.cfg.pool_kernelspecs:
            have = sum(1 for s in self.standbys if s.kernel_name == name) + self._starting.get(name, 0)
            if have < self.target() and not self._waiting_for_first_request():
                self._starting[name] = self._starting.get(name, 0) + 1
                self.background.spawn(self._spawn(name), f"starting a standby {name} kernel")

    def _waiting_for_first_request(self) -> bool:
        """Refill only once adopted kernels have served their first request (or a minute passed),
        so that starting a standby does not compete with the user's first cell."""
        now = time.monotonic()
        for kid, at in list(self.adopted.items()):
            km = internals.get_registered(self.mkm, kid)
            served = km is None or (getattr(km, "execution_state", "") == "idle"
                                    and km.last_activity > getattr(km, "_gpuctx_adopted_at", km.last_activity))
            if served or now - at > 60:
                del self.adopted[kid]
        return bool(self.adopted)

    async def _spawn(self, name: str) -> None:
        try:
            plan = WarmPlan.from_env(await self.hook.plan(name, None) or {})
            if not plan.opt_out:  # the server's own opt-out stands
                plan.policy = "always"  # a standby has no notebook yet: warm it regardless
            env = {**os.environ, **plan.to_env()}
            kwargs = {"env": env, "extra_arguments": ["--ext=gpuctx"]}
            km, _, sid = self.mkm.pre_start_kernel(name, kwargs)
            kwargs["kernel_id"] = sid
            standby = Standby(km, name, env, time.monotonic())
            await ensure_async(km.start_kernel(**kwargs))
            if hasattr(km, "ready"):
                await asyncio.wrap_future(km.ready) if not isinstance(km.ready, asyncio.Future) else await km.ready
            standby.ready = True
            if self._closing:  # the server shut down while this one started
                await self._shutdown(standby)
                return
            self.standbys.append(standby)
            self.log.info("gpuctx pool: standby %s kernel ready (pid %s)", name, standby.pid)
        except Exception as exc:
            self.log.warning("gpuctx pool: could not start a standby %s kernel: %s", name, exc)
        finally:
            self._starting[name] -= 1

    def _take(self, name: str, env: dict) -> Standby | None:
        for s in self.standbys:
            if s.kernel_name != name or not s.ready:
                continue
            differ = compatible(s.env, env)
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
        if kwargs.get("kernel_id") or name not in self.cfg.pool_kernelspecs or not self._serves(env):
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
        self.adopted[kid] = time.monotonic()
        self.log.info("gpuctx pool: kernel %s adopted from the pool (pid %s)", kid, standby.pid)
        return kid

    async def restart_kernel(self, kernel_id, *args, **kwargs):
        old = self.mkm.get_kernel(kernel_id)
        launch = internals.launch_args(old)
        env = launch.get("env") or dict(os.environ)
        fits = old.kernel_name in self.cfg.pool_kernelspecs and self._serves(env)
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
        await asyncio.gather(*(internals.repoint(conn, standby.km) for conn in conns))
        self.adopted[kernel_id] = time.monotonic()
        # The notebook is on its new kernel already; the old process (a CUDA context takes a few
        # hundred ms to tear down) stops in the background, and shutdown_all waits for it.
        self.background.spawn(self._stop_old(old, kernel_id), f"stopping the replaced kernel of {kernel_id}")
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
        delta = {k: v for k, v in env.items() if standby.env.get(k) != v and k not in CUDA_STARTUP_VARS}
        code = (
            "import os as _o\n"
            f"_o.chdir({cwd!r})\n"
            f"_o.environ.update({json.dumps(delta)})\n"
            f"_o.environ[{POOLED!r}] = {str(round(time.monotonic() - standby.started, 1))!r}\n"
            f"if {SESSION!r} in _o.environ:\n"
            f"    get_ipython().user_ns['__session__'] = _o.environ[{SESSION!r}]\n"
            "del _o\n"
        )
        reply = await kernel_client.execute(km, code, timeout=10)
        if reply.get("status") != "ok":
            self.log.warning("gpuctx pool: adopting kernel: %s", reply.get("evalue"))

    # -- shutting down ------------------------------------------------------------------------------
    async def shutdown_all(self, *args, **kwargs):
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        await self.background.drain()
        standbys, self.standbys = self.standbys, []
        await asyncio.gather(*(self._shutdown(s) for s in standbys), return_exceptions=True)
        return await ensure_async(self._next_shutdown_all(*args, **kwargs))

    async def _shutdown(self, s: Standby) -> None:
        try:
            await ensure_async(s.km.shutdown_kernel(now=True))
        except Exception as exc:
            self.log.warning("gpuctx pool: stopping standby %s: %s", s.pid, exc)

    def _kill_all(self) -> None:
        """Last resort at interpreter exit: no standby outlives the server."""
        for s in self.standbys:
            if s.pid:
                try:
                    os.kill(s.pid, signal.SIGKILL)
                except OSError:
                    pass
