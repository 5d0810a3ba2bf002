"""Wiring the kernel side into an IPython shell, and taking it out again."""
from __future__ import annotations

import logging
import os
import sys

from ..contract import SESSION, WARM_SOURCE, notebook_wants_gpu, opted_out
from ..core import inventory
from ..core.devices import SpecError, parse_spec
from . import kernel_view
from .magics import GpuMagics
from .switching import Choice
from .warmup import GpuWarmup

_ATTR = "_gpuctx_magics"
log = logging.getLogger("gpuctx")


def _log_to_kernel_stderr() -> None:
    """gpuctx's kernel-side messages go to the kernel's own stderr (the server's log), never into a
    cell's output: ipykernel redirects sys.stderr into whichever cell is running. Set up here, on
    load, so that importing a module of ours never changes logging in another process."""
    if any(getattr(h, "_gpuctx", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(logging.Formatter("[gpuctx %(levelname)s] %(message)s"))
    handler._gpuctx = True
    log.addHandler(handler)
    log.propagate = False


def load(ip) -> GpuMagics:
    magics = getattr(ip, _ATTR, None)
    if magics is not None:
        return magics
    _log_to_kernel_stderr()
    magics = GpuMagics(ip)
    ip.register_magics(magics)
    ip.events.register("pre_run_cell", magics.pre_run_cell)
    ip.events.register("post_run_cell", magics.post_run_cell)
    magics.import_hook.install()
    kernel_view.register(ip, magics)
    setattr(ip, _ATTR, magics)
    start_from_config(magics, GpuWarmup(parent=ip))
    return magics


def start_from_config(magics: GpuMagics, cfg: GpuWarmup) -> None:
    """Apply the configured device and warm-up policy (kernel config or the server's env)."""
    if cfg.device:
        try:
            dev = parse_spec(cfg.device, inventory.take().devices)
            magics.switcher.use(Choice(dev.ordinal, source=cfg.device_source or "kernel config"))
        except SpecError as exc:
            log.warning("gpuctx: ignoring the configured device %r: %s", cfg.device, exc)
    policy = "never" if opted_out() else cfg.policy
    source = os.environ.get(WARM_SOURCE, "kernel config")
    if policy == "auto":
        wanted, why = notebook_wants_gpu(os.environ.get(SESSION))
        if not wanted:
            magics.warmer.status.detail = f"policy auto: {why}"
            return
    elif policy == "never":
        magics.warmer.status.detail = "opted out (GPUCTX_WARM=0)" if opted_out() else "policy never"
        return
    magics.warmer.start(cfg.frameworks, cfg.ops, source=source, imports=cfg.imports)


def unload(ip) -> None:
    magics = getattr(ip, _ATTR, None)
    if magics is None:
        return
    ip.events.unregister("pre_run_cell", magics.pre_run_cell)
    ip.events.unregister("post_run_cell", magics.post_run_cell)
    magics.import_hook.remove()
    kernel_view.unregister(ip)
    if "gpuctx_jupyter.kernel.monitor" in sys.modules:
        sys.modules["gpuctx_jupyter.kernel.monitor"].close_all()
    magics.switcher.use(None)  # hands torch's default device back if we had set it
    for kind, names in magics.magics.items():
        table = ip.magics_manager.magics[kind]
        for name in names:
            table.pop(name, None)
    ip.magics_manager.registry.pop(type(magics).__name__, None)
    delattr(ip, _ATTR)


def warm_from_env(ip) -> GpuMagics:
    """Load gpuctx and apply the GPUCTX_* settings now (the gateway route: the server sends this
    as the kernel's first request, having put the settings into os.environ)."""
    magics = load(ip)
    if magics.warmer.status.state == "off":
        start_from_config(magics, GpuWarmup(parent=ip))
    return magics
