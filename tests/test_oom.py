"""The out-of-memory explanation (kernel/oom.py), built from NVML records shaped like two H200s, a
fake torch OutOfMemoryError and a holders file as the server writes it: at most 12 lines, in order
(device, this kernel, the other holders largest first, the fixes ranked), never raising on junk,
and costing nothing when a cell does not fail. Also the holders file's writer (server/holders.py)
and the doctor's JAX finding."""
from __future__ import annotations

import json
import os
import stat
import sys
import time
from types import SimpleNamespace

import pytest

from gpuctx_jupyter import contract
from gpuctx_jupyter.contract import holders as hf
from gpuctx_jupyter.core import frameworks as fws
from gpuctx_jupyter.core import inventory
from gpuctx_jupyter.core.devices import GpuProcess
from gpuctx_jupyter.kernel import doctor, hints, oom, release
from gpuctx_jupyter.server import holders as server_holders
from gpuctx_jupyter.server.launch import kernel_env_defaults

from .harness.gpus import h200

GIB, MIB = 2**30, 2**20
NOW = 1_764_470_000.0
A, B, STANDBY, OTHER = 999_901, 999_902, 999_903, 999_904  # PIDs no process here has
TORCH_MESSAGE = ("CUDA out of memory. Tried to allocate 40.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
                 "18.23 GiB is free. Including non-PyTorch memory, this process has 612.00 MiB memory in use. Of the "
                 "allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.")


def fake_error(module: str, name: str = "OutOfMemoryError", message: str = TORCH_MESSAGE, base=RuntimeError):
    """An exception whose class looks like a framework's (detection reads names, never imports)."""
    cls = type(name, (base,), {"__module__": module})
    return cls(message)


def record(index: int, used: int, processes=()) -> object:
    from dataclasses import replace

    return replace(h200(index), memory_total=140 * GIB, memory_used=used,
                   processes=tuple(GpuProcess(pid, size, "compute") for pid, size in processes))


@pytest.fixture
def two_gpus(nvml_records, clean_env):
    """cuda:0 nearly full (this kernel, two notebooks, a standby, another process); cuda:1 empty."""
    procs = [(os.getpid(), 612 * MIB), (A, 60 * GIB + 612 * MIB), (B, 60 * GIB + 612 * MIB), (STANDBY, 630 * MIB),
             (OTHER, 2 * GIB)]
    used = sum(size for _pid, size in procs)
    nvml_records([record(0, used, procs), record(1, 1 * GIB)])
    return 140 * GIB - used


def holders_file(tmp_path, monkeypatch, kernels, name="gpuctx-holders-1.json") -> str:
    path = tmp_path / name
    path.write_text(hf.HoldersFile(1, NOW - 2, tuple(kernels), "/base/gpuctx/api/kernels/{id}/release").to_json())
    monkeypatch.setenv(hf.HOLDERS, str(path))
    return str(path)


def notebooks():
    live = hf.Holder("kid-a", "python3", ("work/analysis.ipynb",), frozenset({A}), "idle", NOW - 7300, 7300,
                           memory=({"framework": "torch", "ordinal": 0, "allocated": 60 * GIB,
                                    "reserved": 60 * GIB, "peak": 60 * GIB},), memory_time=NOW - 7000)
    cached = hf.Holder("kid-b", "python3", ("train.ipynb",), frozenset({B}), "idle", NOW - 900, 900,
                             memory=({"framework": "torch", "ordinal": 0, "allocated": 0,
                                      "reserved": 60 * GIB, "peak": 60 * GIB},), memory_time=NOW - 800)
    standby = hf.Holder(f"standby-{STANDBY}", "python3", (), frozenset({STANDBY}), "idle", None, 30, standby=True)
    return [live, cached, standby]


@pytest.fixture
def own_figures(monkeypatch):
    def install(*figures):
        monkeypatch.setattr(fws, "allocator_figures", lambda ordinal=None: list(figures))

    install()
    return install


