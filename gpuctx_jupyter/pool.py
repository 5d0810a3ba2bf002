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

from .warmup import notebook_wants_gpu, opted_out

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
        proc = getattr(getattr(self.km, "provisioner", None), "process", None)
        return getattr(proc, "pid", None)


def compatible(standby_env: dict, wanted_env: dict) -> list[str]:
    """The CUDA start-up variables that differ (empty: the standby can serve)."""
    return [v for v in CUDA_STARTUP_VARS if standby_env.get(v) != wanted_env.get(v)]


class KernelPool:
    def __init__(self, serverapp, cfg, hook, log):
        self.mkm, self.cfg, self.hook, self.log = serverapp.kernel_manager, cfg, hook, log
        self.standbys: list[Standby] = []
        self._starting: dict[str, int] = {}
        self._task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # background work: standbys starting, replaced kernels stopping
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
                self._background(self._spawn(name))

    def _waiting_for_first_request(self) -> bool:
        """Refill only once adopted kernels have served their first request (or a minute passed),
        so that starting a standby does not compete with the user's first cell."""
        now = time.monotonic()
        for kid, at in list(self.adopted.items()):
            km = self.mkm._kernels.get(kid)
            served = km is None or (getattr(km, "execution_state", "") == "idle"
                                    and km.last_activity > getattr(km, "_gpuctx_adopted_at", km.last_activity))
            if served or now - at > 60:
                del self.adopted[kid]
        return bool(self.adopted)

    async def _spawn(self, name: str) -> None:
        try:
            plan = await self.hook.plan(name, None) or {}
            if plan.get("GPUCTX_WARM") != "0":  # the server's own opt-out stands
                plan["GPUCTX_WARM"] = "always"  # a standby has no notebook yet: warm it regardless
            env = {**os.environ, **plan}
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
        return self.cfg.warm_policy == "always" or notebook_wants_gpu(env.get("JPY_SESSION_NAME"))[0]

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
            self.mkm._kernels.pop(kid, None)
            await self._shutdown(standby)
            return await ensure_async(self._next_start(*args, **kwargs))
        self.adopted[kid] = time.monotonic()
        if not self.mkm._initialized_culler:
            self.mkm.initialize_culler()
        self.log.info("gpuctx pool: kernel %s adopted from the pool (pid %s)", kid, standby.pid)
        return kid

    async def restart_kernel(self, kernel_id, *args, **kwargs):
        old = self.mkm.get_kernel(kernel_id)
        launch = getattr(old, "_launch_args", None) or {}
        env = launch.get("env") or dict(os.environ)
        fits = old.kernel_name in self.cfg.pool_kernelspecs and self._serves(env)
        standby = self._take(old.kernel_name, env) if fits else None
        if standby is None:
            return await ensure_async(self._next_restart(kernel_id, *args, **kwargs))
        conns = _open_connections(old)
        self.mkm.stop_watching_activity(kernel_id)
        try:
            await self._register(kernel_id, standby, launch.get("cwd") or self.mkm.root_dir, env)
        except Exception as exc:
            self.log.warning("gpuctx pool: restart from the pool failed (%s); restarting normally", exc)
            self.mkm._kernels[kernel_id] = old
            self.mkm.start_watching_activity(kernel_id)
            await self._shutdown(standby)
            return await ensure_async(self._next_restart(kernel_id, *args, **kwargs))
        await asyncio.gather(*(_repoint(conn, standby.km) for conn in conns))
        self.adopted[kernel_id] = time.monotonic()
        # The notebook is on its new kernel already; the old process (a CUDA context takes a few
        # hundred ms to tear down) stops in the background, and shutdown_all waits for it.
        self._background(self._stop_old(old, kernel_id))
        self.log.info("gpuctx pool: kernel %s restarted from the pool (pid %s)", kernel_id, standby.pid)

    def _background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop_old(self, old, kernel_id: str) -> None:
        try:
            await ensure_async(old.shutdown_kernel(now=True))
        except Exception as exc:
            self.log.warning("gpuctx pool: stopping the replaced kernel of %s: %s", kernel_id, exc)

    async def _register(self, kid: str, standby: Standby, cwd: str, env: dict) -> None:
        """Hand a standby to the server under `kid`, in the directory and environment that a
        freshly started kernel would have had."""
        from jupyter_server._tz import utcnow

        km = standby.km
        km.kernel_id = kid
        km.execution_state, km.reason, km.last_activity = "idle", "", utcnow()
        launch = dict(getattr(km, "_launch_args", None) or {})
        # Keep the standby's gpuctx settings (device, frameworks) for a later ordinary restart,
        # under the server's own policy rather than the standby's "always".
        gpuctx_vars = {k: v for k, v in standby.env.items() if k.startswith("GPUCTX_")}
        gpuctx_vars["GPUCTX_WARM"] = "0" if opted_out(env) else self.cfg.warm_policy
        launch.update(env={**env, **gpuctx_vars}, cwd=cwd)
        km._launch_args = launch  # a later ordinary restart starts like a fresh kernel would
        await self._adopt_in_kernel(km, cwd, env, standby)
        self.mkm._kernels[kid] = km
        self.mkm._kernel_connections.setdefault(kid, 0)
        await self.mkm._finish_kernel_start(kid)
        km._gpuctx_adopted_at = utcnow()

    async def _adopt_in_kernel(self, km, cwd: str, env: dict, standby: Standby) -> None:
        delta = {k: v for k, v in env.items() if standby.env.get(k) != v and k not in CUDA_STARTUP_VARS}
        code = (
            "import os as _o\n"
            f"_o.chdir({cwd!r})\n"
            f"_o.environ.update({json.dumps(delta)})\n"
            f"_o.environ['GPUCTX_POOLED'] = {str(round(time.monotonic() - standby.started, 1))!r}\n"
            "if 'JPY_SESSION_NAME' in _o.environ:\n"
            "    get_ipython().user_ns['__session__'] = _o.environ['JPY_SESSION_NAME']\n"
            "del _o\n"
        )
        kc = km.client()
        kc.start_channels()
        try:
            msg_id = kc.execute(code, silent=True, store_history=False)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                msg = await kc.get_shell_msg(timeout=10)
                if msg["parent_header"].get("msg_id") == msg_id:
                    if msg["content"]["status"] != "ok":
                        self.log.warning("gpuctx pool: adopting kernel: %s", msg["content"].get("evalue"))
                    return
        finally:
            kc.stop_channels()

    # -- shutting down ------------------------------------------------------------------------------
    async def shutdown_all(self, *args, **kwargs):
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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


