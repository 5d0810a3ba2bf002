"""The `%gpu` subcommands and the `%%on_gpu` cell magic, in one table.

Each entry names its argument parser, the `GpuMagics` method that runs it, a one-line summary and
examples; dispatch, `%gpu help`, `%gpu help <sub>`, `%gpu?`, the "did you mean" suggestion and the
README's command table (`markdown()`) are all made from it. Arguments are split like a POSIX
shell, quotes and all, but backslashes stay literal (Windows paths); every mistake becomes one
line of `UsageError` that says what to do.
"""
from __future__ import annotations

import argparse
import re
import shlex
import textwrap
from dataclasses import dataclass, field
from functools import cached_property

from IPython.core.error import UsageError

from ..contract import FRAMEWORKS


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help as is, with usage reading `usage: %gpu use …` (IPython's own formatter
    prefixes one more `%` and an RST `::`, meant for its docs)."""

    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, "usage: ")


@dataclass(frozen=True)
class Example:
    call: str
    says: str  # one line; `code` in Markdown's marks, which the terminal's help leaves out


@dataclass(frozen=True)
class Command:
    name: str
    summary: str  # one line: what it is for
    # `arg(...)`s, and lists of them for options that exclude each other (their dicts: not compared)
    arguments: tuple = field(compare=False, repr=False)
    handler: str  # the GpuMagics method that runs it with the parsed arguments
    examples: tuple[Example, ...]
    cell: bool = False  # a cell magic (%%name), not a %gpu subcommand

    @cached_property
    def parser(self) -> argparse.ArgumentParser:
        """Built when the command is first used or its help shown, not as every kernel loads gpuctx."""
        from IPython.core.magic_arguments import MagicArgumentParser

        parser = MagicArgumentParser(prog=self.title, description=self.summary, formatter_class=_HelpFormatter)
        for entry in self.arguments:
            target = parser.add_mutually_exclusive_group() if isinstance(entry, list) else parser
            for flags, kwargs in entry if isinstance(entry, list) else [entry]:
                target.add_argument(*flags, **kwargs)
        return parser

    @property
    def title(self) -> str:
        return f"%%{self.name}" if self.cell else f"%gpu {self.name}"

    def help(self, width: int = 96) -> str:
        """`%gpu help <name>`: usage, options (argparse wraps them to the terminal) and examples."""
        return "\n".join([self.parser.format_help().rstrip(), "", "examples:", *_examples(self.examples, width)])


def _examples(examples: tuple[Example, ...], width: int, indent: int = 2) -> list[str]:
    """Examples as an evenly indented two-column list, the second column wrapped to `width`."""
    col = min(28, max(len(e.call) for e in examples) + 2)
    out = []
    for e in examples:
        says = textwrap.wrap(e.says.replace("`", ""), max(30, width - indent - col)) or [""]
        if len(e.call) + 2 > col:
            out.append(" " * indent + e.call)
            first, rest = [], says
        else:
            first, rest = [" " * indent + e.call.ljust(col) + says[0]], says[1:]
        out += first + [" " * (indent + col) + line for line in rest]
    return out


def _seconds(text: str) -> float:
    """A number of seconds, written with ASCII digits (float() would take '١' and 'nan')."""
    if not re.fullmatch(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", text.strip(), flags=re.ASCII):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (write it like 0.5 or 2)")
    return float(text)


def arg(*flags: str, **kwargs) -> tuple[tuple[str, ...], dict]:
    """One argument, as `add_argument` takes it."""
    return flags, kwargs


def _command(name: str, summary: str, examples: list[tuple[str, str]], arguments=(), cell: bool = False,
             handler: str | None = None) -> Command:
    """A table entry; `arguments` holds `arg(...)`s, and lists of them for options that exclude each other."""
    exs = tuple(Example(call, says) for call, says in examples)
    return Command(name, summary, tuple(arguments), handler or f"_gpu_{name}", exs, cell)


SPEC_HELP = "1, cuda:1, a GPU UUID or prefix, a unique name fragment (h200), or auto"

COMMANDS: tuple[Command, ...] = (
    _command("list", "list the GPUs this kernel can see (plain %gpu does the same)", [
        ("%gpu list", "one row per visible GPU: CUDA ordinal (torch's number), nvidia-smi index, name, memory, "
                      "utilisation, temperature, processes; `●` marks the one current in this kernel; GPUs "
                      "hidden by `CUDA_VISIBLE_DEVICES` are named under the table. Plain `%gpu` does the same"),
    ]),
    _command("use", "make a GPU current for every framework, now and in later cells", [
        ("%gpu use 1", "make `cuda:1` current for torch, CuPy, Numba and JAX: now, in every later cell, in "
                       "frameworks imported later and in threads started from now on. torch's switch waits for "
                       "CUDA to start, so it never starts CUDA by itself"),
        ("%gpu use auto", "the visible GPU with the most free memory"),
        ("%gpu use h200 --default", "by a unique name fragment; `--default` also sends tensors created without "
                                    "a device there (`torch.set_default_device`)"),
        ("%gpu use --no-default", "keep the device, send device-less tensors back to the CPU"),
        ("%gpu use 1 --no-threads", "switch without carrying the device into threads started later (they "
                                    "begin on CUDA's device 0)"),
    ], [arg("spec", nargs="?", help=SPEC_HELP),
        [arg("--default", action="store_true", help="tensors created without a device land there too (torch)"),
         arg("--no-default", action="store_true", help="stop sending device-less tensors to the GPU")],
        arg("--no-threads", action="store_true", help="do not carry the device into threads started from now on")]),
    _command("on_gpu", "run one cell on a GPU, then put the previous device back", [
        ("%%on_gpu 1", "run one cell with `cuda:1` current, then restore the previous device (a framework the "
                       "cell imported goes to the kernel's device, else cuda:0), also when the cell raises or is "
                       "interrupted; a `%gpu use` in the cell chooses the device it ends on; a framework that could "
                       "not switch is named in the cell's output"),
        ("%%on_gpu 1 --default --time --mem", "... with device-less tensors on `cuda:1`, and a line reporting "
                                              "wall time, GPU time (CUDA events) and peak/net allocator memory"),
        ("%%on_gpu all", "run the cell on every worker of `%gpu workers` at once: output grouped per rank and "
                         "shown live, each failing rank's traceback, Interrupt reaches every rank; returns rank 0's "
                         "value of the last expression (every rank's in `_ranks`); names stay on the workers"),
        ("%%on_gpu 0,1 --timeout 600", "... on the workers of `cuda:0` and `cuda:1` only, interrupting ranks "
                                       "still running after 600 s"),
    ], [arg("spec", help=SPEC_HELP + "; all, or GPUs separated by commas (0,1): the workers of %%gpu workers"),
        arg("--default", action="store_true", help="tensors created without a device land on it too (torch)"),
        arg("--time", action="store_true", help="report GPU time (CUDA events) beside wall time"),
        arg("--mem", action="store_true", help="report peak and net allocator memory on that GPU (torch)"),
        arg("--timeout", type=_seconds, metavar="S",
            help="workers only: interrupt the ranks still running after S seconds")],
        cell=True, handler="on_gpu"),
    _command("status", "this kernel's GPU state", [
        ("%gpu status", "the device in force and who chose it; per framework its state and current device; "
                        "this kernel's allocator memory per device and NVML's figure for the process; the "
                        "warm-up; threads"),
    ]),
    _command("mem", "memory per GPU, and this kernel's share", [
        ("%gpu mem", "memory per GPU (NVML's used/free/total) and this kernel's share, with its allocators' "
                     "figures"),
    ]),
    _command("free", "give cached allocator memory back to the GPU", [
        ("%gpu free", "`gc.collect()`, release torch's and CuPy's cached blocks, and report what went back to "
                      "the GPU"),
    ]),
    _command("doctor", "check everything that makes a GPU unused, slow or wrong, with the fix", [
        ("%gpu doctor", "driver and NVML, the torch build against the driver's CUDA, `CUDA_VISIBLE_DEVICES` and "
                        "`CUDA_DEVICE_ORDER`, device counts per framework, persistence and MIG modes, fork "
                        "safety: each finding with its fix"),
    ]),
    _command("warm", "warm CUDA in the background now, so the next GPU cell runs at full speed", [
        ("%gpu warm [SPEC] [--wait]", "start CUDA and run a first matmul and conv in a background thread now "
                                      "(`--frameworks torch,cupy,jax`); the kernel stays usable meanwhile and "
                                      "`%gpu status` shows the phases"),
    ], [arg("spec", nargs="?", help="the device to warm (default: this kernel's current device)"),
        arg("--frameworks", default="torch", help=f"comma-separated, from {', '.join(FRAMEWORKS)}"),
        arg("--wait", action="store_true", help="block until the warm-up has finished, then report it")]),
    _command("monitor", "a live monitor of the GPUs, updated while other cells run", [
        ("m = %gpu monitor [SPEC ...]", "a live monitor widget (utilisation, memory, temperature, power, "
                                        "history, processes with this kernel marked); `m.stop()` freezes it, "
                                        "`m.close()` removes it"),
        ("%gpu monitor 1 --interval 0.5", "`cuda:1` only, twice a second (`--history 300`: five minutes of "
                                          "history)"),
        ("%gpu monitor --replay TRACE", "play a recorded NVML trace instead of the live GPUs, labelled as a "
                                        "replay"),
    ], [arg("specs", nargs="*", help="GPUs to show (default: every visible one)"),
        arg("--interval", type=_seconds, default=1.0, help="seconds between samples (default 1)"),
        arg("--history", type=_seconds, default=60.0, help="seconds of history in the plot (default 60)"),
        arg("--replay", metavar="TRACE", help=("play a recorded NVML trace instead of the live GPUs (labelled as "
                                               "a replay; record one with `python -m gpuctx_jupyter.trace record`)"))]),
    _command("workers", "warm data-parallel workers for this notebook, one per GPU, on ipyparallel", [
        ("%gpu workers start all", "one warm worker per visible GPU, pinned to it (`CUDA_VISIBLE_DEVICES` names "
                                   "it by UUID), warmed with the notebook's plan (imports, CUDA, a training step) "
                                   "and in torch.distributed (NCCL; `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, "
                                   "`MASTER_ADDR`, `MASTER_PORT` set), in the notebook's folder and environment; "
                                   "they end with the kernel"),
        ("%gpu workers start 0,1", "workers on `cuda:0` and `cuda:1`, numbered as `%gpu use` numbers them; "
                                   "`%gpu workers start 2`: the first two GPUs, or two CPU workers with gloo where "
                                   "no GPU is visible (`--cpu` asks for CPU workers)"),
        ("%gpu workers start 8 --profile mpi", "eight engines that the launchers of ipyparallel profile `mpi` start "
                                               "(MPI, SSH, Slurm: docs/workers.md), each on a GPU of its host"),
        ("%gpu workers", "the workers: rank, GPU, pid, state, GPU memory; `%gpu workers stop` ends them"),
    ], [arg("action", nargs="?", choices=("start", "stop", "list"), help="start, stop, or list (the default)"),
        arg("which", nargs="?", help="start: all (the default), a count, or GPUs separated by commas (0,1)"),
        arg("--profile", metavar="P", help="an ipyparallel profile (name or folder) whose launchers start the engines"),
        arg("--cpu", action="store_true", help="CPU workers (gloo), also where GPUs are visible"),
        arg("--share", action="store_true", help="use GPUs that another process computes on too"),
        arg("--no-warm", action="store_true", help="no warm-up: only torch.distributed"),
        arg("--master-addr", metavar="ADDR",
            help="the address the other ranks reach rank 0 at (default: 127.0.0.1 on one host, else its host name)")]),
    _command("help", "help on the GPU magics", [
        ("%gpu help [SUBCOMMAND]", "every subcommand with an example (also `%gpu?`); `%gpu help use` for one "
                                   "subcommand's options"),
    ], [arg("subcommand", nargs="?", help="a subcommand, or on_gpu for the cell magic")]),
)

BY_NAME = {c.name: c for c in COMMANDS}
SUBCOMMANDS = tuple(c.name for c in COMMANDS if not c.cell)
ON_GPU = BY_NAME["on_gpu"]

SPECS = ("Device specs: 1 or cuda:1 (CUDA ordinals, as torch counts them), GPU-<uuid> or a unique prefix, "
         "a unique name fragment such as h200, or auto (the most free memory).")


def for_workers(spec: str) -> bool:
    """Whether `%%on_gpu SPEC` means the workers: `all`, or a comma-separated list."""
    return spec.strip().lower() == "all" or "," in spec


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped: a UsageError is one line."""
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)


