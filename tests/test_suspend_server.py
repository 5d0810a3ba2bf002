"""Suspend and resume through the server, without a GPU: a real jupyter_server (pytest-jupyter's,
in this process) with gpuctx, real kernels, and the real checkpoint helper loading the stand-in
libcuda (tests/harness/fake_libcuda.c). NVML has nothing to say here, so the GPUs are NVML records
shaped like an H200 that list the kernel's real PID with its memory while the stand-in says it runs
(and nothing once it is checkpointed) — the one part of the machine the test plays.

Asserted as a user meets it: the routes' answers (what moved, how long, the refusals as one-line
4xx), where a suspended notebook shows (the API's snapshot, /metrics, the holders file the
out-of-memory explanation reads), the next cell resuming it, two actions at once, a resume racing a
restart, a failure that leaves the kernel running, culling and the pressure release suspending
instead, and a machine without the API answering 409 with the driver's reason."""
from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from tornado.httpclient import HTTPClientError

from gpuctx_jupyter.core.devices import GpuProcess, Visibility, VisibleDevice
from gpuctx_jupyter.core.inventory import Inventory
from gpuctx_jupyter.core.sampler import Sample
from gpuctx_jupyter.server import extension, kernel_query, metrics
from gpuctx_jupyter.server.holders import holdings

from .harness.fake_cuda import NOT_SUPPORTED, FakeCuda
from .harness.gpus import h200
from .harness.kernels import arun
from .harness.waiting import wait_for, wait_until

pytest_plugins = ["pytest_jupyter.jupyter_server"]
GIB = 2**30


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCuda:
    cuda = FakeCuda(tmp_path / "fake-cuda")
    for name, value in cuda.env.items():  # the server's helpers and its kernels load the stand-in
        monkeypatch.setenv(name, value)
    return cuda


@pytest.fixture
def jp_server_config(fake):
    return {
        "ServerApp": {"jpserver_extensions": {"gpuctx_jupyter": True}, "allow_unauthenticated_access": False},
        "MappingKernelManager": {"default_kernel_name": "python3"},
        # culling (off until a test turns it on) and the pressure release suspend idle holders
        "GpuctxServer": {"warm_policy": "auto", "kernel_query_timeout": 10.0, "suspend_lock_timeout": 0.5,
                         "cull_idle_gpu_kernels_action": "suspend", "pressure_action": "suspend"},
    }


class Gpu:
    """NVML's view of one H200: each kernel's PID with its memory while the stand-in says it runs."""

    def __init__(self, fake: FakeCuda):
        self.fake, self.held = fake, {}

    def inventory(self, used_extra: int = 0) -> Inventory:
        procs = tuple(GpuProcess(pid, n, "compute") for pid, n in self.held.items() if self.fake.state(pid) != 2)
        record = replace(h200(0), memory_total=141 * GIB,
                         memory_used=sum(p.used_memory for p in procs) + used_extra, processes=procs)
        return Inventory(records=[record], visibility=Visibility((VisibleDevice(0, record),), None, "FASTEST_FIRST", ()))

    async def read(self) -> Inventory:
        return self.inventory()


@pytest.fixture
def gpuctx(jp_serverapp, fake):
    server = extension.of(jp_serverapp)
    gpu = Gpu(fake)
    server.suspend.read_inventory = gpu.read
    yield SimpleNamespace(server=server, manager=server.suspend, gpu=gpu, api=server.api)
    server.holders.stop()
    server.suspend.stop()


async def start(jp_fetch, jp_serverapp, fake, path: str) -> tuple[str, int]:
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
    kid = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body)["kernel"]["id"]
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    for _ in range(150):  # until gpuctx, loaded at start-up, answers, and its warm-up has read the notebook
        answer = await kernel_query.ask(kernel, 2)
        if answer["status"] == "ok" and answer["warmup"]["state"] != "running":
            fake.start_cuda(answer["pid"])
            return kid, answer["pid"]
        await asyncio.sleep(0.2)
    raise TimeoutError("the kernel never answered")


async def post(jp_fetch, kid: str, action: str, **kwargs) -> tuple[int, dict]:
    try:
        r = await jp_fetch("gpuctx", "api", "kernels", kid, action, method="POST", body="", **kwargs)
    except HTTPClientError as err:
        return err.code, json.loads(err.response.body)
    return r.code, json.loads(r.body)


