"""The server's GPU API in a real jupyter_server (pytest-jupyter runs it in this process) with real
ipykernel kernels started through it. No GPU here: NVML is unavailable, so the no-GPU answers are
tested as they are, and attribution is tested by making NVML (the driver's library, not ours)
report an H200 whose process list holds a real kernel's PID."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import HTTPClientError

from gpuctx_jupyter.core import nvml
from gpuctx_jupyter.server import extension
from gpuctx_jupyter.core.sampler import process_sampler

from .harness.gpus import GIB, h200
from .harness.kernels import areply_to
from .harness.waiting import wait_until

pytest_plugins = ["pytest_jupyter.jupyter_server"]

NO_AUTH = {"Authorization": ""}


@pytest.fixture
def gpuctx_traits():
    """c.GpuctxServer settings for one test; override with @pytest.mark.parametrize."""
    return {}


@pytest.fixture
def server_traits():
    """c.ServerApp settings for one test; override with @pytest.mark.parametrize."""
    return {}


@pytest.fixture
def jp_server_config(gpuctx_traits, server_traits):
    return {
        "ServerApp": {"jpserver_extensions": {"gpuctx_jupyter": True}, "allow_unauthenticated_access": False,
                      **server_traits},
        "MappingKernelManager": {"default_kernel_name": "python3"},
        "GpuctxServer": {"warm_policy": "auto", "kernel_query_timeout": 1.0, **gpuctx_traits},
    }


async def get_json(jp_fetch, *parts, **kwargs):
    response = await jp_fetch(*parts, **kwargs)
    return json.loads(response.body)


async def refused(fetch, *parts, **kwargs) -> tuple[int, dict]:
    """The status and JSON body of a request that must fail."""
    with pytest.raises(HTTPClientError) as err:
        await fetch(*parts, **kwargs)
    return err.value.code, json.loads(err.value.response.body)


async def start_kernel(jp_fetch, path: str | None = None) -> str:
    if path is None:
        return (await get_json(jp_fetch, "api", "kernels", method="POST", body=json.dumps({"name": "python3"})))["id"]
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
    return (await get_json(jp_fetch, "api", "sessions", method="POST", body=json.dumps(body)))["kernel"]["id"]


def kernel_pid(serverapp, kernel_id: str) -> int:
    return serverapp.kernel_manager.get_kernel(kernel_id).provisioner.process.pid


async def ask_kernel(jp_fetch, kernel_id: str, want: str = "ok", within: float = 60) -> dict:
    """GET the per-kernel view until it says `want` (a kernel loads gpuctx while it boots)."""
    deadline = time.monotonic() + within
    while True:
        answer = await get_json(jp_fetch, "gpuctx", "api", "kernels", kernel_id)
        if answer["status"] == want or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.2)


async def read_json(ws, timeout: float = 10) -> dict:
    return json.loads(await asyncio.wait_for(ws.read_message(), timeout))


async def scrape(jp_fetch, name: str) -> list[tuple[dict, float]]:
    """The (labels, value) of each series of one metric on the server's /metrics."""
    text = (await jp_fetch("metrics")).body.decode()
    return [(s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


# -- no GPU here: every endpoint answers, and says why -------------------------------------------

async def test_without_a_gpu_the_api_says_why(jp_fetch, jp_ws_fetch):
    snap = await get_json(jp_fetch, "gpuctx", "api", "devices")
    assert snap["gpu"] is False and snap["devices"] == [] and snap["hidden"] == []
    assert snap["reason"].startswith("NVML reports:") and snap["time"] > 0

    ws = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.5"})
    assert (await read_json(ws))["type"] == "hello"
    streamed = await read_json(ws)
    assert streamed["type"] == "snapshot" and streamed["gpu"] is False and streamed["reason"] == snap["reason"]
    ws.close()

    assert await scrape(jp_fetch, "gpuctx_gpu_available") == [({"reason": snap["reason"]}, 0)]
    assert await scrape(jp_fetch, "gpuctx_gpu_utilization_percent") == []  # no per-GPU series without a GPU


# -- authentication --------------------------------------------------------------------------

async def test_every_endpoint_refuses_a_caller_without_a_token(jp_fetch, jp_ws_fetch):
    kid = await start_kernel(jp_fetch)
    for parts, method in [(("gpuctx", "api", "devices"), "GET"), (("gpuctx", "api", "kernels", kid), "GET"),
                          (("gpuctx", "api", "kernels", kid, "interrupt"), "POST"), (("metrics",), "GET")]:
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch(*parts, method=method, headers=NO_AUTH, body=b"" if method == "POST" else None)
        assert err.value.code == 403, parts
    code, body = await refused(jp_ws_fetch, "gpuctx", "api", "stream", headers=NO_AUTH)
    assert code == 403 and "message" in body


# -- the websocket stream -------------------------------------------------------------------

async def test_the_stream_pushes_snapshots_at_the_asked_rate(jp_fetch, jp_ws_fetch):
    ws = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.6"})
    hello = await read_json(ws)
    assert hello == {"type": "hello", "interval": 0.6, "requested": 0.6, "min_interval": 0.5, "max_interval": 60.0,
                     "history": {"seconds": 0.0, "keeps": 3600.0}}
    times = [(await read_json(ws))["time"] for _ in range(3)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(0.5 <= gap < 3 for gap in gaps), gaps  # not faster than asked, and it keeps coming
    ws.close()


async def test_the_stream_clamps_rates_out_of_range_and_refuses_non_numbers(jp_fetch, jp_ws_fetch):
    fast = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.01"})
    hello = await read_json(fast)
    assert hello["interval"] == 0.5 and hello["requested"] == 0.01 and "min_interval" in hello["note"]
    slow = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "3600"})
    hello = await read_json(slow)
    assert hello["interval"] == 60.0 and "max_interval" in hello["note"]
    assert (await read_json(slow))["type"] == "snapshot"  # the first snapshot comes at once
    for bad in ("fast", "nan", "inf", "9" * 400):  # (the last reads as infinity: no JSON could say it)
        code, body = await refused(jp_ws_fetch, "gpuctx", "api", "stream", params={"interval": bad})
        assert code == 400 and "is not a number of seconds" in body["message"], bad
    fast.close()
    slow.close()


async def test_a_kernel_whose_liveness_cannot_be_read_gets_an_answer_not_a_500():
    """A gateway's kernel: its manager asks the gateway whether it runs, over HTTP, which may fail."""
    from gpuctx_jupyter import contract
    from gpuctx_jupyter.server import kernel_query

    class Remote:
        execution_state = "idle"

        async def is_alive(self):
            raise ConnectionError("the gateway did not answer")

    answer = await kernel_query.control(Remote(), contract.REQUEST, contract.REPLY, 1.0, "gone")
    assert answer == {"status": "error",
                      "reason": "could not tell whether the kernel runs: ConnectionError: the gateway did not answer"}


async def test_clients_that_leave_leave_nothing_behind(jp_fetch, jp_ws_fetch):
    sampler = process_sampler()
    clients = [await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.5"}) for _ in range(5)]
    for ws in clients:
        await read_json(ws)  # hello
        await read_json(ws)  # a snapshot: subscribed
    assert sampler.running
    for ws in clients[:4]:
        ws.close()
    clients[4].close()
    assert await wait_until(lambda: not sampler.running), "the sampler kept running without listeners"
    assert sampler.listeners == 0


# -- the GPU history, link throughput and host usage ------------------------------------------------

async def test_a_client_that_connects_gets_the_last_minutes_first(jp_fetch, jp_ws_fetch, monkeypatch):
    monkeypatch.setattr(nvml, "read_records", lambda: [h200(0, used_gib=3)])
    watching = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.5"})
    assert (await read_json(watching))["type"] == "hello"
    seen = [await read_json(watching) for _ in range(7)]  # 3 s of samples: the history keeps 1 a second
    assert {m["type"] for m in seen} == {"snapshot"}  # no history asked for, none sent
    late = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "1", "history": "60"})
    hello = await read_json(late)
    assert hello["history"] == {"seconds": 60.0, "keeps": 3600.0}
    history = await read_json(late)
    assert history["type"] == "history" and history["seconds"] == 60.0 and history["coarse_step"] == 10.0
    (uuid, gpu), = history["gpus"].items()
    assert uuid == h200(0).uuid and len(gpu["t"]) >= 3
    assert gpu["memory_used"][-1] == 3 * GIB and gpu["memory_total"][-1] == 141 * GIB
    assert gpu["t"][-1] <= (await read_json(late))["time"]  # then the snapshots, newer than the history
    # the same for scripts, over REST; and a span that is not a number gets a 400 that says what to ask
    rest = await get_json(jp_fetch, "gpuctx", "api", "history", params={"seconds": "60"})
    assert list(rest["gpus"]) == [uuid] and rest["type"] == "history"
    code, body = await refused(jp_fetch, "gpuctx", "api", "history", params={"seconds": "soon"})
    assert code == 400 and body["message"].startswith("seconds='soon' is not a number of seconds")
    code, body = await refused(jp_ws_fetch, "gpuctx", "api", "stream", params={"history": "all"})
    assert code == 400 and "history='all'" in body["message"]
    watching.close()
    late.close()


