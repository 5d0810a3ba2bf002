"""Everything gpuctx does with jupyter_server's and jupyter_client's private attributes, in one place.

Launching kernels from the warm pool goes through jupyter_client's public provisioner interface
(provisioner.py); what is left has no public API:
- after a restart served by a standby the kernel listens on new ports, and jupyter_server's open
  websocket connections keep talking to the old ones: they are re-pointed here;
- a standby's own kernel manager keeps a control socket to the process the server now owns: it is
  closed here;
- the server's stop skips the kernel manager's `shutdown_all` when no kernel is open
  (`ServerApp.cleanup_kernels` tests the manager's truth, and an empty one has length 0): gpuctx's
  shutdown (the warm pool's standbys, its threads) is then called from here.
Checked against jupyter_server 2.13–2.21 and jupyter_client 8.6–8.10; `missing()` names what a
newer version no longer has, the server extension then turns the pool off with one log line, and
tests/test_architecture.py fails loudly so the next upgrade is noticed.
"""
from __future__ import annotations

import asyncio
import time

from jupyter_core.utils import ensure_async

CHECKED_AGAINST = "jupyter_server 2.13–2.21, jupyter_client 8.6–8.10"

# The names this module relies on, per class.
_RELIED_ON = {
    "ZMQChannelsWebsocketConnection": ("_open_sockets", "create_stream", "nudge", "handle_outgoing_message",
                                       "on_kernel_restarted"),
    "KernelManager": ("_close_control_socket",),
}


def missing() -> list[str]:
    """The names gpuctx relies on that this jupyter_server / jupyter_client no longer has."""
    from jupyter_client.manager import KernelManager
    from jupyter_server.services.kernels.connection.channels import (
        ZMQChannelsWebsocketConnection,
    )

    classes = {"ZMQChannelsWebsocketConnection": ZMQChannelsWebsocketConnection, "KernelManager": KernelManager}
    return [f"{owner}.{name}" for owner, names in _RELIED_ON.items() for name in names
            if not hasattr(classes[owner], name)]


def shutdown_all_at_stop(serverapp) -> bool:
    """Make the server's stop call its kernel manager's `shutdown_all` also when no kernel is open
    (False: this jupyter_server has no `cleanup_kernels` to extend)."""
    own = getattr(serverapp, "cleanup_kernels", None)
    if not callable(own):
        return False

    async def cleanup_kernels():
        km = getattr(serverapp, "kernel_manager", None)
        if km is not None and not km:  # jupyter_server's own then returns at once
            await ensure_async(km.shutdown_all())
        return await own()

    serverapp.cleanup_kernels = cleanup_kernels
    return True


def close_control(km) -> None:
    """Close the control socket a kernel manager keeps to its kernel (the kernel runs on)."""
    km._close_control_socket()


def open_connections(km) -> list:
    """The websocket connections open on kernel manager `km`."""
    from jupyter_server.services.kernels.connection.channels import (
        ZMQChannelsWebsocketConnection,
    )

    return [c for c in list(ZMQChannelsWebsocketConnection._open_sockets) if c.parent is km]


async def repoint_all(km, log) -> None:
    """Move every websocket open on `km` to the ports its kernel listens on now."""
    conns = open_connections(km)
    for conn, result in zip(conns, await asyncio.gather(*(repoint(c, km) for c in conns), return_exceptions=True)):
        if isinstance(result, Exception):  # e.g. a tab closed meanwhile: it reconnects to the new ports
            log.info("gpuctx pool: re-pointing a connection of %s: %s: %s", conn.kernel_id,
                     type(result).__name__, result)


async def repoint(conn, km) -> None:
    """Move an open websocket connection onto its kernel's new ports. As on a fresh connection,
    wait until the new IOPub subscription is live (ZMQ drops what a kernel publishes before that),
    then forward the new streams to the websocket."""
    for stream in conn.channels.values():
        if not stream.closed():
            stream.close()
    conn.session.key = km.session.key  # each kernel process signs its messages with its own key
    conn.create_stream()
    try:
        await _until_subscribed(conn, km)
    except Exception:  # fall back on jupyter_server's own, slower nudge
        await conn.nudge()
    for stream in conn.channels.values():
        stream.on_recv_stream(conn.handle_outgoing_message)
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
