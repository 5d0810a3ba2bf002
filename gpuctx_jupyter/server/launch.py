"""What a kernel of this server gets when it is launched: its warm settings, its device, gpuctx's
extension and the server's environment defaults — decided again at every start and restart.

Local kernels get it through the provisioner (`provisioner.py`: `prepare` runs in its pre_launch),
so that the kernel's warm-up starts while it boots, before it reports ready; a restart is a launch
too, so the kernel re-reads its notebook each time. Kernels behind a gateway cannot be given
arguments: `lifecycle.py` sends them one silent request, first in their queue, that loads gpuctx
and starts the same warm-up (`warm_remote`).

A local kernelspec's Python is asked once (off the event loop, cached per kernelspec) whether it
has gpuctx at all: a kernel of another environment without it is left alone, instead of logging
ModuleNotFoundError at every start, and the GPU API says so rather than waiting for no answer.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .. import contract
from ..contract import SERVER_HOOK, SESSION, WarmSettings, opted_out
from ..contract.holders import HOLDERS
from ..core import inventory
from ..core.devices import most_free
from . import kernel_client
from .config import GpuctxServer
from .notebooks import Notebooks
from .tasks import Background

SOURCE = SERVER_HOOK
# Asked of a kernelspec's Python: exit status 0 when the module is importable, 1 when not.
HAS_GPUCTX = "import importlib.util,sys; sys.exit(importlib.util.find_spec('gpuctx') is None)"
HAS_GPU_FRAMEWORK = ("import importlib.util,sys; "
                     "sys.exit(not any(importlib.util.find_spec(m) for m in ('torch', 'cupy', 'jax')))")
PROBE_TIMEOUT_S = 30.0
EXT_ARG = "--ext=gpuctx"


@dataclass
class Launched:
    """What gpuctx gave a kernel at its last launch."""

    kernel_name: str
    settings: dict[str, str]  # its GPUCTX_* warm settings (empty: left alone)
    notebook: str | None  # JPY_SESSION_NAME
    device: str = ""  # the server-assigned device ("" when none)
    missing: str | None = None  # why it was left alone: gpuctx is not installed in its Python

    @property
    def warmed(self) -> bool:
        return bool(self.settings)


def jax_cache_dir(setting: str) -> str | None:
    """The folder of JAX's persistent compilation cache for c.GpuctxServer.jax_compilation_cache."""
    if setting.strip().lower() == "off":
        return None
    if setting.strip():
        return os.path.expanduser(setting.strip())
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpuctx", "jax")


