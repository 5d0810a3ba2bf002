"""Faults as tests: each failure mode of issue #14 reproduced against a real jupyter_server with
real kernels, then checked for what it leaves behind. After each: the server answers, no kernel
process or connection file is left that neither the server nor the pool tracks, and the server's
log holds no traceback from gpuctx. docs/reliability.md records what was tried and what happened."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import psutil

from gpuctx_jupyter.core import trace

from .harness.gpus import h200
from .harness.faults import (
    assert_clean,
    check_storm,
    concurrently,
    connection_files,
    control_port,
    gpuctx_tracebacks,
    gpuctx_warnings,
    hold_the_interpreter,
    kernel_processes,
    kernelspec,
    pool_of,
    ready_standbys,
    restart_storm,
    server_connections_to,
    settled,
    stop_and_check,
)
from .harness.waiting import wait_for

HERE = os.path.dirname(__file__)

# Fake NVML for the server subprocess only: put on its PYTHONPATH as sitecustomize.py. pynvml (the
# driver's bindings) reports two H200s, the second lost; gpuctx's own read path runs over it.
FAKE_NVML = """
import os
from types import SimpleNamespace

if os.environ.get("GPUCTX_TEST_FAKE_NVML") == "one-lost":
    import pynvml

    GIB = 1024**3

    def _device(query):
        def call(handle, *args):
            if handle == 1:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return query(handle, *args)
        return call

    pynvml.nvmlInit = lambda *a, **k: None
    pynvml.nvmlDeviceGetCount = lambda: 2
    pynvml.nvmlDeviceGetHandleByIndex = lambda i: i
    pynvml.nvmlSystemGetDriverVersion = lambda: "580.159.03"
    pynvml.nvmlSystemGetCudaDriverVersion = lambda: 13000
    for name, query in {
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h:08x}-aaaa-bbbb-cccc-{h:012x}",
        "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:{0x18 + h * 0x20:02X}:00.0"),
        "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
        "nvmlDeviceGetMigMode": lambda h: (0, 0),
        "nvmlDeviceGetPersistenceMode": lambda h: 1,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=141 * GIB, used=GIB, free=140 * GIB),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=5, memory=1),
        "nvmlDeviceGetTemperature": lambda h, sensor: 30,
        "nvmlDeviceGetPowerUsage": lambda h: 100000,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700000,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
    }.items():
        setattr(pynvml, name, _device(query))
"""

# A Python that has ipykernel but not gpuctx: the server's own interpreter with gpuctx hidden.
HIDE_GPUCTX = """
import sys

