"""Giving GPU memory back without losing work: what `%gpu free` and the server's release request
(contract.RELEASE_REQUEST) both run.

Releasing never touches a user variable: it drops the references a failed cell leaves behind
(sys.last_* and the local variables of the failed call's frames), collects garbage and returns
the frameworks' cached blocks to the GPU. It may run on ipykernel's control thread while a cell
runs: gc is safe from any thread, torch's empty_cache takes the allocator's lock and returns only
unused blocks, CuPy's pool has its own lock, and a frame that is still executing cannot be
cleared (Python refuses; it is skipped).
"""
from __future__ import annotations

import gc
import inspect
import os
import sys
import time
from dataclasses import dataclass, field

from ..core import frameworks as fws
from ..core import inventory
from .render import gib


@dataclass
class Released:
    released: dict[str, int] = field(default_factory=dict)  # framework -> bytes returned to the GPU
    gc_collected: int = 0
    cleared: list[str] = field(default_factory=list)  # the failure's references that were dropped
    before: dict[int, int] = field(default_factory=dict)  # NVML bytes of this process per CUDA ordinal
    after: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    no_gpu: str | None = None  # why nothing could go back to a GPU
    output_cache: int = 0  # bytes of GPU tensors IPython's output cache (Out, _) keeps (left alone)

    @property
    def total(self) -> int:
        return sum(self.released.values())

    def as_reply(self) -> dict:
        return {"status": "ok", "pid": os.getpid(), "released": self.released, "released_total": self.total,
                "gc_collected": self.gc_collected, "cleared": self.cleared,
                "before": {str(k): v for k, v in self.before.items()},
                "after": {str(k): v for k, v in self.after.items()}, "seconds": round(self.seconds, 4),
                "no_gpu": self.no_gpu, "output_cache": self.output_cache}


def release_memory(shell=None) -> Released:
    """Drop what a failed cell keeps alive, collect garbage, return cached blocks to the GPU."""
    t0 = time.perf_counter()
    out = Released(cleared=drop_failure_references(shell))
    out.gc_collected = gc.collect()
    out.output_cache = _output_cache_bytes(shell)
    imported = fws.loaded()
    reasons = {fw.name: fws.reason_without_starting(fw) for fw in imported}  # (JAX's backend not started for it)
    loaded = [fw for fw in imported if not reasons[fw.name]]
    if not loaded:
        out.no_gpu = "; ".join(f"{name}: {why}" if name == "jax" else why for name, why in reasons.items()
                               ) or "no GPU framework is imported in this kernel"
        out.seconds = time.perf_counter() - t0
        return out
    inv = inventory.take()
    out.before = inventory.process_memory(inv) if inv.devices else {}
    out.released = return_cached(loaded)
    inv = inventory.take()
    out.after = inventory.process_memory(inv) if inv.devices else {}
    out.seconds = time.perf_counter() - t0
    return out


def return_cached(frameworks=None) -> dict[str, int]:
    """Each framework's cached blocks back to the GPU (default: the loaded ones that reach a GPU),
    its variables untouched: bytes per framework, 0 where it failed."""
    if frameworks is None:
        frameworks = [fw for fw in fws.loaded() if not fw.gpu_reason()]
    released = {}
    for fw in frameworks:
        try:
            released[fw.name] = int(fw.release_cached() or 0)
        except Exception:  # noqa: BLE001 — one framework failing must not keep the others' memory
            released[fw.name] = 0
    return released


def drop_failure_references(shell=None) -> list[str]:
    """Clear the local variables of the frames of the last error's traceback and drop sys.last_*;
    the names of what was dropped. The notebook's variables (module-level frames) are never touched."""
    cleared = []
    errors = [getattr(sys, name, None) for name in ("last_value", "last_exc")]
    result = getattr(shell, "last_execution_result", None)
    errors.append(getattr(result, "error_in_exec", None))
    frames = 0
    for exc in {id(e): e for e in errors if isinstance(e, BaseException)}.values():
        for link in _chain(exc):
            for frame in failed_frames(link):
                try:
                    frame.clear()
                except RuntimeError:  # still executing (a cell running right now): leave it
                    continue
                frames += 1
                try:  # Python 3.11 keeps a snapshot of the locals (f_locals) that clear() leaves
                    frame.f_locals.clear()
                except Exception:  # noqa: BLE001, S110
                    pass
    if frames:
        cleared.append(f"{frames} frame(s) of the failed call")
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if getattr(sys, name, None) is not None:
            try:
                delattr(sys, name)
                cleared.append(f"sys.{name}")
            except AttributeError:
                pass
    return cleared


def _chain(exc: BaseException):
    seen = 0
    while exc is not None and seen < 5:
        yield exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1


def _output_cache_bytes(shell) -> int:
    """GPU tensors IPython's output cache keeps (Out, _, __, ___): reported, never deleted."""
    if shell is None:
        return 0
    ns = getattr(shell, "user_ns", {}) or {}
    values = list((ns.get("Out") or {}).values()) if isinstance(ns.get("Out"), dict) else []
    values += [ns.get(n) for n in ("_", "__", "___")]
    seen = {}
    for v in values:
        for ordinal in range(16):
            key = gpu_bytes(v, ordinal)
            if key:
                seen[key[0]] = key[1]
                break
    return sum(seen.values())


def describe(r: Released) -> str:
    """One line for `%gpu free` (and the same figures the server's release reply carries)."""
    dropped = f"; dropped {', '.join(r.cleared)}" if r.cleared else ""
    if r.no_gpu:
        return f"gpuctx: nothing to free on a GPU: {r.no_gpu} (gc collected {r.gc_collected} objects{dropped})"
    parts = ", ".join(f"{k} {gib(v)}" for k, v in r.released.items())
    line = f"gpuctx: returned {gib(r.total)} of cached allocator memory to the GPU ({parts}){dropped}"
    if r.before or r.after:
        fell = sum(r.before.values()) - sum(r.after.values())
        held = ", ".join(f"cuda:{k} {gib(v)}" for k, v in sorted(r.after.items()))
        change = (f"fell by {gib(fell)}" if fell > 0 else f"rose by {gib(-fell)}" if fell < 0 else "did not change")
        line += f"; NVML: this kernel's GPU memory {change} and is now {held or '0'}"
        line += " (the CUDA context and library handles stay until the kernel restarts)"
    if r.output_cache:
        line += (f"; IPython's output cache (Out, _) keeps {gib(r.output_cache)} of GPU tensors: "
                 "`%reset -f out` frees them")
    return line


def failed_frames(exc: BaseException | None):
    """The function frames (not the notebook's module level) in `exc`'s traceback."""
    tb = getattr(exc, "__traceback__", None)
    n = 0
    while tb is not None and n < 200:
        frame = tb.tb_frame
        if frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            yield frame
        tb, n = tb.tb_next, n + 1


def gpu_bytes(value, ordinal: int) -> tuple[int, int] | None:
    """(storage key, bytes) of a torch tensor or CuPy array on cuda:`ordinal`, else None."""
    try:
        if getattr(value, "is_cuda", False):  # torch
            if value.device.index != ordinal:
                return None
            storage = value.untyped_storage()
            return storage.data_ptr(), storage.nbytes()
        device = getattr(value, "device", None)
        if type(value).__module__.startswith("cupy") and getattr(device, "id", None) == ordinal:
            base = value.base if value.base is not None else value
            return base.data.ptr, base.nbytes
    except Exception:  # noqa: BLE001
        return None
    return None
