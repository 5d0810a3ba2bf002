"""The magics in a real IPython shell, on this machine (no GPU) and with NVML records built here."""
from __future__ import annotations

import sys
import textwrap

import pytest
from IPython.core.error import UsageError

from gpuctx_jupyter.core.frameworks import Framework
from gpuctx_jupyter.kernel.switching import PostImportHook

from .harness.gpus import h200


def gpu(shell, line=""):
    return shell.run_line_magic("gpu", line)


# -- no GPU on this machine: every subcommand says so and why, and keeps working ------------------
@pytest.mark.skipif(sys.platform != "linux", reason="the no-driver message is Linux's")
def test_list_without_gpu_says_why(shell, capsys):
    gpu(shell)
    out = capsys.readouterr().out
    assert "No GPU is visible to this kernel" in out
    assert "NVML reports:" in out


def test_status_without_gpu_lists_frameworks(shell, capsys):
    shell.run_cell("import torch")
    gpu(shell, "status")
    out = capsys.readouterr().out
    assert "device: none chosen" in out
    assert "CUDA started by: nothing yet" in out
    assert "CPU-only build" in out  # torch 2.13.0+cpu in the test environment
    assert "no GPU is visible" in out


def test_doctor_without_gpu_gives_advice(shell, capsys):
    shell.run_cell("import torch")
    gpu(shell, "doctor")
    out = capsys.readouterr().out
    assert "✗  NVML" in out and "NVIDIA container toolkit" in out
    assert "CPU-only build" in out and "install a CUDA build of torch" in out


def test_mem_and_free_without_gpu(shell, capsys):
    gpu(shell, "mem")
    assert "No GPU is visible" in capsys.readouterr().out
    gpu(shell, "free")
    out = capsys.readouterr().out
    assert out.startswith("gpuctx: nothing to free on a GPU: ")
    assert "CPU-only build" in out or "no GPU framework is imported" in out


def test_use_without_gpu_is_a_usage_error_with_reason(shell):
    with pytest.raises(UsageError, match=r"^no GPU is visible: NVML reports: .+"):
        gpu(shell, "use 0")


def test_on_gpu_without_gpu_still_runs_the_cell(shell, capsys):
    result = shell.run_cell("%%on_gpu 0\nz = 20\nz + 1")
    assert result.success and result.result == 21
    assert shell.user_ns["z"] == 20
    assert "no GPU is visible" in capsys.readouterr().err


# -- mistakes get one-line UsageErrors --------------------------------------------------------------
def test_unknown_subcommand_suggests_closest(shell):
    with pytest.raises(UsageError, match=r"unknown %gpu subcommand 'lsit' — did you mean `%gpu list`\?"):
        gpu(shell, "lsit")


def test_use_needs_a_spec(shell):
    with pytest.raises(UsageError, match="say which GPU"):
        gpu(shell, "use")


def test_bad_option_is_a_usage_error(shell):
    with pytest.raises(UsageError):
        gpu(shell, "use 0 --bogus")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("5", r"GPU 5 is not visible.*0-1"),
        ("cuda:7", r"GPU 7 is not visible"),
        ("-1", r"not a device spec"),
        ("nvidia", r"matches 2 GPUs"),
        ("a100", r"matches no visible GPU"),
    ],
)
def test_bad_specs(shell, nvml_records, clean_env, spec, message):
    nvml_records([h200(0), h200(1)])
    with pytest.raises(UsageError, match=message):
        gpu(shell, f"use {spec}")


def test_help_explains_every_subcommand(shell, capsys):
    gpu(shell, "help")
    out = capsys.readouterr().out
    for sub in ("list", "use", "status", "mem", "free", "doctor", "%%on_gpu", "auto", "--default"):
        assert sub in out
    gpu(shell, "help use")
    assert "--no-default" in capsys.readouterr().out


def test_question_mark_help_is_the_docstring(shell):
    from gpuctx_jupyter.kernel.magics import GpuMagics

    assert "%gpu use auto" in GpuMagics.gpu.__doc__
    info = shell.object_inspect("%gpu")
    assert info["found"] and "%gpu use auto" in info["docstring"]


