"""The magics in a real IPython shell, on this machine (no GPU) and with NVML records built here."""
from __future__ import annotations

import logging
import re
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from gpuctx_jupyter.core import frameworks as fws
from gpuctx_jupyter.core.frameworks import AllocatorFigures, Framework, Memory
from gpuctx_jupyter.kernel import commands, kernel_view, reports
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


def test_status_without_gpu_says_so_first_and_once(shell, capsys):
    shell.run_cell("import torch")
    gpu(shell, "warm --wait")  # skipped for want of a GPU: its reason is not repeated below
    capsys.readouterr()
    gpu(shell, "status")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "No GPU is visible to this kernel"
    assert lines[1].startswith("NVML reports: ") and "CPU-only build" in lines[1]  # torch 2.13.0+cpu here
    assert "device: none chosen" in out and "cuda:0" not in out and "CUDA's default" not in out
    assert "CUDA started by: nothing yet" in out
    warm = next(line for line in lines if line.startswith("warm-up: "))
    assert "skipped" in warm and "no GPU is visible (see above)" in warm and "NVML" not in warm
    assert out.count("NVML reports") == 1


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
    out, err = capsys.readouterr()
    assert out.startswith("gpuctx warning: no GPU is visible (NVML reports: ")  # stdout: not red in JupyterLab
    assert "gpuctx" not in err


def test_on_gpu_without_gpu_still_times_the_cell(shell, capsys):
    result = shell.run_cell("%%on_gpu 0 --time --mem\nimport time\ntime.sleep(0.02)")
    assert result.success
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("on_gpu:"))
    assert line.startswith("on_gpu: no GPU · wall ") and line.endswith(" · GPU time and memory need a GPU")
    wall = line.split("wall ", 1)[1].split(" · ", 1)[0]
    assert wall.endswith(" ms") and float(wall.split()[0]) >= 20


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
    assert GpuMagics.gpu.__doc__ == commands.overview()  # written once: the table
    assert "usage: %%on_gpu [--default] [--time] [--mem] [--timeout S] spec" in shell.object_inspect("%%on_gpu")["docstring"]


