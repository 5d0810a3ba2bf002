"""The server's GPU API on a real GPU (marked `gpu`): kernels started through a real
jupyter_server hold real GPU memory, and the API, /metrics and each kernel's monitor name the
right notebook on the right GPU."""
from __future__ import annotations

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .harness.server import Server

pytestmark = pytest.mark.gpu
GIB = 1024**3
COMMON = ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
          "--MappingKernelManager.default_kernel_name=python3"]


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.fixture
def server(tmp_path, request):
    srv = Server(str(tmp_path), [*COMMON, *getattr(request, "param", [])]).start(timeout=120)
    yield srv
    srv.stop()


def notebook_kernel(srv: Server, path: str):
    with open(f"{srv.root}/{path}", "w") as fh:
        json.dump({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, fh)
    kid = srv.start_kernel(path=path)
    ks = srv.channels(kid)
    ks.wait_ready(120)
    return kid, ks


def hold(ks, gib: int) -> dict:
    """Allocate `gib` GiB with torch on the kernel's current device; returns pid and device."""
    r = ks.execute(f"import os, json, torch\nx = torch.ones({gib} * 2**28, device='cuda')\n"
                   "print(json.dumps({'pid': os.getpid(), 'device': torch.cuda.current_device()}))")
    assert r.reply["status"] == "ok", r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def processes_of(srv: Server, kernel_id: str, within: float = 30) -> dict[int, dict]:
    """GPU ordinal -> the API's process entry of this kernel, once NVML lists it."""
    deadline = time.monotonic() + within
    while True:
        status, snap = srv.api("GET", "/gpuctx/api/devices")
        assert status == 200 and snap["gpu"], snap
        found = {d["ordinal"]: p for d in snap["devices"] for p in d["processes"]
                 if p.get("kernel", {}).get("id") == kernel_id}
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def kernel_series(srv: Server) -> list[dict]:
    text = srv.text("/metrics")
    return [{**s.labels, "value": s.value} for fam in text_string_to_metric_families(text)
            if fam.name == "gpuctx_kernel_gpu_memory_bytes" for s in fam.samples]


@pytest.mark.parametrize("server", [["--GpuctxServer.warm_policy=never"]], indirect=True)
def test_a_kernel_holding_gpu_memory_is_attributed_to_its_notebook_and_can_be_stopped(server):
    kid, ks = notebook_kernel(server, "train.ipynb")  # warm_policy=never: the hook leaves it alone
    assert ks.execute("%load_ext gpuctx").reply["status"] == "ok"  # for the per-kernel view below
    held = hold(ks, 2)
    found = processes_of(server, kid)
    assert list(found) == [held["device"]], found
    proc = found[held["device"]]
    assert proc["pid"] == held["pid"] and proc["used_memory"] >= 2 * GIB
    assert proc["kernel"]["paths"] == ["train.ipynb"] and proc["kernel"]["name"] == "python3"

    series = [s for s in kernel_series(server) if s["kernel_id"] == kid]
    assert len(series) == 1 and series[0]["path"] == "train.ipynb" and series[0]["value"] >= 2 * GIB, series
    totals = [s for fam in text_string_to_metric_families(server.text("/metrics"))
              if fam.name == "gpuctx_gpu_memory_total_bytes" for s in fam.samples]
    assert totals and all(s.value > 10 * GIB for s in totals)

    status, view = server.api("GET", f"/gpuctx/api/kernels/{kid}")
    assert status == 200 and view["status"] == "ok" and view["pid"] == held["pid"], view
    assert view["memory"][0]["allocated"] >= 2 * GIB

    ks.close()
    status, _ = server.api("POST", f"/gpuctx/api/kernels/{kid}/shutdown")
    assert status in (200, 204)
    deadline = time.monotonic() + 30
    while processes_of(server, kid, within=0) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_of(server, kid, within=0) == {}, "the kernel's GPU memory was not freed"


@pytest.mark.parametrize("server", [["--GpuctxServer.warm_policy=always",
                                      "--GpuctxServer.assign_devices=round-robin"]], indirect=True)
def test_two_kernels_on_two_gpus_are_attributed_to_their_gpu_and_notebook(server):
    if gpu_count() < 2:
        pytest.skip("needs two GPUs")
    kernels = {}
    for path, gib in (("a.ipynb", 2), ("b.ipynb", 3)):
        kid, ks = notebook_kernel(server, path)
        kernels[path] = (kid, ks, hold(ks, gib), gib)
    devices = {held["device"] for _, _, held, _ in kernels.values()}
    assert devices == {0, 1}, kernels  # round-robin spread them

    for path, (kid, ks, held, gib) in kernels.items():
        found = processes_of(server, kid)
        assert list(found) == [held["device"]], (path, found)  # warm-up warmed its own GPU only
        assert found[held["device"]]["kernel"]["paths"] == [path]
        assert found[held["device"]]["used_memory"] >= gib * GIB
    series = kernel_series(server)
    for path, (kid, _, held, gib) in kernels.items():
        mine = [s for s in series if s["kernel_id"] == kid]
        assert len(mine) == 1 and mine[0]["path"] == path and mine[0]["value"] >= gib * GIB, mine

    # Each kernel's own monitor marks its process on its GPU and on no other.
    for path, (kid, ks, held, gib) in kernels.items():
        r = ks.execute("import time\nm = %gpu monitor --interval 0.2\ntime.sleep(1.5)\n"
                       "print(json.dumps({t.split(' ')[0]: c.procs.value for c in m.cards.values() "
                       "for t in [c.title.value.replace('<b>', '')]}))\nm.close()")
        assert r.reply["status"] == "ok", r.stderr
        cards = json.loads(r.stdout.strip().splitlines()[-1])
        assert set(cards) == {"cuda:0", "cuda:1"}, cards
        marked = [t for t, procs in cards.items() if "◀ this kernel" in procs]
        assert marked == [f"cuda:{held['device']}"], (path, cards)
    for _, ks, _, _ in kernels.values():
        ks.close()


def test_a_dashboards_stream_carries_pcie_and_nvlink_throughput_and_the_history_keeps_it(server):
    """What the GPU dashboard draws on a real GPU: link readings in the snapshots of a stream
    that asks for them (`throughput=1`), and in the history a page gets when it connects."""
    import websocket

    ws = websocket.create_connection(f"ws://127.0.0.1:{server.port}/gpuctx/api/stream?interval=1&throughput=1",
                                     header=[f"Authorization: token {server.token}"], timeout=30)
    try:
        deadline, links = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg["type"] == "snapshot" and all("links" in d for d in msg["devices"]) and \
                    any(d["links"].get("nvlink_links") == 0 or d["links"].get("nvlink_tx") is not None
                        for d in msg["devices"]):
                links = [d["links"] for d in msg["devices"]]
                break
        assert links, "no link readings within 60 s"
        assert all(link["pcie_tx"] is not None and link["pcie_rx"] is not None for link in links), links
        assert msg["links_status"]["reason"] is None
        status, history = server.api("GET", "/gpuctx/api/history?seconds=120")
        assert status == 200 and history["links"] and all(h["pcie_tx"] for h in history["links"].values())
        print(json.dumps(links))
    finally:
        ws.close()
