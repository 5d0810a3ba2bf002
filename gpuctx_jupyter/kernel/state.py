"""What gpuctx keeps in one kernel: the device choice, the warm-up, the post-import hook, the
device the cells' thread last used and the suspend gate — one object that the magics, the
control-channel answers (`kernel_view`), the warm pool's hand-over (`adoption`) and the cell events
share.

It lives on the shell as `ip._gpuctx` from `%load_ext gpuctx` (or the kernel's start-up load)
until `%unload_ext gpuctx`.
"""
from __future__ import annotations

import sys

from ..core import frameworks as fws
from .switching import WATCHED, PostImportHook, Switcher
from .warm.scheduler import Warmer

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
        self.workers = None  # GpuWorkers of `%gpu workers`, made by the magics on first use
        self.loaded_in: float | None = None  # seconds `%load_ext gpuctx` took, its imports included

    def _warmup_starting_cuda(self) -> bool:
        return self.warmer.running and not self.warmer.status.phase.startswith(("import", "starting"))

    # -- cell events (IPython's pre_run_cell / post_run_cell) -------------------------------------
    def before_cell(self, info=None) -> None:
        self.warmer.cell_started(getattr(info, "raw_cell", "") or "")
        self.switcher.enforce()

    def after_cell(self, result=None) -> None:
        self.warmer.cell_finished()
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


def of(ip) -> KernelState | None:
    """The state of gpuctx in shell `ip`, None when gpuctx is not loaded there."""
    return getattr(ip, ATTR, None)
