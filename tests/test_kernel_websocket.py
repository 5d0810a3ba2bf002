"""A kernel's websocket sends each message at once (TCP_NODELAY), in a real jupyter_server
(pytest-jupyter runs it in this process) with a real ipykernel behind it: with Nagle's algorithm on,
jupyter_server's default, a cell's reply waited ~40 ms for the browser to acknowledge the cell's
first messages (benchmarks/cell_latency.py). Looked at on the server's own socket for the
connection, which only this process can see; the cell still runs over it, its reply matched by
msg_id."""
from __future__ import annotations

import asyncio
import gc
import json
import socket
import uuid

import pytest
from tornado.iostream import IOStream

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def gpuctx_traits():
    return {}


@pytest.fixture
def jp_server_config(gpuctx_traits):
    return {
        "ServerApp": {"jpserver_extensions": {"gpuctx_jupyter": True}, "allow_unauthenticated_access": False},
        "MappingKernelManager": {"default_kernel_name": "python3"},
        "GpuctxServer": {"warm_policy": "never", "pool_size": 0, **gpuctx_traits},
    }


def server_side(client_ws) -> socket.socket:
    """The server's socket of the connection `client_ws` opened (both ends live in this process)."""
    mine = client_ws.protocol.stream.socket.getsockname()
    for obj in gc.get_objects():
        if isinstance(obj, IOStream) and obj.socket is not None:
            try:
                if obj.socket.getpeername() == mine:
                    return obj.socket
            except OSError:
                continue
    raise AssertionError(f"no server socket connected to {mine}")


def nodelay(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def run_cell(ws, code: str, timeout: float = 60) -> dict:
    """Send one cell as JupyterLab does; its execute_reply (other messages passed by)."""
    msg_id = uuid.uuid4().hex
    await ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "test", "username": "test",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    while True:
        msg = json.loads(await asyncio.wait_for(ws.read_message(), timeout))
        if msg["msg_type"] == "execute_reply" and msg["parent_header"].get("msg_id") == msg_id:
            return msg


async def open_kernel(jp_fetch, jp_ws_fetch):
    kernel_id = json.loads((await jp_fetch("api", "kernels", method="POST",
                                           body=json.dumps({"name": "python3"}))).body)["id"]
    return await jp_ws_fetch("api", "kernels", kernel_id, "channels", params={"session_id": "test"})


async def test_a_kernels_websocket_sends_at_once_and_cells_run_over_it(jp_fetch, jp_ws_fetch):
    ws = await open_kernel(jp_fetch, jp_ws_fetch)
    try:
        assert nodelay(server_side(ws)), "the server holds small messages back (Nagle's algorithm is on)"
        replies = [await run_cell(ws, f"x = {i} * 2\nx") for i in range(3)]  # back to back, as Run All sends
        assert [r["content"]["status"] for r in replies] == ["ok"] * 3
        assert [r["content"]["execution_count"] for r in replies] == [1, 2, 3]
    finally:
        ws.close()


@pytest.mark.parametrize("gpuctx_traits", [{"kernel_websocket_nodelay": False}])
async def test_the_setting_off_leaves_the_websocket_as_jupyter_server_has_it(jp_fetch, jp_ws_fetch):
    ws = await open_kernel(jp_fetch, jp_ws_fetch)
    try:
        assert not nodelay(server_side(ws))
        assert (await run_cell(ws, "1 + 1"))["content"]["status"] == "ok"
    finally:
        ws.close()


async def test_the_gpu_stream_sends_at_once(jp_ws_fetch):
    ws = await jp_ws_fetch("gpuctx", "api", "stream", params={"interval": "1"})
    try:
        json.loads(await asyncio.wait_for(ws.read_message(), 10))  # its hello: the stream is open
        assert nodelay(server_side(ws))
    finally:
        ws.close()
