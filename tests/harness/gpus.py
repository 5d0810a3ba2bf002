"""NVML records as an H200 machine reports them, for tests that run without a GPU, and whether
this machine has one (the `gpu` marker's skip rule)."""
from __future__ import annotations

from gpuctx_jupyter.core import nvml
from gpuctx_jupyter.core.devices import GpuProcess, GpuRecord

GIB = 1024**3


def gpu_reason() -> str | None:
    """Why this machine cannot run the GPU-marked tests (None: it can)."""
    try:
        records = nvml.read_records()
    except nvml.NvmlUnavailable as exc:
        return str(exc)
    return None if records else "NVML lists no GPU"


NO_GPU = gpu_reason()


def h200(index: int, used_gib: float = 1.0, pids=(), bus: str | None = None, uuid: str | None = None) -> GpuRecord:
    return GpuRecord(
        nvml_index=index,
        uuid=uuid or f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}",
        name="NVIDIA H200",
        pci_bus_id=bus or f"00000000:{0x18 + index * 0x20:02X}:00.0",
        compute_capability=(9, 0),
        memory_total=141 * GIB,
        memory_used=int(used_gib * GIB),
        utilization=10 * index,
        temperature=30 + index,
        power_w=100.0,
        power_limit_w=700.0,
        processes=tuple(GpuProcess(pid, GIB, "compute") for pid in pids),
        persistence_mode=True,
    )
