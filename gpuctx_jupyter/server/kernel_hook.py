"""The server side of pre-warming: every kernel this server starts or restarts warms CUDA.

Local ipykernel kernels get `--ext=gpuctx` and GPUCTX_* variables at launch, so the warm-up
thread starts while the kernel boots, before it reports ready; jupyter_client reuses the launch
arguments on restart, so restarts warm too, and the kernel re-reads its notebook for the `auto`
policy each time. Kernels behind a gateway cannot be given arguments: they get one silent
request, first in their queue, that loads gpuctx and starts the same warm-up.

A local kernelspec's Python is asked once (off the event loop, cached per kernelspec) whether it
has gpuctx at all: a kernel of another environment without it is left alone, instead of logging
ModuleNotFoundError at every start, and the GPU API says so rather than waiting for no answer.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import shutil
import subprocess
import sys

from .. import contract
from ..contract import SESSION, WarmPlan, notebook_wants_gpu, opted_out
from ..core import inventory
from ..core.devices import most_free
from . import kernel_client
from .config import GpuctxServer
from .tasks import Background

SOURCE = "server hook"
# Asked of a kernelspec's Python: exit status 0 when gpuctx is importable, 1 when not.
HAS_GPUCTX = "import importlib.util,sys; sys.exit(importlib.util.find_spec('gpuctx') is None)"
PROBE_TIMEOUT_S = 30.0


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
        self.missing: dict[str, str] = {}  # kernel id -> why it was left alone (no gpuctx in its Python)
        self._probes: dict[tuple[str, str], asyncio.Future] = {}  # (kernelspec, python) -> gpuctx there?
        self._spec_missing: dict[str, str] = {}  # kernelspec -> the sentence, once probed

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
                self.log.warning("gpuctx: not warming kernel %s: %s: %s", name, type(exc).__name__, exc)
        if plan and not self.gateway:
            kwargs["env"] = {**(kwargs.get("env") or os.environ), **plan}
            wanted = WarmPlan.from_env(plan)
            if self.cfg.load_magics or wanted.warms or wanted.device:
                kwargs["extra_arguments"] = [*(kwargs.get("extra_arguments") or []), "--ext=gpuctx"]
        kernel_id = await _maybe_await(self._start(*args, **kwargs))
        for table in (self.warmed, self.missing):
            for gone in [k for k in table if k not in self.km]:  # shut down since
                del table[gone]
        if plan is None and name in self._spec_missing:
            self.missing[kernel_id] = self._spec_missing[name]
        if plan:
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
        ipykernel, python = await self._spec(kernel_name)
        if not ipykernel or await self._gpuctx_missing(kernel_name, python):
            return None
        base = env if env is not None else os.environ
        policy = cfg.warm_policy
        if self.gateway and policy == "auto":  # the remote kernel cannot read our notebook: decide here
            policy = "always" if notebook_wants_gpu(base.get(SESSION))[0] else "never"
        plan = WarmPlan(policy=policy, recipe=cfg.warm_recipe, source=SOURCE, frameworks=list(cfg.warm_frameworks),
                        ops=list(cfg.warm_ops), imports=list(cfg.warm_imports), opt_out=opted_out(base))
        device = await self._assign()
        if device is not None:
            plan.device, plan.device_source = str(device), f"the server ({cfg.assign_devices})"
        return plan.to_env()

    async def _spec(self, name: str) -> tuple[bool, str | None]:
        """Whether the kernelspec runs ipykernel, and the Python it runs (None behind a gateway)."""
        try:
            spec = await _maybe_await(self.ksm.get_kernel_spec(name))
        except Exception:
            return False, None
        if isinstance(spec, dict):  # a gateway answers with its REST model
            spec = spec.get("spec", spec)
            argv, language = spec.get("argv") or [], spec.get("language") or ""
        else:
            argv, language = getattr(spec, "argv", None) or [], getattr(spec, "language", "") or ""
        ipykernel = "ipykernel" in " ".join(argv) or (self.gateway and language.lower() == "python")
        return ipykernel, None if self.gateway or not argv else _python_of(argv[0])

    def without_gpuctx(self, kernel_name: str) -> str | None:
        """Why kernels of this kernelspec are left alone, when its Python lacks gpuctx (once probed)."""
        return self._spec_missing.get(kernel_name)

    async def _gpuctx_missing(self, kernel_name: str, python: str | None) -> bool:
        """True when the kernelspec's Python surely lacks gpuctx; probed once per kernelspec."""
        if python is None or python == sys.executable:  # the server's own Python runs gpuctx already
            return False
        key = (kernel_name, python)
        if key not in self._probes:
            self._probes[key] = asyncio.get_running_loop().run_in_executor(None, _probe, python)
        found = await asyncio.shield(self._probes[key])
        if found is False:
            if kernel_name not in self._spec_missing:
                self.log.info("gpuctx: leaving %s kernels alone: gpuctx is not installed in %s", kernel_name, python)
            self._spec_missing[kernel_name] = f"gpuctx is not installed in this kernel's environment ({python})"
            return True
        self._spec_missing.pop(kernel_name, None)
        return False

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


def _python_of(argv0: str) -> str:
    """The interpreter a kernelspec's argv[0] names, as jupyter_client resolves it ("python" and
    "python3" mean the server's own interpreter)."""
    own = {"python", f"python{sys.version_info[0]}", "python%i.%i" % sys.version_info[:2]}
    if argv0 in own:
        return sys.executable
    return shutil.which(argv0) or argv0


def _probe(python: str) -> bool | None:
    """Whether `python` can import gpuctx: True, False, or None when it cannot be asked (not a
    Python, or it hangs) — then the kernel is treated as before, with gpuctx."""
    try:
        code = subprocess.run([python, "-c", HAS_GPUCTX], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(code)


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