async def test_suspend_and_resume_through_the_routes_and_where_a_suspended_notebook_shows(
        jp_fetch, jp_serverapp, fake, gpuctx):
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "train.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    await arun(kernel, "x = list(range(3))")
    gpuctx.gpu.held[pid] = 10 * GIB
    code, answer = await post(jp_fetch, kid, "suspend")
    assert code == 200 and answer["status"] == "ok" and fake.state(pid) == 2, answer
    assert answer["moved"] == {"0": 10 * GIB} and answer["moved_mib"] == {"0": 10240.0}
    assert set(answer["steps"]) == {"lock", "checkpoint"} and answer["seconds"] > 0
    assert answer["text"].startswith("suspended: 10.0 GiB in host memory since ") and answer["paths"] == ["train.ipynb"]
    # the API's snapshot (and so the panel and the stream), /metrics, the holders file
    snap = gpuctx.api.snapshot(Sample(time.time(), gpuctx.gpu.inventory()))
    assert snap["suspend"]["available"] is True and "stand-in" in snap["suspend"]["reason"]
    assert [s["kernel_id"] for s in snap["suspended"]] == [kid]
    assert snap["devices"][0]["suspended"][0]["bytes"] == 10 * GIB and snap["devices"][0]["processes"] == []
    series = {f.name: f for f in metrics.GpuCollector(lambda: snap).collect()}
    sample = series["gpuctx_kernel_suspended_bytes"].samples[0]
    assert sample.labels["kernel_id"] == kid and sample.labels["path"] == "train.ipynb" and sample.value == 10 * GIB
    holder = next(h for h in gpuctx.server.holders.collect() if h.id == kid)
    assert holder.suspended["moved_total"] == 10 * GIB
    assert gpuctx.server.holders.suspend_url.endswith("/gpuctx/api/kernels/{id}/suspend")
    seen = json.loads((await jp_fetch("gpuctx", "api", "kernels", kid)).body)
    assert seen["suspend"]["state"] == "suspended"  # the kernel answers from before, touching no GPU
    typed = await jp_fetch("gpuctx", "api", "kernels", kid, "cells", method="PUT",
                           body=json.dumps({"cells": ["import torch"]}))  # put off, not refused: sent again later
    assert typed.code == 200 and json.loads(typed.body)["status"] == "suspended" and fake.state(pid) == 2
    code, again = await post(jp_fetch, kid, "suspend")
    assert code == 409 and again["message"].startswith("it is suspended: 10.0 GiB in host memory since ")
    # the next cell, from any client, resumes it; the server notices
    r = await arun(kernel, "print(x)")
    assert r.stdout.startswith("gpuctx: resumed this kernel — 10.0 GiB back on the GPU in ") and fake.state(pid) == 0
    assert r.stdout.splitlines()[-1] == "[0, 1, 2]"
    # suspended again at once, before the watch's round has noticed the resume: asked, not refused
    code, third = await post(jp_fetch, kid, "suspend")
    assert code == 200 and fake.state(pid) == 2, third
    assert gpuctx.manager.resumed[-1]["by"].startswith("the notebook")
    r = await arun(kernel, "print(x)")
    assert r.stdout.splitlines()[-1] == "[0, 1, 2]" and fake.state(pid) == 0
    assert await wait_until(lambda: kid not in gpuctx.manager.suspended, timeout=30)
    # by hand
    assert (await post(jp_fetch, kid, "suspend"))[0] == 200
    code, resumed = await post(jp_fetch, kid, "resume")
    assert code == 200 and resumed["resumed"] is True and fake.state(pid) == 0 and kid not in gpuctx.manager.suspended
    code, twice = await post(jp_fetch, kid, "resume")
    assert code == 409 and twice["message"] == "it is not suspended: nothing to resume"


