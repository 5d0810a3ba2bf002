"""GPU series on jupyter_server's own /metrics (prometheus_client's default registry).

A custom collector, read at scrape time, rather than gauges updated by a subscription: the
sampler then runs only while someone watches (a browser panel, a scrape), and a scrape never
shows figures older than the sampler's latest sample or a fresh read. jupyter_server serves
/metrics synchronously on its event loop, so a scrape without a fresh sample reads NVML there;
that costs a few µs per field per GPU, once per scrape interval.

The registry is per process and refuses a name twice, so one collector is registered per process
and pointed at the current server (tests start several servers in one process).

Kernel ids and notebook paths say what people work on: the per-kernel series carry them only when
/metrics is authenticated (jupyter_server's `authenticate_prometheus`, on by default) or the
operator asks for them (`GpuctxServer.metrics_kernel_labels`); otherwise the series is summed per
kernelspec and GPU. A scrape never fails: a snapshot that cannot be read gives the availability
series with the reason.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

GPU_LABELS = ["gpu", "cuda", "uuid", "name"]  # gpu: nvidia-smi index, as DCGM's exporter labels it
GPU_SERIES = [
    ("gpuctx_gpu_utilization_percent", "GPU utilisation over NVML's last sample period, percent",
     lambda d: d["utilization"]),
    ("gpuctx_gpu_memory_used_bytes", "GPU memory in use (all processes), bytes", lambda d: d["memory_used"]),
    ("gpuctx_gpu_memory_total_bytes", "GPU memory in total, bytes", lambda d: d["memory_total"]),
    ("gpuctx_gpu_temperature_celsius", "GPU core temperature, °C", lambda d: d["temperature"]),
    ("gpuctx_gpu_power_watts", "GPU power draw, watts", lambda d: d["power_w"]),
]


AVAILABLE = ("gpuctx_gpu_available", "1 when the server sees a GPU; 0 with the reason as a label")
KERNEL_MEMORY = ("gpuctx_kernel_gpu_memory_bytes", "GPU memory NVML lists for a kernel of this server "
                 "(its processes and their children), bytes")
SUSPENDED = ("gpuctx_kernel_suspended_bytes", "GPU memory of a suspended kernel of this server, moved into its "
             "host memory until it resumes, bytes (per GPU it came from)")
KERNEL_LABELS = ["kernel_id", "kernel_name", "path", "gpu", "uuid"]  # path: its sessions' notebooks
PUBLIC_KERNEL_LABELS = ["kernel_name", "gpu", "uuid"]  # unauthenticated /metrics: no ids, no paths


class GpuCollector:
    """Turns the GPU API's snapshot into Prometheus gauges at each scrape."""

    def __init__(self, snapshot: Callable[[], dict], kernel_labels: bool = True, log_once=None):
        self.snapshot, self.kernel_labels, self.log_once = snapshot, kernel_labels, log_once

    def describe(self):
        # Given, so that registering does not call collect() (and read NVML) at server start.
        names = [AVAILABLE, *((name, doc) for name, doc, _ in GPU_SERIES), KERNEL_MEMORY, SUSPENDED]
        return [GaugeMetricFamily(name, doc) for name, doc in names]

    def collect(self):
        try:
            families = list(self._families(self.snapshot()))
        except Exception as exc:  # never a failed scrape: the reason is a label
            reason = self.log_once("a /metrics scrape", exc) if self.log_once else f"{type(exc).__name__}: {exc}"
            available = GaugeMetricFamily(*AVAILABLE, labels=["reason"])
            available.add_metric([reason], 0)
            families = [available]
        yield from families

    def _families(self, snap: dict):
        available = GaugeMetricFamily(*AVAILABLE, labels=["reason"])
        available.add_metric([snap["reason"] or ""], 1 if snap["gpu"] else 0)
        yield available
        if not snap["gpu"]:
            return
        for name, doc, value in GPU_SERIES:
            family = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for d in snap["devices"]:
                if value(d) is not None:
                    family.add_metric([str(d["nvml_index"]), str(d["ordinal"]), d["uuid"], d["name"]], value(d))
            yield family
        if self.kernel_labels:
            kernels = GaugeMetricFamily(*KERNEL_MEMORY, labels=KERNEL_LABELS)
            for d in snap["devices"]:
                for kernel, used in kernel_memory(d).values():
                    kernels.add_metric([kernel["id"], kernel["name"], ",".join(kernel["paths"]),
                                        str(d["nvml_index"]), d["uuid"]], used)
        else:
            kernels = GaugeMetricFamily(*KERNEL_MEMORY, labels=PUBLIC_KERNEL_LABELS)
            for d in snap["devices"]:
                per_spec: dict[str, int] = {}
                for kernel, used in kernel_memory(d).values():
                    per_spec[kernel["name"]] = per_spec.get(kernel["name"], 0) + used
                for name, used in sorted(per_spec.items()):
                    kernels.add_metric([name, str(d["nvml_index"]), d["uuid"]], used)
        yield kernels
        yield self._suspended(snap)

    def _suspended(self, snap: dict) -> GaugeMetricFamily:
        """From each device's "suspended" list (SuspendManager.annotate, server/suspend.py), labelled like KERNEL_MEMORY."""
        family = GaugeMetricFamily(*SUSPENDED, labels=KERNEL_LABELS if self.kernel_labels else PUBLIC_KERNEL_LABELS)
        for d in snap["devices"]:
            per_spec: dict[str, int] = {}
            for entry in d.get("suspended") or []:
                kernel = entry["kernel"]
                if self.kernel_labels:
                    family.add_metric([kernel["id"], kernel["name"], ",".join(kernel["paths"]), str(d["nvml_index"]),
                                       d["uuid"]], entry["bytes"])
                else:
                    per_spec[kernel["name"]] = per_spec.get(kernel["name"], 0) + entry["bytes"]
            for name, total in sorted(per_spec.items()):
                family.add_metric([name, str(d["nvml_index"]), d["uuid"]], total)
        return family


def kernel_memory(device: dict) -> dict[str, tuple[dict, int]]:
    """Kernel id -> (the kernel, bytes its processes hold on this device), from a snapshot device."""
    used: dict[str, tuple[dict, int]] = {}
    for p in device["processes"]:
        if "kernel" in p and p["used_memory"] is not None:
            kernel, total = used.get(p["kernel"]["id"], (p["kernel"], 0))
            used[kernel["id"]] = (kernel, total + p["used_memory"])
    return used


_collector: GpuCollector | None = None


def install(snapshot: Callable[[], dict], kernel_labels: bool = True, log_once=None) -> GpuCollector:
    """Register the collector once per process; a later server replaces what it reads."""
    global _collector
    if _collector is None:
        _collector = GpuCollector(snapshot, kernel_labels, log_once)
        REGISTRY.register(_collector)
    else:
        _collector.snapshot, _collector.kernel_labels, _collector.log_once = snapshot, kernel_labels, log_once
    return _collector
