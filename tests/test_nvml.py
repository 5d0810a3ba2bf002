"""NVML reading: clear reasons without a driver, per-device resilience, and the real thing on a GPU."""
import ctypes
import re
import subprocess
import sys
from types import SimpleNamespace

import pynvml
import pytest

from gpuctx_jupyter.core import nvml

MIB = 1024**2


def driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Every test starts as a new process would: NVML neither initialised nor failed."""
    monkeypatch.setattr(nvml, "_nvml", None)
    monkeypatch.setattr(nvml, "_failure", None)
    monkeypatch.setattr(nvml, "_known", {})


def nvml_error(name):
    return pynvml.NVMLError(getattr(pynvml, f"NVML_ERROR_{name}"))


# --- without a driver -----------------------------------------------------------------------------

def test_import_does_not_initialise_nvml_or_cuda():
    code = (
        "import sys, gpuctx_jupyter.core.nvml, gpuctx_jupyter.core.devices\n"
        "lib = getattr(sys.modules.get('pynvml'), 'nvmlLib', None)\n"
        "assert lib is None, 'NVML loaded at import'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(driver_present(), reason="this machine has an NVIDIA driver")
def test_no_driver_gives_a_clear_reason():
    with pytest.raises(nvml.NvmlUnavailable) as raised:
        nvml.init()
    assert str(raised.value) == (
        "NVIDIA driver library libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)"
    )
    with pytest.raises(nvml.NvmlUnavailable, match="libnvidia-ml.so.1"):
        nvml.read_records()
    assert nvml.driver_version() is None
    assert nvml.cuda_driver_version() is None


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("LIBRARY_NOT_FOUND", "NVIDIA driver library libnvidia-ml.so.1 not found "
                              "(no NVIDIA driver on this machine)"),
        ("DRIVER_NOT_LOADED", "NVIDIA driver not loaded"),
        ("NO_PERMISSION", "insufficient permissions to talk to the NVIDIA driver"),
        ("UNKNOWN", "NVML error: Unknown Error"),
    ],
)
def test_init_errors_map_to_reasons(monkeypatch, error, reason):
    def fail():
        raise nvml_error(error)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    with pytest.raises(nvml.NvmlUnavailable) as raised:
        nvml.init()
    assert str(raised.value) == reason


def test_missing_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(nvml.NvmlUnavailable, match=r"^pynvml \(nvidia-ml-py\) is not installed$"):
        nvml.init()


def test_failure_is_remembered_then_retried(monkeypatch):
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(nvml, "time", SimpleNamespace(monotonic=lambda: clock.now))
    calls = []

    def flaky_init():
        calls.append(clock.now)
        if len(calls) == 1:
            raise nvml_error("DRIVER_NOT_LOADED")

    monkeypatch.setattr(pynvml, "nvmlInit", flaky_init)
    for _ in range(2):
        with pytest.raises(nvml.NvmlUnavailable, match="NVIDIA driver not loaded"):
            nvml.init()
    clock.now += nvml.RETRY_AFTER_S - 1
    with pytest.raises(nvml.NvmlUnavailable):
        nvml.init()
    assert calls == [1000.0]  # no retry inside the window

    clock.now += 2
    assert nvml.init() is pynvml  # the driver came back
    assert nvml.init() is pynvml
    assert len(calls) == 2  # initialised once


# --- a simulated machine --------------------------------------------------------------------------

class FakeMachine:
    """Answers pynvml's queries from a table: handle -> {function name: value or exception}."""

    def __init__(self, monkeypatch, devices, handles=None, mig_slots=None):
        self.devices, self.calls = devices, []
        self.handles = handles or {i: i for i in range(len(devices))}
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        count = sum(isinstance(key, int) for key in self.handles)  # MIG handles are "gpu/slot"
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: count)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", self.answer_handle)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex",
                            lambda handle, slot: self.answer_handle(f"{handle}/{slot}"))
        for name in ("GetUUID", "GetName", "GetPciInfo", "GetCudaComputeCapability", "GetMigMode",
                     "GetPersistenceMode", "GetMemoryInfo", "GetUtilizationRates", "GetTemperature",
                     "GetPowerUsage", "GetEnforcedPowerLimit", "GetComputeRunningProcesses",
                     "GetGraphicsRunningProcesses", "GetMaxMigDeviceCount", "GetPcieThroughput",
                     "GetNvLinkState", "GetFieldValues"):
            monkeypatch.setattr(pynvml, f"nvmlDevice{name}", self.query(name))

    def answer_handle(self, key):
        value = self.handles.get(key, nvml_error("NOT_FOUND"))
        if isinstance(value, Exception):
            raise value
        return value

    def query(self, name):
        def answer(handle, *args):
            self.calls.append((handle, name))
            value = self.devices[handle].get(name, nvml_error("NOT_SUPPORTED"))
            if callable(value):  # an answer that depends on the arguments (a link, a counter)
                value = value(*args)
            if isinstance(value, Exception):
                raise value
            return value
        return answer