@pytest.mark.parametrize("gpuctx_traits", [{"history_seconds": 0}])
async def test_without_history_the_stream_is_as_it_was(jp_fetch, jp_ws_fetch, gpuctx_traits):
    ws = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.5", "history": "60"})
    assert "history" not in await read_json(ws)
    assert (await read_json(ws))["type"] == "snapshot"
    code, body = await refused(jp_fetch, "gpuctx", "api", "history")
    assert code == 404 and "history_seconds = 0" in body["message"]
    ws.close()


async def test_link_throughput_is_read_only_while_a_client_asks_for_it(jp_fetch, jp_ws_fetch, jp_serverapp,
                                                                      monkeypatch):
    from gpuctx_jupyter.core.nvml import LinkCounters

    record = h200(0)
    reads = []

    def counters():
        reads.append(time.monotonic())
        return [LinkCounters(record.uuid, t=time.monotonic(), pcie_tx=2e9, pcie_rx=1e9, nvlink_tx=len(reads) * GIB,
                             nvlink_rx=0, nvlink_links=18)]

    monkeypatch.setattr(nvml, "read_records", lambda: [record])
    monkeypatch.setattr(nvml, "read_link_counters", counters)
    links = extension.of(jp_serverapp).history.links
    plain = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.5"})
    await read_json(plain)
    assert "links" not in (await read_json(plain))["devices"][0]
    await links.round()
    assert reads == []  # nobody asked: NVML's 20 ms PCIe query is never made
    dashboard = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.5", "throughput": "1"})
    assert await wait_until(lambda: reads, timeout=10)  # asked at once, not an interval later
    snap = await read_json(dashboard)
    while snap["type"] != "snapshot" or "links" not in snap["devices"][0]:
        snap = await read_json(dashboard)
    assert snap["devices"][0]["links"]["pcie_tx"] == 2e9 and snap["links_status"] == {"interval": 5.0, "reason": None}
    dashboard.close()
    assert await wait_until(lambda: not links.wanted, timeout=10)
    count = len(reads)
    await links.round()
    assert len(reads) == count  # its client left: no more reads
    plain.close()


