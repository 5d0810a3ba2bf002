"""The `%gpu` line magic and the `%%on_gpu` cell magic."""
from __future__ import annotations

import ast
import difflib
import gc
import os
import sys
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.display import display

from ..contract import DEFAULT_OPS, FRAMEWORKS, POOLED
from ..core import frameworks as fws
from ..core import inventory
from ..core.devices import SpecError, parse_spec
from . import doctor, hints
from .render import Report, Section, gib, mib, pct, signed
from .switching import WATCHED, Choice, PostImportHook, Switcher
from .warmup import Warmer

SUBCOMMANDS = ("list", "use", "status", "mem", "free", "doctor", "warm", "monitor", "help")


def _parser(prog: str, description: str) -> MagicArgumentParser:
    return MagicArgumentParser(prog=prog, description=description)


USE = _parser("%gpu use", "Make a GPU current for every loaded framework, now and in later cells.")
USE.add_argument("spec", nargs="?", help="1, cuda:1, a GPU UUID or prefix, a name fragment (h200), or auto")
_g = USE.add_mutually_exclusive_group()
_g.add_argument("--default", action="store_true", help="tensors created without a device land there too (torch)")
_g.add_argument("--no-default", action="store_true", help="stop sending device-less tensors to the GPU")

ON_GPU = _parser("%%on_gpu", "Run this cell on a GPU, then restore the previous device (also on error or interrupt).")
ON_GPU.add_argument("spec", help="1, cuda:1, a GPU UUID or prefix, a name fragment, or auto")
ON_GPU.add_argument("--default", action="store_true", help="tensors created without a device land on it too (torch)")
ON_GPU.add_argument("--time", action="store_true", help="report GPU time (CUDA events) beside wall time")
ON_GPU.add_argument("--mem", action="store_true", help="report peak and net allocator memory on that GPU (torch)")

WARM = _parser("%gpu warm", "Warm CUDA in a background thread now, so the next GPU cell runs at full speed.")
WARM.add_argument("spec", nargs="?", help="the device to warm (default: this kernel's current device)")
WARM.add_argument("--frameworks", default="torch", help=f"comma-separated, from {', '.join(FRAMEWORKS)}")
WARM.add_argument("--wait", action="store_true", help="block until the warm-up has finished, then report it")

MONITOR = _parser("%gpu monitor", "A live monitor of the GPUs, updated while other cells run.")
MONITOR.add_argument("specs", nargs="*", help="GPUs to show (default: every visible one)")
MONITOR.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
MONITOR.add_argument("--history", type=float, default=60.0, help="seconds of history in the plot (default 60)")
MONITOR.add_argument("--replay", metavar="TRACE", help="play a recorded NVML trace instead of the live GPUs "
                     "(labelled as a replay; record one with `python -m gpuctx_jupyter.trace record`)")

NO_ARGS = {name: _parser(f"%gpu {name}", "") for name in ("list", "status", "mem", "free", "doctor")}


def _current_ordinal(switcher: Switcher) -> int:
    """The ordinal new CUDA work of this kernel lands on."""
    if switcher.choice is not None:
        return switcher.choice.ordinal
    if fws.TORCH.loaded() and fws.TORCH.gpu_reason() is None:
        return fws.TORCH.current() or 0
    return 0