def h200(uuid, bus, **extra):
    return {
        "GetUUID": uuid, "GetName": "NVIDIA H200",
        "GetPciInfo": SimpleNamespace(busId=bus), "GetCudaComputeCapability": (9, 0),
        "GetPersistenceMode": 1, "GetMemoryInfo": SimpleNamespace(total=1000 * MIB, used=600 * MIB),
        "GetUtilizationRates": SimpleNamespace(gpu=37, memory=5), "GetTemperature": 41,
        "GetPowerUsage": 123456, "GetEnforcedPowerLimit": 700000,
        "GetComputeRunningProcesses": [SimpleNamespace(pid=42, usedGpuMemory=600 * MIB)],
        "GetGraphicsRunningProcesses": [SimpleNamespace(pid=7, usedGpuMemory=None)],
        **extra,
    }


def test_gpu_lost_on_one_of_two_devices(monkeypatch):
    lost = nvml_error("GPU_IS_LOST")
    machine = FakeMachine(monkeypatch, {
        0: h200(b"GPU-aaaa", b"0000:18:00.0"),
        1: h200("GPU-bbbb", "00000000:2a:00.0", GetMemoryInfo=lost, GetUtilizationRates=lost),
    })
    good, bad = nvml.read_records()

    assert good == nvml.GpuRecord(
        nvml_index=0, uuid="GPU-aaaa", name="NVIDIA H200", pci_bus_id="00000000:18:00.0",
        compute_capability=(9, 0), memory_total=1000 * MIB, memory_used=600 * MIB,
        utilization=37, temperature=41, power_w=123.456, power_limit_w=700.0,
        processes=(nvml.GpuProcess(42, 600 * MIB, "compute"), nvml.GpuProcess(7, None, "graphics")),
        mig_enabled=False, persistence_mode=True, error=None,
    )
    assert good.memory_free == 400 * MIB

    assert bad.error.startswith("NVML error: GPU is lost")
    assert (bad.nvml_index, bad.uuid, bad.pci_bus_id) == (1, "GPU-bbbb", "00000000:2A:00.0")
    assert bad.memory_total is None and bad.utilization is None and bad.processes == ()
    assert (1, "GetUtilizationRates") not in machine.calls  # no more queries to a lost GPU


def test_a_gpu_that_falls_off_the_bus_keeps_its_ordinal_and_its_name(monkeypatch):
    """Xid 79: the first of two GPUs answers nothing, not even its UUID. CUDA still counts it
    where it was, so cuda:1 must stay the second GPU (not move to cuda:0, the lost one's place),
    and the lost one must still say which GPU it is (its history is kept by UUID)."""
    from gpuctx_jupyter.core.devices import resolve_visibility

    machine = FakeMachine(monkeypatch, {0: h200("GPU-aaaa", "0000:18:00.0"),
                                        1: h200("GPU-bbbb", "0000:2a:00.0")})
    before = [(d.ordinal, d.record.uuid) for d in resolve_visibility(nvml.read_records(), {}).devices]
    machine.handles[0] = nvml_error("GPU_IS_LOST")
    after = resolve_visibility(nvml.read_records(), {}).devices

    assert before == [(0, "GPU-aaaa"), (1, "GPU-bbbb")]
    assert [(d.ordinal, d.record.uuid) for d in after] == before
    lost = after[0].record
    assert lost.error.startswith("NVML error: GPU is lost") and lost.name == "NVIDIA H200"
    assert lost.pci_bus_id == "00000000:18:00.0" and lost.memory_used is None


