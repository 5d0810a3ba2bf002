"""The automatic warm reserve (the server's default pool) in a real jupyter_server with real
kernels: filled for a running GPU notebook, adopted by its restart, refilled, dropped when the
last GPU notebook closes, bounded by memory. No GPU here: the standby warms the imports."""
from __future__ import annotations

import json
import sys

from .harness.gpus import NO_GPU
from .harness.notebooks import notebook
from .harness.waiting import wait_for

# The suite's servers keep no pool (conftest); these ask for the default, with no delay.
AUTO = {"GPUCTX_SERVER_POOL": "auto", "GPUCTX_SERVER_IMPORT_STANDBYS": "0"}  # the restart reserve alone
NO_DELAY = "--GpuctxServer.pool_reserve_after=0"


def pool_status(srv) -> dict:
    return srv.api("GET", "/gpuctx/api/devices")[1]["pool"]


def kernel_pids(srv) -> set[int]:
    return set(srv.kernel_processes())


def with_ready_standby(srv, timeout: float = 120) -> dict:
    status = wait_for(lambda: (lambda st: st if any(s["ready"] for s in st["standbys"]) else None)(pool_status(srv)),
                      timeout=timeout)
    return status


def test_the_reserve_follows_the_gpu_notebooks_from_start_to_close(server_factory, tmp_path):
    """With a kernelspec of the user's own (not in pool_kernelspecs): the reserve serves any."""
    notebook(tmp_path / "plain.ipynb", "print('no GPU framework here')")
    notebook(tmp_path / "train.ipynb", ["import torch", "model = torch.nn.Linear(4, 2)"])
    spec = tmp_path / "jupyter-data" / "kernels" / "myproj"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "My project", "language": "python"}))
    srv = server_factory(NO_DELAY, env={**AUTO, "JUPYTER_PATH": str(tmp_path / "jupyter-data")})
    status = pool_status(srv)
    assert status["mode"] == "auto" and status["standbys"] == []
    assert status["reason"] == "no GPU notebook is running: the reserve starts once one runs"
    plain = srv.start_kernel(path="plain.ipynb")
    plain_pid = srv.kernel_pid(plain)
    train = srv.start_kernel(name="myproj", path="train.ipynb")
    train_pid = srv.kernel_pid(train)

    # One standby, kept for train.ipynb alone and warmed with its plan.
    status = with_ready_standby(srv)
    assert status["kernelspecs"]["myproj"]["wanted_for"] == [str(tmp_path / "train.ipynb")]
    assert "python3" not in status["kernelspecs"]  # plain.ipynb's kernelspec keeps none
    [standby] = status["standbys"]
    assert standby["kernel_name"] == "myproj"
    assert standby["notebook"] == str(tmp_path / "train.ipynb") and standby["pid"] not in (plain_pid, train_pid)
    if NO_GPU:  # it imported torch and holds no GPU memory
        assert standby["ordinal"] is None and standby["memory"] is None
    else:  # it warmed on CUDA's default device, the notebook's
        assert standby["ordinal"] == 0

    # Restart is served by the standby: same kernel id, the standby's process, torch imported already.
    code, _ = srv.api("POST", f"/api/kernels/{train}/restart")
    assert code == 200
    ks = srv.channels(train)
    r = ks.execute("import os, sys; print(os.getpid(), 'torch' in sys.modules)")
    assert r.stdout.split() == [str(standby["pid"]), "True"]
    assert r.reply["execution_count"] == 1
    ks.close()

    # Refilled once the restarted kernel has served its first request.
    status = wait_for(lambda: (lambda st: st if any(s["ready"] and s["pid"] != standby["pid"]
                                                    for s in st["standbys"]) else None)(pool_status(srv)), timeout=120)
    refill = next(s["pid"] for s in status["standbys"])

    # The last GPU notebook closes: the reserve goes with it, and says why it is empty.
    assert srv.api("DELETE", f"/api/kernels/{train}")[0] == 204
    status = wait_for(lambda: (lambda st: st if not st["standbys"] and st["reason"] else None)(pool_status(srv)))
    assert status["reason"] == "no GPU notebook is running: the reserve starts once one runs"
    wait_for(lambda: refill not in kernel_pids(srv))
    assert kernel_pids(srv) == {plain_pid}


