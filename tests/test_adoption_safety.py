"""Adopting an imports standby (issue #24) only where the kernel is then indistinguishable from a
fresh one: set-up lines before the imports that the standby's imports may have read already give
a fresh kernel, and `%gpu status` says why; an adopted kernel's directory history and environment
are a fresh kernel's; a server that assigns each kernel its GPU still adopts standbys, the
kernel on the GPU assigned to it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .harness.faults import pool_of
from .harness.gpus import h200
from .harness.notebooks import notebook, warm_status
from .harness.waiting import wait_for

# A standby imports torch at the lowest CPU priority: on a loaded 2-core machine, minutes.
pytestmark = pytest.mark.timeout(900)

AUTO = {"GPUCTX_SERVER_POOL": "auto"}  # the default (the suite's servers keep no pool otherwise)
PROFILE = ("torch", "torch._dynamo", "torch.optim")  # an imports standby's profile before any notebook
# Variables whose values are per kernel, present in a fresh kernel and an adopted one alike.
PER_KERNEL = {"JPY_PARENT_PID", "JPY_SESSION_NAME"}
PROBE = ("import json, os, sys\n"
         "print(json.dumps({'pid': os.getpid(), 'env': sorted(os.environ), 'dh': [str(d) for d in _dh],"
         " 'dhist': [str(d) for d in get_ipython().history_manager.dir_hist],"
         " 'pooled': getattr(get_ipython()._gpuctx, 'pooled', None), 'note': os.environ.get('GPUCTX_POOL_NOTE')}))")


def standby(kind: str = "imports", driver: bool = False):
    from gpuctx_jupyter.server.standby import Standby

    return Standby(None, "python3", {}, 0.0, kind=kind, profile=PROFILE, imports=list(PROFILE), driver=driver)


def facts_of(tmp_path, cells: list[str]):
    from gpuctx_jupyter.contract import notebook as nbread

    notebook(tmp_path / "nb.ipynb", cells)
    return nbread.read(str(tmp_path / "nb.ipynb"))


def ready_imports_standby(srv, timeout: float = 400) -> dict:
    return wait_for(lambda: next((s for s in (pool_of(srv) or {}).get("standbys", [])
                                  if s["kind"] == "imports" and s["ready"] and s["imports"] >= 3), None),
                    timeout=timeout)


def probe(srv, kid: str, imports=()) -> dict:
    """What the kernel has, once its warm-up has ended and it has imported `imports`."""
    ks = srv.channels(kid)
    try:
        warm_status(ks)  # the notebook's own warm-up has ended: what it imports, both kernels have
        r = ks.execute(f"import importlib\nfor m in {list(imports)!r}: importlib.import_module(m)\n{PROBE}")
        assert r.reply["status"] == "ok", r.stderr
        return json.loads(r.stdout)
    finally:
        ks.close()


# -- set-up before the imports ---------------------------------------------------------------------
def test_a_setting_that_an_import_of_the_standbys_read_already_gets_a_fresh_kernel(tmp_path):
    """The review's case: neither numpy nor huggingface_hub is in the standby's list, but torch
    imported numpy (whose OpenBLAS read OMP_NUM_THREADS) and transformers huggingface_hub (which
    read HF_HOME): no list of the standby's own imports proves such a setting safe."""
    from gpuctx_jupyter.server.standby import unsafe_setup

    facts = facts_of(tmp_path, ["import os\nos.environ['OMP_NUM_THREADS'] = '1'\nos.environ['HF_HOME'] = '/x'",
                                "import numpy\nimport huggingface_hub"])
    why = unsafe_setup(standby(), facts)
    assert why and "sets OMP_NUM_THREADS at cell 1, line 2 before its imports" in why
    # a sys.path change before an import of a module the standby never named
    facts = facts_of(tmp_path, ["import sys\nsys.path.insert(0, '/src')", "import mylib"])
    assert "changes sys.path" in unsafe_setup(standby(), facts)