async def test_refusals_are_one_line_4xx_and_leave_the_kernel_running(jp_fetch, jp_serverapp, fake, gpuctx, tmp_path):
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "a.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    assert (await post(jp_fetch, "no-such-kernel", "suspend"))[0] == 404
    code, standby = await post(jp_fetch, "standby-4242", "suspend")
    assert code == 409 and "warm-pool standby" in standby["message"]
    assert (await post(jp_fetch, kid, "suspend", headers={"Authorization": ""}))[0] in (401, 403)
    code, empty = await post(jp_fetch, kid, "suspend")
    assert code == 409 and empty["message"] == "it holds no GPU memory: there is nothing to suspend"
    gpuctx.gpu.held[pid] = 2**50  # a PiB: no host has room for it
    code, host = await post(jp_fetch, kid, "suspend")
    assert code == 409 and host["message"].startswith("the host cannot take it: 1048576.00 GiB of GPU memory")
    gpuctx.gpu.held[pid] = 4 * GIB
    # a cell running
    go = tmp_path / "go"
    cell = asyncio.ensure_future(arun(kernel, f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"))
    assert await wait_until(lambda: kernel.execution_state == "busy", timeout=30)
    code, busy = await post(jp_fetch, kid, "suspend")
    assert code == 409 and busy["message"] == "it is running a cell: suspend it once it is idle"
    go.write_text("")
    await cell
    assert await wait_until(lambda: kernel.execution_state == "idle", timeout=30)
    # a thread of the user's inside a CUDA call: the lock gives up, the kernel runs on
    fake.busy(pid)
    code, locked = await post(jp_fetch, kid, "suspend")
    assert code == 409 and "CUDA_ERROR_NOT_READY" in locked["message"] and "runs as before" in locked["message"]
    fake.busy(pid, False)
    # the driver cannot checkpoint it (managed memory on the H200): unwound
    fake.fail(pid, "checkpoint", NOT_SUPPORTED, leave=1)
    code, unsupported = await post(jp_fetch, kid, "suspend")
    assert code == 409 and "CUDA_ERROR_NOT_SUPPORTED" in unsupported["message"] and fake.state(pid) == 0
    assert fake.steps(pid) == ["lock", "unlock"]
    r = await arun(kernel, "print('still here')")
    assert r.stdout == "still here\n"  # no resume note: it never stopped running
    assert kid not in gpuctx.manager.suspended
    gpuctx.server.cfg.allow_actions = False
    code, off = await post(jp_fetch, kid, "suspend")
    assert code == 403 and "allow_actions" in off["message"]


async def test_two_suspends_at_once_and_a_resume_racing_a_restart_each_get_a_clear_answer(
        jp_fetch, jp_serverapp, fake, gpuctx):
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "b.ipynb")
    gpuctx.gpu.held[pid] = 4 * GIB
    (a, first), (b, second) = await asyncio.gather(post(jp_fetch, kid, "suspend"), post(jp_fetch, kid, "suspend"))
    assert sorted([a, b]) == [200, 409], (first, second)
    refused = first if a == 409 else second
    assert refused["message"] in ("an action on this kernel is in progress (suspend): try again once it has finished",
                                  f"it is {gpuctx.manager.suspended[kid].text()}: it resumes on its next cell, "
                                  "or with POST …/resume")
    restart = jp_fetch("api", "kernels", kid, "restart", method="POST", body="")
    (code, resumed), restarted = await asyncio.gather(post(jp_fetch, kid, "resume"), restart)
    assert restarted.code == 200
    assert code == 200 or "in progress (restart)" in resumed["message"], resumed
    assert kid not in gpuctx.manager.suspended
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    assert (await arun(kernel, "print('new kernel')")).stdout.endswith("new kernel\n")
    if code != 200:  # the restart came first: it did not restore the old process
        assert "restore" not in fake.steps(pid)


async def test_a_suspended_kernel_is_shut_down_at_once(jp_fetch, jp_serverapp, fake, gpuctx):
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "c.ipynb")
    gpuctx.gpu.held[pid] = 4 * GIB
    assert (await post(jp_fetch, kid, "suspend"))[0] == 200
    process = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.process
    await jp_fetch("api", "kernels", kid, method="DELETE")
    assert process.returncode == -signal.SIGKILL  # killed, not asked to exit and wait, checkpointed, for CUDA
    assert "restore" not in fake.steps(pid) and kid not in gpuctx.manager.suspended


async def test_culling_and_the_pressure_release_can_suspend_idle_holders_instead(jp_fetch, jp_serverapp, fake, gpuctx):
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "idle.ipynb")
    gpuctx.gpu.held[pid] = 8 * GIB
    server = gpuctx.server
    culler, pressure = server.culler, server.pressure
    later = time.time() + 7200
    culler.after, culler.clock = 3600.0, lambda: later

    def round_of(inv):
        holders = server.holders.collect()
        return inv, holders, holdings(inv, holders)

    culled = await culler(*round_of(gpuctx.gpu.inventory()))
    assert [(c["kernel_id"], c["action"]) for c in culled] == [(kid, "suspend")] and fake.state(pid) == 2
    assert gpuctx.manager.suspended[kid].by == "culling"
    assert (await post(jp_fetch, kid, "resume"))[0] == 200
    pressure.clock, pressure.idle_seconds = (lambda: later), 300.0
    done = await pressure(*round_of(gpuctx.gpu.inventory(used_extra=131 * GIB)))  # < 5 % of the GPU free
    assert [(d["kernel_id"], d["action"], d["status"]) for d in done] == [(kid, "suspend", "ok")]
    assert done[0]["released_total"] == 8 * GIB and gpuctx.manager.suspended[kid].by == "pressure"


def test_a_machine_without_the_api_answers_409_with_the_drivers_reason(server_factory):
    srv = server_factory("--GpuctxServer.warm_policy=never", env={"GPUCTX_LIBCUDA": "libc.so.6"})
    kid = srv.start_kernel(path="x.ipynb")

    def detected():
        snap = srv.api("GET", "/gpuctx/api/devices")[1]
        return snap["suspend"] if "asking" not in snap["suspend"]["reason"] else None

    support = wait_for(detected, timeout=60)
    assert support["available"] is False and "has no process checkpoint API" in support["reason"]
    code, answer = srv.api("POST", f"/gpuctx/api/kernels/{kid}/suspend")
    assert code == 409 and answer["message"].startswith("suspend is not available on this server: this NVIDIA driver")
    assert "driver 570 or newer" in answer["message"]
