"""A notebook's workers through a real jupyter_server: the server's attribution finds them as the
notebook's (through the kernel's descendants: what its GPU snapshot and holders file list; the
GPU test in test_gpu_workers.py sees their memory attributed), and Shut down or the culler
ending the kernel ends them too."""
from __future__ import annotations

import json

import pytest

from gpuctx_jupyter.server import attribution

from .harness.waiting import wait_for
from .harness.workers import gone, tree

pytestmark = pytest.mark.timeout(600)
pytest.importorskip("ipyparallel")


def start_workers(srv, path: str) -> tuple[str, int, list[int]]:
    """A notebook's kernel with two CPU workers: (kernel id, its PID, the workers' PIDs)."""
    kid = srv.start_kernel(path=path)
    ks = srv.channels(kid)
    try:
        ks.wait_ready()
        r = ks.execute("%load_ext gpuctx\n%gpu workers start 2 --cpu", timeout=300)
        assert r.reply["status"] == "ok", r.text
        r = ks.execute("import json, os\nw = get_ipython()._gpuctx.workers\n"
                       "print(json.dumps([os.getpid(), [r.pid for r in w.ranks]]))")
        pid, workers = json.loads(r.stdout)
    finally:
        ks.close()
    assert pid in srv.kernel_processes()  # the server's own kernel process
    return kid, pid, workers


def test_the_server_counts_the_workers_as_the_notebooks_and_shut_down_ends_them(server_factory):
    srv = server_factory()
    kid, pid, workers = start_workers(srv, "train.ipynb")
    assert len(workers) == 2
    # what the server lists a kernel's GPU memory under (snapshot.list_kernels, the holders file)
    assert set(workers) <= attribution.kernel_pids(pid, None, attribution.child_table())
    below = tree(pid)
    status, _ = srv.api("DELETE", f"/api/kernels/{kid}")  # the panel's (and JupyterLab's) Shut down
    assert status == 204
    wait_for(lambda: gone(below), timeout=60)


def test_a_culled_kernel_takes_its_workers_with_it(server_factory):
    srv = server_factory("--MappingKernelManager.cull_idle_timeout=5", "--MappingKernelManager.cull_interval=1")
    kid, pid, workers = start_workers(srv, "idle.ipynb")
    below = tree(pid)
    assert {p.pid for p in below} >= set(workers)
    wait_for(lambda: srv.api("GET", f"/api/kernels/{kid}")[0] == 404, timeout=120)
    wait_for(lambda: gone(below), timeout=60)
