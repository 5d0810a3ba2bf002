"""Wiring the kernel side into an IPython shell, and taking it out again."""
from __future__ import annotations

import logging
import re
import sys

from . import kernel_view, state, suspend
from .magics import GpuMagics
from .state import KernelState
from .warm import attention, start
from .warm.import_gate import GATE
from .warm.settings import GpuWarmup

_LOAD_LINE = re.compile(r"^\s*%load_ext\s+gpuctx\s*$", re.M)  # a notebook's own load line
_QUIET_ATTR = "_gpuctx_quiet_load"
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


def load(ip) -> KernelState:
    """Load gpuctx into shell `ip` (twice is harmless): the kernel state, the magics, the cell
    events, the post-import and thread hooks, the control-channel answers, the suspend gate, and
    the warm-up its settings ask for."""
    st = state.of(ip)
    if st is not None:
        return st
    _log_to_kernel_stderr()
    st = KernelState()
    ip.register_magics(GpuMagics(ip, state=st))
    ip.events.register("pre_run_cell", st.before_cell)
    ip.events.register("post_run_cell", st.after_cell)
    st.import_hook.install()
    st.switcher.threads.install()
    kernel_view.register(ip, st, on_adopt=lambda previous: start.after_adoption(st, ip, previous))
    suspend.install(ip, st)  # restores a suspended kernel before any request of the user's
    setattr(ip, state.ATTR, st)
    st.warmer.on_plan = lambda plan: (_prepare_workers(st, ip, plan), _watch_attention(st, ip, plan))
    st.warmer.cells_thread.kernel = getattr(ip, "kernel", None)
    at_start = _at_kernel_start(ip)
    if at_start:
        _let_the_notebook_load_quietly(ip)
    info = getattr(getattr(ip.displayhook, "exec_result", None), "info", None)
    if info is not None and not getattr(info, "silent", False):  # loaded by a cell: it counts as running (its
        st.before_cell(info)  # post_run_cell comes to us; a silent one's never does), or the warm-up ran beside it
    start.start_from_config(st, ip, GpuWarmup(parent=ip), defer=at_start)
    return st


def _prepare_workers(st: KernelState, ip, plan) -> None:
    """The notebook starts workers (`%gpu workers start ARGS`): start them ahead, imports only,
    so that the line finds them registered and imported (kernel/workers.py, prepare_for)."""
    if plan.workers is None:
        return
    workers = st.workers_of(ip)
    if workers is not None:  # (None: gpuctx was unloaded meanwhile)
        workers.prepare_for(plan.workers, plan.workers_where)


def _watch_attention(st: KernelState, ip, plan) -> None:
    """A notebook that runs attention, and compiles none of it: note its problems on this run, for
    the next start to build ahead (warm/attention.py). Not once gpuctx is unloaded (the warm-up's
    thread may read its plan after that)."""
    ops = {s.op for s in getattr(plan, "steps", ())}
    if (getattr(plan, "notebook", "") and "attention" in ops and "compile" not in ops and state.of(ip) is st
            and GpuWarmup(parent=ip).attention_shapes):
        attention.WATCH.arm(plan.notebook)


def _at_kernel_start(ip) -> bool:
    """Loaded by the kernel's start-up (`--ext=gpuctx`, kernel config), not by a cell."""
    return getattr(ip, "kernel", None) is not None and getattr(ip.displayhook, "exec_result", None) is None


def _let_the_notebook_load_quietly(ip) -> None:
    """A notebook's own `%load_ext gpuctx` in a kernel that loaded gpuctx at its start prints
    nothing: before a cell with that line, IPython is told gpuctx is not loaded, so the line calls
    load() (idempotent) instead of saying "already loaded"; it counts as loaded again after it —
    also where the line did not run (an error before it, an `if`) — so that `%unload_ext gpuctx`
    works whichever way gpuctx was loaded."""
    told = []

    def loaded_set():
        loaded = getattr(getattr(ip, "extension_manager", None), "loaded", None)
        return loaded if isinstance(loaded, set) else None

    def quietly(info=None):
        loaded = loaded_set()
        if loaded is not None and "gpuctx" in loaded and _LOAD_LINE.search(getattr(info, "raw_cell", "") or ""):
            loaded.discard("gpuctx")
            told.append(True)

    def after(result=None):
        loaded = loaded_set()
        if told and loaded is not None and state.of(ip) is not None:  # (still loaded: not unloaded in the cell)
            loaded.add("gpuctx")
        told.clear()

    ip.events.register("pre_run_cell", quietly)
    ip.events.register("post_run_cell", after)
    setattr(ip, _QUIET_ATTR, (quietly, after))


def unload(ip) -> None:
    st = state.of(ip)
    if st is None:
        return
    ip.events.unregister("pre_run_cell", st.before_cell)
    ip.events.unregister("post_run_cell", st.after_cell)
    quiet = ip.__dict__.pop(_QUIET_ATTR, None)
    if quiet is not None:
        ip.events.unregister("pre_run_cell", quiet[0])
        ip.events.unregister("post_run_cell", quiet[1])
    start.unhook_kernel_info(ip)
    st.warmer.stop()  # (a step under way ends on its own; none follows it)
    attention.WATCH.end()
    GATE.open()  # (a cell that unloads gpuctx leaves no post_run_cell to open it)
    workers = st.close_workers()
    if workers is not None:
        try:
            workers.stop()
        except KeyboardInterrupt:  # pressed while they stop (they do stop): the unload goes on to its end,
            pass  # or IPython would count gpuctx as loaded, half of it gone
    st.import_hook.remove()
    st.switcher.threads.remove()
    suspend.uninstall(ip)
    kernel_view.unregister(ip)
    if "gpuctx_jupyter.kernel.monitor" in sys.modules:
        sys.modules["gpuctx_jupyter.kernel.monitor"].close_all()
    st.switcher.use(None)  # hands torch's default device back if we had set it
    magics = ip.magics_manager.registry.pop(GpuMagics.__name__, None)
    if magics is not None:
        for kind, names in magics.magics.items():
            table = ip.magics_manager.magics[kind]
            for name in names:
                table.pop(name, None)
    delattr(ip, state.ATTR)


def warm_from_env(ip) -> KernelState:
    """Load gpuctx and apply the GPUCTX_* settings now (the gateway route: the server sends this
    as the kernel's first request, having put the settings into os.environ)."""
    st = load(ip)
    if st.warmer.status.state == "off":
        start.start_from_config(st, ip, GpuWarmup(parent=ip))
    return st
