"""Suspend and resume through the server, without a GPU: a real jupyter_server (pytest-jupyter's,
in this process) with gpuctx, real kernels, and the real checkpoint helper loading the stand-in
libcuda (tests/harness/fake_libcuda.c). NVML has nothing to say here, so the GPUs are NVML records
shaped like an H200 that list the kernel's real PID with its memory while the stand-in says it runs
(and nothing once it is checkpointed) — the one part of the machine the test plays.

Asserted as a user meets it: the routes' answers (what moved, how long, the refusals as one-line
4xx), where a suspended notebook shows (the API's snapshot, /metrics, the holders file the
out-of-memory explanation reads), the next cell resuming it, two actions at once, a resume racing a
restart, a failure that leaves the kernel running, culling and the pressure release suspending
instead, and a machine without the API answering 409 with the driver's reason. A driver call or a
kernel that hangs (the stand-in's hang files) must not hold up a restart, a shutdown, a resume of
a kernel that cannot answer, or the holders round."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import replace
from types import SimpleNamespace

import psutil
import pytest
from tornado.httpclient import HTTPClientError

from gpuctx_jupyter.core.devices import GpuProcess, Visibility, VisibleDevice
from gpuctx_jupyter.core.inventory import Inventory
from gpuctx_jupyter.core.sampler import Sample
from gpuctx_jupyter.server import extension, kernel_query, metrics, suspend
from gpuctx_jupyter.server.holders import holdings
from gpuctx_jupyter.server.lifecycle import Lifecycle
from gpuctx_jupyter.server.tasks import Background

from .harness.fake_cuda import NOT_READY, NOT_SUPPORTED, FakeCuda
from .harness.gpus import h200
from .harness.kernels import areply_to, arun
from .harness.waiting import wait_for, wait_until

pytest_plugins = ["pytest_jupyter.jupyter_server"]
GIB = 2**30


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCuda:
    cuda = FakeCuda(tmp_path / "fake-cuda")
    for name, value in cuda.env.items():  # the server's helpers and its kernels load the stand-in
        monkeypatch.setenv(name, value)
    yield cuda
    cuda.unhang_all()  # a kernel's waiting helper left in a hang finishes (its kernel is gone)


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


def helpers(action: str, pid: int) -> list[psutil.Process]:
    """The checkpoint helpers running `action` on `pid` now (the server's, or a kernel's waiting one)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "gpuctx_jupyter.checkpoint" in cmd and cmd[cmd.index("gpuctx_jupyter.checkpoint") + 1:][:2] == [
                action, str(pid)]:
            found.append(proc)
    return found


async def post(jp_fetch, kid: str, action: str, busy_retry_s: float = 15, **kwargs) -> tuple[int, dict]:
    """POST an action; a suspend refused because the cell just sent has not yet ended in the kernel
    (a loaded machine: its end reaches the kernel's thread late) is asked again for `busy_retry_s`."""
    deadline = time.monotonic() + busy_retry_s
    while True:
        try:
            r = await jp_fetch("gpuctx", "api", "kernels", kid, action, method="POST", body="", **kwargs)
            return r.code, json.loads(r.body)
        except HTTPClientError as err:
            code, body = err.code, json.loads(err.response.body)
        if not (action == "suspend" and code == 409 and "running a cell" in body.get("message", "")
                and time.monotonic() < deadline):
            return code, body
        await asyncio.sleep(0.2)


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
    code, busy = await post(jp_fetch, kid, "suspend", busy_retry_s=0)
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