@magics_class
class GpuMagics(Magics):
    """GPU magics: `%gpu` and `%%on_gpu`."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self.warmer = Warmer()
        self.switcher = Switcher(cuda_starting=self._warmup_starting_cuda)
        self.warmer.switcher = self.switcher
        self.import_hook = PostImportHook(WATCHED, self.switcher.on_import)
        self._count_cache: tuple[tuple, int] | None = None
        self.cell_thread_device: tuple[int | None, str | None] | None = None
        self._told_caveats = False

    # -- kernel events ---------------------------------------------------------------------------
    def _warmup_starting_cuda(self) -> bool:
        return self.warmer.running and not self.warmer.status.phase.startswith(("import", "starting"))

    def pre_run_cell(self, info=None):
        self.warmer.cell_started(getattr(info, "raw_cell", "") or "")
        self.switcher.enforce()

    def post_run_cell(self, result=None):
        self.warmer.cell_finished()
        # The control channel answers from its own thread; CUDA's current device and torch's
        # default device are per thread, so remember the cell thread's.
        torch = fws.TORCH
        if torch.loaded() and torch.gpu_reason() is None:
            self.cell_thread_device = (torch.current(), torch.default_device())
        hint = hints.mixed_devices_hint(getattr(result, "error_in_exec", None))
        if hint:
            print(hint, file=sys.stderr)

    # -- %gpu ------------------------------------------------------------------------------------
    @line_magic
    def gpu(self, line=""):
        """See which GPUs this kernel can use and switch between them.

        %gpu                   list the visible GPUs (same as %gpu list)
        %gpu list              one row per GPU: CUDA ordinal (what torch uses), nvidia-smi
                               index, name, memory, utilisation, temperature, processes, and
                               which one is current in this kernel
        %gpu use 1             make cuda:1 current for torch, CuPy, Numba and JAX, now and
                               in every later cell (also frameworks imported later)
        %gpu use auto          the visible GPU with the most free memory
        %gpu use h200 --default   by name; tensors created without a device land there too
        %gpu use --no-default  keep the device, stop sending device-less tensors to it
        %gpu status            this kernel: current device per framework, allocator memory
                               per device, whether CUDA has started
        %gpu mem               memory per GPU: NVML's view and this kernel's share
        %gpu free              collect garbage and return cached allocator memory to the GPU
        %gpu warm [--wait]     start CUDA and run a first matmul and conv in a background
                               thread now, so the next GPU cell does not stall; the state
                               and phase times show in %gpu status
        %gpu monitor [SPEC..]  a live monitor (utilisation, memory, temperature, power, a
                               history plot, processes with this kernel marked); returns it:
                               m = %gpu monitor --interval 0.5;  m.close() stops it;
                               --replay TRACE shows a recorded trace, labelled so
        %gpu doctor            driver, NVML, torch build, CUDA_VISIBLE_DEVICES, device
                               counts, persistence/MIG, fork safety, each with its fix
        %gpu help [SUBCOMMAND] this help, or one subcommand's options

        Device specs: 1, cuda:1, GPU-<uuid> (or a unique prefix), a unique name fragment
        such as h200, or auto. Numbers are CUDA ordinals, as torch counts them.

        Cell magic: %%on_gpu 1 [--default] [--time] [--mem] runs one cell on cuda:1 and
        restores the previous device afterwards, even if the cell fails or is interrupted.
        """
        argv = line.split(None, 1)
        sub = argv[0] if argv else "list"
        rest = argv[1] if len(argv) > 1 else ""
        if sub in ("-h", "--help"):
            sub = "help"
        if sub not in SUBCOMMANDS:
            close = difflib.get_close_matches(sub, SUBCOMMANDS, n=1)
            hint = f" — did you mean `%gpu {close[0]}`?" if close else ""
            raise UsageError(f"unknown %gpu subcommand {sub!r}{hint} (one of: {', '.join(SUBCOMMANDS)}; `%gpu help`)")
        return getattr(self, f"_gpu_{sub}")(rest)

    def _gpu_help(self, rest):
        name = rest.strip()
        if not name:
            print(self.gpu.__doc__)
        elif name == "use":
            USE.print_help()
        elif name == "warm":
            WARM.print_help()
        elif name == "monitor":
            MONITOR.print_help()
        elif name in ("on_gpu", "%%on_gpu"):
            ON_GPU.print_help()
        elif name in SUBCOMMANDS:
            print(f"%gpu {name}: takes no options; see `%gpu help`.")
        else:
            raise UsageError(f"no help for {name!r}: try `%gpu help` or `%gpu help use`")

    def _gpu_list(self, rest):
        NO_ARGS["list"].parse_argstring(rest)
        inv = inventory.take()
        display(self._list_report(inv))

    def _list_report(self, inv: inventory.Inventory) -> Report:
        reason = inv.no_gpu_reason()
        if reason:
            return Report([Section("No GPU is visible to this kernel", lines=[reason])],
                          data={"devices": [], "reason": reason})
        current = _current_ordinal(self.switcher)
        rows, data, marked = [], [], set()
        for i, d in enumerate(inv.devices):
            r = d.record
            mark = "●" if d.ordinal == current else ""
            if mark:
                marked.add(i)
            mem = f"{gib(r.memory_used)} / {gib(r.memory_total)}" if r.memory_total else "–"
            temp = "–" if r.temperature is None else f"{r.temperature}°C"
            state = f"error: {r.error}" if r.error else ""
            rows.append([mark, f"cuda:{d.ordinal}", str(r.nvml_index), r.name, mem, pct(r.utilization), temp,
                         str(len(r.processes)), state])
            data.append({"ordinal": d.ordinal, "nvidia_smi_index": r.nvml_index, "uuid": r.uuid, "name": r.name,
                         "memory_used": r.memory_used, "memory_total": r.memory_total,
                         "utilization": r.utilization, "temperature": r.temperature,
                         "processes": len(r.processes), "current": d.ordinal == current, "error": r.error})
        header = ["", "cuda", "nvidia-smi", "name", "memory used / total", "util", "temp", "procs", ""]
        if not any(row[-1] for row in rows):
            header, rows = header[:-1], [row[:-1] for row in rows]
        lines = [f"● current in this kernel: cuda:{current}" + ("" if self.switcher.choice else " (CUDA's default)")]
        visible = {d.record.uuid for d in inv.devices}
        hidden = [r for r in inv.records if r.uuid not in visible and not (r.mig_enabled and not r.mig_parent)]
        if hidden:
            lines.append("hidden by CUDA_VISIBLE_DEVICES: "
                         + ", ".join(f"nvidia-smi {r.nvml_index} ({r.name})" for r in hidden))
        lines.extend(inv.notes)
        return Report([Section("", header, rows, marked, lines)], data={"devices": data})

    def _resolve(self, spec: str, inv: inventory.Inventory | None = None):
        inv = inventory.take() if inv is None else inv
        reason = inv.no_gpu_reason()
        if reason:
            raise UsageError(f"no GPU is visible: {reason}")
        try:
            return inv, parse_spec(spec, inv.devices)
        except SpecError as exc:
            raise UsageError(str(exc)) from None

    def _gpu_use(self, rest):
        args = USE.parse_argstring(rest)
        if args.spec is None:
            if not args.no_default:
                raise UsageError("say which GPU: `%gpu use 1` (or cuda:1, a UUID, a name, auto); `%gpu list` shows them")
            choice = self.switcher.choice
            if choice is None or not choice.default:
                print("gpuctx: no default device was set; nothing to undo")
                return
            self.switcher.use(Choice(choice.ordinal, False, choice.source))
            print(f"gpuctx: tensors created without a device go to {fws.TORCH.default_device() or 'cpu'} again; "
                  f"cuda:{choice.ordinal} stays current")
            return
        inv, dev = self._resolve(args.spec)
        applied = self.switcher.use(Choice(dev.ordinal, default=args.default, source="%gpu use"))
        r = dev.record
        free = f"{gib(r.memory_free)} free" if r.memory_free is not None else "free memory unknown"
        fw = [f"{k} {v.split(' ', 1)[1] if ' ' in v else ''}".strip() for k, v in applied.results.items()
              if k != "torch default"]
        where = ", ".join(fw) if fw else "GPU frameworks as you import them"
        line = f"gpuctx: cuda:{dev.ordinal} ({r.name}, nvidia-smi {r.nvml_index}, {free}) is current for {where}"
        if args.default:
            line += "; new tensors without a device land there too"
        if applied.errors:
            line += "; not switched: " + "; ".join(f"{k}: {v}" for k, v in applied.errors.items())
        print(line)
        if not self._told_caveats:
            self._told_caveats = True
            print("note: threads you start yourself keep CUDA's device 0 (call torch.cuda.set_device there); "
                  "CUDA_VISIBLE_DEVICES is read once at CUDA start-up, so changing it now has no effect")

    def _gpu_status(self, rest):
        NO_ARGS["status"].parse_argstring(rest)
        display(self._status_report(inventory.take()))

    def _status_report(self, inv: inventory.Inventory) -> Report:
        choice = self.switcher.choice
        started = [fw.name for fw in fws.loaded() if fw.initialized()]
        head = [
            (f"device: cuda:{choice.ordinal} chosen by {choice.source}" + (" (also the default for new tensors)"
                                                                         if choice.default else ""))
            if choice else "device: none chosen; frameworks use cuda:0, CUDA's default (`%gpu use N` to switch)",
            "CUDA started by: " + (", ".join(started) if started else "nothing yet (no CUDA context in this kernel)"),
            "warm-up: " + self.warmer.status.summary(),
        ]
        pooled = os.environ.get(POOLED)
        if pooled:
            head.append(f"kernel: from gpuctx's warm pool (started and warmed {pooled} s before you asked for it)")
        reason = inv.no_gpu_reason()
        if reason:
            head.append(f"no GPU is visible: {reason}")
        rows, fw_data = [], {}
        for fw in fws.ALL:
            if not fw.loaded():
                state = "installed, not imported" if fw.installed() else "not installed"
                rows.append([fw.name, state, "–", "–"])
                fw_data[fw.name] = {"state": state}
                continue
            why = fw.gpu_reason()
            if why:
                rows.append([fw.name, why, "–", "–"])
                fw_data[fw.name] = {"state": why}
                continue
            cur = fw.current()
            rows.append([fw.name, "GPU ready" + (", CUDA started" if fw.initialized() else ""),
                         "–" if cur is None else f"cuda:{cur}", fw.default_device() or "cpu"])
            fw_data[fw.name] = {"state": "gpu", "current": cur, "default": fw.default_device(),
                                "cuda_started": fw.initialized()}
        sections = [Section("gpuctx status", lines=head),
                    Section("frameworks", ["framework", "state", "current", "default device"], rows)]
        mem = self._memory_rows(inv)
        if mem:
            sections.append(Section("this kernel's GPU memory", ["device", "framework", "allocated", "reserved", "peak"],
                                    mem))
        return Report(sections, data={"choice": choice.__dict__ if choice else None, "frameworks": fw_data,
                                      "warmup": self.warmer.status.as_dict(), "pooled": pooled is not None,
                                      "cuda_started": started, "no_gpu_reason": reason})

    def _memory_rows(self, inv) -> list[list[str]]:
        rows = []
        torch = fws.TORCH
        if torch.loaded() and torch.initialized():
            for i in range(torch.device_count()):
                m = torch.memory(i)
                if m and (m.reserved or m.peak or i == torch.current()):
                    rows.append([f"cuda:{i}", "torch", gib(m.allocated, 2), gib(m.reserved, 2), gib(m.peak, 2)])
        cupy = fws.CUPY
        if cupy.loaded() and not cupy.gpu_reason():
            cur = cupy.current()
            m = cupy.memory(cur)
            if m and m.reserved:
                rows.append([f"cuda:{cur}", "cupy", gib(m.allocated, 2), gib(m.reserved, 2), "–"])
        for ordinal, used in sorted(inventory.process_memory(inv).items()):
            rows.append([f"cuda:{ordinal}", "NVML (whole process)", "–", gib(used, 2), "–"])
        return rows

    def _gpu_mem(self, rest):
        NO_ARGS["mem"].parse_argstring(rest)
        inv = inventory.take()
        reason = inv.no_gpu_reason()
        if reason:
            display(Report([Section("No GPU is visible to this kernel", lines=[reason])], data={"reason": reason}))
            return
        mine = inventory.process_memory(inv)
        rows, data = [], []
        for d in inv.devices:
            r = d.record
            rows.append([f"cuda:{d.ordinal}", r.name, gib(r.memory_used), gib(r.memory_free), gib(r.memory_total),
                         gib(mine.get(d.ordinal), 2) if d.ordinal in mine else "–"])
            data.append({"ordinal": d.ordinal, "used": r.memory_used, "free": r.memory_free,
                         "total": r.memory_total, "this_kernel": mine.get(d.ordinal)})
        sections = [Section("GPU memory", ["device", "name", "used", "free", "total", "this kernel"], rows)]
        alloc = self._memory_rows(inv)
        if alloc:
            sections.append(Section("allocators in this kernel", ["device", "framework", "allocated", "reserved",
                                                                  "peak"], alloc))
        display(Report(sections, data={"devices": data}))

    def _gpu_free(self, rest):
        NO_ARGS["free"].parse_argstring(rest)
        loaded = [fw for fw in fws.loaded() if not fw.gpu_reason()]
        collected = gc.collect()
        if not loaded:
            why = "; ".join(fw.gpu_reason() for fw in fws.loaded()) or "no GPU framework is imported in this kernel"
            print(f"gpuctx: nothing to free on a GPU: {why} (gc collected {collected} objects)")
            return
        before = inventory.process_memory(inventory.take())
        released = {fw.name: fw.release_cached() for fw in loaded}
        after_inv = inventory.take()
        after = inventory.process_memory(after_inv)
        total = sum(released.values())
        parts = ", ".join(f"{k} {mib(v)}" for k, v in released.items())
        line = f"gpuctx: returned {gib(total, 2)} of cached allocator memory to the GPU ({parts})"
        if before or after:
            dropped = sum(before.values()) - sum(after.values())
            held = ", ".join(f"cuda:{k} {gib(v, 2)}" for k, v in sorted(after.items()))
            change = (f"fell by {mib(dropped)}" if dropped > 0
                      else f"rose by {mib(-dropped)}" if dropped < 0 else "did not change")
            line += f"; NVML: this kernel's GPU memory {change} and is now {held or '0'}"
            line += " (the CUDA context and library handles stay until the kernel restarts)"
        print(line)

    def _gpu_warm(self, rest):
        args = WARM.parse_argstring(rest)
        names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
        unknown = [n for n in names if n not in FRAMEWORKS]
        if unknown:
            raise UsageError(f"cannot warm {', '.join(unknown)}: choose from {', '.join(FRAMEWORKS)}")
        missing = [n for n in names if not fws.BY_NAME[n].installed()]
        if missing:
            raise UsageError(f"{', '.join(missing)} is not installed in this kernel: install it or leave it out")
        device = self._resolve(args.spec)[1].ordinal if args.spec else None
        if not self.warmer.start(names, DEFAULT_OPS, device, source="%gpu warm"):
            print("gpuctx: a warm-up is already running: " + self.warmer.status.summary())
            return
        if args.wait:
            print("gpuctx warm-up: " + self.warmer.wait().summary())
        else:
            print("gpuctx: warming up in the background (`%gpu status` shows progress)")

    def _gpu_monitor(self, rest):
        args = MONITOR.parse_argstring(rest)
        if not 0.05 <= args.interval <= 3600:
            raise UsageError(f"--interval {args.interval:g} is out of range: give seconds between 0.05 and 3600")
        if not args.interval <= args.history <= 86400:
            raise UsageError(f"--history {args.history:g} must be at least the interval and at most 86400 s")
        replay = None
        if args.replay:
            from ..core.trace import Replay

            try:
                replay = Replay(os.path.expanduser(args.replay))
            except (OSError, ValueError) as exc:
                raise UsageError(f"cannot replay {args.replay}: {exc}") from None
        inv = replay.read() if replay else inventory.take()
        if inv.devices:
            for spec in args.specs:
                try:
                    parse_spec(spec, inv.devices)
                except SpecError as exc:
                    raise UsageError(str(exc)) from None
        from .monitor import monitor

        return monitor(*args.specs, interval=args.interval, history=args.history, replay=replay)

    def _gpu_doctor(self, rest):
        NO_ARGS["doctor"].parse_argstring(rest)
        display(doctor.report(doctor.diagnose(inventory.take(), self.warmer.status)))

    # -- %%on_gpu --------------------------------------------------------------------------------
    def _fast_ordinal(self, spec: str) -> int | None:
        """Plain ordinals skip NVML: `%%on_gpu 1` must cost well under a millisecond."""
        s = spec.strip().lower()
        s = s[5:] if s.startswith("cuda:") else s
        if not s.isdigit():
            return None
        key = (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))
        if self._count_cache is None or self._count_cache[0] != key:
            inv = inventory.take()
            if not inv.devices:
                return None  # let the slow path say why
            self._count_cache = (key, len(inv.devices))
        return int(s) if int(s) < self._count_cache[1] else None

    @cell_magic
    def on_gpu(self, line, cell):
        """Run one cell on a GPU and put the previous device back afterwards.

        %%on_gpu 1                 run the cell with cuda:1 current in torch, CuPy, Numba, JAX
        %%on_gpu 1 --default       ... and tensors created without a device land on cuda:1
        %%on_gpu auto --time       the GPU with most free memory; report GPU time and wall time
        %%on_gpu h200 --mem        report peak and net allocator memory of the cell on that GPU

        The previous device comes back also when the cell raises or is interrupted.
        `--time` uses CUDA events (torch, else CuPy); `--mem` resets torch's peak counter on that GPU.
        """
        __tracebackhide__ = True  # noqa: F841 — keep our frames out of the user's traceback
        args = ON_GPU.parse_argstring(line)
        ordinal = self._fast_ordinal(args.spec)
        if ordinal is None:
            inv = inventory.take()
            reason = inv.no_gpu_reason()
            if reason:
                # The user's work comes first: a GPU notebook opened on a CPU machine still runs.
                print(f"gpuctx: no GPU is visible ({reason}); running this cell without switching device",
                      file=sys.stderr)
                return self._run_body(cell)
            ordinal = self._resolve(args.spec, inv)[1].ordinal
        timer = _GpuTimer(ordinal) if args.time else None
        meter = _MemMeter(ordinal) if args.mem else None
        with self.switcher.scoped(Choice(ordinal, default=args.default, source="%%on_gpu")):
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

    def _run_body(self, cell: str):
        """Execute the cell in the user namespace like IPython does, returning its last expression."""
        __tracebackhide__ = True  # noqa: F841
        shell = self.shell
        code = shell.transform_cell(cell)
        tree = shell.transform_ast(shell.compile.ast_parse(code))
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)
        filename = shell.compile.cache(code, shell.execution_count, raw_code=cell)
        try:
            body = shell.compile(tree, filename, "exec")
            expr = None if last is None else shell.compile(last, filename, "eval")
        except SyntaxError as exc:
            if "await" in str(exc):
                raise UsageError("%%on_gpu cannot run top-level `await` yet: put the awaits in an async "
                                 "function and await it outside, or switch with `%gpu use` instead") from None
            raise
        exec(body, shell.user_ns)
        return None if expr is None else eval(expr, shell.user_ns)


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
        self._before = torch.cuda.memory_allocated(self.ordinal)

    def stop(self) -> list[str]:
        torch = fws.TORCH.mod
        peak = torch.cuda.max_memory_allocated(self.ordinal) - self._before
        net = torch.cuda.memory_allocated(self.ordinal) - self._before
        return [f"peak {signed(peak)}", f"net {signed(net)}"]