class _NoGpuctx:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("gpuctx", "gpuctx_jupyter"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoGpuctx())
"""


# -- what a fault may leave behind ---------------------------------------------------------------

# -- 1, 3: concurrent actions on one kernel ----------------------------------------------------

def test_concurrent_restarts_through_the_pool_lose_no_standby(faulty):
    srv = faulty("--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always")
    ready_standbys(srv)
    kid = srv.start_kernel()
    before = srv.kernel_pid(kid)
    ready_standbys(srv)  # refilled after the kernel's first request
    check_storm(restart_storm(srv, kid))
    after = srv.kernel_pid(kid)
    assert after != before
    assert [k["id"] for k in srv.api("GET", "/api/kernels")[1]] == [kid]
    assert_clean(srv)
    assert not psutil.pid_exists(before) or psutil.Process(before).status() == psutil.STATUS_ZOMBIE


def test_concurrent_restarts_without_the_pool_leave_no_process(faulty):
    srv = faulty("--GpuctxServer.warm_policy=never")
    kid = srv.start_kernel()
    before = srv.kernel_pid(kid)
    check_storm(restart_storm(srv, kid, n=8))
    assert srv.kernel_pid(kid) != before
    settled(srv)
    assert "Address already in use" not in srv.log()
    # a shutdown asked during a restart waits for it, then happens
    restart, shutdown = concurrently([lambda: srv.api("POST", f"/api/kernels/{kid}/restart"),
                                      lambda: srv.api("DELETE", f"/api/kernels/{kid}")])
    assert shutdown[0] == 204, shutdown
    assert srv.api("GET", "/api/kernels")[1] == []
    assert_clean(srv)


# -- 2: concurrent kernel queries ---------------------------------------------------------------

def test_fifty_concurrent_queries_of_an_idle_kernel_lose_no_reply(faulty):
    # policy auto, no notebook: the hook loads gpuctx, nothing is warmed. The kernel answers the
    # fifty one after another: a long wait for each, so that only a lost reply reads "no-answer"
    srv = faulty("--GpuctxServer.kernel_query_timeout=30")
    kid = srv.start_kernel()
    wait_for(lambda: srv.api("GET", f"/gpuctx/api/kernels/{kid}")[1]["status"] == "ok", timeout=60)
    statuses = []
    for _ in range(3):
        answers = concurrently([lambda: srv.api("GET", f"/gpuctx/api/kernels/{kid}") for _ in range(50)])
        statuses += [(code, body["status"]) for code, body in answers]
    assert statuses == [(200, "ok")] * 150
    assert_clean(srv)
    assert not gpuctx_warnings(srv), gpuctx_warnings(srv)  # a healthy run: nothing at WARNING


# -- 12: gpuctx's questions are not the user's activity ------------------------------------------

def test_a_polled_idle_kernel_keeps_its_last_activity_and_is_culled(faulty):
    """The panel asks every few seconds; the culler must still see the kernel as idle. The kernel
    is one adopted from the pool, so the adoption's request must not count either."""
    srv = faulty("--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always",
                 "--GpuctxServer.kernel_query_timeout=15",  # answered while the refill starts
                 "--MappingKernelManager.cull_idle_timeout=3", "--MappingKernelManager.cull_interval=1")
    ready_standbys(srv)
    kid = srv.start_kernel()
    assert srv.api("GET", f"/gpuctx/api/kernels/{kid}")[1]["status"] == "ok"
    model = lambda: srv.api("GET", f"/api/kernels/{kid}")  # noqa: E731
    # the adopted standby's model says "starting" until the server has seen its first status
    assert wait_for(lambda: model()[1]["execution_state"] == "idle", timeout=30)
    first = model()[1]
    deadline = time.monotonic() + 30
    while True:  # poll faster than the culler's timeout: the kernel goes anyway
        asked, answer = srv.api("GET", f"/gpuctx/api/kernels/{kid}")
        code, now = model()
        if 404 in (asked, code):  # culled (possibly between the two requests)
            break
        if answer.get("status") == "dead" and f"({kid}) with 0 connections" in srv.log():
            # asked while the culler shuts it down: the process is gone, the model not yet
            assert wait_for(lambda: model()[0] == 404, timeout=30)
            break
        assert answer["status"] == "ok" and now["last_activity"] == first["last_activity"], (first, now)
        assert now["execution_state"] == "idle", now
        assert time.monotonic() < deadline, "a polled idle kernel was never culled"
        time.sleep(0.5)
    assert "Culling kernel" in srv.log() or "culling" in srv.log().lower()
    assert_clean(srv)
    # a healthy run: nothing at WARNING, at most one INFO line per kernel start (standbys, the
    # adoption) besides the one when the extension loads
    assert not gpuctx_warnings(srv), gpuctx_warnings(srv)
    info = [line for line in srv.log().splitlines() if line.startswith("[I") and "gpuctx" in line
            and "extension was successfully" not in line]
    starts = sum("standby python3 kernel ready" in line for line in info) + 1
    assert len(info) <= starts + 1, info


# -- kernels killed at a bad moment ------------------------------------------------------------

def test_a_standby_killed_during_its_warm_up_is_replaced(faulty):
    srv = faulty("--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always")
    first = wait_for(lambda: kernel_processes(srv), timeout=60)  # launched, not yet ready
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: set(kernel_processes(srv)) - set(first), timeout=90)
    ready_standbys(srv)
    assert_clean(srv)


def test_a_kernel_killed_during_its_warm_up_or_a_query_is_reported_dead(faulty, tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([os.path.join(HERE, "data", "slowimport"), os.environ.get("PYTHONPATH", "")]),
           "GPUCTX_TEST_RELEASE": str(tmp_path / "never")}  # the warm-up waits forever
    srv = faulty("--GpuctxServer.warm_policy=always", "--GpuctxServer.warm_imports=gpuctx_slow_import",
                 "--GpuctxServer.kernel_query_timeout=20", env=env)
    kid = srv.start_kernel()
    pid = srv.kernel_pid(kid)  # ready while its warm-up waits
    blocked = srv.channels(kid)
    hold_the_interpreter(blocked, tmp_path / "holding")  # the query then stays in flight until the kill
    control = control_port(srv, pid)
    before = server_connections_to(srv, control)
    answer = {}
    asking = threading.Thread(target=lambda: answer.update(zip(("code", "body"),
                                                               srv.api("GET", f"/gpuctx/api/kernels/{kid}"))))
    asking.start()
    wait_for(lambda: server_connections_to(srv, control) > before, timeout=30)  # the query is in flight
    os.kill(pid, signal.SIGKILL)
    asking.join(30)
    blocked.close()
    assert answer["code"] == 200 and answer["body"]["status"] in ("ok", "no-answer", "dead", "error"), answer
    # jupyter_client's restarter brings the kernel back; until then the API says it is dead
    wait_for(lambda: (lambda a: a["status"] == "ok" and a["pid"] != pid)(
        srv.api("GET", f"/gpuctx/api/kernels/{kid}")[1]), timeout=60)
    assert srv.api("POST", f"/gpuctx/api/kernels/{kid}/restart")[0] == 200
    assert srv.kernel_pid(kid) != pid
    assert_clean(srv)