def test_the_explanation_names_the_device_this_kernel_the_holders_and_ranks_the_release_first(
        two_gpus, tmp_path, monkeypatch, own_figures):
    holders_file(tmp_path, monkeypatch, notebooks())
    text = oom.explain(fake_error("torch"), now=NOW)
    lines = text.splitlines()
    assert len(lines) <= oom.MAX_LINES
    assert lines[0].startswith("gpuctx: torch ran out of memory on cuda:0 (nvidia-smi 0, NVIDIA H200): "
                               "asked for 40.0 GiB; 15.6 GiB free of 140 GiB")
    assert lines[1].startswith(f"  this kernel (pid {os.getpid()}): no allocator memory on this GPU; "
                               "NVML: 612 MiB on cuda:0")
    assert lines[2] == "  other holders of cuda:0, largest first (1 more holds 630 MiB):"
    # largest first; the tie between the two notebooks keeps NVML's order
    assert lines[3] == "    analysis.ipynb 60.6 GiB (60.0 GiB in tensors, idle 2 h 01 min)"
    assert lines[4] == "    train.ipynb 60.6 GiB (60.0 GiB cached, idle 15 min)"
    assert lines[5] == "    pid 999904 2.00 GiB"
    assert lines[6] == "  fixes, best first:"
    fixes = lines[7:]
    assert fixes[0].startswith("   1. release the cache of train.ipynb (60.0 GiB, idle 15 min; its variables stay): "
                               "the GPU panel's Release button, or POST /base/gpuctx/api/kernels/kid-b/release")
    assert fixes[1].startswith("   2. `%gpu use 1` — cuda:1 has 139 GiB free")
    assert fixes[2].startswith("   3. shut down analysis.ipynb (60.6 GiB, idle 2 h 01 min; its variables are lost)")
    assert "DELETE /api/kernels/kid-a" in fixes[2]
    assert fixes[-1] == "   4. a smaller batch or model (this one asked for 40.0 GiB)"
    assert not any("shut down train.ipynb" in f for f in fixes)  # releasing it is enough: no need to lose it


def test_a_standby_is_named_as_such_and_this_kernels_figures_and_other_devices_are_shown(
        nvml_records, clean_env, tmp_path, monkeypatch, own_figures):
    procs = [(os.getpid(), 20 * GIB), (STANDBY, 100 * GIB)]
    nvml_records([record(0, 120 * GIB + 612 * MIB, procs), record(1, 612 * MIB, [(os.getpid(), 612 * MIB)])])
    holders_file(tmp_path, monkeypatch, notebooks())
    own_figures(fws.AllocatorFigures("torch", 0, 12 * GIB, 19 * GIB, 18 * GIB))
    text = oom.explain(fake_error("torch"), now=NOW)
    assert ("this kernel (pid %d): torch 12.0 GiB allocated, 19.0 GiB reserved (7.00 GiB reserved but unused), "
            "peak 18.0 GiB; NVML: 20.0 GiB on cuda:0, 612 MiB on cuda:1 (a context stays on each GPU it touched "
            "until restart)" % os.getpid()) in text
    assert "    a warm-pool standby kernel 100 GiB" in text
    # 7 GiB reserved but fragmented cannot cover the 20.6 GiB the 40 GiB request lacks: no fix for it
    assert "expandable_segments:True" not in text


def asking(gib_: float) -> Exception:
    return fake_error("torch", message=TORCH_MESSAGE.replace("Tried to allocate 40.00 GiB",
                                                             f"Tried to allocate {gib_:.2f} GiB"))


def fixes_of(text: str) -> list[str]:
    lines = text.splitlines()
    return [line.split(". ", 1)[1] for line in lines[lines.index("  fixes, best first:") + 1:]]