def test_a_lost_gpu_never_read_before_is_still_listed_last(monkeypatch):
    """Lost from the first read on (nothing known of it): listed, with its error, after the rest."""
    FakeMachine(monkeypatch, {1: h200("GPU-bbbb", "0000:2a:00.0")},
                handles={0: nvml_error("GPU_IS_LOST"), 1: 1})
    lost, good = nvml.read_records()
    assert (lost.uuid, good.uuid) == ("", "GPU-bbbb") and lost.error.startswith("NVML error: GPU is lost")


def test_a_process_with_compute_and_graphics_contexts_counts_once(monkeypatch):
    """CUDA-GL interop (a renderer, a simulator) or a workstation's display: NVML lists the
    process in both lists, each with all its memory; summed, every figure of it doubled."""
    FakeMachine(monkeypatch, {0: h200("GPU-aaaa", "0000:18:00.0", GetGraphicsRunningProcesses=[
        SimpleNamespace(pid=42, usedGpuMemory=600 * MIB), SimpleNamespace(pid=7, usedGpuMemory=None)])})
    (record,) = nvml.read_records()
    assert record.processes == (nvml.GpuProcess(42, 600 * MIB, "compute+graphics"),
                                nvml.GpuProcess(7, None, "graphics"))


def test_link_counters_pcie_in_bytes_and_nvlink_summed_over_the_active_links(monkeypatch):
    nvml._active_links.clear()

    def field(kib, ok=True):
        return SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS if ok else 3,
                               valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value=SimpleNamespace(ullVal=kib))

    def links(link):  # links 0 and 2 up, 1 down, none past 3
        return nvml_error("INVALID_ARGUMENT") if link > 3 else (pynvml.NVML_FEATURE_ENABLED if link in (0, 2) else 0)

    def fields(queried):
        assert [scope for _id, scope in queried] == [0, 2, 0, 2]  # TX of each active link, then RX
        return [field(100), field(200), field(10), field(20)]

    machine = FakeMachine(monkeypatch, {
        0: h200("GPU-aaaa", "00000000:18:00.0",
                GetPcieThroughput=lambda counter: 1000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 500,
                GetNvLinkState=links, GetFieldValues=fields),
        1: h200("GPU-bbbb", "00000000:2a:00.0"),  # no NVLink, no PCIe figure: Nones
    })
    nvlinked, plain = nvml.read_link_counters()
    assert (nvlinked.uuid, nvlinked.pcie_tx, nvlinked.pcie_rx) == ("GPU-aaaa", 1000 * 1024.0, 500 * 1024.0)
    assert (nvlinked.nvlink_tx, nvlinked.nvlink_rx, nvlinked.nvlink_links) == (300 * 1024, 30 * 1024, 2)
    assert (plain.pcie_tx, plain.nvlink_tx, plain.nvlink_links) == (None, None, 0)
    nvml.read_link_counters()
    states = [c for c in machine.calls if c == (0, "GetNvLinkState")]
    assert len(states) == 5  # the links are found once per device, not at every read


def test_device_lost_before_its_handle(monkeypatch):
    FakeMachine(monkeypatch, {0: h200("GPU-aaaa", "00000000:18:00.0")},
                handles={0: 0, 1: nvml_error("GPU_IS_LOST")})
    good, bad = nvml.read_records()
    assert good.error is None
    assert (bad.nvml_index, bad.uuid, bad.name) == (1, "", "")
    assert "GPU is lost" in bad.error


def test_unsupported_fields_are_none(monkeypatch):
    device = h200("GPU-aaaa", "00000000:18:00.0")
    for name in ("GetTemperature", "GetPowerUsage", "GetEnforcedPowerLimit", "GetPersistenceMode"):
        device[name] = nvml_error("NOT_SUPPORTED")
    device["GetComputeRunningProcesses"] = nvml_error("NO_PERMISSION")
    FakeMachine(monkeypatch, {0: device})
    (record,) = nvml.read_records()
    assert record.error is None
    assert (record.temperature, record.power_w, record.power_limit_w) == (None, None, None)
    assert record.persistence_mode is None
    assert record.processes == (nvml.GpuProcess(7, None, "graphics"),)