def test_help_is_evenly_indented(shell, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    gpu(shell, "help")
    lines = capsys.readouterr().out.splitlines()
    entries = [line for line in lines if line.startswith("  ")]
    calls = [line for line in entries if re.match(r"  (m = )?%", line)]
    assert len(calls) == sum(len(c.examples) for c in commands.COMMANDS)
    column = {len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in calls if "  " in line[2:].strip()}
    assert len(column) == 1  # every description starts in one column
    (col,) = column
    for line in entries:
        if line not in calls:
            assert line[:col].strip() == "" and line[col] != " ", line  # continuations line up under it
    assert max(map(len, lines)) <= 90


@pytest.mark.parametrize(("name", "usage"), [
    ("use", "usage: %gpu use [--default | --no-default] [--no-threads] [spec]"),
    ("on_gpu", "usage: %%on_gpu [--default] [--time] [--mem] [--timeout S] spec"),
    ("%%on_gpu", "usage: %%on_gpu ["),
    ("warm", "usage: %gpu warm ["),
    ("status", "usage: %gpu status\n"),
])
def test_help_for_one_subcommand_shows_its_usage_as_typed(shell, capsys, name, usage):
    gpu(shell, f"help {name}")
    out = capsys.readouterr().out
    assert out.startswith(usage)
    assert "::" not in out and "%%gpu" not in out and "%%%" not in out
    assert "examples:" in out


def test_suggestions_come_from_the_table(shell):
    with pytest.raises(UsageError, match=r"did you mean `%gpu help monitor`\?"):
        gpu(shell, "help moniter")
    assert commands.SUBCOMMANDS == ("list", "use", "status", "mem", "free", "doctor", "warm", "monitor", "workers",
                                   "help")
    for command in commands.COMMANDS:
        handler = "on_gpu" if command.cell else f"_gpu_{command.name}"
        assert command.handler == handler and callable(getattr(shell.magics_manager.registry["GpuMagics"], handler))


def test_readme_command_table_is_the_tables_rendering():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start, end = "<!-- gpu-commands -->", "<!-- /gpu-commands -->"
    if start not in readme or end not in readme:
        pytest.fail(f"README.md has no {start} … {end} section: paste the output of "
                    "`python -c 'from gpuctx_jupyter.kernel.commands import markdown; print(markdown())'` between "
                    "those two markers, in place of the old %gpu table")
    section = readme.split(start, 1)[1].split(end, 1)[0].strip()
    assert section == commands.markdown(), ("README.md's %gpu table differs from gpuctx_jupyter/kernel/commands.py: "
                                            "paste the output of commands.markdown() between the markers")


# -- with GPUs as NVML reports them (records built here) --------------------------------------------
def test_list_numbers_by_cuda_ordinal_with_smi_index(shell, nvml_records, clean_env, capsys, monkeypatch):
    nvml_records([h200(0, used_gib=3), h200(1, used_gib=5, pids=(1, 2))])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    gpu(shell, "list")
    lines = capsys.readouterr().out.splitlines()
    row0 = next(line for line in lines if "cuda:0" in line and "H200" in line)
    row1 = next(line for line in lines if "cuda:1" in line and "H200" in line)
    assert row0.split()[:3] == ["●", "cuda:0", "1"]  # cuda:0 is nvidia-smi 1, and current
    assert "5.00 GiB / 141 GiB" in row0 and row0.rstrip().endswith("2")
    assert row1.split()[:2] == ["cuda:1", "0"]


def test_list_html_in_notebook(shell, nvml_records, clean_env):
    nvml_records([h200(0), h200(1)])
    report = shell.user_ns["_gpuctx_report"] = shell.magics_manager.registry["GpuMagics"]._list_report(
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
    assert "cuda:1 (NVIDIA H200, nvidia-smi 1, 140 GiB free)" in out
    assert "not switched: torch:" in out and "CPU-only" in out
    assert "note: threads started from now on run on cuda:1 too (`--no-threads` leaves them alone)" in out
    assert "CUDA_VISIBLE_DEVICES is read once, at CUDA start-up" in out
    assert "keep CUDA's device 0" not in out
    gpu(shell, "status")
    assert "device: cuda:1 chosen by %gpu use" in capsys.readouterr().out
    gpu(shell, "list")
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("●"))
    assert "cuda:1" in row


def test_on_gpu_restores_after_exception(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0), h200(1)])
    magics = shell._gpuctx
    result = shell.run_cell("%%on_gpu 1\nseen = __import__('gpuctx_jupyter').kernel.extension\n1/0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert magics.switcher.choice is None
    err = capsys.readouterr()
    assert "1/0" in err.out + err.err  # the cell's own line is in the traceback


def test_on_gpu_choice_is_in_force_inside_the_cell(shell, nvml_records, clean_env):
    nvml_records([h200(0), h200(1)])
    shell.run_line_magic("gpu", "use 0")
    result = shell.run_cell("%%on_gpu 1\n_gpuctx_ext = get_ipython()._gpuctx.switcher.choice.ordinal\n_gpuctx_ext")
    assert result.result == 1
    assert shell._gpuctx.switcher.choice.ordinal == 0


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


class StartedGpu(Framework):
    """A framework that has started CUDA: its current device, and (as torch) its default device."""

    def __init__(self, name):
        self.name, self.module = name, f"gpuctx_test_started_{name}"
        self.device, self.default = 0, None

    def loaded(self):
        return True

    def initialized(self):
        return True

    def current(self):
        return self.device

    def set_current(self, ordinal):
        self.device = ordinal

    def default_device(self):
        return None if self.default is None else f"cuda:{self.default}"

    def set_default(self, ordinal, previous=None):
        before = self.default_device()
        self.default = ordinal if ordinal is not None else (int(previous.split(":")[1]) if previous else None)
        return before


@pytest.mark.parametrize("before, cell, after", [
    ("", "%%on_gpu 1\n%gpu use 0", (0, False, None)),  # no choice before: the one made in the cell stays
    ("use 0", "%%on_gpu 1\n%gpu use 2", (2, False, None)),  # JAX too goes to the new choice, not back to 0
    ("use 0 --default", "%%on_gpu 1 --default\n%gpu use --no-default", (0, False, None)),
    ("use 0", "%%on_gpu 1 --default\n%gpu use 2 --default", (2, True, 2)),
])
def test_gpu_use_inside_on_gpu_is_the_kernels_choice_once_the_cell_ends(shell, nvml_records, clean_env, capsys,
                                                                        monkeypatch, before, cell, after):
    """The block keeps its own device to its end; then every framework is on what `%gpu use`
    chose there, as if it had run in the next cell, and the block's own choice is gone."""
    nvml_records([h200(0), h200(1), h200(2)])
    jax, torch = StartedGpu("jax"), StartedGpu("torch")
    monkeypatch.setattr(shell._gpuctx.switcher, "frameworks", (jax, torch))
    shell.user_ns["_fws"] = (jax, torch)
    if before:
        gpu(shell, before)
    result = shell.run_cell(cell + "\ninside = [fw.device for fw in _fws], _fws[1].default")
    assert result.success, result.error_in_exec
    assert shell.user_ns["inside"] == ([1, 1], 1 if "--default" in cell.splitlines()[0] else None)
    choice = shell._gpuctx.switcher.choice
    ordinal, default, torch_default = after
    assert (choice.ordinal, choice.default, choice.source) == (ordinal, default, "%gpu use")
    assert (jax.device, torch.device, torch.default) == (ordinal, ordinal, torch_default)
    out = capsys.readouterr().out
    if "--no-default" in cell:
        assert "once the %%on_gpu cell running ends, tensors created without a device no longer go to cuda:0" in out
    else:
        assert "becomes the kernel's device when the %%on_gpu cell running ends (cuda:1 stays current" in out
    shell.run_cell("pass")
    assert (jax.device, torch.device, torch.default) == (ordinal, ordinal, torch_default)  # the next cell too


def test_on_gpu_puts_a_framework_imported_in_the_cell_back_on_its_default_and_says_what_failed(
        shell, nvml_records, clean_env, capsys, monkeypatch):
    """No device chosen: a framework the cell imports is moved to the block's device, and must be
    back on its own default (cuda:0) after it, as `%gpu status` says; a framework that cannot
    switch is named in the cell's output, as `%gpu use` does, and the cell still runs."""
    nvml_records([h200(0), h200(1)])
    late, broken = StartedGpu("torch"), StartedGpu("cupy")
    late.loaded = lambda: shell.user_ns.get("imported", False)

    def refuse(ordinal):
        raise RuntimeError("CUDA error: invalid device ordinal")

    broken.set_current = refuse
    switcher = shell._gpuctx.switcher
    monkeypatch.setattr(switcher, "frameworks", (late, broken))
    shell.user_ns.update(imported=False, _sw=switcher, _late=late)
    result = shell.run_cell("%%on_gpu 1\nimported = True\n_sw.on_import(_late.module)\ninside = _late.device")
    assert result.success, result.error_in_exec
    assert shell.user_ns["inside"] == 1 and late.device == 0
    out = capsys.readouterr().out
    assert "gpuctx: cuda:1 not switched to for cupy: RuntimeError: CUDA error: invalid device ordinal" in out


def test_on_gpu_shows_a_syntax_error_at_the_cells_own_line(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0)])
    result = shell.run_cell("%%on_gpu 0\nx = (\n")
    assert not result.success
    err = capsys.readouterr()
    shown = err.out + err.err
    assert "SyntaxError" in shown and "<unknown>" not in shown and "x = (" in shown


