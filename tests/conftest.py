"""Shared fixtures: a real IPython shell, a real ipykernel, and the GPU marker's skip rule."""
from __future__ import annotations

import os

import pytest

from gpuctx_jupyter.core import nvml
from gpuctx_jupyter.core.devices import GpuProcess, GpuRecord



def _gpu_reason() -> str | None:
    try:
        records = nvml.read_records()
    except nvml.NvmlUnavailable as exc:
        return str(exc)
    return None if records else "NVML lists no GPU"


NO_GPU = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if NO_GPU is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test, no GPU here: {NO_GPU} (run scripts/gpu-check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shell():
    """The real IPython shell with gpuctx loaded; unloaded again afterwards."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "gpuctx")
    yield ip
    ip.run_line_magic("unload_ext", "gpuctx")
    ip.run_cell("pass")  # leave a clean last result


GIB = 1024**3


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


@pytest.fixture
def nvml_records(monkeypatch):
    """Make NVML report the given records (NVML is the driver's library, not ours)."""

    def install(records):
        monkeypatch.setattr(nvml, "read_records", lambda: list(records))
        monkeypatch.setattr(nvml, "driver_version", lambda: "580.159.03")
        monkeypatch.setattr(nvml, "cuda_driver_version", lambda: "13.0")

    return install


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(var, raising=False)
    return os.environ


def kernel_config_env(tmp_path, policy: str = "always") -> dict:
    """The environment of a kernel configured to warm by its own config (the VS Code / JupyterHub route)."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.py").write_text(
        f'c.IPKernelApp.extensions = ["gpuctx"]\nc.GpuWarmup.policy = "{policy}"\n')
    return {"IPYTHONDIR": str(tmp_path / "ipython")}


@pytest.fixture(scope="module")
def browser():
    """One headless Debian Chromium per browser-test module (tests/browser/lab.py)."""
    from .browser.lab import Browser

    b = Browser()
    yield b
    b.close()
