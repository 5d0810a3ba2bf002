"""Wiring the kernel side into an IPython shell, and taking it out again."""
from __future__ import annotations

import inspect
import logging
import os
import sys

from ..contract import (
    DEFAULT_OPS,
    SESSION,
    WARM_SOURCE,
    code_cells,
    notebook_opts_out,
    notebook_wants_gpu,
    opted_out,
    read_notebook,
)
from ..core import inventory
from ..core.devices import SpecError, parse_spec
from . import kernel_view, notebook_plan
from .magics import GpuMagics
from .switching import Choice
from .warmup import GpuWarmup

_ATTR = "_gpuctx_magics"
_UNHOOK = "_gpuctx_unhook_kernel_info"
# The name the kernel's start-up load is kept under, so that a notebook's own `%load_ext gpuctx`
# loads quietly instead of printing "The gpuctx extension is already loaded".
STARTUP_NAME = "gpuctx_jupyter"
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
    magics.switcher.threads.install()
    kernel_view.register(ip, magics, on_adopt=lambda previous: warm_after_adoption(magics, previous))
    setattr(ip, _ATTR, magics)
    at_start = _at_kernel_start(ip)
    if at_start:
        _let_the_notebook_load_quietly(ip)
    start_from_config(magics, GpuWarmup(parent=ip), defer=at_start)
    return magics


def _at_kernel_start(ip) -> bool:
    """Loaded by the kernel's start-up (`--ext=gpuctx`, kernel config), not by a cell."""
    return getattr(ip, "kernel", None) is not None and getattr(ip.displayhook, "exec_result", None) is None


def _let_the_notebook_load_quietly(ip) -> None:
    """Before the first cell, keep the start-up load under STARTUP_NAME: the notebook's own
    `%load_ext gpuctx` then finds gpuctx loaded (load() is idempotent) and prints nothing."""
    def once(*_args):
        ip.events.unregister("pre_run_cell", once)
        loaded = getattr(getattr(ip, "extension_manager", None), "loaded", None)
        if isinstance(loaded, set) and "gpuctx" in loaded:
            loaded.discard("gpuctx")
            loaded.add(STARTUP_NAME)
    ip.events.register("pre_run_cell", once)


def _on_kernel_info(ip, warmer):
    """Tell `warmer` of each kernel_info reply (shell or control channel) until its scheduled
    start has happened: the kernel is ready by then, so the warm-up never delays readiness.
    Returns the function that takes the hook out (None when this kernel has no handlers)."""
    kernel = getattr(ip, "kernel", None)
    tables = [t for t in (getattr(kernel, "shell_handlers", None), getattr(kernel, "control_handlers", None))
              if isinstance(t, dict) and callable(t.get("kernel_info_request"))]
    if not tables:
        return None
    originals = [(t, t["kernel_info_request"]) for t in tables]

    def unhook():
        for table, original in originals:
            if getattr(table.get("kernel_info_request"), "_gpuctx", False):
                table["kernel_info_request"] = original
        if getattr(ip, _UNHOOK, None) is unhook:
            delattr(ip, _UNHOOK)

    def wrap(original):
        async def kernel_info_request(*args, **kwargs):
            result = original(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            warmer.answered()
            return result
        kernel_info_request._gpuctx = True
        return kernel_info_request

    for table, original in originals:
        table["kernel_info_request"] = wrap(original)
    setattr(ip, _UNHOOK, unhook)
    return unhook


def _planner(cfg: GpuWarmup, path: str | None):
    """What the warm-up thread calls to make its plan (reading the notebook happens there)."""
    frameworks, ops, imports = tuple(cfg.frameworks), tuple(cfg.ops), tuple(cfg.imports)
    if cfg.recipe == "basic":
        return lambda: notebook_plan.basic(frameworks, ops, imports)
    deny, most = tuple(cfg.import_deny), cfg.max_imports
    extra_ops = tuple(op for op in ops if op not in DEFAULT_OPS)
    return lambda: notebook_plan.derive(path, frameworks_fallback=frameworks, extra_ops=extra_ops,
                                        extra_imports=imports, deny=deny, max_imports=most)


def _new_notebook(path: str | None) -> bool:
    """A notebook with no code yet (just created): the `auto` policy warms its imports only."""
    nb, _why = read_notebook(path)
    return nb is not None and not notebook_opts_out(nb) and not any(src.strip() for _n, src in code_cells(nb))


def start_from_config(magics: GpuMagics, cfg: GpuWarmup, defer: bool = False) -> None:
    """Apply the configured device and warm-up policy (kernel config or the server's env).
    `defer`: at kernel start-up, begin once the kernel has answered kernel_info (or after
    cfg.start_within s), so that readiness never waits for an import holding the GIL."""
    if cfg.device:
        try:
            dev = parse_spec(cfg.device, inventory.take().devices)
            magics.switcher.use(Choice(dev.ordinal, source=cfg.device_source or "kernel config"))
        except SpecError as exc:
            log.warning("gpuctx: ignoring the configured device %r: %s", cfg.device, exc)
    policy = "never" if opted_out() else cfg.policy
    source = os.environ.get(WARM_SOURCE, "kernel config")
    path = os.environ.get(SESSION)
    if policy == "auto":
        wanted, why = notebook_wants_gpu(path)
        if not wanted and not (cfg.recipe == "notebook" and _new_notebook(path)):
            magics.warmer.status.detail = f"policy auto: {why}"
            return
    elif policy == "never":
        magics.warmer.status.detail = "opted out (GPUCTX_WARM=0)" if opted_out() else "policy never"
        return
    warmer = magics.warmer
    warmer.import_budget = cfg.import_budget
    make_plan = _planner(cfg, path)
    unhook = _on_kernel_info(magics.shell, warmer) if defer else None
    if unhook is not None:
        warmer.schedule(make_plan, source=source, within=cfg.start_within, on_start=unhook)
    else:
        warmer.start_plan(make_plan, source=source)


def warm_after_adoption(magics: GpuMagics, previous: str | None) -> bool:
    """The warm pool handed this standby to a notebook other than the one it was warmed for: warm
    what that notebook runs, in the background, once the standby's own warm-up is over (imports
    done already are instant; what the plan adds, e.g. training, runs now). True when started."""
    path = os.environ.get(SESSION)
    cfg = GpuWarmup(parent=magics.shell)
    if not path or path == previous or opted_out() or cfg.policy == "never" or cfg.recipe != "notebook":
        return False
    if cfg.policy == "auto" and not notebook_wants_gpu(path)[0]:
        return False
    magics.warmer.start_after(_planner(cfg, path), source="the warm pool, for this notebook")
    return True


def unload(ip) -> None:
    magics = getattr(ip, _ATTR, None)
    if magics is None:
        return
    ip.events.unregister("pre_run_cell", magics.pre_run_cell)
    ip.events.unregister("post_run_cell", magics.post_run_cell)
    unhook = getattr(ip, _UNHOOK, None)
    if unhook is not None:
        unhook()
    magics.warmer.cancel_scheduled()
    magics.workers.stop()
    magics.import_hook.remove()
    magics.switcher.threads.remove()
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
