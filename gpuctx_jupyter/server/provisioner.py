"""How a local kernel of this server is launched: gpuctx's kernel provisioner.

jupyter_client asks a kernel's provisioner to launch its process — at start, at every restart
(jupyter_server's or the restarter's after a crash) — and the provisioner answers with the
process and its connection info. gpuctx's provisioner is jupyter_client's LocalProvisioner plus
two things, so that starting a kernel from a warmed standby is "how this kernel is launched"
rather than surgery on the kernel manager:

- `pre_launch`: the launch arguments get what gpuctx gives every kernel (launch.Launcher: warm
  settings, device, `--ext=gpuctx`, the holders file, JAX's preallocation off);
- `launch_kernel`: when the warm pool has a standby that fits (pool.Pool.take), its process
  becomes this kernel's — handed over on its control channel (working directory, environment,
  connection file) — instead of a new one; the kernel id, its kernel manager and the open
  websockets (re-pointed at the new ports) stay, and jupyter_server's own bookkeeping (activity,
  culling, sessions, port changes) runs as for any kernel. Anything that goes wrong falls back to
  launching a fresh process.

On a restart that a standby will serve, the old process is not waited for: it has been asked to
shut down, and stops in the background (a CUDA context takes a few hundred ms to tear down).

The server extension registers it under the entry point `gpuctx` and makes it the default
provisioner of kernelspecs that name none (`attach`); a kernelspec that names its own provisioner
keeps it, and is launched without gpuctx's help. A kernel manager the server does not own (in the
same process: another application's) launches as with jupyter_client's LocalProvisioner.
"""
from __future__ import annotations

import asyncio
import os
import signal
import weakref
from importlib.metadata import EntryPoint

from jupyter_client.connect import LocalPortCache
from jupyter_client.provisioning import KernelProvisionerFactory, LocalProvisioner

from ..contract import POOL_NOTE
from . import jupyter_internals as internals

NAME = "gpuctx"
ENTRY_POINT = EntryPoint(NAME, f"{__name__}:GpuctxProvisioner", KernelProvisionerFactory.GROUP_NAME)
STOP_WAIT_S = 5.0  # a replaced process's shutdown wait, where its manager gives none (jupyter_client's default)

# The server's kernel manager -> what launches its kernels (set by the extension's composition root).
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Attachment:
    """What the provisioner needs of the server: the launcher, the pool, and where to run what
    outlives a launch."""

    def __init__(self, launcher, pool, background, log):
        self.launcher, self.pool, self.background, self.log = launcher, pool, background, log


def attach(mkm, launcher, pool, background, log) -> str | None:
    """Make gpuctx's provisioner launch `mkm`'s kernels; None, or why not (a sentence)."""
    factory = KernelProvisionerFactory.instance(parent=mkm)
    configured = factory.default_provisioner_name
    if configured not in ("local-provisioner", NAME):
        return (f"KernelProvisionerFactory.default_provisioner_name is {configured!r}: kernels launch with "
                "that provisioner, without gpuctx's warm-up settings or the warm pool")
    factory.provisioners.setdefault(NAME, ENTRY_POINT)  # also when gpuctx runs from a source tree
    factory.default_provisioner_name = NAME
    _ATTACHED[mkm] = Attachment(launcher, pool, background, log)
    return None


def detach(mkm) -> None:
    """The server is stopping: kernel managers of this process launch as jupyter_client's own again."""
    _ATTACHED.pop(mkm, None)
    if not _ATTACHED:
        KernelProvisionerFactory.instance().default_provisioner_name = "local-provisioner"