def test_mixed_devices_hint_under_traceback(shell, capsys):
    cell = "raise RuntimeError('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1!')"
    shell.run_cell(cell)
    err = capsys.readouterr()
    text = err.out + err.err
    assert "RuntimeError" in text  # the traceback stays
    assert "mixes tensors on cuda:0 and cuda:1" in text and "%%on_gpu 1 --default" in text
    shell.run_cell("raise RuntimeError('something else')")
    assert "gpuctx:" not in capsys.readouterr().err
    # an error that cannot even be turned into text: its own traceback, nothing of ours on top
    shell.run_cell("class Odd(RuntimeError):\n    def __str__(self): raise ValueError('no text')\nraise Odd()")
    err = capsys.readouterr()
    assert "Error in callback" not in err.out + err.err and "gpuctx" not in err.out + err.err


# -- loading and unloading ------------------------------------------------------------------------------
def test_load_twice_is_harmless_and_unload_removes_everything(shell):
    shell.run_line_magic("load_ext", "gpuctx_jupyter")
    shell.run_line_magic("load_ext", "gpuctx")
    state = shell._gpuctx
    assert shell.events.callbacks["pre_run_cell"].count(state.before_cell) == 1
    shell.run_line_magic("unload_ext", "gpuctx")
    assert "gpu" not in shell.magics_manager.magics["line"]
    assert "on_gpu" not in shell.magics_manager.magics["cell"]
    assert "GpuMagics" not in shell.magics_manager.registry and not hasattr(shell, "_gpuctx")
    assert state.before_cell not in shell.events.callbacks["pre_run_cell"]
    assert state.after_cell not in shell.events.callbacks["post_run_cell"]
    assert state.import_hook not in sys.meta_path
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
    assert "gpuctx warm-up: skipped" in out and "no GPU is visible" in out and re.search(r"\bimport(ed)? torch", out)
    gpu(shell, "status")
    assert "warm-up: skipped" in capsys.readouterr().out