def split(line: str, magic: str = "%gpu") -> list[str]:
    """The words of a magic's line, split like a shell (quotes group, backslashes stay literal)."""
    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split = True
    lex.commenters = ""
    lex.escape = ""
    try:
        return list(lex)
    except ValueError:
        raise UsageError(f"{magic}: a quotation mark is not closed in {line.strip()!r}: "
                         "close it or leave it out") from None


def lookup(name: str) -> Command:
    """The %gpu subcommand called `name`; UsageError with the closest one otherwise."""
    command = BY_NAME.get(name)
    if command is not None and not command.cell:
        return command
    if name.lstrip("%") == "on_gpu":
        raise UsageError("on_gpu is a cell magic: put `%%on_gpu 1` on the first line of the cell")
    import difflib  # only for a mistake: kept out of every kernel's start

    close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
    hint = f" — did you mean `%gpu {close[0]}`?" if close else ""
    raise UsageError(f"unknown %gpu subcommand {name!r}{hint} "
                     f"(one of: {', '.join(SUBCOMMANDS)}; `%gpu help`)")


def parse(command: Command, words: list[str]) -> argparse.Namespace:
    """Parsed arguments; any mistake is a one-line UsageError pointing at the command's help."""
    try:
        return command.parser.parse_args(words)
    except UsageError as exc:
        see = "%gpu help on_gpu" if command.cell else f"%gpu help {command.name}"
        raise UsageError(one_line(f"{command.title}: {exc} (`{see}` shows its options)")) from None


