"""The server's GPU history (server/history.py): bounded whatever runs into it, full resolution
then 10 s buckets, gaps as rows without values, one serialised message per change; the link
throughput beside it (server/links.py) and each kernel's host memory and CPU (server/usage.py),
read from a real process tree."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from tornado.web import HTTPError

from gpuctx_jupyter.core.nvml import LinkCounters
from gpuctx_jupyter.server import history as hist
from gpuctx_jupyter.server.history import GpuHistory, Series, asked_seconds, gap_after
from gpuctx_jupyter.server.links import rates
from gpuctx_jupyter.server.usage import ProcessTrees

from .harness.waiting import wait_for

GIB = 2**30
T0 = 1_800_000_000.0


def snapshot(t: float, util: float = 50, used: int = 10 * GIB, kernels=(("k1", "work/train.ipynb", GIB),),
             uuid: str = "GPU-a") -> dict:
    return {"gpu": True, "time": t, "devices": [{
        "uuid": uuid, "ordinal": 0, "utilization": util, "memory_used": used, "memory_total": 141 * GIB,
        "temperature": 40, "power_w": 300.5,
        "processes": [{"pid": 100 + n, "used_memory": size, "kernel": {"id": kid, "name": "python3", "paths": [path]}}
                      for n, (kid, path, size) in enumerate(kernels)] + [{"pid": 9, "used_memory": GIB}]}]}


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_two_hours_at_1_hz_keep_the_last_hour_in_a_fixed_amount_of_memory():
    clock = Clock()
    history = GpuHistory(3600, clock=clock)
    history.add_snapshot(snapshot(T0), 1.0)
    size = history.nbytes
    assert 0 < size < 200 * 1024  # one GPU and the host: their arrays are all made at once
    for s in range(1, 7200):
        clock.t = T0 + s
        history.add_snapshot(snapshot(T0 + s, util=s % 100), 1.0)
    assert history.nbytes == size  # what it holds never grows
    series = history.gpus["GPU-a"]
    assert series.fine.size == hist.FINE_ROWS
    window = history.window(3600)["gpus"]["GPU-a"]
    # the last 600 s at 1 Hz, then 10 s buckets back to an hour
    assert len(window["t"]) == pytest.approx(600 + 300, abs=2)
    assert window["t"][0] >= clock.t - 3600
    steps = [b - a for a, b in zip(window["t"], window["t"][1:])]
    assert steps[:10] == pytest.approx([10.0] * 10) and steps[-10:] == pytest.approx([1.0] * 10)


def test_a_bucket_holds_the_mean_and_memory_at_its_peak():
    series = Series(hist.GPU_FIELDS, 3600, fine_rows=2)
    for s, (util, used) in enumerate([(10, 1), (30, 5), (50, 2), (0, 0), (0, 0), (0, 0)]):
        series.add(T0 + s, {"utilization": util, "memory_used": used * GIB, "memory_total": 8 * GIB}, interval=1.0)
    rows = series.rows(0)
    bucket = rows[0][0]
    assert bucket[1] == pytest.approx(sum((10, 30, 50, 0)) / 4)  # the rows folded so far, averaged
    assert bucket[2] == 5 * GIB  # memory: the most in use within the bucket


def test_time_without_samples_is_a_gap_row_with_no_values():
    clock = Clock()
    history = GpuHistory(3600, clock=clock)
    for s in (0, 1, 2, 3, 33, 34):  # a hung server: nothing from 3 s to 33 s
        clock.t = T0 + s
        history.add_snapshot(snapshot(T0 + s), 1.0)
    g = history.window(120)["gpus"]["GPU-a"]
    assert g["t"] == [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 33, T0 + 34]
    assert g["utilization"][4] is None and g["memory_used"][4] is None and g["kernels"]["k1"][4] is None
    assert all(v is not None for i, v in enumerate(g["utilization"]) if i != 4)
    assert gap_after(1.0) == 3.0 and gap_after(5.0) == 12.5


def test_a_faster_client_adds_no_rows_and_samples_out_of_order_are_dropped():
    series = Series(hist.GPU_FIELDS, 3600)
    assert series.add(T0, {"utilization": 1})
    assert not series.add(T0 + 0.5, {"utilization": 2})  # a client at 0.5 s: one row per second
    assert not series.add(T0 - 1, {"utilization": 3})
    assert series.add(T0 + 1, {"utilization": 4})
    assert [r[0][1] for r in series.rows(0)] == [1, 4]


def test_each_notebooks_memory_and_its_name_go_with_the_rows():
    clock = Clock()
    history = GpuHistory(600, clock=clock)
    for s in range(5):
        clock.t = T0 + s
        kernels = (("k1", "work/train.ipynb", GIB), ("k2", "eval.ipynb", 2 * GIB)) if s < 3 else \
            (("k1", "work/train.ipynb", 3 * GIB),)
        history.add_snapshot(snapshot(T0 + s, kernels=kernels), 1.0)
    w = history.window(600)
    assert w["gpus"]["GPU-a"]["kernels"] == {"k2": [2 * GIB] * 3 + [None] * 2, "k1": [GIB] * 3 + [3 * GIB] * 2}
    assert w["labels"] == {"k1": "train.ipynb", "k2": "eval.ipynb"}
    clock.t += 700  # both have left the history's span: their names go too
    history.add_snapshot(snapshot(clock.t, kernels=()), 1.0)
    assert history.window(600)["labels"] == {} and history.labels == {}


def test_a_kernel_without_a_notebook_is_named_by_kernelspec_and_id():
    assert hist.kernel_label({"id": "abcdef123456", "name": "python3", "paths": []}) == "python3 kernel abcdef12"


def test_one_message_per_change_whatever_the_number_of_clients():
    clock = Clock()
    history = GpuHistory(3600, clock=clock)
    history.add_snapshot(snapshot(T0), 1.0)
    first = history.message(120)
    assert history.message(120) is first  # the next client in the same second: the same string
    clock.t += 1
    history.add_snapshot(snapshot(T0 + 1), 1.0)
    assert history.message(120) is not first
    assert history.message(99999) == history.message(3600)  # no more than it keeps


def test_no_gpu_or_a_snapshot_without_a_time_adds_nothing():
    history = GpuHistory(3600)
    assert not history.add_snapshot({"gpu": False, "reason": "no driver", "time": T0, "devices": []})
    assert not history.add_snapshot({"gpu": True, "devices": []})
    assert history.window(60)["gpus"] == {}


def test_past_the_cap_a_new_gpu_is_kept_and_the_longest_silent_goes():
    """MIG instances made again get new UUIDs: once MAX_SERIES of them were seen, the series just
    made (no row yet, so 'sampled longest ago') was the one forgotten, and no new GPU had a history."""
    clock = Clock()
    history = GpuHistory(3600, clock=clock)
    for n in range(hist.MAX_SERIES):
        clock.t = T0 + n
        history.add_snapshot(snapshot(clock.t, uuid=f"MIG-{n}"))
    clock.t = T0 + hist.MAX_SERIES
    assert history.add_snapshot(snapshot(clock.t, uuid="MIG-new"))
    gpus = history.window(3600)["gpus"]
    assert "MIG-new" in gpus and "MIG-0" not in gpus and len(gpus) == hist.MAX_SERIES


def test_the_host_and_the_links_have_series_of_their_own():
    clock = Clock()
    history = GpuHistory(3600, clock=clock)
    for s in range(0, 20, 2):
        clock.t = T0 + s
        history.add_host(clock.t, {"cpu_percent": s, "memory_used": 4 * GIB, "memory_total": 16 * GIB}, 2.0)
    for s in range(0, 20, 5):
        history.add_links(T0 + s, {"GPU-a": {"pcie_tx": 1e9, "pcie_rx": 2e9, "nvlink_tx": None, "nvlink_rx": None}},
                          5.0)
    w = history.window(60)
    assert w["host"]["cpu_percent"] == list(map(float, range(0, 20, 2)))
    assert w["links"]["GPU-a"]["pcie_rx"] == [2_000_000_000] * 4 and w["links"]["GPU-a"]["nvlink_tx"] == [None] * 4


def test_a_span_that_is_not_a_number_is_refused_with_what_to_ask():
    assert asked_seconds(None, 3600) == 0 and asked_seconds("120", 3600) == 120 and asked_seconds("99999", 3600) == 3600
    for bad in ("abc", "nan", "-5", "inf", "1e9", "1_0", "\u0663"):  # ASCII digits only, as the stream's interval
        with pytest.raises(HTTPError) as err:
            asked_seconds(bad, 3600)
        assert err.value.status_code == 400 and "ask for one between 0 and 3600" in str(err.value)
        assert repr(bad) in str(err.value) and repr(bad) not in err.value.log_message  # an argument, not the format


def test_link_rates_come_from_two_readings_of_the_nvlink_counters():
    first = [LinkCounters("GPU-a", t=100.0, pcie_tx=1e6, pcie_rx=2e6, nvlink_tx=10 * GIB, nvlink_rx=4 * GIB,
                          nvlink_links=18)]
    assert rates({}, first)["GPU-a"] == {"pcie_tx": 1e6, "pcie_rx": 2e6, "nvlink_tx": None, "nvlink_rx": None,
                                         "nvlink_links": 18}
    later = [LinkCounters("GPU-a", t=105.0, pcie_tx=3e6, pcie_rx=0.0, nvlink_tx=20 * GIB, nvlink_rx=2 * GIB,
                          nvlink_links=18)]
    r = rates({c.uuid: c for c in first}, later)["GPU-a"]
    assert r["nvlink_tx"] == pytest.approx(2 * GIB)  # 10 GiB in 5 s
    assert r["nvlink_rx"] is None  # the counter went back (a reset): no rate, rather than a negative one
    assert r["pcie_tx"] == 3e6


def test_host_memory_and_cpu_of_a_kernel_count_its_whole_process_tree():
    """A real process that starts a child, as a kernel with a DataLoader worker: the tree's RSS and
    CPU, read twice (a CPU share needs two readings of the same processes)."""
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: sum(range(10**6))'])\n"
            "print(child.pid, flush=True)\ntime.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        trees = ProcessTrees()
        first = trees.measure({"k": parent.pid})["k"]
        assert first["processes"] == 2 and first["memory"] > 2 * 2**20
        busy = wait_for(lambda: trees.measure({"k": parent.pid})["k"]["cpu_percent"] > 20, timeout=30)
        assert busy
        assert trees.measure({"gone": 2**22 + 12345}) == {}  # no such process: nothing, no error
        os.kill(child, 9)
        assert wait_for(lambda: trees.measure({"k": parent.pid}).get("k", {}).get("processes") == 1, timeout=30)
    finally:
        parent.kill()
        parent.wait(10)
    assert not math.isnan(first["cpu_percent"])