def test_warm_in_the_background_without_gpu_says_so_at_once(shell, capsys):
    gpu(shell, "warm")
    out = capsys.readouterr().out
    assert out.startswith("gpuctx: no GPU is visible (") and "warming the imports and the CPU side only" in out
    shell._gpuctx.warmer.wait(120)


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


def test_warm_without_torch_says_what_to_do(shell, monkeypatch):
    monkeypatch.setattr(fws.TORCH, "installed", lambda: False)
    with pytest.raises(UsageError, match=r"^torch is not installed in this kernel: install a CUDA build of torch, "
                                         r"or name other frameworks with --frameworks$"):
        gpu(shell, "warm")


# -- %gpu doctor --------------------------------------------------------------------------------------
def test_doctor_wraps_to_the_terminal(shell, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    gpu(shell, "doctor")
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "NVIDIA container toolkit" in " ".join(out.split())  # the advice is all there, wrapped
    monkeypatch.setenv("COLUMNS", "400")
    gpu(shell, "doctor")
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 100  # capped for reading


def test_doctor_html_keeps_each_finding_in_one_row(shell):
    from gpuctx_jupyter.core import inventory
    from gpuctx_jupyter.kernel import doctor

    report = doctor.report(doctor.diagnose(inventory.take()))
    html = report._repr_html_()
    assert html.count("<tr") == 1 + len(report.data["findings"])


def test_doctor_reports_a_cpu_only_torch_before_it_is_imported(shell, capsys, monkeypatch):
    from gpuctx_jupyter.kernel.doctor import installed_torch_build

    assert installed_torch_build() == ("2.13.0+cpu", "cpu")  # this venv's torch, from its metadata
    monkeypatch.setattr(fws.TORCH, "loaded", lambda: False)
    gpu(shell, "doctor")
    out = " ".join(capsys.readouterr().out.split())
    assert "torch 2.13.0+cpu is a CPU-only build (read from its installed package; not imported yet)" in out
    assert "install a CUDA build of torch" in out


def test_doctor_counts_a_cpu_only_torch_once(shell, nvml_records, clean_env, capsys):
    """GPUs visible, this venv's CPU-only torch imported: one thing to fix, said once."""
    import torch  # noqa: F401 — imported, as in a notebook

    nvml_records([h200(0)])
    gpu(shell, "doctor")
    lines = capsys.readouterr().out.splitlines()
    torch_lines = [line for line in lines if re.match(r"[✗!]\s+torch\s", line)]
    assert len(torch_lines) == 1 and "CPU-only build" in torch_lines[0], lines
    assert lines[0].endswith("1 finding(s) need attention"), lines[0]


def test_doctor_names_a_bad_device_order_under_its_own_topic(shell, nvml_records, clean_env, capsys, monkeypatch):
    nvml_records([h200(0), h200(1)])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "pci_bus_id")
    gpu(shell, "doctor")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "need attention" in lines[0]
    order = [line for line in lines if re.match(r"[✗!]\s+CUDA_DEVICE_ORDER\s", line)]
    assert len(order) == 1 and "'pci_bus_id'" in order[0]
    assert not any(re.match(r"\S\s+CUDA_VISIBLE_DEVICES\s", line) for line in lines)
    findings = shell._gpuctx  # the same through the data the report keeps
    from gpuctx_jupyter.core import inventory
    from gpuctx_jupyter.kernel import doctor

    data = doctor.report(doctor.diagnose(inventory.take(), findings.warmer.status)).data["findings"]
    assert [f["level"] for f in data if f["topic"] == "CUDA_DEVICE_ORDER"] == ["error"]
    assert not [f for f in data if f["topic"] == "CUDA_VISIBLE_DEVICES"]


# -- threads ------------------------------------------------------------------------------------------
def test_use_no_threads_and_back(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0), h200(1)])
    switcher = shell._gpuctx.switcher
    gpu(shell, "use 1 --no-threads")
    out = capsys.readouterr().out
    assert switcher.follow_threads is False
    assert "note: threads started from now on begin on CUDA's device 0 (call torch.cuda.set_device there)" in out
    gpu(shell, "use 1")
    assert switcher.follow_threads is True
    gpu(shell, "status")
    out = capsys.readouterr().out
    assert "threads\nthreads: follow the kernel's device" in out


