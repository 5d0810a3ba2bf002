"""The `%gpu` line magic and the `%%on_gpu` cell magic: dispatch through `commands.COMMANDS`,
reports from `reports`, device switching and the warm-up through the kernel's `KernelState`.

Loaded with every kernel the server starts, before it answers: what only a command needs
(reports, doctor, release, the workers, and the GPU inventory with NVML's bindings, a third of
gpuctx's load before) is imported when the command first runs."""
from __future__ import annotations

import ast
import os
import time
from typing import TYPE_CHECKING

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display
from traitlets import Bool, observe

from ..contract import DEFAULT_OPS, FRAMEWORKS
from ..core import frameworks as fws
from . import commands
from .state import KernelState
from .switching import Choice, Switcher
from .warm.scheduler import Warmer

if TYPE_CHECKING:
    from ..core.inventory import Inventory
    from .workers import GpuWorkers


@magics_class
class GpuMagics(Magics):
    """GPU magics: `%gpu` and `%%on_gpu` (settable as `c.GpuMagics.<trait>` in the kernel's config)."""

    follow_threads = Bool(
        True,
        help="""Carry the device chosen with `%gpu use` (or by the server) into threads started
        after the choice, as it is carried into cells. `%gpu use N --no-threads` turns it off for
        that choice; `%gpu use N` applies this setting.""",
    ).tag(config=True)

    def __init__(self, shell=None, state: KernelState | None = None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self.state = state if state is not None else KernelState()
        self._count_cache: tuple[tuple, int] | None = None
        self._told_follow: bool | None = None  # what the last `%gpu use` note said about threads
        self._apply_follow_threads()

    @property
    def switcher(self) -> Switcher:
        return self.state.switcher

    @property
    def warmer(self) -> Warmer:
        return self.state.warmer

    @property
    def workers(self) -> GpuWorkers:
        """%gpu workers and %%on_gpu all (made on first use; nothing starts until asked)."""
        return self.state.workers_of(self.shell)

    @observe("follow_threads")
    def _follow_threads_changed(self, change):
        self._apply_follow_threads()

    def _apply_follow_threads(self, follow: bool | None = None) -> None:
        """Hand the setting to the switcher (config arrives before it exists: __init__ hands it on)."""
        state = getattr(self, "state", None)
        if state is not None:
            state.switcher.follow_threads = self.follow_threads if follow is None else follow

    # -- %gpu ------------------------------------------------------------------------------------
    @line_magic
    def gpu(self, line=""):
        # The docstring (what `%gpu?` shows) is commands.overview(), set below the class.
        words = commands.split(line)
        name = words[0] if words else "list"
        command = commands.lookup("help" if name in ("-h", "--help") else name)
        return getattr(self, command.handler)(commands.parse(command, words[1:]))

    def _gpu_help(self, args):
        from . import reports

        width = reports.text_width()
        print(commands.help_for(args.subcommand, width) if args.subcommand else commands.overview(width))

    def _gpu_list(self, args):
        from ..core import inventory

        display(self._list_report(inventory.take()))

    def _list_report(self, inv: Inventory):
        from . import reports

        return reports.list_report(inv, self.switcher)

    def _resolve(self, spec: str, inv: Inventory | None = None):
        from ..core import inventory
        from ..core.devices import SpecError, parse_spec, read_spec

        try:
            read_spec(spec)  # a spec that names nothing is wrong on every machine: say so first
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        inv = inventory.take() if inv is None else inv
        reason = inv.no_gpu_reason()
        if reason:
            raise UsageError(f"no GPU is visible: {reason}")
        try:
            return inv, parse_spec(spec, inv.devices)
        except SpecError as exc:
            raise UsageError(str(exc)) from None

    def _gpu_use(self, args):
        if args.spec is None:
            if not (args.no_default or args.no_threads):
                raise UsageError("say which GPU: `%gpu use 1` (or cuda:1, a UUID, a name, auto); "
                                 "`%gpu list` shows them")
            if args.no_threads:
                self._apply_follow_threads(False)
                self._told_follow = False
                print("gpuctx: threads started from now on begin on CUDA's device 0 "
                      "(`%gpu use N` carries the device into them again)")
            if args.no_default:
                self._undo_default()
            return
        from .render import gib

        _, dev = self._resolve(args.spec)
        follow = self.follow_threads and not args.no_threads
        self._apply_follow_threads(follow)
        # Inside a %%on_gpu cell: the kernel's choice from the cell's end on (the cell keeps its device;
        # what a user who switches there means for the cells after, switching.Switcher says how).
        applied = self.switcher.use(Choice(dev.ordinal, default=args.default, source="%gpu use"))
        block = self.switcher.block
        r = dev.record
        free = f"{gib(r.memory_free)} free" if r.memory_free is not None else "free memory unknown"
        fw = [f"{k} {v.split(' ', 1)[1] if ' ' in v else ''}".strip() for k, v in applied.results.items()
              if k != "torch default"]
        where = ", ".join(fw) if fw else "GPU frameworks as you import them"
        line = f"gpuctx: cuda:{dev.ordinal} ({r.name}, nvidia-smi {r.nvml_index}, {free}) " + (
            f"is current for {where}" if block is None else
            f"becomes the kernel's device when the %%on_gpu cell running ends (cuda:{block.ordinal} stays current "
            "until then)")
        if args.default:
            line += "; new tensors without a device land there too"
        if applied.errors:
            line += "; not switched: " + "; ".join(f"{k}: {v}" for k, v in applied.errors.items())
        print(line)
        if self._told_follow != follow:
            self._told_follow = follow
            print("note: " + self._threads_note(dev.ordinal, follow, after_block=block is not None)
                  + "; CUDA_VISIBLE_DEVICES is read once, at CUDA start-up, so changing it now has no effect")

    def _undo_default(self) -> None:
        choice, block = self.switcher.base, self.switcher.block  # (a %%on_gpu --default ends with its cell)
        if choice is None or not choice.default:
            print("gpuctx: no default device was set with `%gpu use`; nothing to undo"
                  + (" (the --default of the %%on_gpu cell running ends with it)" if block and block.default else ""))
            return
        self.switcher.use(Choice(choice.ordinal, False, choice.source))
        if block is not None:
            print(f"gpuctx: once the %%on_gpu cell running ends, tensors created without a device no longer go to "
                  f"cuda:{choice.ordinal}; cuda:{choice.ordinal} stays the kernel's device")
            return
        print(f"gpuctx: tensors created without a device go to {fws.TORCH.default_device() or 'cpu'} again; "
              f"cuda:{choice.ordinal} stays current")

    def _threads_note(self, ordinal: int, follow: bool, after_block: bool = False) -> str:
        if follow:
            when = "after the %%on_gpu cell" if after_block else "from now on"
            return f"threads started {when} run on cuda:{ordinal} too (`--no-threads` leaves them alone)"
        return "threads started from now on begin on CUDA's device 0 (call torch.cuda.set_device there)"

    def _gpu_status(self, args):
        from ..core import inventory
        from . import reports

        report = reports.status_report(inventory.take(), self.switcher, self.warmer.status, self.warmer.plan_lines(),
                                       pooled=self.state.pooled)
        display(self.workers.extend_status(report))

    def _gpu_mem(self, args):
        from ..core import inventory
        from . import reports

        display(reports.memory_report(inventory.take()))

    def _gpu_free(self, args):
        # The same code path as the server's release request (kernel_view, RELEASE_REQUEST).
        from . import release

        print(release.describe(release.release_memory(self.shell)))

    def _gpu_warm(self, args):
        from ..core import inventory

        names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
        if not names:
            raise UsageError(f"--frameworks names none: give one or more of {', '.join(FRAMEWORKS)}, comma-separated")
        unknown = [n for n in names if n not in FRAMEWORKS]
        if unknown:
            raise UsageError(commands.one_line(f"cannot warm {', '.join(unknown)}: "
                                               f"choose from {', '.join(FRAMEWORKS)}"))
        missing = [n for n in names if not fws.BY_NAME[n].installed()]
        if missing == ["torch"] and names == ["torch"]:
            raise UsageError("torch is not installed in this kernel: install a CUDA build of torch, "
                             "or name other frameworks with --frameworks")
        if missing:
            raise UsageError(f"{', '.join(missing)} is not installed in this kernel: install it, "
                             "or leave it out of --frameworks")
        device = self._resolve(args.spec)[1].ordinal if args.spec else None
        if not self.warmer.start(names, DEFAULT_OPS, device, source="%gpu warm"):
            if self.warmer.held():
                print("gpuctx: a suspend of this kernel is being prepared: run %gpu warm again in a moment")
            else:
                print("gpuctx: a warm-up is already running: " + self.warmer.status.summary())
            return
        if args.wait:
            print("gpuctx warm-up: " + self.warmer.wait().summary())
        elif device is None and (why := inventory.take().no_gpu_reason()):
            print(f"gpuctx: no GPU is visible ({why}): warming the imports and the CPU side only, in the background "
                  "(`%gpu status` shows progress)")
        else:
            print("gpuctx: warming up in the background (`%gpu status` shows progress)")

    def _gpu_monitor(self, args):
        if not 0.05 <= args.interval <= 3600:
            raise UsageError(f"--interval {args.interval:g} is out of range: give seconds between 0.05 and 3600")
        if not args.interval <= args.history <= 86400:
            raise UsageError(f"--history {args.history:g} must be at least the interval and at most 86400 s")
        from ..core import inventory
        from ..core.devices import SpecError, parse_spec, read_spec

        for spec in args.specs:
            try:
                read_spec(spec)
            except SpecError as exc:
                raise UsageError(str(exc)) from None
        replay = None
        if args.replay:
            from ..core.trace import Replay

            try:
                replay = Replay(os.path.expanduser(args.replay))
            except (OSError, ValueError) as exc:
                raise UsageError(commands.one_line(f"cannot replay {args.replay}: {exc}")) from None
        inv = replay.read() if replay else inventory.take()
        if inv.devices:
            for spec in args.specs:
                try:
                    parse_spec(spec, inv.devices)
                except SpecError as exc:
                    raise UsageError(str(exc)) from None
        from .monitor import monitor

        return monitor(*args.specs, interval=args.interval, history=args.history, replay=replay)

    def _gpu_workers(self, args):
        self.workers.command(args)

    def _gpu_doctor(self, args):
        from ..core import inventory
        from . import doctor

        display(doctor.report(doctor.diagnose(inventory.take(), self.warmer.status)))

    # -- %%on_gpu --------------------------------------------------------------------------------
    def _fast_ordinal(self, spec: str) -> int | None:
        """Plain ordinals skip NVML: `%%on_gpu 1` must cost well under a millisecond. The spec is
        read by `read_spec`, as every magic reads it; a visible ordinal is checked against a
        cached device count, anything else goes the slow way."""
        from ..core import inventory
        from ..core.devices import SpecError, read_spec

        try:
            parsed = read_spec(spec)
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        if parsed.kind != "ordinal":
            return None
        key = (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))
        if self._count_cache is None or self._count_cache[0] != key:
            inv = inventory.take()
            if not inv.devices:
                return None  # let the slow path say why
            self._count_cache = (key, len(inv.devices))
        return parsed.ordinal if parsed.ordinal < self._count_cache[1] else None

    @cell_magic
    def on_gpu(self, line, cell):
        # The docstring (what `%%on_gpu?` shows) is the table's help, set below the class.
        __tracebackhide__ = True  # noqa: F841 — keep our frames out of the user's traceback
        args = commands.parse(commands.ON_GPU, commands.split(line, "%%on_gpu"))
        if commands.for_workers(args.spec):
            return self.workers.run_cell(args, cell)
        if args.timeout is not None:
            raise UsageError("--timeout is for the workers: `%%on_gpu all --timeout 600`")
        ordinal = self._fast_ordinal(args.spec)
        if ordinal is None:
            from ..core import inventory

            inv = inventory.take()
            reason = inv.no_gpu_reason()
            if reason:
                return self._run_without_gpu(cell, reason, args)
            ordinal = self._resolve(args.spec, inv)[1].ordinal
        timer = _GpuTimer(ordinal) if args.time else None
        meter = _MemMeter(ordinal) if args.mem else None
        with self.switcher.scoped(Choice(ordinal, default=args.default, source="%%on_gpu")) as applied:
            if applied.errors:  # (on stdout: the cell runs all the same, as with `%gpu use`)
                print(f"gpuctx: cuda:{ordinal} not switched to for " +
                      "; ".join(f"{k}: {v}" for k, v in applied.errors.items()), flush=True)
            if timer:
                timer.start()
            if meter:
                meter.start()
            value = self._run_body(cell)
            parts = [f"cuda:{ordinal}"]
            if timer:
                parts += timer.stop()
            if meter:
                parts += meter.stop()
        if timer or meter:
            print("on_gpu: " + " · ".join(parts))
        return value

    def _run_without_gpu(self, cell: str, reason: str, args):
        """The user's work comes first: a GPU notebook opened on a CPU machine still runs. The
        notice goes to stdout, where JupyterLab does not paint it red like an error."""
        __tracebackhide__ = True  # noqa: F841
        print(f"gpuctx warning: no GPU is visible ({reason}); running this cell without switching device")
        t0 = time.perf_counter()
        try:
            return self._run_body(cell)
        finally:
            if args.time or args.mem:
                parts = ["no GPU"]
                if args.time:
                    parts.append(f"wall {_ms((time.perf_counter() - t0) * 1000)}")
                needs = [what for what, asked in (("GPU time", args.time), ("memory", args.mem)) if asked]
                parts.append(f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} a GPU")
                print("on_gpu: " + " · ".join(parts))

    def _run_body(self, cell: str):
        """Execute the cell in the user namespace like IPython does, returning its last expression."""
        __tracebackhide__ = True  # noqa: F841
        shell = self.shell
        code = shell.transform_cell(cell)
        filename = shell.compile.cache(code, shell.execution_count, raw_code=cell)
        try:
            tree = shell.transform_ast(shell.compile.ast_parse(code, filename))
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
                last = ast.Expression(tree.body.pop().value)
            body = shell.compile(tree, filename, "exec")
            expr = None if last is None else shell.compile(last, filename, "eval")
        except SyntaxError as exc:
            if "await" in str(exc):
                raise UsageError("%%on_gpu cannot run top-level `await` yet: put the awaits in an async "
                                 "function and await it outside, or switch with `%gpu use` instead") from None
            raise exc.with_traceback(None) from None  # the cell's own line, as without %%on_gpu; no frames of ours
        exec(body, shell.user_ns)
        return None if expr is None else eval(expr, shell.user_ns)