def test_mig_instances_follow_their_parent(monkeypatch):
    mig = {"GetName": "NVIDIA H200 MIG 3g.71gb",
           "GetMemoryInfo": SimpleNamespace(total=71 * MIB, used=0)}
    FakeMachine(
        monkeypatch,
        {
            0: h200("GPU-aaaa", "00000000:18:00.0", GetMigMode=[1, 1], GetMaxMigDeviceCount=7),
            "0/0": {**mig, "GetUUID": "MIG-1111"},
            "0/2": {**mig, "GetUUID": "MIG-2222"},
            1: h200("GPU-bbbb", "00000000:2A:00.0", GetMigMode=[0, 0]),
        },
        handles={0: 0, "0/0": "0/0", "0/2": "0/2", 1: 1},
    )
    records = nvml.read_records()
    assert [r.uuid for r in records] == ["GPU-aaaa", "MIG-1111", "MIG-2222", "GPU-bbbb"]
    parent, first, second, plain = records
    assert parent.mig_enabled and not plain.mig_enabled
    assert (second.nvml_index, second.mig_parent, second.mig_index) == (0, "GPU-aaaa", 2)
    assert second.pci_bus_id == "00000000:18:00.0" and second.compute_capability == (9, 0)
    assert second.memory_total == 71 * MIB and second.utilization is None and second.error is None
    assert plain.mig_parent is None and plain.mig_index is None


def test_device_count_failure_makes_nvml_unavailable(monkeypatch):
    FakeMachine(monkeypatch, {})

    def fail():
        raise nvml_error("DRIVER_NOT_LOADED")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", fail)
    with pytest.raises(nvml.NvmlUnavailable, match="^NVIDIA driver not loaded$"):
        nvml.read_records()
    with pytest.raises(nvml.NvmlUnavailable, match="^NVIDIA driver not loaded$"):
        nvml.init()  # remembered: retried only after RETRY_AFTER_S


@pytest.mark.parametrize(("raw", "text"), [(13000, "13.0"), (12040, "12.4"), (12090, "12.9")])
def test_versions(monkeypatch, raw, text):
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: b"580.65.06")
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", lambda: raw)
    assert nvml.driver_version() == "580.65.06"
    assert nvml.cuda_driver_version() == text


# --- on a GPU machine -----------------------------------------------------------------------------

def nvidia_smi_gpus():
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader"],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = [[field.strip() for field in line.split(",")] for line in out.splitlines() if line.strip()]
    return [(int(index), uuid, name, int(memory.split()[0])) for index, uuid, name, memory in rows]


@pytest.mark.gpu
def test_records_from_a_real_gpu():
    records = nvml.read_records()
    gpus = [r for r in records if r.mig_parent is None]
    assert gpus
    for record in gpus:
        assert record.error is None
        assert record.uuid.startswith("GPU-")
        assert record.memory_total > 0 and 0 <= record.memory_used <= record.memory_total
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]", record.pci_bus_id)
        assert record.compute_capability is not None
    assert re.fullmatch(r"\d+\.\d+", nvml.cuda_driver_version())
    assert nvml.driver_version()


@pytest.mark.gpu
def test_link_counters_from_a_real_gpu():
    """PCIe throughput on every GPU, NVLink counters on GPUs joined by NVLink (2 × H200), and a
    rate from two readings (server/links.py), never negative."""
    import time

    from gpuctx_jupyter.server.links import rates

    first = nvml.read_link_counters()
    gpus = [r for r in nvml.read_records() if r.mig_parent is None]
    assert [c.uuid for c in first] == [r.uuid for r in gpus]
    assert all(c.pcie_tx is not None and c.pcie_tx >= 0 and c.pcie_rx >= 0 for c in first), first
    time.sleep(1.0)
    second = nvml.read_link_counters()
    for uuid, r in rates({c.uuid: c for c in first}, second).items():
        if r["nvlink_links"]:
            assert r["nvlink_tx"] is not None and r["nvlink_tx"] >= 0 and r["nvlink_rx"] >= 0, (uuid, r)
    print({c.uuid: (c.pcie_tx, c.pcie_rx, c.nvlink_links) for c in second})


@pytest.mark.gpu
def test_records_agree_with_nvidia_smi():
    gpus = [r for r in nvml.read_records() if r.mig_parent is None]
    smi = nvidia_smi_gpus()
    assert [(r.nvml_index, r.uuid, r.name) for r in gpus] == [row[:3] for row in smi]
    assert [r.memory_total // MIB for r in gpus] == [row[3] for row in smi]