class PerThreadTorch(Framework):
    """A stand-in for torch with CUDA started: its current device is per thread, as CUDA's is."""

    name = "torch"
    module = package = "gpuctx_test_per_thread_torch"

    def __init__(self):
        self._here = threading.local()

    def loaded(self):
        return True

    def gpu_reason(self):
        return None

    def initialized(self):
        return True

    def current(self):
        return getattr(self._here, "device", 0)

    def set_current(self, ordinal):
        self._here.device = ordinal


def test_threads_follow_use_unless_no_threads(shell, nvml_records, clean_env, capsys, monkeypatch):
    nvml_records([h200(0), h200(1)])
    fake = PerThreadTorch()
    monkeypatch.setattr(shell._gpuctx.switcher, "frameworks", (fake,))

    def device_in_a_new_thread():
        seen = []
        thread = threading.Thread(target=lambda: seen.append(fake.current()))
        thread.start()
        thread.join()
        return seen[0]

    gpu(shell, "use 1")
    assert fake.current() == 1 and device_in_a_new_thread() == 1
    gpu(shell, "use 1 --no-threads")
    assert fake.current() == 1 and device_in_a_new_thread() == 0
    gpu(shell, "use 1")
    assert device_in_a_new_thread() == 1
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 3  # said again whenever what happens to threads changes
    gpu(shell, "use --no-threads")  # without a device: only stop following
    assert capsys.readouterr().out.startswith("gpuctx: threads started from now on begin on CUDA's device 0")
    assert device_in_a_new_thread() == 0 and shell._gpuctx.switcher.choice.ordinal == 1


def test_follow_threads_is_kernel_config(shell):
    shell.run_line_magic("unload_ext", "gpuctx")
    shell.config.GpuMagics.follow_threads = False
    try:
        shell.run_line_magic("load_ext", "gpuctx")
        magics = shell.magics_manager.registry["GpuMagics"]
        assert magics.follow_threads is False and magics.switcher.follow_threads is False
        magics.follow_threads = True  # e.g. %config GpuMagics.follow_threads = True
        assert magics.switcher.follow_threads is True
    finally:
        del shell.config["GpuMagics"]


def test_status_shows_thread_warnings(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0), h200(1)])
    gpu(shell, "use 1")
    threads = shell._gpuctx.switcher.threads
    threads.warnings += ["thread 'a' could not be switched to cuda:1 (torch: boom)",
                         "thread 'b' could not be switched to cuda:1 (torch: bang)"]
    capsys.readouterr()
    gpu(shell, "status")
    out = capsys.readouterr().out
    assert "warning: thread 'a' could not be switched to cuda:1 (torch: boom)" in out
    assert "2 threads could not be switched; latest: thread 'b'" in out
    assert "warning: thread 'b'" not in out  # quoted once, not twice
    threads.warnings.clear()


# -- allocator figures: one framework-adapter call for the magics and the control channel -------------
def test_allocator_figures_feed_status_mem_and_the_kernel_view(shell, nvml_records, clean_env, capsys, monkeypatch):
    nvml_records([h200(0), h200(1)])
    GIB = 1024**3
    memory = {0: Memory(0, 0, 0), 1: Memory(2 * GIB, 3 * GIB, 4 * GIB)}
    for name, fake in {"loaded": lambda: True, "initialized": lambda: True, "device_count": lambda: 2,
                       "memory": memory.get, "current": lambda: 0, "gpu_reason": lambda: None,
                       "default_device": lambda: None, "uuids": lambda: None}.items():
        monkeypatch.setattr(fws.TORCH, name, fake)
    assert fws.allocator_figures() == [AllocatorFigures("torch", 0, 0, 0, 0),
                                       AllocatorFigures("torch", 1, 2 * GIB, 3 * GIB, 4 * GIB)]
    assert fws.allocator_figures(1) == fws.allocator_figures()[1:] and fws.allocator_figures(5) == []
    assert kernel_view.report(shell._gpuctx)["memory"] == [
        {"framework": "torch", "ordinal": 1, "allocated": 2 * GIB, "reserved": 3 * GIB, "peak": 4 * GIB}]
    monkeypatch.setattr("gpuctx_jupyter.core.inventory._torch_reserved", lambda: {})
    rows = reports.allocator_rows(reports.inventory.take())
    assert [row[:2] for row in rows] == [["cuda:0", "torch"], ["cuda:1", "torch"]]  # cuda:0: current, empty
    gpu(shell, "mem")
    assert "cuda:1  torch      2.00 GiB   3.00 GiB  4.00 GiB" in capsys.readouterr().out


