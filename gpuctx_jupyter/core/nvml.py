"""The only module that talks to NVML, through NVIDIA's own bindings (`pynvml`, from nvidia-ml-py).

NVML reads the driver's view of every GPU without creating a CUDA context, so it is safe to call
from a kernel that has not touched CUDA, and cheap enough (a few µs a query) to sample often.
Nothing happens at import: NVML is initialised on first use, and a failure is remembered for a
while so that callers on a GPU-less machine get the same clear reason without paying for a retry
on every call, while a driver that comes back is still noticed.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from types import ModuleType

from .devices import GpuProcess, GpuRecord

RETRY_AFTER_S = 30.0

_lock = threading.Lock()
_nvml: ModuleType | None = None  # the initialised pynvml module
_failure: tuple[float, str] | None = None  # (time.monotonic() of the failure, reason)
# Each NVML index's identity as last read in full (uuid, name, bus id, capability): a GPU that
# falls off the bus (Xid 79) answers nothing, not even its UUID, yet CUDA's ordinals and the
# history still count it where it was. Forgotten with the session (a driver reload renumbers).
_known: dict[int, tuple] = {}

# Errors after which nothing more can be read from a device: the record carries them as `error`.
_DEVICE_GONE = ("GPU_IS_LOST", "RESET_REQUIRED", "UNKNOWN", "IRQ_ISSUE", "GPU_NOT_FOUND")


class NvmlUnavailable(Exception):
    """NVML cannot be used in this process; str() is one line a person can act on."""


def init() -> ModuleType:
    """Initialise NVML once per process and return the pynvml module, or raise NvmlUnavailable."""
    global _nvml, _failure
    with _lock:
        if _nvml is not None:
            return _nvml
        if _failure is not None and time.monotonic() - _failure[0] < RETRY_AFTER_S:
            raise NvmlUnavailable(_failure[1])
        try:
            import pynvml
        except ImportError:
            reason = "pynvml (nvidia-ml-py) is not installed"
        else:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                reason = _reason(pynvml, e)
            else:
                _nvml, _failure = pynvml, None
                return pynvml
        _failure = (time.monotonic(), reason)
        raise NvmlUnavailable(reason)


def _reason(nv: ModuleType, error: Exception) -> str:
    """A one-line reason for an NVML error that makes NVML as a whole unusable."""
    reasons = {
        nv.NVML_ERROR_LIBRARY_NOT_FOUND: "NVIDIA driver library libnvidia-ml.so.1 not found "
        "(no NVIDIA driver on this machine)",
        nv.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
        nv.NVML_ERROR_NO_PERMISSION: "insufficient permissions to talk to the NVIDIA driver",
        nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the NVIDIA driver and its NVML library differ in "
        "version (a driver update that needs a reboot?)",
    }
    return reasons.get(getattr(error, "value", None), f"NVML error: {error}")


def _forget(reason: str) -> NvmlUnavailable:
    """Drop a session that stopped working (driver unloaded): init() retries after RETRY_AFTER_S."""
    global _nvml, _failure
    with _lock:
        _nvml, _failure = None, (time.monotonic(), reason)
        _known.clear()
    return NvmlUnavailable(reason)


def read_records() -> list[GpuRecord]:
    """Snapshot every GPU in NVML index order, each followed by its MIG instances.

    Never raises for one bad device: a field NVML cannot give is None, and a device that is lost
    comes back as a record with `error` set. Raises NvmlUnavailable when NVML itself is unusable.
    Only cheap queries (µs each); PCIe throughput takes ~20 ms a call and is never read here.
    """
    nv = init()
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as e:
        raise _forget(_reason(nv, e)) from e
    records: list[GpuRecord] = []
    for index in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as e:
            gpu = GpuRecord(nvml_index=index, uuid="", name="", error=_device_error(e))
        else:
            gpu = _read_device(nv, handle, index)
        gpu = _identified(gpu)
        records.append(gpu)
        if gpu.mig_enabled:
            records.extend(_read_mig_instances(nv, handle, gpu))
    return records


def _identified(gpu: GpuRecord) -> GpuRecord:
    """`gpu` with the identity its NVML index last had where it can no longer say (lost): so it
    keeps its place in CUDA's order (by bus id) and its history (by UUID), and says which it is."""
    if gpu.error is None and gpu.uuid:
        _known[gpu.nvml_index] = (gpu.uuid, gpu.name, gpu.pci_bus_id, gpu.compute_capability)
        return gpu
    known = _known.get(gpu.nvml_index)
    if gpu.error is None or known is None or (gpu.uuid and gpu.uuid != known[0]):
        return gpu
    uuid, name, bus, capability = known
    return replace(gpu, uuid=uuid, name=gpu.name or name, pci_bus_id=gpu.pci_bus_id or bus,
                   compute_capability=gpu.compute_capability or capability)


