"""When a kernel warms up, and with which plan: at its start (from its settings, once it has
answered kernel_info, so readiness never waits), and after the warm pool hands it to a notebook."""
from __future__ import annotations

import inspect
import logging
import os
from typing import TYPE_CHECKING

from ...contract import (DEFAULT_OPS, INDUCTOR_MODULE, SERVER_HOOK, SESSION, STANDBY, STANDBY_RECIPE, WARM_SOURCE,
                         WORKER_IMPORTS, opted_out)
from ..switching import Choice
from . import attention, settle
from . import plan as plans
from .settings import GpuWarmup

if TYPE_CHECKING:
    from ...contract import notebook as nbread

log = logging.getLogger("gpuctx")
_UNHOOK = "_gpuctx_unhook_kernel_info"


def planner(cfg: GpuWarmup, path: str | None, facts: nbread.Facts | None = None, typed: bool = False):
    """What the warm-up thread calls to make its plan (reading the notebook happens there, unless
    the notebook's `facts` are given: read already, or cells as typed with `typed`, warm/typed.py)."""
    frameworks, ops, imports = tuple(cfg.frameworks), tuple(cfg.ops), tuple(cfg.imports)
    if cfg.recipe == STANDBY_RECIPE:
        return lambda: plans.imports_only(imports, tuple(cfg.import_deny))
    if cfg.recipe == "basic":
        return lambda: plans.basic(frameworks, ops, imports)
    deny, most = tuple(cfg.import_deny), cfg.max_imports
    extra_ops = tuple(op for op in ops if op not in DEFAULT_OPS)
    return lambda: plans.derive(path, frameworks_fallback=frameworks, extra_ops=extra_ops, extra_imports=imports,
                                deny=deny, max_imports=most, facts=facts, typed=typed, shapes=cfg.attention_shapes)


def _off(cfg: GpuWarmup) -> str:
    """Why no warm-up at all, as far as the settings say ("": the policy may warm)."""
    if opted_out():
        return "opted out (GPUCTX_WARM=0)"
    return "policy never" if cfg.policy == "never" else ""


def wanted(cfg: GpuWarmup, path: str | None, facts: nbread.Facts | None = None) -> tuple[bool, str]:
    """Whether the policy warms this kernel's notebook (and why not); `facts`: the notebook, read
    already. `auto` warms a notebook that uses a GPU framework, and a new one's imports (the recipe
    then imports only: no CUDA)."""
    off = _off(cfg)
    if off:
        return False, off
    if cfg.policy == "auto":
        if facts is None:
            from ...contract import notebook as nbread

            facts = nbread.read(path)
        gpu, why = facts.wants_gpu()
        if not gpu and not (cfg.recipe == "notebook" and facts.readable and facts.new):
            return False, f"policy auto: {why}"
    return True, ""


def configured_device(cfg: GpuWarmup) -> Choice | None:
    """The device the configuration names (kernel config, or the server's launch), if any and valid
    (else logged and ignored)."""
    if not cfg.device:
        return None
    from ...core import inventory  # (not at load: with NVML's bindings, a third of what loading gpuctx took)
    from ...core.devices import SpecError, parse_spec

    try:
        dev = parse_spec(cfg.device, inventory.take().devices)
    except SpecError as exc:
        log.warning("gpuctx: ignoring the configured device %r: %s", cfg.device, exc)
        return None
    return Choice(dev.ordinal, source=cfg.device_source or "kernel config")