# -- logging ------------------------------------------------------------------------------------------
def test_a_healthy_session_logs_nothing_at_warning_and_at_most_one_info_line(shell, nvml_records, clean_env):
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    log = logging.getLogger("gpuctx")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        shell.run_line_magic("unload_ext", "gpuctx")
        shell.run_line_magic("load_ext", "gpuctx")
        nvml_records([h200(0), h200(1)])
        for line in ("list", "use 1", "status", "mem", "free", "doctor", "warm --wait", "help"):
            gpu(shell, line)
        assert shell.run_cell("%%on_gpu 0\nx = 1").success
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert [r for r in records if r.levelno >= logging.WARNING] == []
    assert len([r for r in records if r.levelno == logging.INFO]) <= 1


@pytest.mark.parametrize(("version", "requires", "build"), [
    ("2.13.0+cpu", [], "cpu"),
    ("2.11.0+cu130", [], "CUDA 13.0"),
    ("2.5.1+cu121", [], "CUDA 12.1"),
    ("2.6.0+rocm6.2", [], "ROCm 6.2"),
    ("2.11.0", ["filelock", "nvidia-cuda-runtime==13.0.96; platform_system == 'Linux'"], "CUDA"),
    ("2.11.0", ["filelock"], "cpu"),  # no label, no NVIDIA requirement: this venv's torch/lib has no libtorch_cuda
])
def test_torch_build_from_its_package_metadata(monkeypatch, version, requires, build):
    import importlib.metadata

    from gpuctx_jupyter.kernel import doctor

    fake = type("Dist", (), {"version": version, "requires": requires})()
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: fake)
    assert doctor.installed_torch_build() == (version, build)


def test_doctor_checks_the_driver_against_torch_before_it_is_imported(shell, nvml_records, clean_env, capsys,
                                                                       monkeypatch):
    from gpuctx_jupyter.kernel import doctor

    nvml_records([h200(0)])  # the driver supports CUDA up to 13.0
    monkeypatch.setattr(fws.TORCH, "loaded", lambda: False)
    monkeypatch.setattr(doctor, "installed_torch_build", lambda: ("2.99.0+cu140", "CUDA 14.0"))
    gpu(shell, "doctor")
    out = " ".join(capsys.readouterr().out.split())
    assert "torch 2.99.0+cu140, CUDA 14.0 build (read from its installed package); not imported yet" in out
    assert "✗ torch built for CUDA 14.0, but the driver supports only up to 13.0" in out


def test_a_cell_and_the_warm_ups_prepare_asking_for_the_workers_at_once_share_one(shell, monkeypatch):
    """The warm-up's thread prepares the workers a notebook starts while a cell may run
    `%gpu workers`: each made its own GpuWorkers, and the line never found the prepared ones
    (two sets of workers). Now the kernel makes one, whoever asks first."""
    import threading
    import time

    from gpuctx_jupyter.kernel import workers

    made, real_init = [], workers.GpuWorkers.__init__

    def slow_init(self, *args, **kwargs):
        made.append(self)
        time.sleep(0.2)  # (the window two askers have to meet in)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(workers.GpuWorkers, "__init__", slow_init)
    state, magics = shell._gpuctx, shell.magics_manager.registry["GpuMagics"]
    got = []
    warm_up = threading.Thread(target=lambda: got.append(state.workers_of(shell)))
    warm_up.start()
    got.append(magics.workers)
    warm_up.join()
    assert len(made) == 1 and got[0] is got[1]


def test_a_warm_up_that_reads_its_plan_after_unload_prepares_no_workers(shell):
    """`%unload_ext gpuctx` while the warm-up's thread reads a notebook that starts workers: the
    thread then prepared them (a controller and engines, ~1 GiB each) with nothing left to stop
    them but the kernel's end."""
    from types import SimpleNamespace

    st, prepare = shell._gpuctx, shell._gpuctx.warmer.on_plan
    shell.run_line_magic("unload_ext", "gpuctx")
    try:
        prepare(SimpleNamespace(workers="2 --cpu", workers_where="cell 1, line 1"))  # the thread goes on
        assert st.workers is None
    finally:
        if st.workers is not None:
            st.workers.stop()
        shell.run_line_magic("load_ext", "gpuctx")  # (the fixture unloads it)