async def test_each_kernels_host_memory_and_cpu_are_in_the_snapshot(jp_fetch, jp_ws_fetch):
    kid = await start_kernel(jp_fetch)
    ws = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "0.5"})
    await read_json(ws)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        snap = await read_json(ws)
        usage = (snap.get("host") or {}).get("kernels", {}).get(kid)
        if usage:
            break
    assert usage and usage["memory"] > 10 * 2**20 and usage["processes"] >= 1 and usage["cpu_percent"] >= 0
    host = snap["host"]
    assert host["memory_total"] > host["memory_used"] > 0 and host["cpu_count"] >= 1 and host["interval"] == 2.0
    ws.close()


# -- the per-kernel view ---------------------------------------------------------------------

async def test_a_kernel_with_gpuctx_answers_with_its_pid(jp_fetch, jp_serverapp):
    kid = await start_kernel(jp_fetch)  # policy auto, no notebook: gpuctx loaded, no warm-up
    answer = await ask_kernel(jp_fetch, kid)
    assert answer["status"] == "ok", answer
    assert answer["kernel_id"] == kid and answer["pid"] == kernel_pid(jp_serverapp, kid)
    assert answer["device"] is None and "warmup" in answer


async def test_what_the_server_keeps_per_kernel_goes_with_the_kernel(jp_fetch, jp_serverapp):
    """A long-running server starts and stops many kernels: nothing of theirs stays behind."""
    state = extension.of(jp_serverapp)
    first = await start_kernel(jp_fetch)
    assert (await ask_kernel(jp_fetch, first))["status"] == "ok"
    assert first in state.api.reported and first in state.launcher.launched
    await jp_fetch("api", "kernels", first, method="DELETE")
    second = await start_kernel(jp_fetch)
    assert (await ask_kernel(jp_fetch, second))["status"] == "ok"
    assert set(state.api.reported) == {second} and set(state.launcher.launched) == {second}