def test_only_settings_read_when_cuda_starts_or_set_after_the_imports_keep_the_standby(tmp_path):
    from gpuctx_jupyter.server.standby import unsafe_setup

    cuda = facts_of(tmp_path, ["import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
                               "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'", "import torch"])
    assert unsafe_setup(standby(), cuda) is None
    assert "CUDA_VISIBLE_DEVICES" in unsafe_setup(standby(driver=True), cuda)  # read already: the driver started
    # CUDA_HOME is read by torch.utils.cpp_extension when it is imported, not when CUDA starts
    assert "CUDA_HOME" in unsafe_setup(standby(), facts_of(tmp_path, ["import os\nos.environ['CUDA_HOME'] = '/c'",
                                                                      "import torch"]))
    after = facts_of(tmp_path, ["import os, sys\nimport torch", "os.environ['HF_HOME'] = '/x'\nsys.path.append('/s')"])
    assert unsafe_setup(standby(), after) is None
    only_sys = facts_of(tmp_path, ["import os\nos.environ['HF_HOME'] = '/x'\nimport sys", "x = 1"])
    assert unsafe_setup(standby(), only_sys) is None  # loaded before any code: importing it reads nothing


def test_a_setting_before_an_import_the_standby_loaded_indirectly_gets_a_fresh_kernel(server_factory, tmp_path):
    """In a real server: the standby's torch imported numpy; a notebook opened afterwards sets
    OMP_NUM_THREADS and then imports numpy, which is not in the standby's list of imports."""
    srv = server_factory(env=AUTO)
    held = ready_imports_standby(srv)
    assert "numpy" not in pool_of(srv)["import_profile"]["modules"]  # the notebook is written after the start
    notebook(tmp_path / "nb.ipynb", ["import os\nos.environ['OMP_NUM_THREADS'] = '1'", "%gpu list", "import numpy"])
    kid = srv.start_kernel(path="nb.ipynb")
    ks = srv.channels(kid)
    try:
        assert srv.kernel_pid(kid) != held["pid"]
        status = ks.execute("%gpu status").text
        assert ("started fresh, not from the warm pool: the notebook sets OMP_NUM_THREADS at cell 1, line 2 "
                "before its imports") in status
    finally:
        ks.close()


# -- what a fresh kernel has -----------------------------------------------------------------------
def test_an_adopted_kernel_has_a_fresh_kernels_directory_history_and_environment(server_factory, tmp_path):
    (tmp_path / "project").mkdir()
    notebook(tmp_path / "project" / "train.ipynb", ["import torch", "x = torch.ones(3)"])
    pooled = server_factory(env=AUTO)
    held = ready_imports_standby(pooled)
    ahead = pool_of(pooled)["import_profile"]["modules"]  # what it imported
    adopted = probe(pooled, pooled.start_kernel(path="project/train.ipynb"))
    unpooled = server_factory("--GpuctxServer.pool_size=0", env=AUTO)
    # a fresh kernel that has imported what the standby imported ahead (`import torch._dynamo` sets
    # TORCHINDUCTOR_CACHE_DIR, as it would in the notebook's kernel the first time it compiles)
    fresh = probe(unpooled, unpooled.start_kernel(path="project/train.ipynb"), imports=ahead)
    assert adopted["pid"] == held["pid"] and fresh["pid"] != held["pid"]
    project = str(tmp_path / "project")
    assert adopted["dh"] == adopted["dhist"] == fresh["dh"] == [project]
    assert set(adopted["env"]) - PER_KERNEL == set(fresh["env"]) - PER_KERNEL
    assert adopted["pooled"] is not None and fresh["pooled"] is None  # known to gpuctx, not in the environment