# -- with GPUs as NVML reports them (records built here) --------------------------------------------
def test_list_numbers_by_cuda_ordinal_with_smi_index(shell, nvml_records, clean_env, capsys, monkeypatch):
    nvml_records([h200(0, used_gib=3), h200(1, used_gib=5, pids=(1, 2))])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    gpu(shell, "list")
    lines = capsys.readouterr().out.splitlines()
    row0 = next(line for line in lines if "cuda:0" in line and "H200" in line)
    row1 = next(line for line in lines if "cuda:1" in line and "H200" in line)
    assert row0.split()[:3] == ["●", "cuda:0", "1"]  # cuda:0 is nvidia-smi 1, and current
    assert "5.0 GiB / 141.0 GiB" in row0 and row0.rstrip().endswith("2")
    assert row1.split()[:2] == ["cuda:1", "0"]


def test_list_html_in_notebook(shell, nvml_records, clean_env):
    nvml_records([h200(0), h200(1)])
    report = shell.user_ns["_gpuctx_magics"] = shell._gpuctx_magics._list_report(
        __import__("gpuctx_jupyter.core.inventory", fromlist=["take"]).take()
    )
    html = report._repr_html_()
    assert "<table" in html and "cuda:1" in html and "NVIDIA H200" in html
    assert [d["ordinal"] for d in report.data["devices"]] == [0, 1]


