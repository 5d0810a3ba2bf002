"""Asking one kernel what it is doing on the GPU, over its control channel (kernel_view.py answers).

The control channel is served on its own thread in ipykernel, so a kernel busy in a cell still
answers; the question goes through the server's own kernel client, which is a ZMQ client for a
local kernel and a websocket client for a kernel behind a gateway. Every outcome is a JSON
answer, never an exception: a kernel that cannot answer is a state to show, not a server error.
"""
from __future__ import annotations

import asyncio
from queue import Empty

from jupyter_core.utils import ensure_async

from .kernel_view import REPLY, REQUEST


async def ask(kernel, timeout: float) -> dict:
    """`{"status": "ok", "pid": …, …}` as the kernel answers, or why there is no answer."""
    if getattr(kernel, "execution_state", None) == "dead" or not await ensure_async(kernel.is_alive()):
        return {"status": "dead", "reason": "the kernel's process is not running: restart the kernel"}
    client = kernel.client()
    try:
        # iopub too: a gateway client's one websocket carries the kernel's status broadcasts,
        # and its router thread stops at the first message for a channel that was not started.
        await ensure_async(client.start_channels(shell=False, iopub=True, stdin=False, hb=False, control=True))
        msg = client.session.msg(REQUEST, {})
        # A gateway routes websocket messages by this key; jupyter_server's GatewayKernelClient
        # does not set it, so without it the request would land on the shell channel. ZMQ
        # clients ignore it.
        msg["channel"] = "control"
        client.control_channel.send(msg)
        reply = await _reply_to(client, msg["header"]["msg_id"], timeout)
    except Exception as exc:  # the kernel's connection is broken: say so, as an answer
        return {"status": "error", "reason": f"could not reach the kernel: {type(exc).__name__}: {exc}"}
    finally:
        client.stop_channels()
    if reply is None:
        return {"status": "no-answer",
                "reason": f"the kernel did not answer within {timeout:g} s: it may be busy in a C call, "
                          "or gpuctx is not loaded in it (%load_ext gpuctx)"}
    content = reply.get("content", {})
    if reply.get("msg_type") != REPLY or content.get("status") != "ok":
        return {"status": "error", "reason": content.get("message") or f"unexpected reply {reply.get('msg_type')!r}"}
    return content


async def _reply_to(client, msg_id: str, timeout: float) -> dict | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (left := deadline - loop.time()) > 0:
        try:
            msg = await asyncio.wait_for(client.get_control_msg(timeout=left), left + 0.5)
        except (Empty, asyncio.TimeoutError):
            return None
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg
    return None
