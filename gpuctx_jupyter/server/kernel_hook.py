"""The server side of pre-warming: every kernel this server starts or restarts warms CUDA.

Local ipykernel kernels get `--ext=gpuctx` and GPUCTX_* variables at launch, so the warm-up
thread starts while the kernel boots, before it reports ready; jupyter_client reuses the launch
arguments on restart, so restarts warm too, and the kernel re-reads its notebook for the `auto`
policy each time. Kernels behind a gateway cannot be given arguments: they get one silent
request, first in their queue, that loads gpuctx and starts the same warm-up.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import os

from .. import contract
from ..contract import SESSION, WarmPlan, notebook_wants_gpu, opted_out
from ..core import inventory
from ..core.devices import most_free
from . import kernel_client
from .config import GpuctxServer
from .tasks import Background

SOURCE = "server hook"


class KernelHook:
    def __init__(self, serverapp, cfg: GpuctxServer, log, background: Background):
        self.km = serverapp.kernel_manager
        self.ksm = serverapp.kernel_spec_manager
        self.cfg, self.log = cfg, log
        self.gateway = bool(getattr(getattr(serverapp, "gateway_config", None), "gateway_enabled", False))
        self._start, self._restart = self.km.start_kernel, self.km.restart_kernel
        self._rr = itertools.count()
        self.background = background
        self.warmed: dict[str, dict] = {}  # kernel id -> the plan it was started with

    def install(self) -> None:
        self.km.start_kernel = self.start_kernel
        self.km.restart_kernel = self.restart_kernel

    # -- the wrapped kernel manager methods ---------------------------------------------------
    async def start_kernel(self, *args, **kwargs):
        name = kwargs.get("kernel_name") or getattr(self.km, "default_kernel_name", "python3")
        existing = kwargs.get("kernel_id")
        plan = None
        if not (existing and existing in self.km):
            try:
                plan = await self.plan(name, kwargs.get("env"))
            except Exception as exc:  # planning must never stop a kernel from starting
                self.log.warning("gpuctx: not warming kernel %s: %s", name, exc)
        if plan and not self.gateway:
            kwargs["env"] = {**(kwargs.get("env") or os.environ), **plan}
            wanted = WarmPlan.from_env(plan)
            if self.cfg.load_magics or wanted.warms or wanted.device:
                kwargs["extra_arguments"] = [*(kwargs.get("extra_arguments") or []), "--ext=gpuctx"]
        kernel_id = await _maybe_await(self._start(*args, **kwargs))
        if plan:
            for gone in [k for k in self.warmed if k not in self.km]:  # shut down since
                del self.warmed[gone]
            self.warmed[kernel_id] = plan
            if self.gateway:
                self._warm_remote(kernel_id, plan)
        return kernel_id

    async def restart_kernel(self, kernel_id, *args, **kwargs):
        result = await _maybe_await(self._restart(kernel_id, *args, **kwargs))
        if self.gateway and kernel_id in self.warmed:
            self._warm_remote(kernel_id, self.warmed[kernel_id])
        return result

    # -- what a kernel gets ---------------------------------------------------------------------
    async def plan(self, kernel_name: str, env: dict | None) -> dict | None:
        """The GPUCTX_* variables for this kernel, or None to leave it alone."""
        cfg = self.cfg
        if cfg.warm_policy == "never" and cfg.assign_devices == "off":
            return None
        if cfg.warm_kernelspecs and kernel_name not in cfg.warm_kernelspecs:
            return None
        if not await self._is_ipykernel(kernel_name):
            return None
        base = env if env is not None else os.environ
        policy = cfg.warm_policy
        if self.gateway and policy == "auto":  # the remote kernel cannot read our notebook: decide here
            policy = "always" if notebook_wants_gpu(base.get(SESSION))[0] else "never"
        plan = WarmPlan(policy=policy, source=SOURCE, frameworks=list(cfg.warm_frameworks), ops=list(cfg.warm_ops),
                        imports=list(cfg.warm_imports), opt_out=opted_out(base))
        device = await self._assign()
        if device is not None:
            plan.device, plan.device_source = str(device), f"the server ({cfg.assign_devices})"
        return plan.to_env()

    async def _is_ipykernel(self, name: str) -> bool:
        try:
            spec = await _maybe_await(self.ksm.get_kernel_spec(name))
        except Exception:
            return False
        if isinstance(spec, dict):  # a gateway answers with its REST model
            spec = spec.get("spec", spec)
            argv, language = spec.get("argv") or [], spec.get("language") or ""
        else:
            argv, language = getattr(spec, "argv", None) or [], getattr(spec, "language", "") or ""
        argv, language = " ".join(argv), language.lower()
        return "ipykernel" in argv or (self.gateway and language == "python")

    async def _assign(self) -> int | None:
        mode = self.cfg.assign_devices
        if mode == "off":
            return None
        inv = await asyncio.get_running_loop().run_in_executor(None, inventory.take)
        return pick_device(inv.devices, mode, self._rr)

    # -- kernels behind a gateway ------------------------------------------------------------
    def _warm_remote(self, kernel_id: str, plan: dict) -> None:
        self.background.spawn(self._send_warm_request(kernel_id, plan), f"warming kernel {kernel_id}")

    async def _send_warm_request(self, kernel_id: str, plan: dict) -> None:
        code = (
            "import os as _gpuctx_os\n"
            f"_gpuctx_os.environ.update({plan!r})\n"
            f"from {contract.WARM_ENTRY_MODULE} import {contract.WARM_ENTRY_FUNCTION} as _gpuctx_warm\n"
            "_gpuctx_warm(get_ipython())\n"
            "del _gpuctx_os, _gpuctx_warm\n"
        )
        try:
            reply = await kernel_client.execute(self.km.get_kernel(kernel_id), code, self.cfg.gateway_timeout)
            if reply.get("status") != "ok":
                self.log.warning("gpuctx: kernel %s did not start its warm-up: %s: %s", kernel_id,
                                 reply.get("ename"), reply.get("evalue"))
        except Exception as exc:  # a remote kernel that cannot warm still works
            self.log.warning("gpuctx: could not ask kernel %s to warm up: %s: %s", kernel_id,
                             type(exc).__name__, exc)


def pick_device(devices, mode: str, turns) -> int | None:
    """The CUDA ordinal a new kernel gets: 'least-used' (most free memory, lowest ordinal on a
    tie) or 'round-robin' (the next healthy GPU in turn); None without a healthy GPU."""
    healthy = [d for d in devices if not d.record.error]
    if not healthy or mode == "off":
        return None
    if mode == "round-robin":
        return healthy[next(turns) % len(healthy)].ordinal
    return most_free(healthy).ordinal


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value