def start_from_config(state, shell, cfg: GpuWarmup, defer: bool = False) -> None:
    """Apply the configured device and warm-up policy (kernel config or the server's launch).
    `defer`: at kernel start-up, begin once the kernel has answered kernel_info (or after
    cfg.start_within s), so that readiness never waits for an import holding the GIL."""
    choice = configured_device(cfg)
    if choice is not None:
        state.switcher.use(choice)
    if cfg.recipe == STANDBY_RECIPE:
        # what its hand-over runs, imported while it waits rather than while an open waits for it
        from .. import adoption, worker_zygote  # noqa: F401

        if os.environ.get(WORKER_IMPORTS) == "1":
            # not torch.compile's import: it starts the CUDA driver, after which the process may not fork
            why_not = worker_zygote.start_for_standby(tuple(m for m in cfg.imports if m != INDUCTOR_MODULE and ":" not in m))
            if why_not:
                log.info("gpuctx: no workers' imports in this standby: %s", why_not)
    path = os.environ.get(SESSION)
    warmer = state.warmer
    if os.environ.get(STANDBY):  # its warm-up over, a standby freezes what its imports left (settle.py)
        warmer.on_end = settle.settle
    source = os.environ.get(WARM_SOURCE, "kernel config")
    # Whether the notebook uses a GPU framework: read by the warm-up thread, after readiness, in the
    # kernels the server starts; a kernel warmed by its own config decides now, so that a server's
    # later settings (a gateway's kernels: extension.warm_from_env) replace a decision not to warm.
    later = cfg.policy == "auto" and source == SERVER_HOOK and not _off(cfg)
    warm, why = (True, "") if later else wanted(cfg, path)
    if not warm:
        warmer.status.detail = why
        return
    warmer.import_budget = cfg.import_budget
    make_plan = _if_wanted(cfg, path) if later else planner(cfg, path)
    unhook = on_kernel_info(shell, warmer) if defer else None
    if unhook is not None:
        warmer.schedule(make_plan, source=source, within=cfg.start_within, on_start=unhook)
    else:
        warmer.start_plan(make_plan, source=source)


def _if_wanted(cfg: GpuWarmup, path: str | None):
    """The plan maker that first reads the notebook (once, in the warm-up thread: a notebook of
    megabytes of outputs takes tens of ms to read, not before the kernel answers) and plans from it
    where the policy warms it (else plans.NotWanted)."""
    def make():
        from ...contract import notebook as nbread

        facts = nbread.read(path)
        warm, why = wanted(cfg, path, facts)
        if not warm:
            raise plans.NotWanted(why)
        return planner(cfg, path, facts)()
    return make


def after_adoption(state, shell, previous: str | None) -> bool:
    """The warm pool handed this standby to a notebook other than the one it was warmed for: warm
    what that notebook runs, in the background, once the standby's own warm-up is over (imports
    done already are instant; what the plan adds, e.g. training, runs now). True when started
    (under policy auto the thread then reads whether the notebook uses a GPU framework).
    The workers' imports stay only for a notebook that starts workers."""
    from .. import worker_zygote

    path = os.environ.get(SESSION)
    worker_zygote.after_adoption(path)
    cfg = GpuWarmup(parent=shell)
    if not path or cfg.recipe != "notebook" or _off(cfg):
        return False
    if path == previous:
        return _noted_since(state, cfg, path)
    # (under auto the notebook is read by the warm-up thread: not by the hand-over, which an open waits for)
    make_plan = _if_wanted(cfg, path) if cfg.policy == "auto" else planner(cfg, path)
    state.warmer.start_after(make_plan, source="the warm pool, for this notebook")
    return True


def _noted_since(state, cfg: GpuWarmup, path: str) -> bool:
    """A restart reserve warmed before its notebook's first attention cell had run: build what that
    cell noted (warm/attention.py), the rest of its plan kept as done (typed.merge)."""
    plan = state.warmer.plan
    if plan is None or not any(s.op == "attention" for s in plan.steps) or any(
            s.op == "attention_shapes" for s in plan.steps) or not attention.remembered(path):
        return False
    from .typed import merge  # (typed.py builds on this module)

    make = planner(cfg, path)
    state.warmer.replan(lambda previous: merge(make(), previous), "the attention its notebook ran since it was warmed")
    return True


def on_kernel_info(ip, warmer):
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


def unhook_kernel_info(ip) -> None:
    unhook = getattr(ip, _UNHOOK, None)
    if unhook is not None:
        unhook()
