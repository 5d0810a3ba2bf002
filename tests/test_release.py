"""Releasing cached GPU memory without losing work, against real kernels (no GPU here, so the
frameworks have nothing cached: what is checked is the path — the control-channel request and its
reply, the failed cell's references dropped, the notebook's variables kept — and the server side:
the release route's logic, the holders round with the kernels' own answers, automatic release on
memory pressure and culling of idle GPU holders, driven by NVML records that list the real kernel's
PID and by a fake clock)."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from tornado.httpclient import HTTPClientError

from gpuctx_jupyter import contract
from gpuctx_jupyter.contract import RELEASE_REPLY, RELEASE_REQUEST
from gpuctx_jupyter.contract.holders import HOLDERS, Holder, read_holders
from gpuctx_jupyter.core.devices import GpuProcess, Visibility, VisibleDevice
from gpuctx_jupyter.core.inventory import Inventory
from gpuctx_jupyter.server import extension
from gpuctx_jupyter.server import release, snapshot
from gpuctx_jupyter.server.culling import GpuCuller
from gpuctx_jupyter.server.holders import Holders
from gpuctx_jupyter.server.release import PressureRelease

from .harness.gpus import h200
from .harness.kernels import held_cell, reply_to, run

pytest_plugins = ["pytest_jupyter.jupyter_server"]
GIB = 2**30

FAIL_IN_A_FUNCTION = """
import gc, sys, weakref
keep = [1, 2, 3]                      # the notebook's own variable: must survive
class Big: pass
refs = []
def step():
    local_big = Big()                 # only the failed call's frame keeps this alive
    refs.append(weakref.ref(local_big))
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
for _ in range(10):                   # garbage in cycles, for gc to collect
    a = []; a.append(a)