def help_for(name: str, width: int = 96) -> str:
    """`%gpu help NAME`: one command's usage, options and examples."""
    command = BY_NAME.get(name.lstrip("%"))
    if command is None:
        import difflib

        close = difflib.get_close_matches(name, list(BY_NAME), n=1)
        hint = f" — did you mean `%gpu help {close[0]}`?" if close else ""
        raise UsageError(f"no help for {name!r}{hint} (try `%gpu help` or `%gpu help use`)")
    return command.help(width)


def overview(width: int = 96) -> str:
    """`%gpu help` and `%gpu?`: every command with its examples, evenly indented."""
    examples = tuple(e for c in COMMANDS for e in c.examples)
    return "\n".join([
        "%gpu: see which GPUs this kernel can use, and switch between them.",
        "",
        *_examples(examples, width),
        "",
        *textwrap.wrap(SPECS, width),
        *textwrap.wrap("`%gpu help SUBCOMMAND` shows one subcommand's options: `%gpu help use`, "
                       "`%gpu help on_gpu`.", width),
    ])


def markdown() -> str:
    """The README's command table, made from the same entries (tests/test_magics.py keeps the
    README's copy, between <!-- gpu-commands --> and <!-- /gpu-commands -->, equal to it)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| command | what it does |", "| --- | --- |"]
    rows += [f"| `{cell(e.call)}` | {cell(e.says)} |" for c in COMMANDS for e in c.examples]
    return "\n".join(rows)