# -- 6: the server going away --------------------------------------------------------------------

def test_standbys_stop_with_the_server_when_no_kernel_is_open(faulty):
    srv = faulty("--GpuctxServer.pool_size=1")
    ready_standbys(srv)
    assert srv.api("GET", "/api/kernels")[1] == []
    stop_and_check(srv, list(kernel_processes(srv)))


def test_sigterm_while_the_pool_fills_leaves_nothing(faulty):
    srv = faulty("--GpuctxServer.pool_size=2", "--GpuctxServer.warm_policy=always")
    pids = list(wait_for(lambda: kernel_processes(srv), timeout=60))  # starting, not ready
    stop_and_check(srv, pids + list(kernel_processes(srv)))



def test_a_server_stopped_with_a_request_in_flight_still_exits(faulty, tmp_path):
    """jupyter_server runs the blocking part of many requests (file reads, the exporter list
    JupyterLab asks for on each load) in anyio's worker threads; one in flight when the server
    stopped used to keep the process alive for ever after its kernels were shut down."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    srv = faulty("--ServerApp.jpserver_extensions=tests.harness.slow_request=True", "--GpuctxServer.pool_size=1",
                 env=env)
    ready_standbys(srv)
    pids = list(kernel_processes(srv))  # the standby's; no notebook is open
    release = tmp_path / "release"
    answered = threading.Thread(target=lambda: srv.api("GET", f"/slow-request?until={release}", timeout=120),
                                daemon=True)
    answered.start()
    wait_for(lambda: "slow request: a worker thread waits" in srv.log(), timeout=30)
    srv.proc.terminate()
    # the loop stops once the kernels are shut down; the request's thread is still at its work
    try:
        wait_for(lambda: srv.proc.poll() is not None or "worker thread of requests in flight told to end" in srv.log(),
                 timeout=60)
    except AssertionError:
        pass  # (then the thread is left waiting: the wait below says what that does)
    release.touch()  # its work ends, after the loop: nothing will ever hand that thread more
    try:
        srv.proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the server did not exit after SIGTERM: {srv.log()[-2000:]}") from None
    # and nothing the warm pool started outlives the server
    wait_for(lambda: not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE],
             timeout=20)
    assert connection_files(srv) == set()
    assert "Traceback" not in srv.log()


# -- 5: broken kernelspecs -------------------------------------------------------------------------

def test_broken_kernelspecs_are_retried_with_backoff_and_say_why(faulty, tmp_path):
    data = tmp_path / "jupyter-data"
    kernelspec(data, "bogus", ["/nonexistent/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    kernelspec(data, "exits", [sys.executable, "-c", "import sys; sys.exit(3)", "ipykernel", "-f", "{connection_file}"])
    srv = faulty("--GpuctxServer.pool_size=1", "--GpuctxServer.warm_policy=always",
                 "--GpuctxServer.pool_kernelspecs=nosuch", "--GpuctxServer.pool_kernelspecs=bogus",
                 "--GpuctxServer.pool_kernelspecs=exits", env={"JUPYTER_PATH": str(data)})
    t0 = time.monotonic()
    wait_for(lambda: all(s["failures"] >= 2 for s in pool_of(srv)["kernelspecs"].values()), timeout=60)
    time.sleep(max(0.0, 7 - (time.monotonic() - t0)))  # once a second would be 7 tries by now
    specs = pool_of(srv)["kernelspecs"]
    for name, spec in specs.items():
        assert 2 <= spec["failures"] <= 4, (name, spec)  # 2, 4, 8 s apart
        assert spec["ready"] == 0 and spec["reason"].startswith("standbys fail to start"), spec
    assert "NoSuchKernel" in specs["nosuch"]["error"]
    assert "is not a program that exists" in specs["bogus"]["error"]
    assert "exited during start-up (exit code 3)" in specs["exits"]["error"]
    # nothing left behind: an attempt may be under way at any moment, one that failed leaves nothing
    wait_for(lambda: connection_files(srv) == set() and kernel_processes(srv) == {}, timeout=30)
    warnings = gpuctx_warnings(srv)
    for name in specs:  # one line per change of state, not one per attempt
        assert sum(f"no standby {name} kernel" in w for w in warnings) == 1, warnings
    assert not gpuctx_tracebacks(srv), gpuctx_tracebacks(srv)
    # nor jupyter_client's traceback of each failed launch (~30 lines, once per attempt): the
    # pool's one line says what failed
    assert "Traceback" not in srv.log() and "Failed to run command" not in srv.log()


# -- 7: a kernel of an environment without gpuctx ----------------------------------------------

def test_a_kernel_without_gpuctx_is_left_alone_and_the_api_says_why(faulty, tmp_path):
    hide = tmp_path / "hide-gpuctx"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_GPUCTX)
    python = tmp_path / "other-env-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={hide}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    data = tmp_path / "jupyter-data"
    kernelspec(data, "other", [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    # a long wait for a reply: an answer well within it came without asking the kernel
    srv = faulty("--GpuctxServer.warm_policy=always", "--GpuctxServer.kernel_query_timeout=30",
                 env={"JUPYTER_PATH": str(data)})
    kid = srv.start_kernel("other")
    t0 = time.monotonic()
    code, answer = srv.api("GET", f"/gpuctx/api/kernels/{kid}")
    assert code == 200 and time.monotonic() - t0 < 10
    assert answer["status"] == "no-gpuctx"
    assert answer["reason"].startswith(f"gpuctx is not installed in this kernel's environment ({python})")
    ks = srv.channels(kid)
    assert ks.execute("1 + 1").text == "2"  # the kernel works, untouched
    ks.close()
    assert "ModuleNotFoundError" not in srv.log()
    ours = srv.start_kernel()  # the server's own Python still gets gpuctx
    wait_for(lambda: srv.api("GET", f"/gpuctx/api/kernels/{ours}")[1]["status"] == "ok", timeout=60)
    assert_clean(srv)


# -- 4: malformed replay traces --------------------------------------------------------------------

def good_sample(t: float) -> str:
    return json.dumps({"t": t, "records": [trace.record_to_dict(h200(0, used_gib=2))]})


def test_malformed_trace_samples_are_skipped_with_one_log_line(faulty, tmp_path):
    path = tmp_path / "trace.jsonl"
    newer = trace.record_to_dict(h200(0))
    newer["nvlink_bandwidth"] = 123  # a field from a newer version: ignored
    as_string = dict(trace.record_to_dict(h200(0)), memory_used="2 GiB")
    lines = [json.dumps({"gpuctx_trace": 1, "recorded": "2026-11-30", "host": "h", "interval": 1.0}),
             good_sample(0.0),
             json.dumps({"records": [trace.record_to_dict(h200(0))]}),  # no t
             json.dumps({"t": 1.0, "records": [newer]}),
             json.dumps({"t": 2.0, "records": [as_string]}),
             json.dumps({"t": 3.0, "records": [{"uuid": 7}]}),
             "{not json",
             json.dumps({"t": 4.0, "records": "none"}),
             good_sample(5.0)]
    path.write_text("\n".join(lines) + "\n")
    srv = faulty(f"--GpuctxServer.replay_trace={path}")
    for _ in range(3):
        code, snap = srv.api("GET", "/gpuctx/api/devices")
        assert code == 200 and snap["gpu"] is True and snap["devices"][0]["name"] == "NVIDIA H200"
        assert "gpuctx_gpu_memory_used_bytes" in srv.text("/metrics")
    skipped = [line for line in srv.log().splitlines() if "unreadable sample" in line]
    assert len(skipped) == 1 and "skipped 5 unreadable samples of 8 (line 3: no time 't'" in skipped[0], skipped
    assert not gpuctx_tracebacks(srv), gpuctx_tracebacks(srv)


# -- NVML failing on one GPU -----------------------------------------------------------------------

def test_one_lost_gpu_is_shown_as_such_and_the_rest_served(faulty, tmp_path):
    shim = tmp_path / "fake-nvml"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(FAKE_NVML)
    srv = faulty(env={"PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]),
                      "GPUCTX_TEST_FAKE_NVML": "one-lost"})
    for _ in range(3):
        code, snap = srv.api("GET", "/gpuctx/api/devices")
        assert code == 200 and snap["gpu"] is True, snap
        records = snap["devices"] + snap["hidden"]
        assert any(r["error"] is None and r["memory_total"] == 141 * 1024**3 for r in records), records
        assert any(r["error"] and "GPU is lost" in r["error"] for r in records), records
        assert "gpuctx_gpu_memory_total_bytes" in srv.text("/metrics")
    assert not gpuctx_tracebacks(srv) and not gpuctx_warnings(srv)