def test_a_fix_is_listed_only_where_it_can_cover_the_request(nvml_records, clean_env, tmp_path, monkeypatch,
                                                              own_figures):
    """One GPU, 10 GiB free; train.ipynb keeps 6 GiB cached, eval.ipynb 5 GiB; this kernel's
    CuPy pool 1 MiB and its torch allocator 8 GiB reserved but unused (fragmented)."""
    def cached(kid, name, pid, size):
        return hf.Holder(kid, "python3", (name,), frozenset({pid}), "idle", NOW - 900, 900,
                               memory=({"framework": "torch", "ordinal": 0, "allocated": 0, "reserved": size,
                                        "peak": size},), memory_time=NOW - 800)

    procs = [(os.getpid(), 10 * GIB), (A, 6 * GIB), (B, 5 * GIB)]
    nvml_records([record(0, 130 * GIB, procs)])
    holders_file(tmp_path, monkeypatch, [cached("kid-a", "train.ipynb", A, 6 * GIB),
                                         cached("kid-b", "eval.ipynb", B, 5 * GIB)])
    own_figures(fws.AllocatorFigures("cupy", 0, 0, MIB, MIB), fws.AllocatorFigures("torch", 0, 2 * GIB, 10 * GIB, 10 * GIB))
    # 40 GiB asked, 30 GiB short: nothing here covers it, not even everything released together
    assert fixes_of(oom.explain(asking(40), now=NOW)) == ["a smaller batch or model (this one asked for 40.0 GiB)"]
    # 14 GiB asked, 4 GiB short: each cache covers it; the fragmented allocator does too
    fixes = fixes_of(oom.explain(asking(14), now=NOW))
    assert fixes[0].startswith("release the cache of train.ipynb (6.00 GiB")
    assert fixes[1].startswith("release the cache of eval.ipynb (5.00 GiB")
    assert fixes[2].startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") and len(fixes) == 4
    assert not [f for f in fixes if f.startswith("`%gpu free`")]  # its 1 MiB covers nothing
    # 19 GiB asked, 9 GiB short: no single cache covers it; the two together do, as one fix
    fixes = fixes_of(oom.explain(asking(19), now=NOW))
    assert fixes[0] == ("together, the Release button of train.ipynb, the Release button of eval.ipynb — 11.0 GiB, "
                        "their variables stay")
    assert not [f for f in fixes if f.startswith(("release the cache of", "shut down train", "shut down eval"))]


def test_without_a_holders_file_other_processes_are_named_by_pid_and_the_reason_is_given(
        two_gpus, monkeypatch, own_figures):
    monkeypatch.delenv(hf.HOLDERS, raising=False)
    text = oom.explain(fake_error("torch"), now=NOW)
    assert f"pid {A} 60.6 GiB" in text
    assert "notebooks cannot be named: this kernel was not started by a gpuctx server (GPUCTX_HOLDERS unset)" in text
    assert len(text.splitlines()) <= oom.MAX_LINES


