"""Which workers `%gpu workers start WHICH` asks for, on two H200s as NVML reports them: GPUs
numbered as `%gpu use` numbers them (CUDA_VISIBLE_DEVICES honoured), never more workers than
GPUs, never a GPU another notebook computes on; each mistake a one-line UsageError. The
processes themselves are started in tests/test_workers.py."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
from IPython.core.error import UsageError

from gpuctx_jupyter.contract import holders as contract
from gpuctx_jupyter.core import inventory, nvml
from gpuctx_jupyter.core.devices import GpuProcess
from gpuctx_jupyter.kernel.worker_placement import check_free, choose

from .harness.gpus import GIB, h200

OTHER_NOTEBOOK, STANDBY, STRANGER = 999_801, 999_802, 999_803  # PIDs no process here has


@pytest.fixture
def two_h200(nvml_records, clean_env):
    nvml_records([h200(0), h200(1)])
    return inventory.take()


def one_line_error(call) -> str:
    with pytest.raises(UsageError) as caught:
        call()
    message = str(caught.value)
    assert message and "\n" not in message
    return message


def test_all_a_count_and_a_list_name_gpus_as_gpu_use_does(two_h200, monkeypatch, nvml_records):
    assert [d.ordinal for d in choose("all", two_h200).gpus] == [0, 1]
    assert [d.ordinal for d in choose(None, two_h200).gpus] == [0, 1]
    assert [d.ordinal for d in choose("1", two_h200).gpus] == [0]
    assert [d.ordinal for d in choose("1,0", two_h200).gpus] == [1, 0]  # rank 0 on cuda:1
    uuid1 = h200(1).uuid
    assert [d.record.uuid for d in choose("cuda:1,cuda:0", two_h200).gpus] == [uuid1, h200(0).uuid]
    assert [d.record.uuid for d in choose(uuid1, two_h200).gpus] == [uuid1]
    assert choose("3", two_h200, cpu=True).count == 3 and not choose("3", two_h200, cpu=True).gpus
    # CUDA_VISIBLE_DEVICES reorders: this kernel's cuda:0 is nvidia-smi's GPU 1, and so is rank 0's GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    hidden = inventory.take()
    assert [d.record.uuid for d in choose("all", hidden).gpus] == [uuid1]
    assert one_line_error(lambda: choose("2", hidden)).startswith("2 workers asked for, but this kernel sees 1 GPU "
                                                                   "(cuda:0)")


@pytest.mark.parametrize(("which", "says"), [
    ("3", "3 workers asked for, but this kernel sees 2 GPUs (cuda:0-1): one worker per GPU — "
          "`%gpu workers start 2`, or add --cpu for CPU workers"),
    ("0", "give at least one worker: a count (`%gpu workers start 2`), `all`, or GPUs such as `0,1`"),
    ("0,0", "cuda:0 is named twice in '0,0': one worker per GPU"),
    ("0,,1", "'0,,1' has an empty entry"),
    ("0,5", "GPU 5 is not visible: this kernel sees GPUs 0-1"),
    ("nvidia,0", "'nvidia' matches 2 GPUs (0, 1): give an ordinal or a UUID"),
    ("1000", "1000 workers is more than gpuctx starts on one machine (256): give fewer"),
])
def test_asking_for_what_is_not_there_is_one_line(two_h200, which, says):
    assert says in one_line_error(lambda: choose(which, two_h200))


def test_cpu_takes_a_count_only(two_h200):
    assert "--cpu takes a number of workers, not '0,1'" in one_line_error(lambda: choose("0,1", two_h200, cpu=True))


def test_without_a_gpu_a_count_means_cpu_workers_and_all_says_why_not(clean_env, monkeypatch):
    def no_driver():
        raise nvml.NvmlUnavailable("NVIDIA driver library libnvidia-ml.so.1 not found")

    monkeypatch.setattr(nvml, "read_records", no_driver)  # the driver's library, as on this machine
    inv = inventory.take()
    placement = choose("2", inv)
    assert not placement.gpus and placement.count == 2
    assert placement.note.startswith("no GPU is visible (NVML reports: NVIDIA driver library")
    assert placement.note.endswith("starting 2 CPU workers with gloo")
    assert one_line_error(lambda: choose("all", inv)).endswith(
        "for CPU workers with gloo, give their number, e.g. `%gpu workers start 2`")
    assert one_line_error(lambda: choose("0,1", inv)).startswith("no GPU is visible: NVML reports:")


def holders_file(tmp_path, monkeypatch, holders) -> None:
    path = tmp_path / "gpuctx-holders-1.json"
    path.write_text(contract.HoldersFile(1, 0.0, tuple(holders)).to_json())
    monkeypatch.setenv(contract.HOLDERS, str(path))


def test_a_gpu_another_notebook_computes_on_is_refused_with_its_name(nvml_records, clean_env, tmp_path, monkeypatch):
    busy = h200(1)

    nvml_records([replace(h200(0), processes=(GpuProcess(os.getpid(), GIB, "compute"),  # this kernel: ours
                                              GpuProcess(STANDBY, GIB, "compute"))),  # a warm-pool standby
                  replace(busy, processes=(GpuProcess(OTHER_NOTEBOOK, 12 * GIB, "compute"),))])
    holders_file(tmp_path, monkeypatch, [
        contract.Holder("kid-me", "python3", ("me.ipynb",), frozenset({os.getpid()})),
        contract.Holder("kid-other", "python3", ("work/other.ipynb",), frozenset({OTHER_NOTEBOOK})),
        contract.Holder(f"standby-{STANDBY}", "python3", (), frozenset({STANDBY}), standby=True),
    ])
    inv = inventory.take()
    check_free(choose("cuda:0", inv).gpus, inv)  # this kernel and a standby hold cuda:0: it is free for workers
    says = one_line_error(lambda: check_free(choose("all", inv).gpus, inv))
    assert says == ("cuda:1 (NVIDIA H200) is in use by another notebook, other.ipynb (pid 999801, 12.0 GiB): "
                    "choose free GPUs (`%gpu workers start cuda:0`) or add --share")


def test_a_gpu_another_program_computes_on_is_refused_with_its_pid(nvml_records, clean_env, monkeypatch):
    monkeypatch.delenv(contract.HOLDERS, raising=False)
    nvml_records([replace(h200(0), processes=(GpuProcess(STRANGER, 3 * GIB, "compute"),)),
                  replace(h200(1), processes=(GpuProcess(STRANGER, 3 * GIB, "compute"),))])
    inv = inventory.take()
    says = one_line_error(lambda: check_free(inv.devices, inv))
    assert says == ("cuda:0 (NVIDIA H200) is in use by another process, pid 999803 (3.00 GiB) (and 1 more of the "
                    "chosen GPUs): free it first, or add --share to use it anyway")


# -- the kernel's own processes (its workers) count as the kernel's ----------------------------------
@pytest.fixture
def child():
    """A process this test process started, as a kernel starts its workers."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_gpu_memory_of_processes_the_kernel_started_is_the_kernels(child, nvml_records, clean_env, monkeypatch):
    """What `%gpu status` / `%gpu mem` count as this kernel's, what the monitor marks "◀ this kernel"
    and what the out-of-memory explanation leaves out of the other holders."""
    from gpuctx_jupyter.kernel import oom

    monkeypatch.delenv(contract.HOLDERS, raising=False)
    nvml_records([replace(h200(0), memory_used=8 * GIB, processes=(GpuProcess(child, 5 * GIB, "compute"),
                                                                   GpuProcess(STRANGER, 2 * GIB, "compute")))])
    inv = inventory.take()
    assert child in inventory.own_pids() and child in inventory.OwnPids().update(inv)
    assert inventory.process_memory(inv) == {0: 5 * GIB}
    error = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})("CUDA out of memory.")
    lines = oom.explain(error).splitlines()
    assert lines[1].endswith("NVML: 5.00 GiB on cuda:0")  # this kernel's line
    assert lines[2] == "  other holders of cuda:0, largest first (notebooks cannot be named: this kernel was not " \
                       "started by a gpuctx server (GPUCTX_HOLDERS unset)):"
    assert lines[3] == "    pid 999803 2.00 GiB" and f"pid {child}" not in "\n".join(lines)
    assert "another process, pid 999803" in one_line_error(lambda: check_free(inv.devices, inv))
