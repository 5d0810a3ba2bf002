"""Asking one kernel what it is doing on the GPU, over its control channel.

The control channel is served on its own thread in ipykernel, so a kernel busy in a cell still
answers; the question goes through a client of our own (kernel_client.request), a ZMQ client for
a local kernel and a websocket client for a kernel behind a gateway. Every outcome is a JSON
answer, never an exception: a kernel that cannot answer is a state to show, not a server error.
"""
from __future__ import annotations

from jupyter_core.utils import ensure_async

from ..contract import REPLY, REQUEST
from . import kernel_client


# What a kernel may answer instead of "ok", passed on as it says: "refused" (it never will, for this
# request), "suspended" (not now: its GPU memory is in host memory until its next cell).
DECLINED = ("refused", "suspended")


async def control(kernel, request: str, reply_type: str, timeout: float, dead: str, content: dict | None = None
                  ) -> dict:
    """Send `request` (with `content`) on the kernel's control channel; the reply's content when it
    is `reply_type` with status ok, else why there is none, as an answer (`dead`: what a dead kernel
    means here). A kernel that declines says so: {"status": "refused" | "suspended", "reason": its sentence}."""
    try:
        alive = getattr(kernel, "execution_state", None) != "dead" and await ensure_async(kernel.is_alive())
    except Exception as exc:  # a gateway's kernel: its manager asks over HTTP, which may fail
        return {"status": "error", "reason": f"could not tell whether the kernel runs: {type(exc).__name__}: {exc}"}
    if not alive:
        return {"status": "dead", "reason": f"the kernel's process is not running: {dead}"}
    try:
        reply = await kernel_client.request(kernel, "control", request, content or {}, timeout)
    except kernel_client.NoReply:
        return {"status": "no-answer",
                "reason": f"the kernel did not answer within {timeout:g} s: it may be busy in a C call, "
                          "or gpuctx is not loaded in it (%load_ext gpuctx)"}
    except Exception as exc:  # the kernel's connection is broken: say so, as an answer
        return {"status": "error", "reason": f"could not reach the kernel: {type(exc).__name__}: {exc}"}
    content = dict(reply.get("content", {}))
    if reply.get("msg_type") == reply_type and content.get("status") in DECLINED:
        return {"status": content["status"], "reason": str(content.get("message") or "the kernel declined")}
    if reply.get("msg_type") != reply_type or content.get("status") != "ok":
        why = content.get("message") or f"unexpected reply {reply.get('msg_type')!r}"
        if reply.get("msg_type") != reply_type:
            why += " (is this kernel's gpuctx older than the server's? restart it)"
        return {"status": "error", "reason": why}
    return content


async def ask(kernel, timeout: float) -> dict:
    """`{"status": "ok", "pid": …, …}` as the kernel answers, or why there is no answer."""
    return await control(kernel, REQUEST, REPLY, timeout, "restart the kernel")
