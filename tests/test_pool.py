"""The warm kernel pool in a real jupyter_server with real kernels (no GPU here)."""
from __future__ import annotations

import json
import os
import signal

import psutil

from gpuctx_jupyter.server.standby import Standby, differing_environment

from .harness.notebooks import notebook
from .harness.waiting import wait_for


def kernel_pids(srv) -> set[int]:
    """Every kernel process the server has started (listed kernels and standbys)."""
    return set(srv.kernel_processes())


def pool_status(srv) -> dict:
    """The pool as GET /gpuctx/api/devices shows it."""
    return srv.api("GET", "/gpuctx/api/devices")[1]["pool"]


def ready_standby(srv) -> set[int]:
    """The PIDs of the pool's standbys once one is ready (answers kernel_info)."""
    return wait_for(lambda: {s["pid"] for s in pool_status(srv)["standbys"]}
                    if pool_status(srv)["kernelspecs"]["python3"]["ready"] else None)


def listed(srv) -> list[str]:
    return [k["id"] for k in srv.api("GET", "/api/kernels")[1]]


def test_a_new_notebook_adopts_a_standby_in_its_own_directory(pool_server, tmp_path):
    (tmp_path / "project").mkdir()
    notebook(tmp_path / "project" / "train.ipynb", "import torch")
    srv = pool_server()
    standby = wait_for(lambda: kernel_pids(srv))
    assert listed(srv) == []  # the standby is invisible
    spec = wait_for(lambda: (lambda s: s if s["ready"] else None)(pool_status(srv)["kernelspecs"]["python3"]))
    assert spec == {"ready": 1, "starting": 0, "failures": 0, "error": None, "reason": None}
    kid = srv.start_kernel(path="project/train.ipynb")
    assert pool_status(srv)["kernelspecs"]["python3"]["reason"] in (  # why the reserve is empty now: refilling
        "a standby will start shortly", "a standby is starting", None)
    ks = srv.channels(kid)
    r = ks.execute("import os, json; print(json.dumps([os.getcwd(), os.environ.get('JPY_SESSION_NAME'), os.getpid()]))")
    cwd, session, pid = json.loads(r.stdout)
    assert pid in standby  # the request was served by the standby, not a fresh kernel
    assert r.reply["execution_count"] == 1  # the hand-over was no cell: the notebook's first is In [1]
    assert cwd == str(tmp_path / "project") and session.endswith("train.ipynb")
    assert "from gpuctx's warm pool" in ks.execute("%gpu status").text
    assert listed(srv) == [kid]
    wait_for(lambda: len(kernel_pids(srv)) == 2)  # refilled at once
    ks.close()


def test_standbys_are_exempt_from_the_culler_and_replaced_when_they_die(pool_server):
    srv = pool_server("--MappingKernelManager.cull_idle_timeout=1", "--MappingKernelManager.cull_interval=1")
    first = wait_for(lambda: kernel_pids(srv))
    assert srv.api("POST", "/api/kernels", {"name": "python3"})[0] == 201  # this one the culler ends
    wait_for(lambda: "Culling kernel" in srv.log() and not listed(srv), timeout=60)  # the culler ran past 1 s
    assert first <= kernel_pids(srv) and listed(srv) == []
    os.kill(next(iter(first)), signal.SIGKILL)
    second = wait_for(lambda: kernel_pids(srv) - first)
    assert second and not (second & first)


def test_restart_is_served_from_the_pool_keeping_the_kernel_id_and_the_websocket(pool_server):
    srv = pool_server("--GpuctxServer.warm_policy=always")
    ready_standby(srv)
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    ks.execute("x = 1")
    standby = ready_standby(srv)  # the refill
    assert srv.api("POST", f"/api/kernels/{kid}/restart")[0] == 200
    r = ks.execute("import os; print(os.getpid(), 'x' in dir())")  # the same websocket
    pid, has_x = r.stdout.split()
    assert int(pid) in standby and has_x == "False"
    assert listed(srv) == [kid]
    ks.close()


def test_server_shutdown_leaves_no_kernel_process(pool_server):
    srv = pool_server()
    wait_for(lambda: kernel_pids(srv))
    srv.start_kernel()
    pids = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(kernel_pids(srv)))
    srv.stop()

    def running():
        alive = []
        for p in pids:
            try:
                if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        return alive

    wait_for(lambda: not running(), timeout=20)


def test_a_start_up_variable_that_differs_refuses_adoption():
    """A GPU-warm standby has started CUDA: every variable CUDA read then must match. An imports
    standby has not: only what the process read when it started (LD_LIBRARY_PATH) must."""
    env = {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib"}
    gpu = Standby(None, "python3", env, 0.0, kind="gpu")
    assert differing_environment(gpu, dict(env, PATH="/bin")) == []  # other variables are set at adoption
    assert differing_environment(gpu, dict(env, CUDA_VISIBLE_DEVICES="1")) == ["CUDA_VISIBLE_DEVICES"]
    assert differing_environment(gpu, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib"}) == ["CUDA_VISIBLE_DEVICES"]
    imports = Standby(None, "python3", env, 0.0, kind="imports")
    assert differing_environment(imports, dict(env, CUDA_VISIBLE_DEVICES="1")) == []  # taken at the hand-over
    assert differing_environment(imports, dict(env, LD_LIBRARY_PATH="/elsewhere")) == ["LD_LIBRARY_PATH"]
    imports.driver = True  # an import started the driver: CUDA's variables are fixed now
    assert differing_environment(imports, dict(env, CUDA_VISIBLE_DEVICES="1")) == ["CUDA_VISIBLE_DEVICES"]
    assert gpu.pid is None


def test_notebooks_that_must_not_start_cuda_get_a_fresh_kernel(pool_server, tmp_path):
    """auto: a notebook without a GPU framework, or one that opts out, never gets a warmed standby."""
    notebook(tmp_path / "plain.ipynb", "print('no GPU here')")
    notebook(tmp_path / "optout.ipynb", "import torch", metadata={"gpuctx": {"warm": False}})
    srv = pool_server()
    standby = wait_for(lambda: kernel_pids(srv))
    for name in ("plain", "optout"):
        ks = srv.channels(srv.start_kernel(path=f"{name}.ipynb"))
        pid = int(ks.execute("import os; print(os.getpid())").stdout)
        assert pid not in standby
        assert "warm pool" not in ks.execute("%gpu status").text
        ks.close()
    assert standby <= kernel_pids(srv)  # the standby still waits for a GPU notebook

