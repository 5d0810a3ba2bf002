"""Out of GPU memory: who holds the GPU, and what to do — printed under the traceback.

The explanation costs nothing until an error happens: `detect` looks only at the exception's
class names and message (no framework is imported), and only a detected out-of-memory error
reads NVML, the allocators and the server's holders file (`contract.holders`). It never raises
and is at most MAX_LINES lines. Giving memory back is `release.py`'s.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from .. import contract
from ..contract import holders as holders_file
from ..core import frameworks as fws
from ..core import inventory
from ..core.procs import process_name
from .release import failed_frames, gpu_bytes
from .render import gib

MAX_LINES = 12
MAX_HOLDER_LINES = 3
MAX_FIXES = 4
GIB = 2**30
# Reserved-but-unallocated bytes of the failing allocator from which fragmentation is worth a fix.
FRAGMENTATION_FLOOR = GIB

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 2**10, "MB": 2**20, "GB": 2**30}
_TORCH_ASKED = re.compile(r"Tried to allocate ([\d.]+) ?(B|KiB|MiB|GiB|TiB)")
_TORCH_GPU = re.compile(r"\bGPU (\d+) has a total capacity")
_BYTES = re.compile(r"(?:allocat\w*|request for)\D{0,40}?([\d,]{2,}) ?bytes", re.IGNORECASE)
_JAX_BYTES = re.compile(r"\((\d+)B\)")
_JAX_ORDINAL = re.compile(r"device ordinal (\d+)")


@dataclass(frozen=True)
class OomError:
    framework: str  # torch | cupy | jax
    ordinal: int | None  # the CUDA ordinal the message names, if it names one
    requested: int | None  # bytes the failing allocation asked for, if the message says
    message: str


def detect(exc: BaseException | None) -> OomError | None:
    """The out-of-memory error in `exc` (or in what caused it), else None; reads names and text only."""
    seen = 0
    while exc is not None and seen < 5:
        found = _detect_one(exc)
        if found:
            return found
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _detect_one(exc: BaseException) -> OomError | None:
    try:
        names = [(c.__name__, getattr(c, "__module__", "") or "") for c in type(exc).__mro__]
        msg = str(exc)
    except Exception:  # noqa: BLE001 — an exception whose str() fails is not ours to explain
        return None
    oom_class = [m for n, m in names if n == "OutOfMemoryError"]
    if any(m.startswith("torch") for m in oom_class) or msg.lstrip().startswith("CUDA out of memory"):
        asked = _TORCH_ASKED.search(msg)
        gpu = _TORCH_GPU.search(msg)
        return OomError("torch", int(gpu.group(1)) if gpu else None,
                        int(float(asked.group(1)) * _UNITS[asked.group(2)]) if asked else None, msg)
    if any(m.startswith("cupy") for m in oom_class):
        asked = _BYTES.search(msg)
        return OomError("cupy", None, int(asked.group(1).replace(",", "")) if asked else None, msg)
    if "RESOURCE_EXHAUSTED" in msg and any(m.startswith(("jax", "jaxlib")) for _n, m in names):
        asked = _JAX_BYTES.search(msg) or _BYTES.search(msg)
        ordinal = _JAX_ORDINAL.search(msg)
        return OomError("jax", int(ordinal.group(1)) if ordinal else None,
                        int(asked.group(1).replace(",", "")) if asked else None, msg)
    return None


# -- what the explanation is built from -----------------------------------------------------------
@dataclass
class HolderShare:
    """One holder of the GPU that failed, as the explanation names it."""

    label: str
    used: int  # bytes NVML lists
    holder: holders_file.Holder | None = None  # a kernel (or standby) of the same server
    idle: float | None = None  # seconds


@dataclass
class Fix:
    command: str
    frees: int | None  # bytes it would make available on the failing GPU (None: not memory)
    enough: bool  # it covers what the allocation lacks
    cost: int  # lower is gentler: nothing lost < something restarted < work lost
    holder: str | None = None  # the other notebook's kernel id, for fixes that act on one


# The last out-of-memory error of this kernel, for the server (kernel_view's answer carries it):
# the GPU panel highlights the holders of that GPU for a while after it.
last_oom: dict | None = None


def explain(exc: BaseException | None, now: float | None = None) -> str | None:
    """The explanation for `exc`, or None when it is not an out-of-memory error; never raises."""
    global last_oom
    oom = detect(exc)
    if oom is None:
        return None
    last_oom = {"time": time.time() if now is None else now, "framework": oom.framework, "ordinal": oom.ordinal,
                "requested": oom.requested}
    try:
        return _explain(oom, exc, time.time() if now is None else now)
    except Exception as err:  # noqa: BLE001 — a hint must never add a second traceback
        return (f"gpuctx: {oom.framework} ran out of GPU memory (could not say more: "
                f"{type(err).__name__}: {err}); `%gpu mem` shows who holds it")


def _explain(oom: OomError, exc: BaseException | None, now: float) -> str:
    inv = inventory.take()
    fw = fws.BY_NAME.get(oom.framework)
    ordinal = oom.ordinal
    if ordinal is None and fw is not None and fw.loaded():
        try:
            ordinal = fw.current()
        except Exception:  # noqa: BLE001
            ordinal = None
    ordinal = 0 if ordinal is None else ordinal
    if last_oom is not None:
        last_oom["ordinal"] = ordinal
    device = inv.by_ordinal(ordinal)
    holders, why_no_holders = holders_file.read_holders()
    figures = [f for f in fws.allocator_figures() if f.reserved or f.peak]
    own_nvml = inventory.process_memory(inv) if inv.devices else {}
    held = _held_by_traceback(exc, ordinal)
    lines = [_headline(oom, ordinal, device, inv)]  # at most 1 + 1 + 4 + 1 + 5 = 12 lines
    lines.append(_this_kernel(ordinal, figures, own_nvml, held))
    shares: list[HolderShare] = []
    if device is not None:
        shares = _other_holders(device.record, holders, now)
        suspended = _suspended_line(ordinal, holders)
        lines.extend(_holder_lines(ordinal, shares, why_no_holders, MAX_HOLDER_LINES - bool(suspended)))
        if suspended:
            lines.append(suspended)
    prealloc = _jax_preallocated(oom, device)
    cupy_cache = sum(f.reserved - f.allocated for f in figures if f.framework == "cupy" and f.ordinal == ordinal)
    keeps = []
    if prealloc:
        keeps.append(f"JAX preallocated {prealloc:.0%} of this GPU at start-up (XLA_PYTHON_CLIENT_PREALLOCATE=false "
                      "or XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 before jax starts)")
    if cupy_cache > 0:
        keeps.append(f"CuPy's memory pool keeps {gib(cupy_cache)} cached (`%gpu free` returns it)")
    if keeps:
        lines.append("  frameworks: " + "; ".join(keeps))
    fixes = _fixes(oom, ordinal, device, inv, figures, shares, held, prealloc, holders)
    if fixes:
        lines.append("  fixes, best first:")
        lines.extend(f"   {i}. {f.command}" for i, f in enumerate(fixes[:MAX_FIXES], start=1))
    return "\n".join(lines[:MAX_LINES])


def _headline(oom: OomError, ordinal: int, device, inv) -> str:
    asked = f"asked for {gib(oom.requested)}; " if oom.requested else ""
    if device is None:
        why = inv.no_gpu_reason() or f"cuda:{ordinal} is not among the visible GPUs"
        return f"gpuctx: {oom.framework} ran out of GPU memory on cuda:{ordinal} ({asked}no GPU figures: {why})"
    r = device.record
    return (f"gpuctx: {oom.framework} ran out of memory on cuda:{ordinal} (nvidia-smi {r.nvml_index}, {r.name}): "
            f"{asked}{gib(r.memory_free)} free of {gib(r.memory_total)}, {gib(r.memory_used)} in use")


def _this_kernel(ordinal: int, figures, own_nvml: dict[int, int], held: int) -> str:
    here = [f for f in figures if f.ordinal == ordinal]
    parts = []
    for f in here:
        peak = f", peak {gib(f.peak)}" if f.peak is not None else ""
        parts.append(f"{f.framework} {gib(f.allocated)} allocated, {gib(f.reserved)} reserved "
                     f"({gib(max(0, f.reserved - f.allocated))} reserved but unused){peak}")
    text = "; ".join(parts) if parts else "no allocator memory on this GPU"
    if held:
        text += f"; the failed cell's traceback keeps {gib(held)} of tensors alive"
    if own_nvml:
        text += "; NVML: " + ", ".join(f"{gib(v)} on cuda:{k}" for k, v in sorted(own_nvml.items()))
        others = [k for k in own_nvml if k != ordinal]
        if others:
            text += " (a context stays on each GPU it touched until restart)"
    return f"  this kernel (pid {os.getpid()}): {text}"


def _other_holders(record, holders: holders_file.HoldersFile | None, now: float) -> list[HolderShare]:
    by_pid = holders.by_pid() if holders else {}
    mine = {os.getpid(), *inventory.own_pids()}
    self_entry = by_pid.get(os.getpid())
    if self_entry is not None:
        mine |= self_entry.pids
    grouped: dict[str, HolderShare] = {}
    for p in record.processes:
        if p.pid in mine:
            continue
        holder = by_pid.get(p.pid)
        if holder is not None:
            key = f"k:{holder.id}"
            share = grouped.get(key) or HolderShare(holder.label(), 0, holder, holder.idle_at(now, holders.time))
            share.used += p.used_memory or 0
            grouped[key] = share
        else:
            name = process_name(p.pid)
            grouped[f"p:{p.pid}"] = HolderShare(f"pid {p.pid}" + (f" ({name})" if name else ""), p.used_memory or 0)
    return sorted(grouped.values(), key=lambda s: -s.used)


def _suspended_line(ordinal: int, holders: holders_file.HoldersFile | None) -> str | None:
    """The notebooks suspended from this GPU (not on it now: NVML does not list them)."""
    rows = [(h, h.suspended_from(ordinal)) for h in (holders.kernels if holders else ()) if h.suspended]
    rows = [(h, n) for h, n in rows if n]
    if not rows:
        return None
    return "  " + "; ".join(f"{h.label()} is {holders_file.suspended_text(n, h.suspended.get('since'))}"
                            for h, n in rows) + " (back on its next cell)"


def _holder_lines(ordinal: int, shares: list[HolderShare], why_no_holders: str,
                  limit: int = MAX_HOLDER_LINES) -> list[str]:
    if not shares:
        return [f"  no other process holds memory on cuda:{ordinal}"]
    more = shares[limit:]
    head = f"  other holders of cuda:{ordinal}, largest first"
    if more:
        head += f" ({len(more)} more hold{'s' if len(more) == 1 else ''} {gib(sum(s.used for s in more))})"
    if why_no_holders and not any(s.holder for s in shares):
        head += f" (notebooks cannot be named: {why_no_holders})"
    lines = [head + ":"]
    for s in shares[:limit]:
        detail = []
        if s.holder is not None and not s.holder.standby:
            rows = [m for m in s.holder.memory if m.get("ordinal") == ordinal]
            live = sum(int(m.get("allocated") or 0) for m in rows)
            cached = s.holder.cached(ordinal)
            if live:
                detail.append(f"{gib(live)} in tensors")
            if cached:
                detail.append(f"{gib(cached)} cached")
            if s.holder.execution_state == "busy":
                detail.append("running a cell")
            elif s.idle is not None:
                detail.append(f"idle {duration(s.idle)}")
        lines.append(f"    {s.label} {gib(s.used)}" + (f" ({', '.join(detail)})" if detail else ""))
    return lines


def _fixes(oom, ordinal, device, inv, figures, shares, held, prealloc, holders) -> list[Fix]:
    free = device.record.memory_free if device is not None else None
    short = max(0, oom.requested - free) if (oom.requested is not None and free is not None) else None

    def enough(frees: int | None) -> bool:
        return frees is not None and (short is None or frees >= short)

    fixes: list[Fix] = []
    # This kernel's cache: the failing allocator has already emptied its own cache and retried
    # (torch and CuPy both do), so what %gpu free adds is the other frameworks' caches and the
    # tensors the failed cell's traceback keeps alive.
    mine = held + sum(max(0, f.reserved - f.allocated) for f in figures
                      if f.ordinal == ordinal and f.framework != oom.framework)
    if mine >= 64 * 2**20:
        fixes.append(Fix(f"`%gpu free` — returns {gib(mine)} this kernel keeps cached or alive for the failed cell",
                         mine, enough(mine), 0))
    url = holders.release_url if holders else ""
    suspend_url = holders.suspend_url if holders else ""
    for s in shares:
        h = s.holder
        if h is None or h.standby or h.execution_state == "busy":
            continue
        cached = h.cached(ordinal)
        idle = f", idle {duration(s.idle)}" if s.idle is not None else ""
        if cached:
            where = "the GPU panel's Release button" + (f", or POST {url.replace('{id}', h.id)}" if url else "")
            fixes.append(Fix(f"release the cache of {s.label} ({gib(cached)}{idle}; its variables stay): {where}",
                             cached, enough(cached), 1, h.id))
        if suspend_url and not h.suspended:
            fixes.append(Fix(f"suspend {s.label} ({gib(s.used)}{idle}; its variables stay; it resumes on its next "
                             f"cell): the GPU panel's Suspend button, or POST {suspend_url.replace('{id}', h.id)}",
                             s.used, enough(s.used), 2, h.id))
        fixes.append(Fix(f"shut down {s.label} ({gib(s.used)}{idle}; its variables are lost): the GPU panel's "
                         f"Shut down button, or DELETE /api/kernels/{h.id}", s.used, enough(s.used), 4, h.id))
    needed = oom.requested or 0
    for d in inv.devices:
        f = d.record.memory_free
        if d.ordinal != ordinal and f is not None and f > needed and (free is None or f > free):
            fixes.append(Fix(f"`%gpu use {d.ordinal}` — cuda:{d.ordinal} has {gib(f)} free (tensors made before "
                             f"stay on cuda:{ordinal})", None, oom.requested is not None, 2))
            break  # inv.devices is in ordinal order: name the first that fits, not every one
    frag = sum(max(0, f.reserved - f.allocated) for f in figures if f.ordinal == ordinal and f.framework == "torch")
    if (oom.framework == "torch" and frag >= FRAGMENTATION_FLOOR
            and "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")):
        fixes.append(Fix(f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the kernel's environment, then "
                         f"restart: {gib(frag)} is reserved but too fragmented to use", frag, enough(frag), 3))
    if prealloc and device is not None and device.record.memory_total:
        grabbed = int(prealloc * device.record.memory_total)
        fixes.append(Fix("XLA_PYTHON_CLIENT_PREALLOCATE=false in the kernel's environment, then restart "
                         f"(JAX holds ~{gib(grabbed)} here)", grabbed, enough(grabbed), 3))
    # A fix is listed only where it can cover the request: releasing 1 MiB is no fix for 40 GiB.
    # Caches that each fall short may still do together: then that is one fix.
    releases = [f for f in fixes if f.cost <= 1 and not f.enough and f.frees]
    together = sum(f.frees for f in releases)
    if len(releases) > 1 and enough(together):
        names = ", ".join("`%gpu free` here" if f.holder is None else f.command.split(" (")[0].replace(
            "release the cache of ", "the Release button of ") for f in releases)
        fixes.append(Fix(f"together, {names} — {gib(together)}, their variables stay", together, True, 1))
    fixes = [f for f in fixes if f.enough]
    fixes.sort(key=lambda f: (f.cost, -(f.frees or 0)))
    # Releasing a notebook's cache, or suspending it, makes shutting it down pointless (and a release
    # makes its suspend pointless): keep the gentler.
    released = {f.holder for f in fixes if f.holder and f.command.startswith("release")}
    fixes = [f for f in fixes if not (f.holder in released and f.command.startswith("suspend"))]
    gentle = released | {f.holder for f in fixes if f.holder and f.command.startswith("suspend")}
    fixes = [f for f in fixes if not (f.holder in gentle and f.command.startswith("shut down"))]
    asked = f" (this one asked for {gib(oom.requested)})" if oom.requested else ""
    return fixes[:MAX_FIXES - 1] + [Fix(f"a smaller batch or model{asked}", None, False, 9)]


def _jax_preallocated(oom: OomError, device) -> float | None:
    """The fraction JAX preallocated on GPUs in this kernel, when it has started a GPU backend."""
    if not fws.JAX.loaded():
        return None
    fraction = contract.jax_preallocation(os.environ)
    if fraction is None:
        return None
    return fraction if fws.JAX.initialized() or oom.framework == "jax" else None  # (asked without starting it)


def _held_by_traceback(exc: BaseException | None, ordinal: int) -> int:
    """Bytes of GPU tensors that the failed call's frames keep alive (their local variables), less
    those the notebook holds anyway (its variables, and its models' parameters and buffers)."""
    seen: dict[int, int] = {}
    for frame in failed_frames(exc):
        try:
            values = list(frame.f_locals.values())
        except Exception:  # noqa: BLE001, S112 — a frame we cannot read holds nothing we can count
            continue
        for v in values:
            key_size = gpu_bytes(v, ordinal)
            if key_size:
                seen[key_size[0]] = key_size[1]
    if seen:
        for key in _notebook_storages(ordinal):
            seen.pop(key, None)
    return sum(seen.values())


def _notebook_storages(ordinal: int, limit: int = 100_000) -> set[int]:
    """The storages of the GPU tensors the notebook's variables hold (directly, or as a module's
    parameters and buffers); bounded, so that a huge namespace cannot stall the explanation."""
    try:
        from IPython import get_ipython

        ns = dict(getattr(get_ipython(), "user_ns", None) or {})
    except Exception:  # noqa: BLE001
        return set()
    keys: set[int] = set()
    n = 0
    for value in ns.values():
        tensors = [value]
        if callable(getattr(value, "parameters", None)) and callable(getattr(value, "buffers", None)):
            try:
                tensors = [*value.parameters(), *value.buffers()]
            except Exception:  # noqa: BLE001
                tensors = []
        for t in tensors:
            n += 1
            if n > limit:
                return keys
            key_size = gpu_bytes(t, ordinal)
            if key_size:
                keys.add(key_size[0])
    return keys


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `2 h 03 min`, `3 d 4 h`."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"