class GpuctxProvisioner(LocalProvisioner):
    _adopted = False  # the running process came from the pool
    _reaping: asyncio.Task | None = None  # the replaced process, stopping in the background

    @property
    def _attachment(self) -> Attachment | None:
        mkm = getattr(self.parent, "parent", None)
        return _ATTACHED.get(mkm) if mkm is not None else None

    async def pre_launch(self, **kwargs):
        at = self._attachment
        if at is not None:
            km = self.parent
            standby = at.pool is not None and at.pool.launched_by_pool(km)
            kwargs = await at.launcher.prepare(km.kernel_id, km.kernel_name, kwargs, standby=standby)
        return await super().pre_launch(**kwargs)

    async def launch_kernel(self, cmd, **kwargs):
        at = self._attachment
        try:
            standby, note = await self._take(at, kwargs) if at is not None else (None, "")
        except Exception as exc:  # noqa: BLE001 — the pool's fault never fails a launch
            at.log.warning("gpuctx pool: choosing a standby for kernel %s failed (%s: %s); starting a fresh "
                           "process", self.parent.kernel_id, type(exc).__name__, exc)
            standby, note = None, ""
        if note and isinstance(kwargs.get("env"), dict):
            kwargs["env"][POOL_NOTE] = note  # %gpu status says why this kernel started fresh
        if standby is not None:
            km = self.parent
            cwd = kwargs.get("cwd") or os.getcwd()
            try:
                await at.pool.hand_over(standby, km.kernel_id, cwd, kwargs.get("env") or {}, km.connection_file)
            except Exception as exc:  # the pool stopped it: launch as if there had been none
                at.log.warning("gpuctx pool: handing a standby to kernel %s failed (%s: %s); starting a fresh "
                               "process", km.kernel_id, type(exc).__name__, exc)
            else:
                return self._become(standby, cwd)
        self._adopted = False
        if self._reaping is not None:  # a fresh process binds the old one's ports: let it go first
            await asyncio.wait([self._reaping])
        return await super().launch_kernel(cmd, **kwargs)

    async def _take(self, at: Attachment, kwargs: dict):
        """A standby for this launch, or (None, why none served it: "" when none was asked)."""
        pool, km = at.pool, self.parent
        if pool is not None and pool.launched_by_pool(km):
            pool.launching(km, kwargs.get("env") or {})  # the environment it really gets
            return None, ""
        if pool is None or not pool.serves(km.kernel_name):
            return None, ""
        env = kwargs.get("env") or {}
        restart = km.kernel_id in at.launcher.started
        # With assign_devices, a new kernel's GPU is the server's pick (GPUCTX_DEVICE in `env`): an
        # imports standby that has not started the CUDA driver takes it at the hand-over; the pool
        # refuses a gpu standby warmed on another GPU, and standby.differing_environment one that
        # started the driver.
        if not await pool.fits(env):
            return None, ""
        return await pool.take(km.kernel_name, env, kwargs.get("cwd") or os.getcwd(), restart)

    def _become(self, standby, cwd: str):
        """The standby's process is this kernel's now: its process, ports and connection info."""
        if self.ports_cached:  # the ports reserved for a process that will not be launched
            lpc = LocalPortCache.instance()
            for name in ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port"):
                port = self.connection_info.get(name)
                if port:
                    lpc.return_port(port)
        theirs = standby.km.provisioner
        self.process, self.pid, self.pgid = theirs.process, theirs.pid, theirs.pgid
        self.connection_info, self.ports_cached, self.cwd = dict(theirs.connection_info), theirs.ports_cached, cwd
        theirs.process, theirs.ports_cached = None, False  # nothing of the standby's manager stops it now
        self._adopted = True
        return self.connection_info

    async def post_launch(self, **kwargs):
        await super().post_launch(**kwargs)
        at = self._attachment
        if at is None:
            return
        km = self.parent
        if at.pool is not None and at.pool.launched_by_pool(km):
            return
        first = km.kernel_id not in at.launcher.started
        at.launcher.started.add(km.kernel_id)
        if self._adopted and not first:  # a restart: the notebook's websockets move to the new ports
            await internals.repoint_all(km, at.log)
        if self._adopted:
            at.log.info("gpuctx pool: kernel %s %s from the pool (pid %s)", km.kernel_id,
                        "adopted" if first else "restarted", self.pid)

    async def shutdown_requested(self, restart: bool = False):
        """On a restart that a standby will serve, the old process stops in the background."""
        await super().shutdown_requested(restart=restart)
        at = self._attachment
        if restart and at is not None and at.pool is not None and at.pool.has_standby_for(self.parent.kernel_name):
            process, pgid = self.process, self.pgid
            if process is not None:
                self.process = None  # jupyter_client sees it gone at once
                wait = float(getattr(self.parent, "shutdown_wait_time", STOP_WAIT_S) or STOP_WAIT_S)
                self._reaping = at.background.spawn(_reap(process, pgid, at.log, wait),
                                                    f"stopping the replaced process {process.pid}")

    async def cleanup(self, restart: bool = False):
        await super().cleanup(restart=restart)
        at = self._attachment
        if at is not None and not restart:
            at.launcher.forget(self.parent.kernel_id)


async def _reap(process, pgid, log, wait: float = STOP_WAIT_S) -> None:
    """Wait for a process that was asked to shut down, as jupyter_client waits for a kernel: half
    of `wait` (its manager's shutdown_wait_time), then SIGTERM to its group, the other half, then
    SIGKILL (a hung GPU notebook's memory is freed within `wait`, and its SIGTERM handlers run)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = loop.time() + wait / 2
        while process.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.1)
        if process.poll() is not None:
            break
        log.info("gpuctx pool: the replaced kernel process %s did not exit: %s", process.pid, sig.name)
        try:
            os.killpg(pgid, sig) if pgid else process.send_signal(sig)
        except OSError:
            pass
    try:
        await loop.run_in_executor(None, process.wait, 5)
    except Exception:  # noqa: BLE001 — it is gone either way
        pass
