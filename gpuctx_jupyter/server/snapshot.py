"""The GPU API's snapshot: every exposed GPU, numbered as the server's kernels number it, with
each process on it attributed to this server's kernels where it is one of them.

Built in two halves so that nothing blocks the event loop for long: the NVML read (an
`inventory.Inventory`) is taken in the sampler thread or an executor; the kernel list (kernel
manager and session table) is read on the event loop, and only when some GPU has processes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from ..core.devices import GpuRecord, SpecError, VisibleDevice, parse_spec
from ..core.inventory import Inventory
from . import attribution, kernel_client
from .attribution import KernelInfo
from .kernel_client import kernel_pid


def session_paths(session_manager) -> dict[str, list[str]]:
    """Kernel id → the notebook paths of the sessions using it.

    Read straight from the session table, on a cursor of our own: jupyter_server serves /metrics
    synchronously, so this cannot await `SessionManager.list_sessions()`, which reads the same
    table. Rows of kernels that died are harmless: only live kernels are looked up.
    """
    try:
        rows = session_manager.connection.execute("SELECT kernel_id, path FROM session").fetchall()
    except Exception:  # no session yet (the table is created on first use), or a custom manager
        return {}
    paths: dict[str, list[str]] = {}
    for kernel_id, path in rows:
        paths.setdefault(kernel_id, []).append(path)
    return paths


def list_kernels(serverapp, reported: Mapping[str, tuple[int | None, int]]) -> list[KernelInfo]:
    """This server's kernels with every PID NVML may list them under.

    `reported` maps a kernel id to (its local PID when it answered, the PID it reported); the
    reported PID is used only while the local one is unchanged, i.e. until a restart.
    """
    km = serverapp.kernel_manager
    paths = session_paths(serverapp.session_manager)
    children = attribution.recent_children()  # (not read on the event loop each time: see there)
    kernels = []
    for kernel_id in km.list_kernel_ids():
        kernel = kernel_client.find(km, kernel_id)
        if kernel is None:  # shut down meanwhile
            continue
        pid = kernel_pid(kernel)
        answered_as, own = reported.get(kernel_id, (None, None))
        kernels.append(KernelInfo(
            id=kernel_id,
            name=getattr(kernel, "kernel_name", ""),
            execution_state=getattr(kernel, "execution_state", None),
            paths=tuple(paths.get(kernel_id, ())),
            pids=attribution.kernel_pids(pid, own if answered_as == pid else None, children),
        ))
    return kernels


def exposed(inv: Inventory, specs: Sequence[str]) -> tuple[list[VisibleDevice], list[str]]:
    """The visible devices that `expose_gpus` selects (all when empty), and notes on bad specs."""
    if not specs or not inv.devices:
        return list(inv.devices), []
    chosen: dict[int, VisibleDevice] = {}
    notes = []
    for spec in specs:
        try:
            device = parse_spec(spec, inv.devices)
        except SpecError as exc:
            notes.append(f"GpuctxServer.expose_gpus entry {spec!r} is ignored: {exc}")
            continue
        chosen[device.ordinal] = device
    return [chosen[o] for o in sorted(chosen)], notes


def build(inv: Inventory, t: float, expose: Sequence[str] = (),
          kernels: Callable[[], Iterable[KernelInfo]] = list) -> dict:
    """The snapshot JSON; `kernels` is called only when some exposed GPU lists processes."""
    devices, notes = exposed(inv, expose)
    visible = {d.record.uuid for d in inv.devices}
    hidden = [r for r in inv.records if r.uuid not in visible]
    by_pid = attribution.owners(kernels()) if any(d.record.processes for d in devices) else {}
    reason = inv.no_gpu_reason()
    if reason is None and not devices:
        reason = (f"GpuctxServer.expose_gpus={list(expose)!r} selects none of the "
                  f"{len(inv.devices)} visible GPUs")
    return {
        "gpu": bool(devices),
        "reason": reason,
        "time": t,
        "devices": [_device(d, by_pid) for d in devices],
        "hidden": [_record(r) for r in hidden] if not expose else [],
        "notes": [*inv.notes, *notes],
    }


def _record(r: GpuRecord) -> dict:
    return {
        "nvml_index": r.nvml_index, "uuid": r.uuid, "name": r.name, "pci_bus_id": r.pci_bus_id,
        "memory_used": r.memory_used, "memory_total": r.memory_total, "memory_free": r.memory_free,
        "utilization": r.utilization, "temperature": r.temperature,
        "power_w": r.power_w, "power_limit_w": r.power_limit_w, "error": r.error,
    }


def _device(d: VisibleDevice, by_pid: Mapping[int, KernelInfo]) -> dict:
    return {"ordinal": d.ordinal, **_record(d.record),
            "processes": [attribution.describe(p, by_pid) for p in d.record.processes]}
