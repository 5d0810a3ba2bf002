"""Running code in a real ipykernel started through jupyter_client, the way a frontend does."""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field

from jupyter_client.manager import start_new_kernel


@dataclass
class Run:
    """What one executed cell produced, as a frontend sees it."""

    reply: dict
    stdout: str = ""
    stderr: str = ""
    data: list[dict] = field(default_factory=list)  # display_data / execute_result bundles
    error: dict | None = None
    messages: list[dict] = field(default_factory=list)
    seconds: float = 0.0  # request sent -> reply and idle received (when measured)

    def absorb(self, msg: dict) -> None:
        """Add one iopub message of this cell."""
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            if content["name"] == "stdout":
                self.stdout += content["text"]
            else:
                self.stderr += content["text"]
        elif kind in ("display_data", "execute_result"):
            self.data.append(content["data"])
        elif kind == "error":
            self.error = content
            self.stderr += "\n".join(content.get("traceback", []))

    @property
    def text(self) -> str:
        return self.stdout + self.stderr + "".join(d.get("text/plain", "") for d in self.data)

    @property
    def html(self) -> str:
        return "".join(d.get("text/html", "") for d in self.data)


def run(kc, code: str, timeout: float = 60) -> Run:
    msgs: list[dict] = []
    reply = kc.execute_interactive(code, output_hook=msgs.append, timeout=timeout, allow_stdin=False)
    out = Run(reply=reply["content"], messages=msgs)
    for m in msgs:
        out.absorb(m)
    return out


def start(env: dict | None = None, kernel_name: str = "python3", **kwargs):
    import os

    full = dict(os.environ, **(env or {}))
    km, kc = start_new_kernel(kernel_name=kernel_name, env=full, **kwargs)
    return km, kc


def stop(km, kc) -> None:
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def drain(kc) -> None:
    while True:
        try:
            kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            return


def reply_to(kc, msg_id: str, timeout: float = 30, channel: str = "shell") -> dict:
    """The reply to request `msg_id` on `channel` ("shell" or "control"), skipping any other
    reply still queued: on a loaded machine `wait_for_ready` may have sent kernel_info twice and
    left the second reply behind, so the first message read is not always ours."""
    get = kc.get_control_msg if channel == "control" else kc.get_shell_msg
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no {channel} reply to {msg_id} within {timeout:g} s") from None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


async def areply_to(client, msg_id: str, timeout: float = 30, channel: str = "shell") -> dict:
    """`reply_to` for jupyter_client's asyncio clients (a server's kernel manager gives those)."""
    get = client.get_control_msg if channel == "control" else client.get_shell_msg
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = await get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no {channel} reply to {msg_id} within {timeout:g} s") from None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