def _read_mig_instances(nv: ModuleType, handle, gpu: GpuRecord) -> list[GpuRecord]:
    """The MIG instances of a GPU in MIG mode; NVML's slots are sparse, so empty ones are skipped."""
    try:
        slots = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
    except nv.NVMLError:
        return []
    instances = []
    for slot in range(slots):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nv.NVMLError:
            continue
        instances.append(_read_device(nv, mig, gpu.nvml_index, parent=gpu, mig_index=slot))
    return instances


class _Reader:
    """Calls NVML on one device: a failing field gives None; once the device is gone, reads stop."""

    def __init__(self, nv: ModuleType, handle):
        self.nv, self.handle, self.error = nv, handle, None
        self.gone = {getattr(nv, f"NVML_ERROR_{n}") for n in _DEVICE_GONE if hasattr(nv, f"NVML_ERROR_{n}")}
        # Unversioned process queries raise this instead of NVMLError on a too-old driver.
        self.failures = (nv.NVMLError, getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError))

    def __call__(self, query, *args):
        if self.error is not None:
            return None
        try:
            return query(self.handle, *args)
        except self.failures as e:
            if getattr(e, "value", None) in self.gone:
                self.error = _device_error(e)
            return None


def _one_per_process(listed) -> tuple[GpuProcess, ...]:
    """NVML lists a process with both a compute and a graphics context (CUDA-GL interop, a
    workstation's display) in both lists, each with all its memory: one entry, "compute+graphics",
    its memory once."""
    out: dict[int, GpuProcess] = {}
    for p in listed:
        seen = out.get(p.pid)
        if seen is None:
            out[p.pid] = p
        elif seen.kind != p.kind:
            used = max((m for m in (seen.used_memory, p.used_memory) if m is not None), default=None)
            out[p.pid] = GpuProcess(p.pid, used, "compute+graphics")
    return tuple(out.values())


