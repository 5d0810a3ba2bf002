"""What gpuctx keeps in one kernel: the device choice, the warm-up, the post-import hook, the
device the cells' thread last used and the suspend gate — one object that the magics, the
control-channel answers (`kernel_view`), the warm pool's hand-over (`adoption`) and the cell events
share.

It lives on the shell as `ip._gpuctx` from `%load_ext gpuctx` (or the kernel's start-up load)
until `%unload_ext gpuctx`.
"""
from __future__ import annotations

import ast
import logging
import sys
import threading
import time

from ..core import frameworks as fws
from .switching import WATCHED, PostImportHook, Switcher
from .warm import compile_guard
from .warm.attention import WATCH
from .warm.scheduler import Warmer

log = logging.getLogger("gpuctx")

ATTR = "_gpuctx"


class KernelState:
    def __init__(self):
        self.warmer = Warmer()
        self.switcher = Switcher(cuda_starting=self._warmup_starting_cuda)
        self.warmer.switcher = self.switcher
        self.import_hook = PostImportHook(WATCHED, self.switcher.on_import)
        # (CUDA device, torch default device) of the thread that runs cells, as the last cell left
        # them: the control channel answers from its own thread, and both are per thread.
        self.cell_thread_device: tuple[int | None, str | None] | None = None
        self.suspend = None  # kernel/suspend.py's Gate, in an ipykernel (installed by extension.load)
        self.workers = None  # GpuWorkers of `%gpu workers`, made on first use (workers_of)
        self._making_workers = threading.Lock()
        self._workers_closed = False  # gpuctx unloaded: no workers are made any more
        self.loaded_in: float | None = None  # seconds `%load_ext gpuctx` took, its imports included
        # Seconds it waited ready in the warm pool, once the pool has handed it to a notebook (kept
        # here, not in os.environ: a fresh kernel has no such variable, and neither has this one)
        self.pooled: str | None = None
        self._interrupting = False  # this cell raises KeyboardInterrupt (_Interrupted), once
        self.cells_running = 0  # cells of the user's running now (a monitor pauses in an idle kernel)
        self.last_cell = time.monotonic()  # when the last cell ended (or gpuctx was loaded)

    def workers_of(self, shell):
        """The kernel's one GpuWorkers, made on first use: by a cell (`%gpu workers`) or by the
        warm-up's thread preparing what the notebook starts, maybe at the same moment — two would
        each start their own workers, and the line would not find the prepared ones."""
        with self._making_workers:
            if self.workers is None and not self._workers_closed:
                from .workers import GpuWorkers

                self.workers = GpuWorkers(parent=shell)
            return self.workers

    def close_workers(self):
        """gpuctx is unloaded: the workers made so far (to stop), and none made after (the
        warm-up's thread may be about to prepare some: nothing would stop those)."""
        with self._making_workers:
            self._workers_closed = True
            return self.workers

    def _warmup_starting_cuda(self) -> bool:
        """Whether the warm-up is in torch's lazy CUDA init right now (not merely running: a cell
        that set the device while the warm-up imports, reads or waits would start CUDA itself)."""
        return self.warmer.running and self.warmer.starting_cuda.is_set()

    # -- cell events (IPython's pre_run_cell / post_run_cell) -------------------------------------
    def before_cell(self, info=None) -> None:
        self.cells_running += 1
        source = getattr(info, "raw_cell", "") or ""
        try:
            self.warmer.cell_started(source)
            _quietly(WATCH.before_cell)
            compile_guard.wait_for(source)  # a cell that sets what the warm-up's compile puts back
        except KeyboardInterrupt:  # Interrupt while the cell waited for the warm-up's import or compile
            _interrupt_the_cell()
            self._interrupting = True
        self.switcher.enforce()

    def after_cell(self, result=None) -> None:
        if self._interrupting:
            self._interrupting = False
            _interrupt_the_cell(undo=True)
        self.warmer.cell_finished()
        self.cells_running, self.last_cell = max(0, self.cells_running - 1), time.monotonic()
        _quietly(WATCH.after_cell)
        try:  # what follows adds to the cell's output; it never adds an error of its own
            torch = fws.TORCH
            if torch.loaded() and torch.usable():  # (None: CUDA not started: nothing on a device yet)
                self.cell_thread_device = (torch.current(), torch.default_device())
            error = getattr(result, "error_in_exec", None)
            if error is None:
                return
            from . import hints  # (with oom.py: read on a cell's first error, not at the kernel's start)

            hint = hints.hint_for(error)
            if hint:
                print(hint, file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 — a sticky CUDA error, an exception whose str() raises
            log.debug("gpuctx: after the cell: %s: %s", type(exc).__name__, exc)


class _Interrupted(ast.NodeTransformer):
    """Once: the cell's code becomes `raise KeyboardInterrupt` at its first line. IPython catches
    what a pre_run_cell callback raises (it prints "Error in callback" and runs the cell anyway), so
    an Interrupt pressed while the cell waited for the warm-up stops the cell this way instead."""

    def visit_Module(self, node):
        raised = ast.Raise(exc=ast.Name("KeyboardInterrupt", ast.Load()), cause=None)
        raised.lineno = node.body[0].lineno if node.body else 1
        return ast.fix_missing_locations(ast.Module(body=[raised], type_ignores=[]))


def _quietly(fn) -> None:
    """What gpuctx does around a cell never adds an error to it: logged to the kernel's stderr."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        log.warning("gpuctx: %s: %s: %s", getattr(fn, "__qualname__", fn), type(exc).__name__, exc)


def _interrupt_the_cell(undo: bool = False) -> None:
    from IPython import get_ipython

    ip = get_ipython()
    if ip is None:
        return
    ip.ast_transformers[:] = [t for t in ip.ast_transformers if not isinstance(t, _Interrupted)]
    if not undo:
        ip.ast_transformers.insert(0, _Interrupted())


def of(ip) -> KernelState | None:
    """The state of gpuctx in shell `ip`, None when gpuctx is not loaded there."""
    return getattr(ip, ATTR, None)