@pytest.mark.parametrize("gpuctx_traits", [{"warm_policy": "never"}])
async def test_a_kernel_without_gpuctx_gets_no_answer_within_the_timeout(jp_fetch):
    kid = await start_kernel(jp_fetch)
    t0 = time.monotonic()
    answer = await get_json(jp_fetch, "gpuctx", "api", "kernels", kid)
    assert time.monotonic() - t0 < 5
    assert answer == {"kernel_id": kid, "status": "no-answer",
                      "reason": "the kernel did not answer within 1 s: it may be busy in a C call, "
                                "or gpuctx is not loaded in it (%load_ext gpuctx)"}


async def test_unknown_kernels_and_actions_are_refused_with_a_json_message(jp_fetch):
    code, body = await refused(jp_fetch, "gpuctx", "api", "kernels", "no-such-kernel")
    assert code == 404 and "no kernel 'no-such-kernel'" in body["message"]
    code, body = await refused(jp_fetch, "gpuctx", "api", "kernels", "no-such-kernel", "interrupt", method="POST", body=b"")
    assert code == 404
    kid = await start_kernel(jp_fetch)
    code, body = await refused(jp_fetch, "gpuctx", "api", "kernels", kid, "explode", method="POST", body=b"")
    assert code == 400 and body["message"] == ("unknown action 'explode': use one of interrupt, restart, shutdown, "
                                               "release, suspend, resume")


# -- kernel actions ------------------------------------------------------------------------

async def test_interrupt_stops_a_running_cell(jp_fetch, jp_serverapp):
    kid = await start_kernel(jp_fetch)
    client = jp_serverapp.kernel_manager.get_kernel(kid).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        msg_id = client.execute("import time; print('sleeping', flush=True); time.sleep(30)")
        while True:  # the cell is in its sleep once it has said so
            msg = await client.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                break
        t0 = time.monotonic()
        answer = await get_json(jp_fetch, "gpuctx", "api", "kernels", kid, "interrupt", method="POST", body=b"")
        assert answer == {"status": "ok", "kernel_id": kid, "action": "interrupt"}
        reply = await areply_to(client, msg_id, timeout=20)  # not a leftover kernel_info_reply
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - t0 < 10
    finally:
        client.stop_channels()


async def test_restart_gives_a_new_process_and_shutdown_removes_the_kernel(jp_fetch, jp_serverapp):
    kid = await start_kernel(jp_fetch)
    before = kernel_pid(jp_serverapp, kid)
    await jp_fetch("gpuctx", "api", "kernels", kid, "restart", method="POST", body=b"")
    assert kernel_pid(jp_serverapp, kid) != before
    await jp_fetch("gpuctx", "api", "kernels", kid, "shutdown", method="POST", body=b"")
    assert kid not in [k["id"] for k in await get_json(jp_fetch, "api", "kernels")]
    code, _ = await refused(jp_fetch, "gpuctx", "api", "kernels", kid)
    assert code == 404


