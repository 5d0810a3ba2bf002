"""Which GPUs `%gpu workers start WHICH` asks for, numbered as `%gpu use` numbers them, and whether
another process computes on them (NVML's process list). Pure reads of an inventory: every rule is
testable on NVML records shaped like H200s (tests/test_workers_choice.py)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from IPython.core.error import UsageError

from ..contract.holders import read_holders
from ..core import inventory
from ..core.devices import SpecError, VisibleDevice, parse_spec
from ..core.procs import process_name
from .commands import one_line
from .render import gib

MAX_WORKERS = 256
COUNT = re.compile(r"[0-9]+", flags=re.ASCII)


@dataclass(frozen=True)
class Placement:
    """The workers to start here: one per GPU in `gpus`, or `count` CPU workers (gloo)."""

    gpus: tuple[VisibleDevice, ...]
    count: int
    note: str = ""


def check_count(n: int) -> None:
    if n < 1:
        raise UsageError("give at least one worker: a count (`%gpu workers start 2`), `all`, or GPUs such as "
                         "`0,1` (`cuda:0` for GPU 0 alone)")
    if n > MAX_WORKERS:
        raise UsageError(f"{n} workers is more than gpuctx starts on one machine ({MAX_WORKERS}): give fewer")


def choose(which: str | None, inv: inventory.Inventory, cpu: bool = False) -> Placement:
    """What `%gpu workers start WHICH` asks for: `all` (every visible GPU), a count N (the first N
    GPUs; without a GPU, N CPU workers), or GPUs named as `%gpu use` names them, comma-separated
    (`0,1`, `cuda:1`, UUIDs). Every mistake is a one-line UsageError."""
    which = (which or "all").strip()
    reason = inv.no_gpu_reason()
    if cpu:
        if not COUNT.fullmatch(which):
            raise UsageError(f"--cpu takes a number of workers, not {which!r}: `%gpu workers start 2 --cpu`")
        check_count(int(which))
        return Placement((), int(which))
    if which.lower() == "all":
        if reason:
            raise UsageError(one_line(f"no GPU is visible ({reason}): for CPU workers with gloo, give their "
                                      "number, e.g. `%gpu workers start 2`"))
        return Placement(tuple(inv.devices), len(inv.devices))
    if COUNT.fullmatch(which):
        n = int(which)
        check_count(n)
        if reason:
            return Placement((), n, one_line(f"no GPU is visible ({reason}): starting {n} CPU "
                                             f"worker{'s' if n > 1 else ''} with gloo"))
        if n > len(inv.devices):
            seen = len(inv.devices)
            raise UsageError(f"{n} workers asked for, but this kernel sees {seen} GPU{'s' if seen > 1 else ''} "
                             f"({_ordinals(inv.devices)}): one worker per GPU — `%gpu workers start {seen}`, "
                             "or add --cpu for CPU workers")
        return Placement(tuple(inv.devices[:n]), n)
    specs = [s.strip() for s in which.split(",")]
    if not all(specs):
        raise UsageError(f"{which!r} has an empty entry: name GPUs separated by commas, like `0,1`")
    if reason:
        raise UsageError(one_line(f"no GPU is visible: {reason}"))
    chosen: list[VisibleDevice] = []
    for spec in specs:
        try:
            dev = parse_spec(spec, inv.devices)
        except SpecError as exc:
            raise UsageError(one_line(str(exc))) from None
        if any(d.ordinal == dev.ordinal for d in chosen):
            raise UsageError(f"cuda:{dev.ordinal} is named twice in {which!r}: one worker per GPU")
        chosen.append(dev)
    return Placement(tuple(chosen), len(chosen))


def _ordinals(devices) -> str:
    ordinals = [d.ordinal for d in devices]
    return "cuda:" + (f"{ordinals[0]}-{ordinals[-1]}" if len(ordinals) > 1 else str(ordinals[0]))


def check_free(gpus, inv: inventory.Inventory) -> None:
    """UsageError when another process computes on one of `gpus` (NVML's process list): another
    notebook (named from the server's holders file) or any other program. This kernel, its own
    processes and the warm pool's standbys (which the server stops when memory is short) do not
    count."""
    mine = inventory.own_pids()
    holders, _why = read_holders()
    by_pid = holders.by_pid() if holders else {}
    entry = by_pid.get(os.getpid())
    if entry is not None:
        mine |= entry.pids

    def foreign(dev):
        for p in dev.record.processes:
            holder = by_pid.get(p.pid)
            if p.pid not in mine and "compute" in p.kind and not (holder is not None and holder.standby):
                return p, holder
        return None

    busy = [(d, found) for d in gpus if (found := foreign(d))]
    if not busy:
        return
    dev, (p, holder) = busy[0]
    if holder is not None:
        who = f"another notebook, {holder.label()} (pid {p.pid}, {gib(p.used_memory)})"
    else:
        name = process_name(p.pid)
        who = f"another process, pid {p.pid} ({name + ', ' if name else ''}{gib(p.used_memory)})"
    free = [d for d in inv.devices if not foreign(d)]
    more = f" (and {len(busy) - 1} more of the chosen GPUs)" if len(busy) > 1 else ""
    named = ",".join(str(d.ordinal) for d in free) if len(free) > 1 else f"cuda:{free[0].ordinal}" if free else ""
    hint = (f"choose free GPUs (`%gpu workers start {named}`) or add --share" if free
            else "free it first, or add --share to use it anyway")
    raise UsageError(one_line(f"cuda:{dev.ordinal} ({dev.record.name}) is in use by {who}{more}: {hint}"))


# -- the ranks a `%%on_gpu 0,1` cell names -------------------------------------------------------------
def select_ranks(ranks: list, spec: str) -> list:
    """The workers (kernel/workers.py's Worker) that `%%on_gpu SPEC` names: all of them, or those
    on the GPUs named as this notebook numbers them (for CPU or remote workers, numbers are ranks)."""
    if spec.strip().lower() == "all":
        return list(ranks)
    chosen: list = []
    for item in (s.strip() for s in spec.split(",")):
        w = _named(ranks, item)
        if w in chosen:
            raise UsageError(f"{item!r} names rank {w.rank} twice in {spec!r}")
        chosen.append(w)
    return chosen


def _named(ranks: list, item: str):
    from ..core.devices import GpuRecord

    listing = ", ".join(w.label for w in ranks)
    if not item:
        raise UsageError("an empty entry in the list: name workers separated by commas, like `0,1`")
    on_gpus = [w for w in ranks if w.ordinal is not None]
    if on_gpus and len(on_gpus) == len(ranks):
        visible = tuple(VisibleDevice(w.ordinal, GpuRecord(nvml_index=-1, uuid=w.uuid, name=w.gpu_name))
                        for w in on_gpus)
        try:
            dev = parse_spec(item, visible)
        except SpecError:
            raise UsageError(one_line(f"no worker runs on {item!r}: the workers are {listing}")) from None
        return next(w for w in on_gpus if w.ordinal == dev.ordinal)
    number = item.removeprefix("rank")
    if COUNT.fullmatch(number) and int(number) < len(ranks):
        return ranks[int(number)]
    raise UsageError(one_line(f"no rank {item!r}: the workers are {listing} (name ranks by number)"))