def kernel_env_defaults(env: Mapping[str, str], holders_file: str | None, jax_preallocate: bool,
                        jax_cache: str | None = None, jax_cache_max_gib: float = 0.0) -> dict[str, str]:
    """What every kernel this server starts gets in its environment, on top of `env`: the holders
    file's path; XLA_PYTHON_CLIENT_PREALLOCATE=false unless the user's environment says
    something about JAX's preallocation (or c.GpuctxServer.jax_preallocate is True); JAX's
    persistent compilation cache in `jax_cache`, bounded, unless the environment names one."""
    out = {}
    if jax_cache and "JAX_COMPILATION_CACHE_DIR" not in env:
        out["JAX_COMPILATION_CACHE_DIR"] = jax_cache
        out["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"  # a first jit cell's compile counts
        if jax_cache_max_gib > 0:
            out["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(int(jax_cache_max_gib * 2**30))
        out = {k: v for k, v in out.items() if k not in env}  # the user's own bounds stay theirs
    if holders_file:
        out[HOLDERS] = holders_file
    said = any(v in env for v in (contract.XLA_PREALLOCATE, contract.XLA_MEM_FRACTION, contract.XLA_ALLOCATOR))
    if not jax_preallocate and (not said or env.get(contract.XLA_SET_BY) == "server"):
        out[contract.XLA_PREALLOCATE] = "false"
        out[contract.XLA_SET_BY] = "server"
    return out


class Launcher:
    def __init__(self, cfg: GpuctxServer, log, kernel_spec_manager, notebooks: Notebooks, background: Background,
                 holders_file: str | None = None, gateway: bool = False, kernel_manager=None):
        self.cfg, self.log, self.ksm = cfg, log, kernel_spec_manager
        self.kernel_manager = kernel_manager  # the server's, for the warm-up requests to gateway kernels
        self.notebooks, self.background = notebooks, background
        self.holders_file, self.gateway = holders_file, gateway
        self.launched: dict[str, Launched] = {}  # kernel id -> what its last launch got
        self.started: set[str] = set()  # kernel ids launched once at least (a next launch is a restart)
        self._devices: dict[str, str] = {}  # kernel id -> its assigned device (kept across restarts)
        self._turn = 0  # round-robin: the next kernel's turn
        self._probes: dict[tuple[str, str], asyncio.Future] = {}  # (kernelspec, python) -> gpuctx there?
        self._spec_missing: dict[str, str] = {}  # kernelspec -> the sentence, once probed
        self._frameworks: dict[str, bool] = {}  # kernelspec -> a GPU framework is installed there

    # -- a local launch ---------------------------------------------------------------------------
    async def prepare(self, kernel_id: str, kernel_name: str, kwargs: dict, standby: bool = False) -> dict:
        """The launch arguments of a kernel with what gpuctx gives it (new dicts: jupyter_client
        keeps the originals for the next restart, which is prepared afresh). A standby of the pool
        keeps the warm settings the pool gave it."""
        env = dict(kwargs.get("env") or os.environ)
        env.update(kernel_env_defaults(env, self.holders_file, self.cfg.jax_preallocate,
                                       jax_cache_dir(self.cfg.jax_compilation_cache),
                                       self.cfg.jax_compilation_cache_max_gib))
        out = dict(kwargs, env=env)
        if standby:
            out["extra_arguments"] = [*(kwargs.get("extra_arguments") or []), EXT_ARG]
            return out
        try:
            settings = await self.settings(kernel_name, env, kernel_id)
        except Exception as exc:  # planning must never stop a kernel from starting
            self.log.warning("gpuctx: not warming kernel %s: %s: %s", kernel_name, type(exc).__name__, exc)
            settings = None
        record = Launched(kernel_name, settings or {}, env.get(SESSION), (settings or {}).get(contract.DEVICE, ""),
                          missing=None if settings else self._spec_missing.get(kernel_name))
        self.launched[kernel_id] = record
        if settings:
            env.update(settings)
            wanted = WarmSettings.from_env(settings)
            if self.cfg.load_magics or wanted.warms or wanted.device:
                out["extra_arguments"] = [*(kwargs.get("extra_arguments") or []), EXT_ARG]
        return out

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone (shut down): its records go."""
        self.launched.pop(kernel_id, None)
        self._devices.pop(kernel_id, None)
        self.started.discard(kernel_id)

    # -- what a kernel gets -----------------------------------------------------------------------
    async def settings(self, kernel_name: str, env: Mapping[str, str] | None, kernel_id: str | None = None
                       ) -> dict | None:
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
            policy = gateway_policy(await self.notebooks.facts(base.get(SESSION)), cfg.warm_recipe)
        settings = WarmSettings(policy=policy, recipe=cfg.warm_recipe, source=SOURCE,
                                frameworks=list(cfg.warm_frameworks), ops=list(cfg.warm_ops),
                                imports=list(cfg.warm_imports), opt_out=opted_out(base))
        device = await self._device(kernel_id)
        if device is not None:
            settings.device, settings.device_source = device, f"the server ({cfg.assign_devices})"
        return settings.to_env()

    async def _device(self, kernel_id: str | None) -> str | None:
        """The kernel's assigned device: chosen at its first launch, kept across its restarts."""
        if self.cfg.assign_devices == "off":
            return None
        if kernel_id is not None and kernel_id in self._devices:
            return self._devices[kernel_id]
        inv = await asyncio.get_running_loop().run_in_executor(None, inventory.take)
        ordinal = pick_device(inv.devices, self.cfg.assign_devices, self._turn)
        if ordinal is None:
            return None
        if kernel_id is not None:  # (a standby of the pool takes no turn: the notebook it goes to does)
            self._turn += 1
            self._devices[kernel_id] = str(ordinal)
        return str(ordinal)

    async def _spec(self, name: str) -> tuple[bool, str | None]:
        """Whether the kernelspec runs ipykernel, and the Python it runs (None behind a gateway)."""
        try:
            spec = self.ksm.get_kernel_spec(name)
            spec = await spec if inspect.isawaitable(spec) else spec
        except Exception:
            return False, None
        if isinstance(spec, dict):  # a gateway answers with its REST model
            spec = spec.get("spec", spec)
            argv, language = spec.get("argv") or [], spec.get("language") or ""
        else:
            argv, language = getattr(spec, "argv", None) or [], getattr(spec, "language", "") or ""
        ipykernel = "ipykernel" in " ".join(argv) or (self.gateway and language.lower() == "python")
        return ipykernel, None if self.gateway or not argv else _python_of(argv[0])

    async def unlaunchable(self, kernel_name: str) -> str | None:
        """Why a local kernelspec's kernels cannot launch, when its argv names no program that exists
        (checked before launching, so that a broken kernelspec costs one line, not a traceback)."""
        if self.gateway:
            return None
        try:
            spec = self.ksm.get_kernel_spec(kernel_name)
            spec = await spec if inspect.isawaitable(spec) else spec
        except Exception as exc:  # noqa: BLE001 — the launch says the same, in its own words
            return f"kernelspec {kernel_name!r}: {type(exc).__name__}: {exc}"
        argv = getattr(spec, "argv", None) or []
        if argv and not shutil.which(_python_of(argv[0])):
            return (f"its argv[0] {argv[0]!r} is not a program that exists: fix the kernelspec "
                    f"({getattr(spec, 'resource_dir', 'jupyter kernelspec list')})")
        return None

    async def has_gpu_framework(self, kernel_name: str) -> bool:
        """Whether a GPU framework (torch, CuPy, JAX) is installed in a kernelspec's Python (asked
        once per kernelspec, off the event loop)."""
        if kernel_name not in self._frameworks:
            _ipykernel, python = await self._spec(kernel_name)
            code = HAS_GPU_FRAMEWORK
            found = await asyncio.get_running_loop().run_in_executor(None, _probe, python or sys.executable, code)
            self._frameworks[kernel_name] = found is not False
        return self._frameworks[kernel_name]

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

    # -- kernels behind a gateway -------------------------------------------------------------------
    async def gateway_started(self, kernel_id: str, kernel_name: str, env: Mapping[str, str] | None) -> None:
        """A gateway kernel started: plan it and send it the warm-up request (in the background)."""
        try:
            settings = await self.settings(kernel_name, env or os.environ, kernel_id)
        except Exception as exc:
            self.log.warning("gpuctx: not warming kernel %s: %s: %s", kernel_name, type(exc).__name__, exc)
            settings = None
        self.launched[kernel_id] = Launched(kernel_name, settings or {}, (env or {}).get(SESSION))
        if settings:
            self.warm_remote(kernel_id)

    def warm_remote(self, kernel_id: str) -> None:
        record = self.launched.get(kernel_id)
        if record is not None and record.settings:
            self.background.spawn(self._send_warm_request(kernel_id, record.settings), f"warming kernel {kernel_id}")

    async def _send_warm_request(self, kernel_id: str, settings: dict) -> None:
        code = (
            "import os as _gpuctx_os\n"
            f"_gpuctx_os.environ.update({settings!r})\n"
            f"from {contract.WARM_ENTRY_MODULE} import {contract.WARM_ENTRY_FUNCTION} as _gpuctx_warm\n"
            "_gpuctx_warm(get_ipython())\n"
            "del _gpuctx_os, _gpuctx_warm\n"
        )
        km = self.kernel_manager
        try:
            reply = await kernel_client.execute(km.get_kernel(kernel_id), code, self.cfg.gateway_timeout)
            if reply.get("status") != "ok":
                self.log.warning("gpuctx: kernel %s did not start its warm-up: %s: %s", kernel_id,
                                 reply.get("ename"), reply.get("evalue"))
        except Exception as exc:  # a remote kernel that cannot warm still works
            self.log.warning("gpuctx: could not ask kernel %s to warm up: %s: %s", kernel_id,
                             type(exc).__name__, exc)


def gateway_policy(facts, recipe: str) -> str:
    """The policy a kernel behind a gateway gets where the server's is `auto`: `always` for a GPU
    notebook; `auto` for a new, empty one with the notebook recipe, which warms nothing at start
    where the kernel cannot read the file, and what its cells use once they are typed; `never`
    for a notebook without a GPU framework."""
    if facts.wants_gpu()[0]:
        return "always"
    return "auto" if recipe == "notebook" and facts.readable and facts.new else "never"


def _python_of(argv0: str) -> str:
    """The interpreter a kernelspec's argv[0] names, as jupyter_client resolves it ("python" and
    "python3" mean the server's own interpreter)."""
    own = {"python", f"python{sys.version_info[0]}", "python%i.%i" % sys.version_info[:2]}
    if argv0 in own:
        return sys.executable
    return shutil.which(argv0) or argv0


def _probe(python: str, check: str = HAS_GPUCTX) -> bool | None:
    """Whether `python` passes `check` (can import gpuctx): True, False, or None when it cannot be
    asked (not a Python, or it hangs) — then the kernel is treated as before, with gpuctx."""
    try:
        code = subprocess.run([python, "-c", check], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(code)


def pick_device(devices, mode: str, turn: int) -> int | None:
    """The CUDA ordinal a new kernel gets: 'least-used' (most free memory, lowest ordinal on a
    tie) or 'round-robin' (the healthy GPU of this `turn`); None without a healthy GPU."""
    healthy = [d for d in devices if not d.record.error]
    if not healthy or mode == "off":
        return None
    if mode == "round-robin":
        return healthy[turn % len(healthy)].ordinal
    return most_free(healthy).ordinal