def test_the_hand_over_leaves_the_pooled_mark_for_status_and_the_directory_history_fresh(
        shell, tmp_path, monkeypatch):
    from gpuctx_jupyter.kernel import adoption

    monkeypatch.chdir(os.getcwd())  # restored afterwards: the hand-over moves the process
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    saved = list(shell.history_manager.dir_hist)
    try:
        adoption.adopt(shell, {"cwd": str(tmp_path), "env": {}, "pooled": "4.2"})
        assert shell.user_ns["_dh"] == [Path(tmp_path)] and shell.user_ns["_dh"] is shell.history_manager.dir_hist
        assert "GPUCTX_POOLED" not in os.environ
        assert "from gpuctx's warm pool (started and warmed 4.2 s before" in _status(shell)
    finally:
        shell.history_manager.dir_hist[:] = saved


# -- assign_devices ----------------------------------------------------------------------------------
def test_a_server_that_assigns_devices_still_gives_new_notebooks_an_imports_standby(server_factory, tmp_path):
    """The standby has started no CUDA: it takes the server's pick at the hand-over, and the
    notebook opened teaches the import profile as without assign_devices."""
    srv = server_factory("--GpuctxServer.assign_devices=round-robin", env=AUTO)
    held = ready_imports_standby(srv)
    notebook(tmp_path / "nb.ipynb", ["import torch\nimport psutil"])
    kid = srv.start_kernel(path="nb.ipynb")
    assert srv.kernel_pid(kid) == held["pid"]
    wait_for(lambda: "psutil" in pool_of(srv)["import_profile"]["modules"], timeout=10)


def test_the_hand_over_puts_the_kernel_on_the_device_the_server_assigned(shell, tmp_path, monkeypatch, nvml_records,
                                                                       clean_env):
    from gpuctx_jupyter.kernel import adoption

    from gpuctx_jupyter.kernel import state

    nvml_records([h200(0), h200(1)])
    # no framework of this process switched: a queued torch switch to cuda:1 would outlive the test
    monkeypatch.setattr(state.of(shell).switcher, "frameworks", ())
    monkeypatch.chdir(os.getcwd())
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    for name in ("GPUCTX_DEVICE", "GPUCTX_DEVICE_SOURCE"):
        monkeypatch.setenv(name, "")  # restored (removed) afterwards; the hand-over sets them
    saved = list(shell.history_manager.dir_hist)
    try:
        adoption.adopt(shell, {"cwd": str(tmp_path), "pooled": "1.0",
                               "env": {"GPUCTX_DEVICE": "1", "GPUCTX_DEVICE_SOURCE": "the server (round-robin)"}})
        choice = state.of(shell).switcher.choice
        assert (choice and choice.ordinal, choice and choice.source) == (1, "the server (round-robin)")
        assert "device: cuda:1 chosen by the server (round-robin)" in _status(shell)
    finally:
        shell.history_manager.dir_hist[:] = saved


@pytest.mark.gpu
def test_an_adopted_kernel_starts_cuda_on_the_gpu_the_server_assigned(server_factory, tmp_path):
    srv = server_factory("--GpuctxServer.assign_devices=round-robin", env=AUTO)
    held = ready_imports_standby(srv)
    notebook(tmp_path / "nb.ipynb", ["import torch", "x = torch.ones(3, device='cuda')"])
    kid = srv.start_kernel(path="nb.ipynb")
    ks = srv.channels(kid)
    try:
        status = ks.execute("%gpu status").text
        assert srv.kernel_pid(kid) == held["pid"] and "chosen by the server (round-robin)" in status, status
        r = ks.execute("import torch; print(torch.ones(1, device='cuda').device.index, torch.cuda.current_device())")
        device = status.split("device: cuda:")[1].split()[0]
        assert r.stdout.split() == [device, device], (r.stdout, r.stderr)
    finally:
        ks.close()


def _status(shell) -> str:
    from gpuctx_jupyter.core import inventory
    from gpuctx_jupyter.kernel import reports, state

    st = state.of(shell)
    return str(reports.status_report(inventory.take(), st.switcher, st.warmer.status, pooled=st.pooled).text())