def test_cupy_and_jax_errors_are_recognised_by_name_and_message_without_importing_them():
    cupy = oom.detect(fake_error("cupy.cuda.memory", message="Out of memory allocating 42,949,672,960 bytes "
                                                             "(allocated so far: 0 bytes)."))
    assert (cupy.framework, cupy.requested) == ("cupy", 40 * GIB)
    jax = oom.detect(fake_error("jaxlib.xla_extension", "XlaRuntimeError",
                                "RESOURCE_EXHAUSTED: Failed to allocate request for 40.00GiB (42949672960B) on device "
                                "ordinal 1"))
    assert (jax.framework, jax.ordinal, jax.requested) == ("jax", 1, 40 * GIB)
    torch = oom.detect(fake_error("torch"))
    assert (torch.framework, torch.ordinal, torch.requested) == ("torch", 0, 40 * GIB)
    old_torch = oom.detect(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert (old_torch.framework, old_torch.requested) == ("torch", 20 * MIB)
    try:
        try:
            raise fake_error("torch")
        except RuntimeError as inner:
            raise ValueError("while training") from inner
    except ValueError as outer:
        assert oom.detect(outer).framework == "torch"  # the cause is explained
    assert oom.detect(RuntimeError("RESOURCE_EXHAUSTED")) is None  # not JAX's class
    assert oom.detect(MemoryError()) is None
    assert "jax" not in sys.modules and "cupy" not in sys.modules


class _Unprintable(RuntimeError):
    def __str__(self):
        raise ValueError("no")


@pytest.mark.parametrize("junk", ["", "not json", "[]", '{"version": 1, "kernels": 7}', '{"version": 2}',
                                  '{"version": 1, "kernels": [null, 3, {"id": 5}, {"id": "x", "pids": "1", '
                                  '"memory": [1, {"ordinal": "0"}], "last_activity": "yesterday"}]}',
                                  "\x00\x01" * 10])
def test_junk_in_the_holders_file_never_raises(two_gpus, tmp_path, monkeypatch, own_figures, junk):
    path = tmp_path / "h.json"
    path.write_text(junk)
    monkeypatch.setenv(hf.HOLDERS, str(path))
    text = oom.explain(fake_error("torch"), now=NOW)
    assert text.startswith("gpuctx: torch ran out of memory on cuda:0") and len(text.splitlines()) <= 12


def test_nothing_raises_whatever_the_error_and_the_machine(monkeypatch, own_figures):
    assert oom.detect(_Unprintable()) is None
    assert hints.hint_for(None) is None and oom.explain(ValueError("x")) is None
    monkeypatch.setattr(inventory, "take", lambda env=None: 1 / 0)
    text = oom.explain(fake_error("torch"))
    assert text.startswith("gpuctx: torch ran out of GPU memory (could not say more: ZeroDivisionError")


def test_without_a_gpu_the_explanation_says_so(nvml_records, clean_env, own_figures, monkeypatch):
    monkeypatch.setattr(inventory.nvml, "read_records", lambda: (_ for _ in ()).throw(
        inventory.nvml.NvmlUnavailable("NVML Shared Library Not Found")))
    text = oom.explain(fake_error("torch"))
    assert "no GPU figures: NVML reports: NVML Shared Library Not Found" in text.splitlines()[0]


def test_a_cell_that_does_not_fail_costs_no_io(shell, monkeypatch):
    calls = []
    monkeypatch.setattr(inventory, "take", lambda env=None: calls.append("nvml"))
    monkeypatch.setattr(hf, "read_holders", lambda env=None: calls.append("holders"))
    monkeypatch.setattr(oom, "explain", lambda *a, **k: calls.append("explain"))
    result = shell.run_cell("x_ok = 1 + 1")
    assert result.success and calls == []
    result = shell.run_cell("raise KeyError('not a GPU error')")
    assert not result.success and calls == ["explain"]  # only the name check ran; no NVML, no file


def test_an_out_of_memory_cell_prints_the_explanation_under_the_traceback(shell, two_gpus, tmp_path, monkeypatch,
                                                                          own_figures, capsys):
    holders_file(tmp_path, monkeypatch, notebooks())
    shell.user_ns["make_error"] = lambda: fake_error("torch")
    shell.run_cell("raise make_error()")
    err = capsys.readouterr().err
    assert "gpuctx: torch ran out of memory on cuda:0" in err and "release the cache of train.ipynb" in err


def test_the_server_writes_a_private_holders_file_that_the_kernel_reads(tmp_path):
    app = SimpleNamespace(runtime_dir=str(tmp_path / "runtime"), base_url="/x/", log=None,
                          kernel_manager=None)
    h = server_holders.Holders(app, clock=lambda: NOW)
    assert h.path == str(tmp_path / "runtime" / f"gpuctx-holders-{os.getpid()}.json")
    assert h.write(notebooks()) is True
    assert stat.S_IMODE(os.stat(h.path).st_mode) == 0o600
    assert h.write(notebooks()) is False  # unchanged: not rewritten
    parsed, why = hf.read_holders({hf.HOLDERS: h.path})
    assert why == "" and [k.id for k in parsed.kernels] == ["kid-a", "kid-b", f"standby-{STANDBY}"]
    assert parsed.release_url == "/x/gpuctx/api/kernels/{id}/release" and parsed.kernels[1].cached(0) == 60 * GIB
    assert json.loads(open(h.path).read())["server_pid"] == os.getpid()
    h.remove()
    assert not os.path.exists(h.path)


def test_kernels_get_the_holders_path_and_jax_preallocation_off_unless_the_user_says():
    assert kernel_env_defaults({}, "/r/h.json", jax_preallocate=False) == {
        hf.HOLDERS: "/r/h.json", contract.XLA_PREALLOCATE: "false", contract.XLA_SET_BY: "server"}
    assert kernel_env_defaults({contract.XLA_MEM_FRACTION: ".5"}, "/r/h.json", False) == {
        hf.HOLDERS: "/r/h.json"}
    assert kernel_env_defaults({}, None, jax_preallocate=True) == {}
    assert contract.jax_preallocation({}) == 0.75
    assert contract.jax_preallocation({contract.XLA_PREALLOCATE: "false"}) is None
    assert contract.jax_preallocation({contract.XLA_MEM_FRACTION: "0.3"}) == 0.3


def test_doctor_names_jax_preallocation_and_its_switch(nvml_records, clean_env, monkeypatch):
    nvml_records([record(0, GIB)])
    monkeypatch.setattr(fws.JAX, "installed", lambda: True)
    inv = inventory.take()
    on = doctor._keeper_findings(inv, env={})
    assert on[0].level == doctor.INFO and "will preallocate 75% of every GPU it starts on (~105 GiB of each 140 GiB GPU)" \
        in on[0].detail and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in on[0].advice
    off = doctor._keeper_findings(inv, env={contract.XLA_PREALLOCATE: "false", contract.XLA_SET_BY: "server"})
    assert off[0].level == doctor.OK and "set by the gpuctx server" in off[0].detail


def test_idle_is_measured_from_the_last_activity_and_busy_kernels_are_not_idle():
    h = hf.Holder("k", last_activity=NOW - 60, execution_state="idle")
    assert h.idle_at(NOW, NOW - 30) == 60
    assert hf.Holder("k", execution_state="busy", last_activity=NOW - 60).idle_at(NOW, NOW) == 0
    assert hf.Holder("k", idle_s=10).idle_at(NOW, NOW - 5) == 15
    assert oom.duration(59) == "59 s" and oom.duration(3 * 3600 + 65) == "3 h 01 min"
    assert time.time() > 0


class FakeTensor:
    """Shaped like a CUDA torch tensor as far as the explanation looks."""

    is_cuda = True

    def __init__(self, nbytes: int, ptr: int):
        self.device = SimpleNamespace(index=0)
        self._storage = SimpleNamespace(data_ptr=lambda: ptr, nbytes=lambda: nbytes)

    def untyped_storage(self):
        return self._storage


def test_tensors_the_failed_calls_frames_keep_alive_are_counted_and_released(two_gpus, own_figures, monkeypatch):
    import weakref

    monkeypatch.delenv(hf.HOLDERS, raising=False)
    refs = []

    def step(asked=40):
        activations = FakeTensor(3 * GIB, 1)
        refs.append(weakref.ref(activations))
        raise asking(asked)

    try:
        step()
    except RuntimeError as exc:
        error = exc
    text = oom.explain(error, now=NOW)
    assert "the failed cell's traceback keeps 3.00 GiB of tensors alive" in text
    assert "`%gpu free`" not in text  # 3 GiB cannot cover the 24.4 GiB the 40 GiB request lacks
    try:
        step(17)  # 1.4 GiB short: releasing the 3 GiB covers it
    except RuntimeError as exc:
        small = exc
    assert "`%gpu free` — returns 3.00 GiB this kernel keeps cached or alive for the failed cell" in \
        oom.explain(small, now=NOW)
    del small
    saved = {n: getattr(sys, n) for n in ("last_type", "last_value", "last_traceback") if hasattr(sys, n)}
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
    del error
    try:
        cleared = release.drop_failure_references()
    finally:
        for name, value in saved.items():
            setattr(sys, name, value)
    assert "sys.last_value" in cleared and "1 frame(s) of the failed call" in cleared
    assert refs[0]() is None  # the local tensor went with the frame; nothing of the notebook's did