def test_a_new_gpu_notebook_takes_the_reserve_and_then_warms_its_own_imports(server_factory, tmp_path):
    notebook(tmp_path / "train.ipynb", "import torch")
    notebook(tmp_path / "other.ipynb", ["import torch\nimport yaml", "print(yaml.__name__)"])
    srv = server_factory(NO_DELAY, env=AUTO)
    srv.start_kernel(path="train.ipynb")
    [standby] = with_ready_standby(srv)["standbys"]
    other = srv.start_kernel(path="other.ipynb")

    def warmed_for_other():
        view = srv.api("GET", f"/gpuctx/api/kernels/{other}")[1]
        warm = view.get("warmup") or {}
        return view if warm.get("source") == "the warm pool, for this notebook" and warm.get("state") != "running" \
            else None

    view = wait_for(warmed_for_other, timeout=120)
    assert view["pid"] == standby["pid"] and view["pooled"]
    steps = {s["name"]: s["state"] for s in view["plan"]["steps"]}
    assert steps.get("import yaml") == "done", view["plan"]
    ks = srv.channels(other)
    r = ks.execute("import os, sys; print(os.environ['JPY_SESSION_NAME'], 'yaml' in sys.modules)")
    assert r.stdout.split() == [str(tmp_path / "other.ipynb"), "True"]
    ks.close()


def test_the_reserve_stays_within_the_gpu_budget_and_says_so(server_factory, tmp_path):
    notebook(tmp_path / "train.ipynb", "import torch")
    srv = server_factory(NO_DELAY, "--GpuctxServer.pool_gpu_budget_mib=100", env=AUTO)
    srv.start_kernel(path="train.ipynb")
    status = wait_for(lambda: (lambda st: st if st["kernelspecs"].get("python3") else None)(pool_status(srv)))
    assert status["standbys"] == [] and status["target"] == 0
    assert status["kernelspecs"]["python3"]["reason"].startswith("pool_gpu_budget_mib=100 leaves no room")


def test_no_standby_where_it_would_leave_a_gpu_below_the_floor(server_factory, tmp_path):
    """A replayed GPU with 5% free: the reserve keeps none and says why (the floor is 10%)."""
    header = {"gpuctx_trace": 1, "recorded": "2026-11-30T00:00:00+0000", "host": "composed (a full GPU)",
              "interval": 1.0}
    total = 150754820096
    record = {"nvml_index": 0, "uuid": "GPU-00000000-0000-0000-0000-0000000000f5", "name": "NVIDIA H200",
              "pci_bus_id": "00000000:00:06.0", "compute_capability": [9, 0], "memory_total": total,
              "memory_used": int(total * 0.95), "utilization": 0, "temperature": 34, "power_w": 80.0,
              "power_limit_w": 700.0, "processes": [], "mig_enabled": False, "mig_parent": None, "mig_index": None,
              "persistence_mode": True, "error": None}
    trace = tmp_path / "full-gpu.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in [header, *({"t": float(t), "records": [record]}
                                                                 for t in range(5))]) + "\n")
    notebook(tmp_path / "train.ipynb", "import torch")
    srv = server_factory(NO_DELAY, f"--GpuctxServer.replay_trace={trace}", env=AUTO)
    srv.start_kernel(path="train.ipynb")
    status = wait_for(lambda: (lambda st: st if st["reason"] and "cuda:0" in st["reason"] else None)(pool_status(srv)))
    assert status["reason"].startswith("cuda:0 would have less than 10% free with a standby")
    assert status["standbys"] == []