async def test_a_second_action_while_one_is_in_flight_gets_409_and_nothing_fails(jp_fetch, jp_serverapp):
    kid = await start_kernel(jp_fetch)
    before = kernel_pid(jp_serverapp, kid)
    action = lambda name: jp_fetch("gpuctx", "api", "kernels", kid, name, method="POST", body=b"",  # noqa: E731
                                   raise_error=False)
    own = lambda: jp_fetch("api", "kernels", kid, "restart", method="POST", body=b"", raise_error=False)  # noqa: E731
    actions = extension.of(jp_serverapp).lifecycle.actions
    first = asyncio.ensure_future(action("restart"))
    assert await wait_until(lambda: actions.busy(kid) or first.done()), "the first restart never began"
    others = await asyncio.gather(action("restart"), action("interrupt"), action("release"), own(), own())
    answers = [await first, *others]
    codes = [a.code for a in answers]
    assert codes[0] == 200 and codes[1:4] == [409, 409, 409] and codes[4:] == [200, 200], codes
    for refusal in answers[1:4]:
        assert json.loads(refusal.body)["message"].startswith("an action on this kernel is in progress (restart)")
    assert kernel_pid(jp_serverapp, kid) != before  # restarted once: jupyter_server's own route joined it
    assert not actions.busy(kid)
    assert (await ask_kernel(jp_fetch, kid))["status"] == "ok"


@pytest.mark.parametrize("gpuctx_traits", [{"allow_actions": False}])
async def test_actions_can_be_turned_off(jp_fetch):
    kid = await start_kernel(jp_fetch)
    for action in ("interrupt", "restart", "shutdown"):
        code, body = await refused(jp_fetch, "gpuctx", "api", "kernels", kid, action, method="POST", body=b"")
        assert code == 403 and "allow_actions = False" in body["message"]
    assert kid in [k["id"] for k in await get_json(jp_fetch, "api", "kernels")]


# -- attribution of a real kernel ------------------------------------------------------------

