"""The magics on a real GPU (marked `gpu`: run them with scripts/gpu-check.sh on a GPU machine)."""
from __future__ import annotations

import subprocess
import threading

import pytest

from gpuctx_jupyter.core import inventory

from .harness.kernels import run, start, stop

pytestmark = pytest.mark.gpu


def _smi() -> list[tuple[int, str]]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    return [(int(i), u.strip()) for i, u in (line.split(",") for line in out.strip().splitlines())]


def test_list_agrees_with_torch_and_nvidia_smi(shell, capsys):
    import torch

    torch.cuda.init()
    report = shell.magics_manager.registry["GpuMagics"]._list_report(inventory.take())
    rows = report.data["devices"]
    assert len(rows) == torch.cuda.device_count() >= 1
    smi = dict(_smi())
    for row in rows:
        props = torch.cuda.get_device_properties(row["ordinal"])
        assert row["uuid"].removeprefix("GPU-") == str(props.uuid)
        assert smi[row["nvidia_smi_index"]] == row["uuid"]
        assert row["name"] == props.name
    shell.run_line_magic("gpu", "list")
    out = capsys.readouterr().out
    assert "cuda:0" in out and rows[0]["name"] in out


def test_use_switches_every_framework_together(shell, capsys):
    import cupy
    import jax
    import numba.cuda
    import torch

    shell.run_line_magic("gpu", "use 0")
    out = capsys.readouterr().out
    for name in ("torch", "cupy", "numba", "jax"):
        assert name in out.split("is current for", 1)[1]
    assert "not switched" not in out
    assert torch.cuda.current_device() == 0
    assert torch.ones(1, device="cuda").device.index == 0
    assert cupy.cuda.runtime.getDevice() == 0 and cupy.ones(1).device.id == 0
    assert numba.cuda.get_current_device().id == 0
    assert jax.numpy.ones(1).devices().pop().id == 0


def test_use_auto_and_by_name(shell, capsys):
    import torch
    from IPython.core.error import UsageError

    shell.run_line_magic("gpu", "use auto")
    assert "is current for" in capsys.readouterr().out
    name = torch.cuda.get_device_name(0).split()[-1].lower()  # "h200"
    if torch.cuda.device_count() == 1:
        shell.run_line_magic("gpu", f"use {name}")
        assert "cuda:0" in capsys.readouterr().out
    else:
        with pytest.raises(UsageError, match="give an ordinal or a UUID"):
            shell.run_line_magic("gpu", f"use {name}")


def test_on_gpu_default_time_mem_then_restore(shell, capsys):
    import torch

    shell.run_cell("import torch")
    assert str(torch.get_default_device()) == "cpu"
    result = shell.run_cell("%%on_gpu 0 --default --time --mem\nt = torch.ones(1024, 1024)\n(t @ t).sum(); t.device")
    assert result.success, result.error_in_exec
    assert str(result.result) == "cuda:0"
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("on_gpu:"))
    assert "wall" in line and "GPU" in line and "peak +" in line and "net +" in line
    net = line.split("net +", 1)[1]
    net_mib = float(net.split()[0]) * (1024 if "GiB" in net else 1)
    assert net_mib >= 4.0  # t itself (4 MiB), plus cuBLAS workspace on a first matmul
    assert str(torch.get_default_device()) == "cpu"  # restored
    assert shell._gpuctx.switcher.choice is None


def test_on_gpu_restores_default_after_exception(shell):
    import torch

    shell.run_cell("import torch")
    result = shell.run_cell("%%on_gpu 0 --default\nu = torch.zeros(2)\nraise ValueError('boom')")
    assert isinstance(result.error_in_exec, ValueError)
    assert shell.user_ns["u"].device.type == "cuda"
    assert str(torch.get_default_device()) == "cpu"


def test_use_default_then_no_default(shell, capsys):
    import torch

    shell.run_line_magic("gpu", "use 0 --default")
    assert torch.zeros(1).device.type == "cuda"
    shell.run_line_magic("gpu", "use --no-default")
    assert torch.zeros(1).device.type == "cpu"
    assert torch.cuda.current_device() == 0


def test_choice_follows_into_kernel_threads(shell):
    """A cell run on another thread (as kernels with subshells do) gets the device and default."""
    import torch

    shell.run_line_magic("gpu", "use 0 --default")
    seen = {}

    def cell_on_thread():
        shell._gpuctx.before_cell()
        seen["device"] = torch.zeros(1).device

    t = threading.Thread(target=cell_on_thread)
    t.start()
    t.join()
    assert seen["device"].type == "cuda"
    shell.run_line_magic("gpu", "use --no-default")


def test_free_returns_memory(shell, capsys):
    import torch

    shell.run_cell("import torch")
    shell.run_cell("big = torch.empty(2 * 1024**3, dtype=torch.uint8, device='cuda:0'); del big")
    reserved = torch.cuda.memory_reserved(0)
    assert reserved >= 2 * 1024**3
    shell.run_line_magic("gpu", "free")
    out = capsys.readouterr().out
    assert "returned" in out and "torch" in out
    assert "NVML: this kernel's GPU memory fell by" in out  # the driver saw it too
    returned = float(out.split("returned ", 1)[1].split(" GiB", 1)[0])
    assert returned >= 2.0
    assert torch.cuda.memory_reserved(0) < reserved


def test_status_and_mem_show_allocator_figures(shell, capsys):
    import torch

    keep = torch.ones(256, 1024, 1024, device="cuda:0")  # 1 GiB
    shell.run_line_magic("gpu", "status")
    out = capsys.readouterr().out
    assert "CUDA started by: torch" in out
    row = next(line for line in out.splitlines() if line.startswith("cuda:0  torch"))
    assert float(row.split()[2]) >= 1.0  # allocated GiB: our 1 GiB plus whatever earlier cells left
    shell.run_line_magic("gpu", "mem")
    out = capsys.readouterr().out
    assert "this kernel" in out and "NVML (whole process)" in out
    del keep


def test_doctor_on_a_healthy_machine(shell, capsys):
    import torch

    torch.cuda.init()
    shell.run_line_magic("gpu", "doctor")
    out = capsys.readouterr().out
    assert "✓  NVML" in out and "driver" in out
    assert "✗" not in out


def test_mixed_devices_hint_on_a_real_error(shell, capsys):
    shell.run_cell("import torch\ntorch.ones(2, device='cuda:0') @ torch.ones(2)")
    err = capsys.readouterr()
    text = err.out + err.err
    assert "RuntimeError" in text and "mixes a CPU tensor with one on cuda:0" in text


def test_in_a_kernel_framework_imported_later_lands_on_the_choice_and_interrupt_restores():
    km, kc = start()
    try:
        assert run(kc, "%load_ext gpuctx\n%gpu use 0 --default").reply["status"] == "ok"
        r = run(kc, "import torch\nprint(torch.ones(2).device, torch.cuda.current_device())")
        assert r.stdout.strip() == "cuda:0 0", r.stderr
        timer = threading.Timer(2.0, km.interrupt_kernel)
        timer.start()
        r = run(kc, "%%on_gpu 0 --time\nimport time\nx = torch.ones(3)\ntime.sleep(30)")
        assert r.reply["status"] == "error" and r.reply["ename"] == "KeyboardInterrupt"
        r = run(kc, "print(get_ipython()._gpuctx.switcher.choice.ordinal, torch.ones(1).device)")
        assert r.stdout.strip() == "0 cuda:0"
    finally:
        stop(km, kc)