del a
step()
"""


def ask_release(kc, timeout: float = 30) -> dict:
    msg = kc.session.msg(RELEASE_REQUEST, {})
    kc.control_channel.send(msg)
    return reply_to(kc, msg["header"]["msg_id"], timeout, channel="control")


def test_the_kernel_releases_over_its_control_channel_and_keeps_the_notebooks_variables(loaded_kernel):
    _, kc = loaded_kernel
    r = run(kc, FAIL_IN_A_FUNCTION)
    assert r.reply["status"] == "error"
    assert "gpuctx: torch ran out of GPU memory" in r.stderr or "gpuctx: torch ran out" in r.stderr
    r = run(kc, "print(hasattr(sys, 'last_value'), refs[0]() is not None)")
    assert r.stdout.split() == ["True", "True"]  # the failure keeps the local object alive
    reply = ask_release(kc)
    assert reply["msg_type"] == RELEASE_REPLY
    content = reply["content"]
    assert content["status"] == "ok" and content["pid"] > 0
    assert "sys.last_value" in content["cleared"] and "sys.last_traceback" in content["cleared"]
    assert any("frame(s) of the failed call" in c for c in content["cleared"])
    assert content["no_gpu"] == "no GPU framework is imported in this kernel" and content["released_total"] == 0
    r = run(kc, "print(keep, hasattr(sys, 'last_value'), refs[0]() is None, Big.__name__)")
    assert r.stdout.split() == ["[1,", "2,", "3]", "False", "True", "Big"]


def test_the_release_is_answered_while_a_cell_runs(loaded_kernel, tmp_path):
    _, kc = loaded_kernel
    release = tmp_path / "release"
    msg_id = held_cell(kc, release)  # runs until released: the answer cannot wait for it to end
    reply = ask_release(kc)
    assert reply["content"]["status"] == "ok"
    release.write_text("go")
    assert reply_to(kc, msg_id, 30)["content"]["status"] == "ok"
    assert run(kc, "print(done)").stdout.strip() == "True"


def test_gpu_free_runs_the_same_release(loaded_kernel):
    _, kc = loaded_kernel
    run(kc, FAIL_IN_A_FUNCTION)
    r = run(kc, "%gpu free")
    assert r.stdout.startswith("gpuctx: nothing to free on a GPU: no GPU framework is imported in this kernel "
                               "(gc collected")
    assert "dropped" in r.stdout and "sys.last_value" in r.stdout
    assert run(kc, "print(keep)").stdout.strip() == "[1, 2, 3]"


# -- the server side, against real kernels -----------------------------------------------------------
async def test_the_server_asks_a_real_kernel_to_release_through_an_async_kernel_manager():
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel(extra_arguments=["--ext=gpuctx"])
    try:
        answer = await asyncio.wait_for(_until_ok(km), 60)
        assert answer["status"] == "ok" and answer["gc_collected"] >= 0 and "round_trip_s" in answer
    finally:
        await km.shutdown_kernel(now=True)
    dead = await release.release(km, 5)
    assert dead["status"] == "dead" and "nothing to release" in dead["reason"]


async def _until_ok(km) -> dict:
    while True:  # the kernel answers once it has loaded gpuctx
        answer = await release.release(km, 2)
        if answer["status"] == "ok":
            return answer
        await asyncio.sleep(0.2)


@pytest.fixture
def jp_server_config():
    return {
        "ServerApp": {"jpserver_extensions": {"gpuctx_jupyter": True}, "allow_unauthenticated_access": False},
        "MappingKernelManager": {"default_kernel_name": "python3"},
        "GpuctxServer": {"warm_policy": "auto", "kernel_query_timeout": 10.0},  # a loaded machine answers late
    }


@pytest.fixture
def wired(jp_serverapp):
    """The holders of the extension the server loaded."""
    return extension.of(jp_serverapp).holders


async def _start_kernel(jp_fetch, path: str) -> str:
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    return json.loads(r.body)["kernel"]["id"]


async def _ready(jp_serverapp, kid: str) -> None:
    from gpuctx_jupyter.server import kernel_query

    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    for _ in range(200):
        if (await kernel_query.ask(kernel, 2))["status"] == "ok":
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the kernel never answered the GPU question")


async def test_the_release_route_answers_with_the_kernels_reply_and_4xx_json_for_bad_requests(
        jp_fetch, jp_serverapp, wired):
    kid = await _start_kernel(jp_fetch, "a.ipynb")
    await _ready(jp_serverapp, kid)
    r = await jp_fetch("gpuctx", "api", "kernels", kid, "release", method="POST", body="")
    answer = json.loads(r.body)
    assert answer["kernel_id"] == kid and answer["status"] == "ok" and "released_total" in answer
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("gpuctx", "api", "kernels", "no-such-kernel", "release", method="POST", body="")
    assert err.value.code == 404 and "no kernel 'no-such-kernel'" in json.loads(err.value.response.body)["message"]
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("gpuctx", "api", "kernels", kid, "release", method="POST", body="",
                       headers={"Authorization": ""})
    assert err.value.code in (401, 403)
    extension.of(jp_serverapp).cfg.allow_actions = False
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("gpuctx", "api", "kernels", kid, "release", method="POST", body="")
    assert err.value.code == 403 and "allow_actions" in json.loads(err.value.response.body)["message"]
    # the kernel was given the holders file and JAX's preallocation off; the API says "no GPU" as before
    env = json.loads((await _run(jp_serverapp, kid, "import os, json; print(json.dumps(dict(os.environ)))")))
    assert env[HOLDERS] == wired.path and env[contract.XLA_PREALLOCATE] == "false"
    snap = json.loads((await jp_fetch("gpuctx", "api", "devices")).body)
    assert snap["gpu"] is False and snap["holders"]["release_below_free_fraction"] == 0.05
    assert RELEASE_REQUEST in jp_serverapp.kernel_manager.untracked_message_types


async def _run(jp_serverapp, kid: str, code: str) -> str:
    kernel = jp_serverapp.kernel_manager.get_kernel(kid)
    client = kernel.client()
    client.start_channels()
    try:
        msg_id = client.execute(code)
        out = ""
        while True:
            msg = await client.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out += msg["content"]["text"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return out
    finally:
        client.stop_channels()


def test_neither_status_nor_a_release_starts_jaxs_gpu_backend(shell, monkeypatch, capsys):
    """Asking JAX for its GPUs starts its backend, which by JAX's defaults takes 75% of every visible
    GPU: `%gpu status`, `%gpu free` and the server's release request (on the control thread) only
    report or give back, so they say the backend has not started rather than start it."""
    import sys
    import types

    from gpuctx_jupyter.kernel.release import release_memory

    asked = []
    jax = types.ModuleType("jax")
    jax.devices = lambda *a: asked.append(a) or []
    jax.config = SimpleNamespace(jax_default_device=None)
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge._backends = {}  # imported, no backend started
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)
    from gpuctx_jupyter.core import frameworks as fws

    shell.run_line_magic("gpu", "status")
    assert "imported; its GPU backend starts at its first use" in capsys.readouterr().out
    release_memory(shell)
    assert asked == []
    bridge._backends = {"cuda": object()}  # started by the notebook's own first use: asked as before
    assert fws.JAX.initialized() and fws.reason_without_starting(fws.JAX) is not None and asked == [("gpu",)]


def test_negative_times_are_refused_at_start_up():
    from traitlets import TraitError

    from gpuctx_jupyter.server.config import GpuctxServer

    with pytest.raises(TraitError, match="release_idle_seconds = -5.0: give 0 .off. or a positive number"):
        GpuctxServer(release_idle_seconds=-5)
    with pytest.raises(TraitError, match="fraction"):
        GpuctxServer(release_below_free_fraction=1.5)


def inventory_with(pid_sizes: dict[int, int], total: int = 140 * GIB, used: int | None = None) -> Inventory:
    """An inventory as NVML would give it with these processes on one GPU (cuda:0)."""
    used = sum(pid_sizes.values()) if used is None else used
    record = replace(h200(0), memory_total=total, memory_used=used,
                     processes=tuple(GpuProcess(pid, size, "compute") for pid, size in pid_sizes.items()))
    return Inventory(records=[record], visibility=Visibility((VisibleDevice(0, record),), None, "FASTEST_FIRST", ()))


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_holders_rounds_write_the_file_annotate_the_api_release_under_pressure_and_cull(
        jp_fetch, jp_serverapp, tmp_path):
    mkm = jp_serverapp.kernel_manager
    # gpuctx's release request is not user activity (the extension's UNTRACKED names it once wired;
    # without it, each release would start a new idle stretch and be repeated every round)
    untracked = [t for t in (RELEASE_REQUEST, RELEASE_REPLY) if t not in mkm.untracked_message_types]
    mkm.untracked_message_types = [*mkm.untracked_message_types, *untracked]
    idle_kid = await _start_kernel(jp_fetch, "idle.ipynb")
    await _ready(jp_serverapp, idle_kid)
    pid = mkm.get_kernel(idle_kid).provisioner.process.pid
    clock = Clock()
    holders = Holders(jp_serverapp, path=str(tmp_path / "holders.json"), clock=clock)
    evicted, culled_ids = [], []
    async def release_kernel(kid):
        return await release.release(mkm.get_kernel(kid), 10)

    pressure = PressureRelease(0.05, 300, 0, release_kernel, evicted.append, clock=clock)

    async def shutdown(kid):
        culled_ids.append(kid)
        await mkm.shutdown_kernel(kid)

    culler = GpuCuller(after=3600, shutdown=shutdown, clock=clock, warning_s=600)
    holders.consumers += [pressure, culler]

    # 1. NVML lists the kernel's process holding 60 GiB; plenty free: the file names the notebook
    busy_gpu = inventory_with({pid: 60 * GIB})
    held, by = await holders.tick(busy_gpu)
    entry = next(h for h in held if h.id == idle_kid)
    assert entry.paths == ("idle.ipynb",) and pid in entry.pids and by[idle_kid] == {0: 60 * GIB}
    assert entry.memory_time is not None  # the kernel was asked for its allocator figures
    parsed, _ = read_holders({HOLDERS: holders.path})
    assert [k.paths for k in parsed.kernels if k.id == idle_kid] == [("idle.ipynb",)]
    assert evicted == [] and pressure.history == [] and culled_ids == []
    snap = holders.annotate(snapshot.build(busy_gpu, clock(), (), lambda: snapshot.list_kernels(jp_serverapp, {})),
                            idle_after=600, cull_at=culler.cull_at, cull_warning_s=600)
    kernel = snap["devices"][0]["processes"][0]["kernel"]
    assert kernel["id"] == idle_kid and kernel["idle_holder"] is False and kernel["idle_s"] < 600
    assert kernel["cull_at"] == pytest.approx(entry.last_activity + 3600, abs=1) and kernel["cull_warning"] is False

    # 2. most of an hour later the GPU is short of memory: standbys go first, then the idle
    # kernel's cache
    clock.now = entry.last_activity + 3100
    short = inventory_with({pid: 60 * GIB}, used=137 * GIB)
    before = next(h for h in (await holders.tick(short))[0] if h.id == idle_kid)
    await pressure.background.drain()  # the release runs beside the round, not in it
    assert evicted == [0]
    assert [(e["kernel_id"], e["status"]) for e in pressure.history] == [(idle_kid, "ok")]
    assert "less than 5% free" in pressure.history[0]["why"]
    entry = next(h for h in (await holders.tick(short))[0] if h.id == idle_kid)
    await pressure.background.drain()
    # the same idle stretch: not released again. (The server may record one late start-up message
    # as activity, ipykernel 7's greeting of its iopub subscriber, which comes late on a loaded
    # machine: then a new stretch has begun, and with this clock an hour ahead it is long idle.)
    assert len(pressure.history) == (1 if entry.last_activity == before.last_activity else 2)
    snap = holders.annotate(snapshot.build(short, clock(), (), lambda: snapshot.list_kernels(jp_serverapp, {})),
                            idle_after=600, cull_at=culler.cull_at, cull_warning_s=600)
    kernel = snap["devices"][0]["processes"][0]["kernel"]
    assert kernel["idle_holder"] is True and kernel["cull_warning"] is True  # < 10 min left: the panel warns
    assert snap["devices"][0]["idle_held"] == 60 * GIB

    # 3. past the culling time: the kernel is shut down, once, and its holders entry goes
    clock.now = entry.last_activity + 3660
    await holders.tick(short)
    await culler.background.drain()
    assert culled_ids == [idle_kid] and idle_kid not in mkm
    assert culler.culled[0]["freed"] == 60 * GIB and culler.culled[0]["label"] == "idle.ipynb"
    holders.remove()


async def test_a_busy_kernel_is_never_culled_and_culling_off_sets_no_times():
    clock = Clock()
    h = Holder("k1", paths=("x.ipynb",), pids=frozenset({1}), execution_state="busy",
                        last_activity=clock.now - 10_000)
    gone = []
    culler = GpuCuller(after=60, shutdown=gone.append, clock=clock)
    await culler(Inventory(), [h], {"k1": {0: GIB}})
    assert gone == [] and culler.cull_at == {"k1": clock.now + 60}
    off = GpuCuller(after=0, shutdown=gone.append, clock=clock)
    assert await off(Inventory(), [replace(h, execution_state="idle")], {"k1": {0: GIB}}) == [] and off.cull_at == {}
    with pytest.raises(ValueError):
        GpuCuller(after=-1, shutdown=gone.append)


def test_the_api_names_a_gpus_last_out_of_memory_error_for_the_panel_to_highlight_its_holders():
    clock = Clock()
    app = SimpleNamespace(runtime_dir="/nonexistent", base_url="/", log=None, kernel_manager=None)
    h = Holders(app, clock=clock)
    victim = Holder("k-oom", paths=("train.ipynb",), pids=frozenset({11}), execution_state="idle",
                             last_activity=clock.now - 5)
    holder = Holder("k-idle", paths=("idle.ipynb",), pids=frozenset({22}), execution_state="idle",
                             last_activity=clock.now - 4000,
                             memory=({"framework": "torch", "ordinal": 0, "allocated": 0, "reserved": 60 * GIB},))
    h.latest = ([victim, holder], {"k-oom": {0: GIB}, "k-idle": {0: 61 * GIB}})
    h.remember("k-oom", 11, {"status": "ok", "memory": [], "last_oom": {"time": clock.now - 2, "framework": "torch",
                                                                         "ordinal": 0, "requested": 40 * GIB}})
    inv = inventory_with({11: GIB, 22: 61 * GIB})
    snap = h.annotate(snapshot.build(inv, clock(), ()), idle_after=600)
    device = snap["devices"][0]
    assert device["oom"] == {"kernel_id": "k-oom", "paths": ["train.ipynb"], "time": clock.now - 2,
                             "framework": "torch", "requested": 40 * GIB}
    clock.now += 301
    assert h.annotate(snapshot.build(inv, clock(), ()), idle_after=600)["devices"][0]["oom"] is None


def test_pool_standbys_get_the_same_environment_and_are_still_adopted(pool_server, tmp_path):
    """The holders file's path and JAX's preallocation switch are CUDA start-up variables for the
    pool: a standby started without them could never serve a kernel that has them."""
    import psutil

    from .harness.notebooks import notebook
    from .harness.waiting import wait_for

    notebook(tmp_path / "train.ipynb", "import torch")
    srv = pool_server()
    wait_for(lambda: srv.api("GET", "/gpuctx/api/devices")[1]["pool"]["kernelspecs"]["python3"]["ready"], timeout=120)
    standbys = {c.pid for c in psutil.Process(srv.proc.pid).children(recursive=True)}
    kid = srv.start_kernel(path="train.ipynb")
    ks = srv.channels(kid)
    r = ks.execute("import os, json; print(json.dumps([os.getpid(), os.environ.get('GPUCTX_HOLDERS'), "
                   "os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')]))")
    pid, holders_file, prealloc = json.loads(r.stdout)
    ks.close()
    assert pid in standbys, srv.log()[-3000:]  # adopted, not refused for a differing variable
    assert holders_file.endswith(f"gpuctx-holders-{srv.proc.pid}.json") and prealloc == "false"


async def test_automatic_release_idle_after_and_after_an_out_of_memory_error():
    clock = Clock()
    asked = []

    async def release_kernel(kid):
        asked.append(kid)
        return {"status": "ok", "released_total": GIB}

    idle = Holder("k1", paths=("a.ipynb",), pids=frozenset({1}), execution_state="idle",
                           last_activity=clock.now - 4000)
    small = Holder("k2", paths=("b.ipynb",), pids=frozenset({2}), execution_state="idle",
                            last_activity=clock.now - 4000,
                            memory=({"framework": "torch", "ordinal": 0, "allocated": GIB, "reserved": GIB},))
    held = {"k1": {0: 10 * GIB}, "k2": {0: 2 * GIB}}
    roomy = inventory_with({1: 10 * GIB, 2: 2 * GIB})
    timed = PressureRelease(0.05, 300, 3600, release_kernel, clock=clock)
    assert await timed(roomy, [idle, small], held) == ["k1"]  # k2 caches nothing: not asked
    await timed.background.drain()
    assert asked == ["k1"] and "release_idle_after=3600" in timed.history[0]["why"]
    assert await timed(roomy, [idle, small], held) == []  # once per idle stretch
    oom = {0: False}
    pressured = PressureRelease(0.05, 300, 0, release_kernel, clock=clock, recent_oom=lambda o: oom[o])
    asked.clear()
    assert await pressured(roomy, [idle], held) == []
    oom[0] = True
    assert await pressured(roomy, [idle], held) == ["k1"]
    await pressured.background.drain()
    assert asked == ["k1"] and pressured.history[0]["why"] == "a notebook ran out of memory on cuda:0"
    # pressure_action = "suspend": what runs short is suspended; release_idle_after still only releases
    suspended = []

    async def suspend_kernel(kid):
        suspended.append(kid)
        return {"status": "ok", "released_total": 10 * GIB}

    asked.clear()
    both = PressureRelease(0.05, 300, 3600, suspend_kernel, clock=clock, action="suspend",
                           idle_release=release_kernel)
    assert await both(roomy, [idle], held) == ["k1"]
    await both.background.drain()
    assert (asked, suspended) == (["k1"], []) and both.history[0]["action"] == "release"
    clock.now += 10  # active again, then idle on a GPU that runs short: suspended
    pressed = replace(idle, last_activity=clock.now - 400)
    short = inventory_with({1: 10 * GIB}, used=135 * GIB)  # < 5% of the GPU free
    assert await both(short, [pressed], held) == ["k1"]
    await both.background.drain()
    assert suspended == ["k1"] and both.history[-1]["action"] == "suspend"


class Log:
    """The lines a consumer logs, as text."""

    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def info(self, fmt, *args):
        self.lines.append(("info", fmt % args))

    def warning(self, fmt, *args):
        self.lines.append(("warning", fmt % args))


async def test_a_release_that_fails_is_an_answer_and_the_others_are_released_all_the_same():
    """A kernel shut down between the holders round and its release (the kernel manager's KeyError)
    is one "error" entry and one log line; the round's other kernels are released."""
    clock, asked, log = Clock(), [], Log()

    async def release_kernel(kid):
        asked.append(kid)
        if kid == "gone":
            raise KeyError(kid)
        return {"status": "ok", "released_total": GIB}

    holders = [Holder(kid, paths=(f"{kid}.ipynb",), pids=frozenset({pid}), execution_state="idle",
                      last_activity=clock.now - 4000) for kid, pid in (("gone", 1), ("k2", 2))]
    short = inventory_with({1: 10 * GIB, 2: 10 * GIB}, used=137 * GIB)
    pressure = PressureRelease(0.05, 300, 0, release_kernel, clock=clock, log=log)
    assert await pressure(short, holders, {"gone": {0: 10 * GIB}, "k2": {0: 10 * GIB}}) == ["gone", "k2"]
    await pressure.background.drain()
    assert sorted(asked) == ["gone", "k2"]
    assert sorted((e["kernel_id"], e["status"], e["reason"]) for e in pressure.history) == [
        ("gone", "error", "KeyError: 'gone'"), ("k2", "ok", None)]
    assert [text for level, text in log.lines if level == "warning"] == [
        "gpuctx: could not release the cache of gone.ipynb (kernel gone): KeyError: 'gone'"]


async def test_a_culling_action_in_flight_is_not_started_twice_and_the_round_goes_on():
    """Culling's shutdown (or suspend) runs beside the round: a round returns while it is in
    flight, and a later round starts no second one for the same kernel."""
    clock, calls, go = Clock(), [], asyncio.Event()

    async def shutdown(kid):
        calls.append(kid)
        await go.wait()

    h = Holder("k1", paths=("x.ipynb",), pids=frozenset({1}), execution_state="idle", last_activity=clock.now - 4000)
    culler = GpuCuller(after=60, shutdown=shutdown, clock=clock)
    assert await asyncio.wait_for(culler(Inventory(), [h], {"k1": {0: GIB}}), 5) == ["k1"]
    assert await asyncio.wait_for(culler(Inventory(), [h], {"k1": {0: GIB}}), 5) == []
    go.set()
    await culler.background.drain()
    assert calls == ["k1"] and [c["kernel_id"] for c in culler.culled] == ["k1"]