async def test_gpu_memory_is_attributed_to_the_kernel_and_its_notebook(jp_fetch, jp_serverapp, jp_root_dir, monkeypatch):
    (jp_root_dir / "train.ipynb").write_text(json.dumps(
        {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    kid = await start_kernel(jp_fetch, "train.ipynb")
    pid = kernel_pid(jp_serverapp, kid)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(nvml, "read_records", lambda: [h200(0, used_gib=2, pids=[pid, 999999]), h200(1)])

    snap = await get_json(jp_fetch, "gpuctx", "api", "devices")
    assert snap["gpu"] is True and snap["reason"] is None
    gpu0 = snap["devices"][0]
    assert gpu0["ordinal"] == 0 and gpu0["nvml_index"] == 0 and gpu0["name"] == "NVIDIA H200"
    assert gpu0["memory_total"] == 141 * GIB and gpu0["memory_free"] == 139 * GIB and gpu0["error"] is None
    ours, other = gpu0["processes"]
    assert ours["pid"] == pid and ours["used_memory"] == GIB
    assert ours["kernel"]["id"] == kid and ours["kernel"]["paths"] == ["train.ipynb"]
    assert ours["kernel"]["name"] == "python3" and ours["kernel"]["execution_state"] in ("idle", "busy", "starting")
    assert other == {"pid": 999999, "used_memory": GIB, "kind": "compute"}  # not ours, and no such process

    assert await scrape(jp_fetch, "gpuctx_gpu_available") == [({"reason": ""}, 1)]
    labels = {"gpu": "0", "cuda": "0", "uuid": gpu0["uuid"], "name": "NVIDIA H200"}
    assert (labels, 141 * GIB) in await scrape(jp_fetch, "gpuctx_gpu_memory_total_bytes")
    assert (labels, 100.0) in await scrape(jp_fetch, "gpuctx_gpu_power_watts")
    assert await scrape(jp_fetch, "gpuctx_kernel_gpu_memory_bytes") == [
        ({"kernel_id": kid, "kernel_name": "python3", "path": "train.ipynb", "gpu": "0", "uuid": gpu0["uuid"]}, GIB)]


@pytest.mark.parametrize("server_traits", [{"authenticate_prometheus": False}])
async def test_unauthenticated_metrics_carry_no_kernel_ids_or_paths(jp_fetch, jp_serverapp, jp_root_dir, monkeypatch):
    (jp_root_dir / "secret-project.ipynb").write_text(json.dumps(
        {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    kid = await start_kernel(jp_fetch, "secret-project.ipynb")
    other = await start_kernel(jp_fetch)
    pids = [kernel_pid(jp_serverapp, k) for k in (kid, other)]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(nvml, "read_records", lambda: [h200(0, used_gib=2, pids=pids)])
    text = (await jp_fetch("metrics", headers=NO_AUTH)).body.decode()
    assert kid not in text and "secret-project" not in text
    series = [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
              if s.name == "gpuctx_kernel_gpu_memory_bytes"]
    uuid = h200(0).uuid
    assert series == [({"kernel_name": "python3", "gpu": "0", "uuid": uuid}, 2 * GIB)]  # both kernels, summed


@pytest.mark.parametrize("gpuctx_traits", [{"expose_gpus": ["1", "GPU-nope"]}])
async def test_expose_gpus_and_cuda_visible_devices_choose_what_is_shown(jp_fetch, monkeypatch):
    monkeypatch.setattr(nvml, "read_records", lambda: [h200(0), h200(1), h200(2)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")  # as the server's kernels inherit it
    snap = await get_json(jp_fetch, "gpuctx", "api", "devices")
    assert [(d["ordinal"], d["nvml_index"]) for d in snap["devices"]] == [(1, 0)]  # cuda:1 is nvidia-smi 0
    assert snap["hidden"] == []  # what expose_gpus leaves out is not shown at all
    assert any("'GPU-nope' is ignored" in note for note in snap["notes"])


async def test_gpus_hidden_by_cuda_visible_devices_are_listed_apart(jp_fetch, monkeypatch):
    monkeypatch.setattr(nvml, "read_records", lambda: [h200(0), h200(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    snap = await get_json(jp_fetch, "gpuctx", "api", "devices")
    assert [(d["ordinal"], d["nvml_index"]) for d in snap["devices"]] == [(0, 1)]
    assert [h["nvml_index"] for h in snap["hidden"]] == [0] and "ordinal" not in snap["hidden"][0]


# -- a kernel behind a gateway ---------------------------------------------------------------

def test_a_kernel_behind_a_gateway_answers_through_it(server_factory, kernel_gateway):
    """The question travels over the gateway's websocket (which also carries status broadcasts,
    and routes by each message's channel), before and after gpuctx is loaded in the kernel."""
    srv = server_factory("--GpuctxServer.warm_policy=never", "--GpuctxServer.kernel_query_timeout=10",
                         f"--GatewayClient.url={kernel_gateway}")  # each ask: a websocket, then a round trip
    kid = srv.start_kernel()
    assert srv.api("GET", f"/gpuctx/api/kernels/{kid}")[1]["status"] == "no-answer"
    ks = srv.channels(kid)
    assert ks.execute("%load_ext gpuctx").reply["status"] == "ok"
    for _ in range(3):  # while a client holds the kernel's websocket, and repeatedly
        status, answer = srv.api("GET", f"/gpuctx/api/kernels/{kid}")
        assert status == 200 and answer["status"] == "ok", answer
        assert answer["kernel_id"] == kid and answer["pid"] > 0
    ks.close()


@pytest.mark.parametrize("gpuctx_traits", [{"pool_size": 1, "warm_policy": "always"}])
async def test_a_gpu_short_of_memory_evicts_its_standbys_and_pauses_the_refill(jp_fetch, jp_serverapp):
    """Automatic release under memory pressure calls the pool's evict(ordinal) first: the standby
    warmed on that GPU stops, the pool says why it is empty, and starts no other meanwhile."""
    import psutil

    pool = extension.of(jp_serverapp).pool
    assert await wait_until(lambda: any(s.ready for s in pool.standbys), timeout=120)
    pid = pool.standbys[0].pid
    assert await pool.evict(0) == 1
    assert pool.standbys == []
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    await pool._tick()  # what the pool's maintenance does each second: it must not refill
    assert pool._starting.get(("python3", "gpu"), 0) == 0 and pool.standbys == []
    snap = await get_json(jp_fetch, "gpuctx", "api", "devices")
    spec = snap["pool"]["kernelspecs"]["python3"]
    assert spec["ready"] == 0 and spec["starting"] == 0 and "short of memory" in spec["reason"]
