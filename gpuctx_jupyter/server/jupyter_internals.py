"""Everything gpuctx does with jupyter_server's and jupyter_client's private attributes, in one place.

The warm pool hands a kernel started outside the server's kernel manager to that manager, and
swaps one under an existing kernel id on a restart, re-pointing the open websockets. Neither has
a public API, so this module reaches in. It was checked against jupyter_server 2.13–2.21 and
jupyter_client 8.6–8.10; `missing()` names what a newer version no longer has, the server
extension then turns the pool off with one log line, and tests/test_jupyter_internals.py fails
loudly so the next upgrade is noticed.
"""
from __future__ import annotations

import asyncio
import time

CHECKED_AGAINST = "jupyter_server 2.13–2.21, jupyter_client 8.6–8.10"

# The names this module relies on, per class.
_RELIED_ON = {
    "MappingKernelManager": ("_kernels", "_kernel_connections", "_finish_kernel_start", "_initialized_culler",
                             "initialize_culler", "stop_watching_activity", "start_watching_activity",
                             "pre_start_kernel", "cwd_for_path", "new_kernel_id"),
    "ZMQChannelsWebsocketConnection": ("_open_sockets", "create_stream", "nudge", "handle_outgoing_message",
                                       "on_kernel_restarted", "on_restart_failed"),
}


def missing() -> list[str]:
    """The names gpuctx relies on that this jupyter_server no longer has (empty: all there)."""
    from jupyter_server.services.kernels.connection.channels import (
        ZMQChannelsWebsocketConnection,
    )
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

    classes = {"MappingKernelManager": MappingKernelManager,
               "ZMQChannelsWebsocketConnection": ZMQChannelsWebsocketConnection}
    gone = [f"{owner}.{name}" for owner, names in _RELIED_ON.items() for name in names
            if not hasattr(classes[owner], name)]
    try:
        from jupyter_server._tz import utcnow  # noqa: F401
    except ImportError:
        gone.append("jupyter_server._tz.utcnow")
    return gone


def utcnow():
    from jupyter_server._tz import utcnow as now

    return now()


def launch_args(km) -> dict:
    """The arguments a kernel manager was started with; jupyter_client restarts with them."""
    return dict(getattr(km, "_launch_args", None) or {})


def set_launch_args(km, args: dict) -> None:
    km._launch_args = args


def get_registered(mkm, kernel_id: str):
    return mkm._kernels.get(kernel_id)


async def register(mkm, kernel_id: str, km) -> None:
    """Make `km` the server's kernel `kernel_id`, as if the server had started it itself."""
    mkm._kernels[kernel_id] = km
    mkm._kernel_connections.setdefault(kernel_id, 0)
    await mkm._finish_kernel_start(kernel_id)
    if not mkm._initialized_culler:
        mkm.initialize_culler()


def unregister(mkm, kernel_id: str, previous=None) -> None:
    """Undo `register`: put the previous kernel manager back, or forget the id."""
    if previous is None:
        mkm._kernels.pop(kernel_id, None)
    else:
        mkm._kernels[kernel_id] = previous


def open_connections(km) -> list:
    """The websocket connections open on kernel manager `km`."""
    from jupyter_server.services.kernels.connection.channels import (
        ZMQChannelsWebsocketConnection,
    )

    return [c for c in list(ZMQChannelsWebsocketConnection._open_sockets) if c.parent is km]


async def repoint(conn, km) -> None:
    """Move an open websocket connection onto the kernel that replaced its kernel. As on a
    fresh connection, wait until the new IOPub subscription is live (ZMQ drops what a kernel
    publishes before that), then forward the new streams to the websocket."""
    for stream in conn.channels.values():
        if not stream.closed():
            stream.close()
    conn.parent = km
    conn.session.key = km.session.key  # each kernel signs its messages with its own key
    conn.create_stream()
    try:
        await _until_subscribed(conn, km)
    except Exception:  # fall back on jupyter_server's own, slower nudge
        await conn.nudge()
    for stream in conn.channels.values():
        stream.on_recv_stream(conn.handle_outgoing_message)
    conn.multi_kernel_manager.add_restart_callback(conn.kernel_id, conn.on_kernel_restarted)
    conn.multi_kernel_manager.add_restart_callback(conn.kernel_id, conn.on_restart_failed, "dead")
    conn.on_kernel_restarted()  # tell the frontend, as an ordinary restart does


async def _until_subscribed(conn, km, every: float = 0.05, timeout: float = 10.0) -> None:
    """Ask the kernel for kernel_info on a control socket of our own until the connection's new
    IOPub subscription carries a message. jupyter_server's nudge does the same every 0.5 s, which
    would be most of a pooled restart's time; the replies go to the throwaway socket."""
    from zmq.eventloop.zmqstream import ZMQStream

    iopub = conn.channels["iopub"]
    control = km.connect_control()  # jupyter_server's kernel managers wrap it in a stream already
    control = control if isinstance(control, ZMQStream) else ZMQStream(control)
    live = asyncio.get_running_loop().create_future()
    iopub.on_recv(lambda _msg: live.done() or live.set_result(None))
    control.on_recv(lambda _msg: None)
    deadline = time.monotonic() + timeout
    try:
        while not live.done() and time.monotonic() < deadline:
            conn.session.send(control, "kernel_info_request")
            try:
                await asyncio.wait_for(asyncio.shield(live), every)
            except asyncio.TimeoutError:
                pass
    finally:
        iopub.stop_on_recv()
        control.close()
