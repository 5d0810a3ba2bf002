"""One request to a kernel and its reply, from the server; a kernel's process id.

Every message the server sends a kernel (the GPU question, the pool's adoption code, the
gateway's warm-up request) goes through `request`, built so that any number may be in flight
at once:
- each request has a client and a ZMQ identity of its own: clients cloned from the kernel
  manager share its session id, which ZMQ uses as the socket identity, so the kernel's reply to
  one of two concurrent requests would go to the other's socket and be lost;
- the reply is the message whose parent is our request (`msg_id`), never merely the next one;
- the timeout holds for local and gateway kernels alike (a gateway client's own wait is 1 s).
"""
from __future__ import annotations

import asyncio
import uuid
from queue import Empty

from jupyter_core.utils import ensure_async


class NoReply(Exception):
    """The kernel did not answer within the timeout."""


async def request(kernel, channel: str, msg_type: str, content: dict, timeout: float) -> dict:
    """Send `msg_type` on the kernel's `channel` ("control" or "shell") and return its reply.

    Raises NoReply after `timeout` seconds, and the client's own exceptions when the kernel
    cannot be reached at all.
    """
    client = kernel.client()
    client.session.session = str(uuid.uuid4())  # our own identity: see the module's docstring
    try:
        # iopub too: a gateway client's one websocket carries the kernel's status broadcasts, and
        # its router thread stops at the first message for a channel that was not started.
        await ensure_async(client.start_channels(shell=channel == "shell", iopub=True, stdin=False, hb=False,
                                                 control=channel == "control"))
        msg = client.session.msg(msg_type, content)
        # A gateway routes websocket messages by this key; jupyter_server's GatewayKernelClient
        # does not set it, so a control request would land on the shell channel. ZMQ ignores it.
        msg["channel"] = channel
        getattr(client, f"{channel}_channel").send(msg)
        return await _reply_to(client, channel, msg["header"]["msg_id"], timeout)
    finally:
        client.stop_channels()


async def answered(kernel, channel: str, msg_type: str, content: dict, timeout: float,
                   first: float = 1.0, most: float = 8.0) -> dict:
    """`request`, tried again until the kernel answers or `timeout` s pass (NoReply), each try
    waiting twice as long as the one before (`first` up to `most` s): a reply that comes after its
    try gave up is lost with the try's client, and a kernel on a loaded machine may take over a
    second to answer every time."""
    loop = asyncio.get_running_loop()
    deadline, wait = loop.time() + timeout, first
    while (left := deadline - loop.time()) > 0:
        try:
            return await request(kernel, channel, msg_type, content, min(wait, left))
        except NoReply:
            wait = min(most, wait * 2)
    raise NoReply(f"no reply within {timeout:g} s")


async def execute(kernel, code: str, timeout: float) -> dict:
    """Run `code` silently on the kernel's shell channel; the execute_reply's content."""
    reply = await request(kernel, "shell", "execute_request",
                          {"code": code, "silent": True, "store_history": False, "user_expressions": {},
                           "allow_stdin": False, "stop_on_error": False}, timeout)
    return reply.get("content", {})


async def _reply_to(client, channel: str, msg_id: str, timeout: float) -> dict:
    get = getattr(client, f"get_{channel}_msg")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (left := deadline - loop.time()) > 0:
        try:
            msg = await asyncio.wait_for(ensure_async(get(timeout=left)), left + 0.5)
        except (Empty, asyncio.TimeoutError):
            continue  # a client may give up before our deadline: ask again for what is left
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg
    raise NoReply(f"no reply within {timeout:g} s")


def kernel_pid(kernel) -> int | None:
    """The PID of a kernel this server launched (jupyter_client's LocalProvisioner); None for one
    it did not (a gateway kernel) or one whose process is gone."""
    process = getattr(getattr(kernel, "provisioner", None), "process", None)
    return getattr(process, "pid", None)


def find(mkm, kernel_id: str):
    """The server's kernel manager for `kernel_id`, or None when there is no such kernel (jupyter_server
    answers that with an HTTP 404 error, jupyter_client with a KeyError)."""
    if kernel_id not in mkm:
        return None
    try:
        return mkm.get_kernel(kernel_id)
    except Exception:  # noqa: BLE001 — shut down between the two lines
        return None
