"""Mapping NVML's GPU processes to this server's kernels (attribution.py), with NVML records built
here and real processes (this test process and children it starts) where /proc is read."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpuctx_jupyter.core.devices import GpuProcess
from gpuctx_jupyter.server import attribution
from gpuctx_jupyter.server.attribution import KernelInfo, describe, kernel_pids, owners

from .harness.gpus import GIB, h200


def no_children(pid):
    return ()


def kernel(kid: str, pids, path: str = "train.ipynb") -> KernelInfo:
    return KernelInfo(kid, "python3", "idle", (path,), frozenset(pids))


def test_a_kernels_own_pid_names_the_kernel_and_its_notebook():
    gpu = h200(0, pids=[4242, 777])
    by_pid = owners([kernel("k1", kernel_pids(4242, None, no_children, proc="/nonexistent"))])
    entries = [describe(p, by_pid, name_of=lambda pid: None) for p in gpu.processes]
    assert entries[0] == {"pid": 4242, "used_memory": GIB, "kind": "compute",
                          "kernel": {"id": "k1", "name": "python3", "execution_state": "idle",
                                     "paths": ["train.ipynb"]}}
    assert entries[1] == {"pid": 777, "used_memory": GIB, "kind": "compute"}  # not ours: pid only


def test_an_unknown_pid_gets_the_name_proc_shows(tmp_path):
    (tmp_path / "777").mkdir()
    (tmp_path / "777" / "comm").write_text("python\n")
    entry = describe(GpuProcess(777, GIB, "compute"), {}, name_of=lambda pid: attribution.process_name(pid, str(tmp_path)))
    assert entry == {"pid": 777, "used_memory": GIB, "kind": "compute", "name": "python"}
    assert attribution.process_name(778, str(tmp_path)) is None


def test_nspid_outer_pids_match_what_nvml_reports_from_the_host(tmp_path):
    """Inside a container the server knows the kernel as 12 (and its worker as 13); NVML lists the
    host PIDs, which /proc/<pid>/status NSpid shows first."""
    for inner, outer in ((12, 80012), (13, 80013)):
        (tmp_path / str(inner)).mkdir()
        (tmp_path / str(inner) / "status").write_text(f"Name:\tpython\nNSpid:\t{outer}\t{inner}\n")
    pids = kernel_pids(12, None, lambda pid: [13] if pid == 12 else [], proc=str(tmp_path))
    assert pids == {12, 13, 80012, 80013}
    by_pid = owners([kernel("k1", pids)])
    assert describe(GpuProcess(80013, GIB, "compute"), by_pid)["kernel"]["id"] == "k1"


def test_a_kernels_own_pid_names_a_process_of_the_server_only_within_its_tree(tmp_path):
    """The process a checkpoint acts on: the PID a kernel gives (its own namespace's, or ours) is
    mapped to the server's PID of that process where it is the launched process or below it, and
    to nothing otherwise."""
    (tmp_path / "13").mkdir()
    (tmp_path / "13" / "status").write_text("Name:\tpython\nNSpid:\t13\t2\n")  # the kernel, PID 2 inside
    children = lambda pid: [13] if pid == 12 else []  # noqa: E731 — a wrapper (12) started the kernel (13)
    assert attribution.host_pid(13, 12, children, proc=str(tmp_path)) == 13
    assert attribution.host_pid(2, 12, children, proc=str(tmp_path)) == 13  # said in its own namespace
    assert attribution.host_pid(1, 12, children, proc=str(tmp_path)) is None  # another process of the machine


def test_the_pid_a_kernel_reports_is_matched_as_given():
    pids = kernel_pids(None, 31337, no_children)  # a kernel the server did not launch (gateway)
    assert pids == {31337}
    assert describe(GpuProcess(31337, GIB, "compute"), owners([kernel("k2", pids)]))["kernel"]["id"] == "k2"


@pytest.fixture
def grandchild():
    """This process → a child → a grandchild: DataLoader workers hang off a kernel this way."""
    code = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(p.pid, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild_pid = int(child.stdout.readline())
    yield child.pid, grandchild_pid
    os.kill(grandchild_pid, 9)
    child.kill()
    child.wait()


@pytest.mark.parametrize("source", ["psutil", "proc"])
def test_children_and_grandchildren_belong_to_the_kernel(grandchild, source, monkeypatch):
    if source == "proc":
        if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
            pytest.skip("this kernel has no /proc/<pid>/task/*/children (CONFIG_PROC_CHILDREN)")
        monkeypatch.setattr(attribution, "psutil", None)
    child, grand = grandchild
    deadline = time.monotonic() + 10
    while True:  # the grandchild is registered under its parent as soon as it runs; allow for that
        pids = kernel_pids(os.getpid(), None, attribution.child_table())
        if grand in pids or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert {os.getpid(), child, grand} <= pids
    by_pid = owners([kernel("k1", pids)])
    assert describe(GpuProcess(grand, GIB, "compute"), by_pid)["kernel"]["id"] == "k1"
    assert "kernel" not in describe(GpuProcess(1, GIB, "compute"), by_pid)


def test_the_event_loops_process_table_is_read_in_a_thread_and_sees_new_children_soon(monkeypatch):
    """Every stream tick and holders round attributes GPU memory to kernels' children: reading the
    whole process table on the event loop each time stalled it ~100 ms on a host of 1,500
    processes. Within its time to live the last table serves; past it, the next round still gets
    the last one at once while a thread reads the next, which finds children started meanwhile."""
    import threading

    reads = []
    real = attribution.psutil.process_iter

    def counted(*args, **kwargs):
        reads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(attribution.psutil, "process_iter", counted)
    recent = attribution.RecentChildren(ttl=60)  # none goes stale while the calls run, however slow
    recent()
    for _ in range(20):
        recent()
    assert reads == [threading.current_thread().name]  # the first read only, made at once
    recent.ttl = 0  # from now on every call finds the table stale
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid not in kernel_pids(os.getpid(), None, recent())  # the last table, at once
        deadline = time.monotonic() + 10
        while child.pid not in kernel_pids(os.getpid(), None, recent()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in kernel_pids(os.getpid(), None, recent())
        assert set(reads[1:]) == {"gpuctx-process-table"}  # every later read in a thread of its own
    finally:
        child.kill()
        child.wait()


def test_a_pid_two_kernels_claim_goes_to_the_first():
    by_pid = owners([kernel("k1", {5}), kernel("k2", {5, 6})])
    assert by_pid[5].id == "k1" and by_pid[6].id == "k2"