def _open_connections(km) -> list:
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

    return [c for c in list(ZMQChannelsWebsocketConnection._open_sockets) if c.parent is km]


async def _repoint(conn, km) -> None:
    """Move an open websocket connection onto the kernel that replaced its kernel. As on a
    fresh connection, wait until the new IOPub subscription is live (ZMQ drops what a kernel
    publishes before that), then forward the new streams to the websocket."""
    for stream in conn.channels.values():
        if not stream.closed():
            stream.close()
    conn.parent = km
    conn.session.key = km.session.key  # each kernel signs its messages with its own key
    conn.create_stream()
    try:
        await _until_subscribed(conn, km)
    except Exception:  # fall back on jupyter_server's own, slower nudge
        await conn.nudge()
    for stream in conn.channels.values():
        stream.on_recv_stream(conn.handle_outgoing_message)
    conn.multi_kernel_manager.add_restart_callback(conn.kernel_id, conn.on_kernel_restarted)
    conn.multi_kernel_manager.add_restart_callback(conn.kernel_id, conn.on_restart_failed, "dead")
    conn.on_kernel_restarted()  # tell the frontend, as an ordinary restart does


async def _until_subscribed(conn, km, every: float = 0.05, timeout: float = 10.0) -> None:
    """Ask the kernel for kernel_info on a control socket of our own until the connection's new
    IOPub subscription carries a message. jupyter_server's nudge does the same every 0.5 s, which
    would be most of a pooled restart's time; the replies go to the throwaway socket."""
    from zmq.eventloop.zmqstream import ZMQStream

    iopub = conn.channels["iopub"]
    control = km.connect_control()  # jupyter_server's kernel managers wrap it in a stream already
    control = control if isinstance(control, ZMQStream) else ZMQStream(control)
    live = asyncio.get_running_loop().create_future()
    iopub.on_recv(lambda _msg: live.done() or live.set_result(None))
    control.on_recv(lambda _msg: None)
    deadline = time.monotonic() + timeout
    try:
        while not live.done() and time.monotonic() < deadline:
            conn.session.send(control, "kernel_info_request")
            try:
                await asyncio.wait_for(asyncio.shield(live), every)
            except asyncio.TimeoutError:
                pass
    finally:
        iopub.stop_on_recv()
        control.close()