GpuMagics.gpu.__doc__ = commands.overview()
GpuMagics.on_gpu.__doc__ = commands.ON_GPU.help()


class _GpuTimer:
    """Wall time and GPU time (CUDA events on the current stream) of one cell."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        if fws.TORCH.loaded() and fws.TORCH.gpu_reason() is None:
            self.kind = "torch"
        elif fws.CUPY.loaded() and fws.CUPY.gpu_reason() is None:
            self.kind = "cupy"
        elif fws.TORCH.installed():
            import torch  # noqa: F401 — --time asked for CUDA events; torch is the way to get them

            if fws.TORCH.gpu_reason():
                raise UsageError(f"--time needs CUDA events: {fws.TORCH.gpu_reason()}")
            self.kind = "torch"
        else:
            raise UsageError("--time needs CUDA events from torch or CuPy: install or import one of them")

    def start(self):
        if self.kind == "torch":
            import torch

            self._events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        else:
            import cupy

            self._events = cupy.cuda.Event(), cupy.cuda.Event()
        self._events[0].record()
        self._t0 = time.perf_counter()

    def stop(self) -> list[str]:
        self._events[1].record()
        self._events[1].synchronize()
        wall = time.perf_counter() - self._t0
        if self.kind == "torch":
            gpu_ms = self._events[0].elapsed_time(self._events[1])
        else:
            import cupy

            gpu_ms = cupy.cuda.get_elapsed_time(*self._events)
        return [f"wall {_ms(wall * 1000)}", f"GPU {_ms(gpu_ms)}"]


def _ms(v: float) -> str:
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.1f} ms" if v >= 1 else f"{v * 1000:.0f} µs"


class _MemMeter:
    """Peak and net torch allocator memory of one cell on one GPU."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        torch = fws.TORCH
        if not torch.installed():
            raise UsageError("--mem reads torch's allocator: torch is not installed")
        if not torch.loaded():
            import torch as _  # noqa: F401
        if torch.gpu_reason():
            raise UsageError(f"--mem needs torch with CUDA: {torch.gpu_reason()}")

    def start(self):
        torch = fws.TORCH.mod
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(self.ordinal)
        self._before = self._figures().allocated

    def stop(self) -> list[str]:
        figures = self._figures()
        from .render import signed

        return [f"peak {signed(figures.peak - self._before)}", f"net {signed(figures.allocated - self._before)}"]

    def _figures(self) -> fws.AllocatorFigures:
        return next(f for f in fws.allocator_figures(self.ordinal) if f.framework == "torch")