def test_list_shows_hidden_devices_and_truncation(shell, nvml_records, clean_env, capsys, monkeypatch):
    nvml_records([h200(0), h200(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,bogus,0")
    gpu(shell, "list")
    out = capsys.readouterr().out
    assert "hidden by CUDA_VISIBLE_DEVICES: nvidia-smi 0" in out
    assert "'bogus'" in out


def test_list_empty_visible_devices_explains(shell, nvml_records, monkeypatch, capsys):
    nvml_records([h200(0)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpu(shell, "list")
    assert "empty" in capsys.readouterr().out
    with pytest.raises(UsageError, match="no GPU is visible: .*empty"):
        gpu(shell, "use 0")


def test_use_records_choice_and_reports_what_did_not_follow(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0, used_gib=100), h200(1, used_gib=1)])
    shell.run_cell("import torch")
    gpu(shell, "use auto")
    out = capsys.readouterr().out
    assert "cuda:1 (NVIDIA H200, nvidia-smi 1, 140.0 GiB free)" in out
    assert "not switched: torch:" in out and "CPU-only" in out
    assert "threads you start yourself" in out and "CUDA_VISIBLE_DEVICES" in out
    gpu(shell, "status")
    assert "device: cuda:1 chosen by %gpu use" in capsys.readouterr().out
    gpu(shell, "list")
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("●"))
    assert "cuda:1" in row


def test_on_gpu_restores_after_exception(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0), h200(1)])
    magics = shell._gpuctx_magics
    result = shell.run_cell("%%on_gpu 1\nseen = __import__('gpuctx_jupyter').kernel.extension\n1/0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert magics.switcher.choice is None
    err = capsys.readouterr()
    assert "1/0" in err.out + err.err  # the cell's own line is in the traceback


def test_on_gpu_choice_is_in_force_inside_the_cell(shell, nvml_records, clean_env):
    nvml_records([h200(0), h200(1)])
    shell.run_line_magic("gpu", "use 0")
    result = shell.run_cell("%%on_gpu 1\n_gpuctx_ext = get_ipython()._gpuctx_magics.switcher.choice.ordinal\n_gpuctx_ext")
    assert result.result == 1
    assert shell._gpuctx_magics.switcher.choice.ordinal == 0


def test_on_gpu_rejects_bad_spec_without_running(shell, nvml_records, clean_env):
    nvml_records([h200(0)])
    shell.user_ns.pop("ran", None)
    result = shell.run_cell("%%on_gpu 3\nran = True")
    assert isinstance(result.error_in_exec, UsageError)
    assert "ran" not in shell.user_ns


def test_on_gpu_semicolon_and_magics_inside(shell, nvml_records, clean_env):
    nvml_records([h200(0)])
    result = shell.run_cell("%%on_gpu 0\nq = %time 6*7\nq;")
    assert result.success and result.result is None and shell.user_ns["q"] == 42


def test_mixed_devices_hint_under_traceback(shell, capsys):
    cell = "raise RuntimeError('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1!')"
    shell.run_cell(cell)
    err = capsys.readouterr()
    text = err.out + err.err
    assert "RuntimeError" in text  # the traceback stays
    assert "mixes tensors on cuda:0 and cuda:1" in text and "%%on_gpu 1 --default" in text
    shell.run_cell("raise RuntimeError('something else')")
    assert "gpuctx:" not in capsys.readouterr().err


# -- loading and unloading ------------------------------------------------------------------------------
def test_load_twice_is_harmless_and_unload_removes_everything(shell):
    shell.run_line_magic("load_ext", "gpuctx_jupyter")
    shell.run_line_magic("load_ext", "gpuctx")
    magics = shell._gpuctx_magics
    assert shell.events.callbacks["pre_run_cell"].count(magics.pre_run_cell) == 1
    shell.run_line_magic("unload_ext", "gpuctx")
    assert "gpu" not in shell.magics_manager.magics["line"]
    assert "on_gpu" not in shell.magics_manager.magics["cell"]
    assert magics.pre_run_cell not in shell.events.callbacks["pre_run_cell"]
    assert magics.post_run_cell not in shell.events.callbacks["post_run_cell"]
    assert magics.import_hook not in sys.meta_path
    shell.run_line_magic("load_ext", "gpuctx")  # the fixture unloads it again


def test_post_import_hook_calls_back_after_the_module_ran(tmp_path, monkeypatch):
    (tmp_path / "gpuctx_probe_pkg").mkdir()
    (tmp_path / "gpuctx_probe_pkg" / "__init__.py").write_text(textwrap.dedent("""
        VALUE = 41 + 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    probe = type("Probe", (Framework,), {"module": "gpuctx_probe_pkg"})()
    hook = PostImportHook({"gpuctx_probe_pkg"},
                          lambda name: seen.append((name, sys.modules[name].VALUE, probe.loaded())))
    hook.install()
    try:
        import gpuctx_probe_pkg
    finally:
        hook.remove()
        sys.modules.pop("gpuctx_probe_pkg", None)
    assert seen == [("gpuctx_probe_pkg", 42, True)]  # switching code sees it as loaded
    assert type(gpuctx_probe_pkg.__loader__).__name__ == "SourceFileLoader"


# -- %gpu warm --------------------------------------------------------------------------------------
def test_warm_by_hand_without_gpu_imports_then_says_why(shell, capsys):
    gpu(shell, "warm --wait")
    out = capsys.readouterr().out
    assert "gpuctx warm-up: skipped" in out and "no GPU is visible" in out and "import torch" in out
    gpu(shell, "status")
    assert "warm-up: skipped" in capsys.readouterr().out


def test_warm_rejects_unknown_and_missing_frameworks(shell):
    with pytest.raises(UsageError, match="cannot warm tensorflow: choose from torch, cupy, jax"):
        gpu(shell, "warm --frameworks tensorflow")
    with pytest.raises(UsageError, match="jax is not installed in this kernel"):
        gpu(shell, "warm --frameworks jax")


def test_on_gpu_time_needs_a_cuda_framework(shell, nvml_records, clean_env):
    nvml_records([h200(0)])
    with pytest.raises(UsageError, match="--time needs CUDA events: torch .* CPU-only build"):
        shell.run_cell("%%on_gpu 0 --time\nx = 1").raise_error()


def test_on_gpu_with_top_level_await_says_what_to_do(shell, nvml_records, clean_env):
    nvml_records([h200(0)])
    result = shell.run_cell("%%on_gpu 0\nimport asyncio\nawait asyncio.sleep(0)")
    assert isinstance(result.error_in_exec, UsageError)
    assert "cannot run top-level `await`" in str(result.error_in_exec)