async def test_a_suspend_asked_while_the_warm_up_imports_waits_for_the_import_and_succeeds(
        jp_fetch, jp_serverapp, fake, gpuctx, tmp_path):
    """The user suspends while the warm-up is importing (a module that takes 3 s): the kernel cannot
    stop an import half-done, so the server asks again until it has ended, and the suspend succeeds
    with the import complete in the kernel."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "w.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    site = tmp_path / "lib" / "site-packages"
    (site / "gpuctx_slow_three").mkdir(parents=True)
    (site / "gpuctx_slow_three" / "__init__.py").write_text("import time\ntime.sleep(3)\n")
    r = await arun(kernel, f"import sys; sys.path.insert(0, {str(site)!r})\n"
                           "from gpuctx_jupyter.kernel.warm import plan as plans, scheduler\n"
                           "scheduler.HEAVY_IDLE_S = 0.0\n"
                           "print(get_ipython()._gpuctx.warmer.start_plan(lambda: plans.imports_only(['gpuctx_slow_three'])))")
    assert r.stdout.split() == ["True"], r.stdout
    for _ in range(150):
        if (await kernel_query.ask(kernel, 2))["warmup"]["phase"] == "import gpuctx_slow_three":
            break
        await asyncio.sleep(0.1)
    gpuctx.gpu.held[pid] = 4 * GIB
    code, answer = await post(jp_fetch, kid, "suspend")
    assert code == 200 and fake.state(pid) == 2, answer
    r = await arun(kernel, "print('gpuctx_slow_three' in sys.modules)")
    assert r.stdout.splitlines()[-1] == "True"


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
    # the resume finished first, or the restart came first, or the restart stopped it midway
    assert code == 200 or resumed["message"] in (
        "an action on this kernel is in progress (restart): try again once it has finished",
        "the resume was stopped: the kernel is being restarted"), resumed
    assert kid not in gpuctx.manager.suspended
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    assert (await arun(kernel, "print('new kernel')")).stdout.endswith("new kernel\n")
    if code != 200 and "in progress" in resumed["message"]:  # the restart came first: no restore of the old process
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

    assert await culler(*round_of(gpuctx.gpu.inventory())) == [kid]  # started, in the background
    assert await wait_until(lambda: culler.culled, timeout=30)
    assert [(c["kernel_id"], c["action"]) for c in culler.culled] == [(kid, "suspend")] and fake.state(pid) == 2
    assert gpuctx.manager.suspended[kid].by == "culling"
    assert (await post(jp_fetch, kid, "resume"))[0] == 200
    pressure.clock, pressure.idle_seconds = (lambda: later), 300.0
    assert await pressure(*round_of(gpuctx.gpu.inventory(used_extra=131 * GIB))) == [kid]  # < 5 % of the GPU free
    assert await wait_until(lambda: pressure.history, timeout=30)
    done = pressure.history
    assert [(d["kernel_id"], d["action"], d["status"]) for d in done] == [(kid, "suspend", "ok")]
    assert done[0]["released_total"] == 8 * GIB and gpuctx.manager.suspended[kid].by == "pressure"


def restoring(pid: int) -> Inventory:
    """NVML listing `pid` with its 8 GiB again, as it does while a restore brings them back."""
    record = replace(h200(0), memory_total=141 * GIB, memory_used=8 * GIB, processes=(GpuProcess(pid, 8 * GIB, "compute"),))
    return Inventory(records=[record], visibility=Visibility((VisibleDevice(0, record),), None, "FASTEST_FIRST", ()))


async def test_culling_never_takes_a_kernel_the_user_is_resuming_or_has_just_resumed(
        jp_fetch, jp_serverapp, fake, gpuctx):
    """A resume is the user's: its memory coming back shows in NVML while the restore runs, and the
    kernel's last activity was hours ago (it was suspended for being idle). Culling (its default
    action, shutdown) then killed the kernel mid-resume or at the next round, variables and all."""
    from datetime import timedelta

    from jupyter_server._tz import utcnow

    kid, pid = await start(jp_fetch, jp_serverapp, fake, "back.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    gpuctx.gpu.held[pid] = 8 * GIB
    assert (await post(jp_fetch, kid, "suspend"))[0] == 200
    server, culler = gpuctx.server, gpuctx.server.culler
    culler.shutdown, culler.action = jp_serverapp.kernel_manager.shutdown_kernel, "shutdown"
    culler.after = 3600.0
    kernel.last_activity = utcnow() - timedelta(hours=2)  # suspended for being idle, two hours ago

    def round_of(inv):
        holders = server.holders.collect()
        return inv, holders, holdings(inv, holders)

    fake.hang(pid, "restore")
    resuming = asyncio.ensure_future(post(jp_fetch, kid, "resume"))
    assert await wait_until(lambda: fake.hanging(pid, "restore"), timeout=30)
    listed = restoring(pid)
    assert await culler(*round_of(listed)) == []  # mid-restore: its memory listed again
    fake.hang(pid, "restore", False)
    code, answer = await asyncio.wait_for(resuming, 30)
    assert code == 200, answer
    assert await culler(*round_of(gpuctx.gpu.inventory())) == []  # the next round: active just now
    assert kid in jp_serverapp.kernel_manager and culler.culled == []


async def test_culling_judges_a_kernel_by_its_activity_now_not_by_the_rounds_holders(
        jp_fetch, jp_serverapp, fake, gpuctx):
    """The round's holders are read before its consumers run, and the pressure release awaits its
    evictions first: a resume that ended meanwhile left the holder showing hours of idleness, and
    culling shut the kernel down as it came back."""
    from datetime import timedelta

    from jupyter_server._tz import utcnow

    kid, pid = await start(jp_fetch, jp_serverapp, fake, "evicting.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    gpuctx.gpu.held[pid] = 8 * GIB
    assert (await post(jp_fetch, kid, "suspend"))[0] == 200
    server, culler = gpuctx.server, gpuctx.server.culler
    culler.shutdown, culler.action, culler.after = jp_serverapp.kernel_manager.shutdown_kernel, "shutdown", 3600.0
    kernel.last_activity = utcnow() - timedelta(hours=2)
    fake.hang(pid, "restore")
    resuming = asyncio.ensure_future(post(jp_fetch, kid, "resume"))
    assert await wait_until(lambda: fake.hanging(pid, "restore"), timeout=30)
    listed = restoring(pid)
    holders = server.holders.collect()  # the round's, read mid-restore
    assert holdings(listed, holders)[kid] == {0: 8 * GIB} and culler.busy(kid)  # listed, the resume in flight
    fake.hang(pid, "restore", False)
    code, answer = await asyncio.wait_for(resuming, 30)  # ends while the round's pressure release awaits
    assert code == 200, answer
    assert await culler(listed, holders, holdings(listed, holders)) == []
    assert kid in jp_serverapp.kernel_manager and culler.culled == []


async def test_a_failed_suspend_that_cannot_be_undone_leaves_the_kernel_to_restore_itself_first(
        jp_fetch, jp_serverapp, fake, gpuctx):
    """The checkpoint fails with the process locked, and unlocking fails too, twice (the helper's
    unwind, the server's retry): the answer said the next cell would try again, but the kernel had
    been told it ran, and its next cell ran on a locked process."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "stuck.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    await arun(kernel, "x = 41")
    gpuctx.gpu.held[pid] = 4 * GIB
    fake.fail(pid, "checkpoint", NOT_SUPPORTED, leave=1)
    fake.fail(pid, "unlock", NOT_READY, times=2)
    code, answer = await post(jp_fetch, kid, "suspend")
    assert code == 500 and "could not be put back" in answer["message"], answer
    assert answer["message"].endswith("its next cell, or Resume, tries again; restart it if that fails")
    assert fake.state(pid) == 1 and kid not in gpuctx.manager.suspended
    seen = json.loads((await jp_fetch("gpuctx", "api", "kernels", kid)).body)
    assert seen["suspend"]["state"] == "suspended" and "could not be put back" in seen["suspend"]["error"], seen
    r = await arun(kernel, "print(x + 1)")
    assert r.stdout.splitlines()[-1] == "42" and fake.state(pid) == 0  # unlocked before it ran
    for _ in range(600):  # the steps the consent gave up run again once it runs: a suspend waits for them
        if (await kernel_query.ask(kernel, 5)).get("warmup", {}).get("state") != "running":
            break
        await asyncio.sleep(0.2)
    fake.fail(pid, "checkpoint", NOT_SUPPORTED, leave=1)  # again, and this time Resume puts it back
    fake.fail(pid, "unlock", NOT_READY, times=2)
    assert (await post(jp_fetch, kid, "suspend"))[0] == 500 and fake.state(pid) == 1
    code, resumed = await post(jp_fetch, kid, "resume")
    assert code == 200 and resumed["resumed"] is True and fake.state(pid) == 0, resumed


async def test_a_cell_sent_during_the_checkpoint_resumes_the_kernel_and_the_suspend_says_so(
        jp_fetch, jp_serverapp, fake, gpuctx):
    """A cell that came while the driver checkpointed: the kernel restored itself for it once the
    checkpoint ended, but the server answered 200 and kept the kernel listed as suspended — for
    good when the cell ended before the record was made (nothing counted as activity since)."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "during.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    await arun(kernel, "y = 7")
    gpuctx.gpu.held[pid] = 4 * GIB
    client = kernel.client()  # connected before the suspend: the cell is sent at the moment chosen
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    fake.hang(pid, "checkpoint")
    suspending = asyncio.ensure_future(post(jp_fetch, kid, "suspend"))
    assert await wait_until(lambda: fake.hanging(pid, "checkpoint"), timeout=30)
    msg_id = client.execute("print(y)")
    for _ in range(300):  # the cell is waiting for the checkpoint's end, to restore first
        if ((await kernel_query.ask(kernel, 5)).get("suspend") or {}).get("state") == "resuming":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the cell never began to resume the kernel")
    fake.hang(pid, "checkpoint", False)
    code, answer = await asyncio.wait_for(suspending, 60)
    assert code == 409 and answer["message"].startswith("not suspended: the notebook sent a request during the "
                                                        "suspend and resumed itself"), answer
    try:
        reply = await areply_to(client, msg_id, timeout=60)
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok" and fake.state(pid) == 0
    assert kid not in gpuctx.manager.suspended


async def test_a_kernel_that_could_not_take_turns_with_the_helper_is_not_suspended(
        jp_fetch, jp_serverapp, fake, gpuctx, tmp_path):
    """The kernel and the checkpoint helper take turns through lock files in the temporary folder:
    a kernel with a TMPDIR of its own (or in another container) withdrew its consent where the
    helper never looked, and a cell could run while its process was checkpointed."""
    own = tmp_path / "kernel-tmp"
    own.mkdir()
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(own)  # the kernel's environment, not the server's helpers'
    try:
        kid, pid = await start(jp_fetch, jp_serverapp, fake, "own-tmp.ipynb")
    finally:
        os.environ.pop("TMPDIR") if before is None else os.environ.__setitem__("TMPDIR", before)
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    gpuctx.gpu.held[pid] = 4 * GIB
    code, answer = await post(jp_fetch, kid, "suspend")
    assert code == 409 and answer["message"].startswith("its temporary folder is not the server's"), answer
    assert fake.state(pid) == 0 and "lock" not in fake.steps(pid)
    assert (await arun(kernel, "print('on')")).stdout == "on\n"


async def test_a_checkpoint_helper_that_cannot_start_leaves_the_kernel_running(
        jp_fetch, jp_serverapp, fake, gpuctx, tmp_path):
    """The helper's Python gone (an environment removed under the server): the error escaped as a
    bare 500 and the kernel, having consented, stayed "suspending" — its warm-up and sampler held."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "no-helper.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    gpuctx.gpu.held[pid] = 4 * GIB
    gpuctx.manager.checkpointer.python = str(tmp_path / "no-such-python")
    code, answer = await post(jp_fetch, kid, "suspend")
    assert code == 409 and answer["message"].startswith("not suspended: could not start the checkpoint helper: "), answer
    assert answer["message"].endswith("the kernel runs as before")
    seen = json.loads((await jp_fetch("gpuctx", "api", "kernels", kid)).body)
    assert "suspend" not in seen and seen["status"] == "ok", seen  # running: it answers as usual, not "suspending"
    assert (await arun(kernel, "print('on')")).stdout == "on\n"


async def test_a_kernel_that_names_another_process_as_itself_gets_nothing_checkpointed(
        jp_fetch, jp_serverapp, fake, gpuctx):
    """What a kernel says its PID is (its notebook's code can make it say anything) must not choose
    the process a checkpoint helper acts on: another process of the machine, which the server (as
    root, say) could reach, is named and refused, and nothing is suspended."""
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        fake.start_cuda(other.pid)  # a process that uses the GPU, not the kernel's
        kid, pid = await start(jp_fetch, jp_serverapp, fake, "liar.ipynb")
        kernel = jp_serverapp.kernel_manager.get_kernel(kid)
        gpuctx.gpu.held[pid] = 4 * GIB
        await arun(kernel, "import gpuctx_jupyter.kernel.kernel_view as _kv\n_real = _kv.report\n"
                           f"_kv.report = lambda state: dict(_real(state), pid={other.pid})\n"
                           f"get_ipython()._gpuctx.suspend.pid = {other.pid}")
        assert (await jp_fetch("gpuctx", "api", "kernels", kid)).code == 200  # its answer names the other one
        code, answer = await post(jp_fetch, kid, "suspend")
        assert code == 409 and f"the kernel reports pid {other.pid}, which is not among this kernel's processes" \
            in answer["message"], answer
        assert fake.state(other.pid) == 0 and fake.state(pid) == 0
        assert (await arun(kernel, "print(1 + 1)")).stdout.strip() == "2"  # it runs as before
    finally:
        other.kill()
        other.wait()


async def test_the_holders_round_goes_on_while_culling_suspends_a_kernel(jp_fetch, jp_serverapp, fake, gpuctx):
    """A suspend takes about a minute for a full H200 (900 s if the driver hangs): the round that
    started it goes on, writing the holders file and feeding the pressure release meanwhile."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "slow.ipynb")
    gpuctx.gpu.held[pid] = 8 * GIB
    server = gpuctx.server
    later = time.time() + 7200
    server.culler.after, server.culler.clock = 3600.0, lambda: later
    fake.hang(pid, "checkpoint")  # until the test lets it go on
    await asyncio.wait_for(server.holders.tick(gpuctx.gpu.inventory()), 15)
    assert await wait_until(lambda: fake.hanging(pid, "checkpoint"), timeout=30)
    assert server.lifecycle.actions.busy(kid) == "suspend_kernel"
    for _ in range(2):  # more rounds while it is in flight: each returns, none starts a second suspend
        holders, held = await asyncio.wait_for(server.holders.tick(gpuctx.gpu.inventory()), 15)
        assert held[kid] == {0: 8 * GIB} and kid in [h.id for h in holders]
    assert len(helpers("suspend", pid)) == 1 and server.culler.culled == []
    fake.hang(pid, "checkpoint", False)
    assert await wait_until(lambda: server.culler.culled, timeout=30)
    assert [(c["kernel_id"], c["action"]) for c in server.culler.culled] == [(kid, "suspend")]
    assert gpuctx.manager.suspended[kid].by == "culling" and fake.state(pid) == 2


async def test_a_restart_stops_a_suspend_whose_driver_call_hangs(jp_fetch, jp_serverapp, fake, gpuctx):
    """Restart is the way out of a stuck kernel: it does not wait behind a suspend (up to
    suspend_timeout, 900 s): it stops it, its helper killed, and restarts the kernel at once."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "hung.ipynb")
    gpuctx.gpu.held[pid] = 4 * GIB
    fake.hang(pid, "lock")
    suspending = asyncio.ensure_future(post(jp_fetch, kid, "suspend"))
    assert await wait_until(lambda: fake.hanging(pid, "lock"), timeout=30)
    process = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.process
    restarted = await asyncio.wait_for(jp_fetch("api", "kernels", kid, "restart", method="POST", body=""), 45)
    assert restarted.code == 200
    code, answer = await asyncio.wait_for(suspending, 10)
    assert code == 409 and answer["message"] == "the suspend was stopped: the kernel is being restarted"
    assert helpers("suspend", pid) == []  # killed with it, not left waiting in the driver
    assert process.returncode == -signal.SIGKILL  # it may have been locked: stopped at once
    assert kid not in gpuctx.manager.suspended and server_busy(gpuctx, kid) is None
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    assert (await arun(kernel, "print('new kernel')")).stdout.endswith("new kernel\n")


async def test_a_shutdown_stops_a_resume_the_kernel_never_answers(jp_fetch, jp_serverapp, fake, gpuctx):
    """The kernel answers RESUME only once it has restored itself; here its restore hangs (so its
    control thread never answers): a shutdown stops the resume and the record goes."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "stuck.ipynb")
    gpuctx.gpu.held[pid] = 4 * GIB
    assert (await post(jp_fetch, kid, "suspend"))[0] == 200
    fake.hang(pid, "restore")
    resuming = asyncio.ensure_future(post(jp_fetch, kid, "resume"))
    assert await wait_until(lambda: fake.hanging(pid, "restore"), timeout=30)  # the kernel's own helper
    process = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.process
    stopped = await asyncio.wait_for(jp_fetch("api", "kernels", kid, method="DELETE"), 30)
    assert stopped.code == 204
    code, answer = await asyncio.wait_for(resuming, 10)
    assert code == 409 and answer["message"] == "the resume was stopped: the kernel is being shut down"
    assert process.returncode == -signal.SIGKILL and kid not in jp_serverapp.kernel_manager
    assert kid not in gpuctx.manager.suspended and server_busy(gpuctx, kid) is None


async def test_a_resume_of_a_kernel_that_cannot_answer_goes_to_the_helper_at_once(jp_fetch, jp_serverapp, fake,
                                                                                 gpuctx):
    """Whether the kernel answers is asked within kernel_query_timeout, not suspend_timeout (900 s):
    a stopped kernel is restored by the server's helper, and its next cell runs."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "stopped.ipynb")
    gpuctx.gpu.held[pid] = 4 * GIB
    assert (await post(jp_fetch, kid, "suspend"))[0] == 200
    gpuctx.server.cfg.kernel_query_timeout = 1.0
    os.kill(pid, signal.SIGSTOP)  # its control thread cannot answer
    try:
        code, answer = await asyncio.wait_for(post(jp_fetch, kid, "resume"), 30)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert code == 200 and "restore" in answer["steps"] and fake.state(pid) == 0, answer
    assert kid not in gpuctx.manager.suspended
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    assert (await arun(kernel, "print('runs')")).stdout.endswith("runs\n")


SLOW_CONSENT = ("import time\nfrom gpuctx_jupyter import contract\nk = get_ipython().kernel\n"
                "consent = k.control_handlers[contract.SUSPEND_PREPARE_REQUEST]\n"
                "def slow(*args):\n    time.sleep(6)\n    return consent(*args)\n"
                "k.control_handlers[contract.SUSPEND_PREPARE_REQUEST] = slow")


async def test_a_consent_that_takes_seconds_still_suspends(jp_fetch, jp_serverapp, fake, gpuctx):
    """The kernel's consent may itself wait 3.5 s (a cell just ended, a warm-up step, a sampler
    read), and a loaded machine adds to that: with kernel_query_timeout's default 2 s, the server
    gave it 5 s in all and refused "the kernel did not answer (is gpuctx loaded in it?)"."""
    kid, pid = await start(jp_fetch, jp_serverapp, fake, "slow.ipynb")
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    assert (await arun(kernel, SLOW_CONSENT)).reply["status"] == "ok"
    gpuctx.gpu.held[pid] = 4 * GIB
    gpuctx.server.cfg.kernel_query_timeout = 2.0
    code, answer = await post(jp_fetch, kid, "suspend")
    assert code == 200 and fake.state(pid) == 2, answer
    assert (await arun(kernel, "print('runs')")).stdout.endswith("runs\n") and fake.state(pid) == 0


class Manager:
    """The kernel manager's methods the lifecycle wraps, recording how each kernel was stopped."""

    log = None

    def __init__(self, kernels=("k1",)):
        self.kernels, self.calls = list(kernels), []

    def __contains__(self, kid):
        return kid in self.kernels

    def list_kernel_ids(self):
        return list(self.kernels)

    async def shutdown_all(self, *args, **kwargs):
        self.calls.append(("shutdown_all", sorted(self.kernels)))

    async def restart_kernel(self, kid, *args, **kwargs):
        self.calls.append(("restart", kid, kwargs.get("now", False)))

    async def shutdown_kernel(self, kid, *args, **kwargs):
        self.calls.append(("shutdown", kid, kwargs.get("now", False)))
        self.kernels.remove(kid)

    async def interrupt_kernel(self, *args, **kwargs): ...

    async def start_kernel(self, *args, **kwargs): ...


def hung_lifecycle(kernels=("k1",), suspended=(), unwinds: bool = True):
    """A lifecycle whose suspends hang (a helper that never answers); with unwinds=False their
    unwinding hangs too, as a killed helper inside a driver call that never returns does."""
    entered, forgotten = asyncio.Event(), []

    async def hung_suspend(kid, by):
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not unwinds:
                await asyncio.Event().wait()  # awaiting the killed helper's end
            raise

    manager = SimpleNamespace(suspend=hung_suspend, resume=hung_suspend, is_suspended=lambda kid: kid in suspended,
                              forget=forgotten.append)
    background = Background(None)
    lifecycle = Lifecycle(Manager(kernels), None, background, suspend=manager)
    return lifecycle, background, entered, forgotten


async def test_the_servers_shutdown_stops_a_hung_suspend_before_it_awaits_its_tasks():
    """Culling's suspends run as background tasks, which the server's shutdown awaits: one that
    hangs is pre-empted first, not waited for (up to suspend_timeout). Its kernel and a suspended
    one are stopped at once (now=True), not asked politely by jupyter_server's shutdown_all (its
    shutdown_wait_time each); the others are left to it."""
    lifecycle, background, entered, forgotten = hung_lifecycle(("k1", "k2", "k3"), suspended={"k2"})
    culled = background.spawn(suspend.run(lifecycle.actions, "suspend", "k1", by="culling"), "culling k1")
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.wait_for(lifecycle.shutdown_all(), 5)
    *shutdowns, last = lifecycle.mkm.calls
    assert sorted(shutdowns) == [("shutdown", "k1", True), ("shutdown", "k2", True)]
    assert last == ("shutdown_all", ["k3"])
    assert sorted(forgotten) == ["k1", "k2"] and isinstance(culled.exception(), suspend.Refused)
    assert culled.exception().message == "the suspend was stopped: the kernel is being shut down"


async def test_a_restart_goes_on_when_the_stopped_suspend_does_not_unwind(monkeypatch):
    """A helper inside a driver call that does not return outlives its SIGKILL, and the suspend
    awaiting its end never unwinds: the restart waits for it UNWIND_S at most, then restarts the
    kernel at once; the suspend's caller gets its 409 all the same, and so does the server's
    shutdown behind another such suspend."""
    from gpuctx_jupyter.server import lifecycle as lifecycle_module

    monkeypatch.setattr(lifecycle_module, "UNWIND_S", 0.2)
    lifecycle, background, entered, _ = hung_lifecycle(("k1", "k2"), unwinds=False)
    suspending = asyncio.ensure_future(suspend.run(lifecycle.actions, "suspend", "k1"))
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.wait_for(lifecycle.restart_kernel("k1"), 5)
    assert lifecycle.mkm.calls == [("restart", "k1", True)]
    with pytest.raises(suspend.Refused, match="the suspend was stopped: the kernel is being restarted"):
        await asyncio.wait_for(suspending, 5)
    entered.clear()
    culled = background.spawn(suspend.run(lifecycle.actions, "suspend", "k2", by="culling"), "culling k2")
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.wait_for(lifecycle.shutdown_all(), 5)
    assert lifecycle.mkm.calls[1:] == [("shutdown", "k2", True), ("shutdown_all", ["k1"])]
    assert isinstance(culled.exception(), suspend.Refused)


async def test_a_cancelled_checkpoint_helper_that_outlives_sigkill_is_not_waited_for(monkeypatch):
    """SIGKILL does not end a process inside an uninterruptible driver call until that call
    returns. The helper's end is awaited KILL_WAIT_S at most, whether the action was cancelled (a
    restart pre-empted it) or ran past its timeout; the log names the helper left behind."""
    from gpuctx_jupyter.server import checkpointer

    spawned, warnings = [], []

    class Stuck:  # the helper's asyncio process: its output and its end never come
        pid = 4242

        def __init__(self):
            self.killed = False
            spawned.append(self)

        async def communicate(self):
            await asyncio.Event().wait()

        def kill(self):
            self.killed = True

        async def wait(self):
            await asyncio.Event().wait()

    async def create_subprocess_exec(*args, **kwargs):
        return Stuck()

    monkeypatch.setattr(checkpointer.asyncio, "create_subprocess_exec", create_subprocess_exec)
    monkeypatch.setattr(checkpointer, "KILL_WAIT_S", 0.2)
    log = SimpleNamespace(warning=lambda *args: warnings.append(args[0] % args[1:]))
    helper = checkpointer.HelperCheckpointer(timeout=0.2, log=log)
    suspending = asyncio.ensure_future(helper.suspend(1234, 500, "token"))
    assert await wait_until(lambda: spawned, timeout=5)
    suspending.cancel()
    try:
        await asyncio.wait([suspending], timeout=5)
        assert suspending.cancelled() and spawned[0].killed
    finally:
        suspending.cancel()
    outcome = await asyncio.wait_for(helper.resume(1234), 5)  # past its timeout
    assert not outcome.ok and "did not finish within 0.2 s" in outcome.error and spawned[1].killed
    assert len(warnings) == 2 and "helper 4242 (suspend of pid 1234) has not ended" in warnings[0], warnings


def server_busy(gpuctx, kid: str) -> str | None:
    return gpuctx.server.lifecycle.actions.busy(kid)


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