def _read_device(
    nv: ModuleType,
    handle,
    nvml_index: int,
    parent: GpuRecord | None = None,
    mig_index: int | None = None,
) -> GpuRecord:
    """One record; identity first, so a device lost mid-read still says which one it is."""
    read = _Reader(nv, handle)
    uuid = _text(read(nv.nvmlDeviceGetUUID))
    name = _text(read(nv.nvmlDeviceGetName))
    pci = read(nv.nvmlDeviceGetPciInfo)
    capability = read(nv.nvmlDeviceGetCudaComputeCapability)
    mig_mode = None if parent else read(nv.nvmlDeviceGetMigMode)
    persistence = read(nv.nvmlDeviceGetPersistenceMode)
    memory = read(nv.nvmlDeviceGetMemoryInfo)
    utilization = read(nv.nvmlDeviceGetUtilizationRates)
    temperature = read(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
    power = read(nv.nvmlDeviceGetPowerUsage)
    limit = read(nv.nvmlDeviceGetEnforcedPowerLimit)
    processes = _one_per_process(
        GpuProcess(pid=p.pid, used_memory=p.usedGpuMemory, kind=kind)
        for kind, query in (
            ("compute", nv.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses),
        )
        for p in read(query) or ()
    )
    if parent is not None:  # a MIG instance shares its parent's PCI slot and architecture
        bus_id = _bus_id(pci.busId) if pci else parent.pci_bus_id
        capability = capability or parent.compute_capability
    else:
        bus_id = _bus_id(pci.busId) if pci else ""
    return GpuRecord(
        nvml_index=nvml_index,
        uuid=uuid,
        name=name,
        pci_bus_id=bus_id,
        compute_capability=tuple(capability) if capability else None,
        memory_total=memory.total if memory else None,
        memory_used=memory.used if memory else None,
        utilization=utilization.gpu if utilization else None,
        temperature=temperature,
        power_w=power / 1000 if power is not None else None,
        power_limit_w=limit / 1000 if limit is not None else None,
        processes=processes,
        mig_enabled=bool(mig_mode) and mig_mode[0] == nv.NVML_DEVICE_MIG_ENABLE,
        mig_parent=parent.uuid if parent else None,
        mig_index=mig_index,
        persistence_mode=None if persistence is None else persistence == nv.NVML_FEATURE_ENABLED,
        error=read.error,
    )


@dataclass(frozen=True)
class LinkCounters:
    """What one GPU moved over its links, as NVML reports it: PCIe throughput in bytes/s (NVML
    samples it over ~20 ms), NVLink data moved so far in bytes (a counter: the rate is its change
    between two reads). None where NVML does not report it (no NVLink, a MIG instance, a driver
    without the field)."""

    uuid: str
    t: float  # time.monotonic() of the read
    pcie_tx: float | None = None
    pcie_rx: float | None = None
    nvlink_tx: int | None = None
    nvlink_rx: int | None = None
    nvlink_links: int = 0  # active NVLinks (0: none, or not reported)


_active_links: dict[str, tuple[int, ...]] = {}  # uuid -> its active NVLinks, found once per device


def read_link_counters() -> list[LinkCounters]:
    """PCIe throughput and NVLink counters of every GPU (not MIG instances), NVML index order.

    Slow: each PCIe query blocks ~20 ms (NVML samples the bus for it), so a
    read of 8 GPUs takes ~320 ms. Call it rarely and off any event loop (the server reads it every
    few seconds in an executor, only while a GPU dashboard is open); never from the sampler's
    loop. Raises NvmlUnavailable when NVML itself is unusable; a device or field that fails gives
    None for what it could not read.
    """
    nv = init()
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as e:
        raise _forget(_reason(nv, e)) from e
    out = []
    for index in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError:
            continue
        read = _Reader(nv, handle)
        uuid = _text(read(nv.nvmlDeviceGetUUID))
        if not uuid:
            continue
        tx = read(nv.nvmlDeviceGetPcieThroughput, nv.NVML_PCIE_UTIL_TX_BYTES)
        rx = read(nv.nvmlDeviceGetPcieThroughput, nv.NVML_PCIE_UTIL_RX_BYTES)
        links = _links(nv, handle, uuid)
        nvl_tx = nvl_rx = None
        if links:
            fields = [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) for link in links] + \
                     [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in links]
            values = read(nv.nvmlDeviceGetFieldValues, fields)
            if values is not None:
                kib = [_field_value(nv, v) for v in values]
                if all(v is not None for v in kib):
                    nvl_tx = sum(kib[:len(links)]) * 1024
                    nvl_rx = sum(kib[len(links):]) * 1024
        out.append(LinkCounters(uuid=uuid, t=time.monotonic(),
                                pcie_tx=None if tx is None else tx * 1024.0,  # NVML says KB/s
                                pcie_rx=None if rx is None else rx * 1024.0,
                                nvlink_tx=nvl_tx, nvlink_rx=nvl_rx, nvlink_links=len(links)))
    return out


def _links(nv: ModuleType, handle, uuid: str) -> tuple[int, ...]:
    """The device's active NVLinks (µs per link; asked once per device and remembered)."""
    if uuid not in _active_links:
        active = []
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                state = nv.nvmlDeviceGetNvLinkState(handle, link)
            except nv.NVMLError:
                break  # past the device's last link, or no NVLink at all
            if state == nv.NVML_FEATURE_ENABLED:
                active.append(link)
        _active_links[uuid] = tuple(active)
    return _active_links[uuid]


def _field_value(nv: ModuleType, value) -> int | None:
    if value.nvmlReturn != nv.NVML_SUCCESS:
        return None
    kinds = {nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal", nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
             nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal", nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}
    name = kinds.get(value.valueType)
    return int(getattr(value.value, name)) if name else None


def _device_error(error: Exception) -> str:
    return f"NVML error: {error}; the GPU may need a reset (`nvidia-smi -r`) or a reboot"


def _text(value: bytes | str | None) -> str:
    """pynvml returns bytes or str depending on its version."""
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus_id(value: bytes | str) -> str:
    """Normalise to NVML's 8-digit-domain, upper-case form, "00000000:65:00.0", to match on it."""
    text = _text(value).strip().upper()
    parts = text.split(":")
    if len(parts) != 3:
        return text
    return f"{parts[0].zfill(8)}:{parts[1]}:{parts[2]}"


def driver_version() -> str | None:
    """The NVIDIA driver version, e.g. "580.65.06"; None when NVML is unusable."""
    try:
        nv = init()
    except NvmlUnavailable:
        return None
    try:
        return _text(nv.nvmlSystemGetDriverVersion())
    except nv.NVMLError:
        return None


def cuda_driver_version() -> str | None:
    """The newest CUDA version the driver supports, e.g. "13.0"; None when NVML is unusable."""
    try:
        nv = init()
    except NvmlUnavailable:
        return None
    try:
        version = nv.nvmlSystemGetCudaDriverVersion()
    except nv.NVMLError:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"
