"""Running code in a real ipykernel started through jupyter_client, the way a frontend does."""
from __future__ import annotations

import os
import queue
import time
import uuid
from dataclasses import dataclass, field

from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir


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
    in_kernel: float | None = None  # the kernel's own clock: execution started -> reply sent (when measured)
    displays: dict[str, int] = field(default_factory=dict)  # display_id -> its index in `data`

    def absorb(self, msg: dict) -> None:
        """Add one iopub message of this cell."""
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            if content["name"] == "stdout":
                self.stdout += content["text"]
            else:
                self.stderr += content["text"]
        elif kind in ("display_data", "execute_result"):
            display_id = (content.get("transient") or {}).get("display_id")
            if display_id:
                self.displays[display_id] = len(self.data)
            self.data.append(content["data"])
        elif kind == "update_display_data":  # a frontend replaces what that display shows
            index = self.displays.get((content.get("transient") or {}).get("display_id"))
            if index is not None:
                self.data[index] = content["data"]
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


def manager(kernel_name: str = "python3") -> KernelManager:
    """A kernel manager whose kernel listens on Unix sockets in this test process's runtime folder.

    Over TCP, jupyter_client picks free ports and the kernel binds them later: a kernel started
    meanwhile by the other test worker can take one, and the first dies ("Address already in
    use"). The servers under test keep TCP, as users run them."""
    folder = jupyter_runtime_dir()
    os.makedirs(folder, exist_ok=True)
    name = f"kernel-{uuid.uuid4().hex[:12]}-ipc"
    return KernelManager(kernel_name=kernel_name, transport="ipc", ip=os.path.join(folder, name))


def start(env: dict | None = None, kernel_name: str = "python3", **kwargs):
    """A started kernel (its manager) and a client whose channels are ready."""
    full = dict(os.environ, **(env or {}))
    km = manager(kernel_name)
    km.start_kernel(env=full, **kwargs)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
    except RuntimeError:
        stop(km, kc)
        raise
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


def control(kc, msg_type: str, content: dict, timeout: float = 30) -> dict:
    """A request of gpuctx's on the control channel, and its reply's content: it reaches the kernel
    without running a cell (no cell starts, so the warm-up does not pause or step aside for it)."""
    request = kc.session.msg(msg_type, content)
    kc.control_channel.send(request)
    return reply_to(kc, request["header"]["msg_id"], timeout=timeout, channel="control")["content"]


def warm_up_ended(kc, step_prefix: str) -> dict | None:
    """The kernel view (`gpuctx_request`) once its warm-up has stopped running with a step named
    `step_prefix...` in its plan, ended; else None (for wait_for)."""
    view = control(kc, "gpuctx_request", {})
    steps = (view.get("plan") or {}).get("steps", [])
    ended = any(s["name"].startswith(step_prefix) and s["state"] not in ("planned", "running") for s in steps)
    return view if ended and view["warmup"]["state"] != "running" else None


def wait_output(kc, msg_id: str, text: str, timeout: float = 60) -> None:
    """Read the kernel's iopub until the cell `msg_id` has printed `text` (so it is running)."""
    deadline, out = time.monotonic() + timeout, ""
    while text not in out:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"the cell {msg_id} did not print {text!r} within {timeout:g} s") from None
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            out += msg["content"]["text"]


def wait_idle(kc, msg_id: str, timeout: float = 60) -> None:
    """Read the kernel's iopub until it is idle after the request `msg_id`: only then is the
    request done (after an error ipykernel aborts what arrives before that)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"the kernel was not idle after {msg_id} within {timeout:g} s") from None
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            return


def held_cell(kc, release) -> str:
    """Send a cell that runs until the file `release` exists; returns its msg_id once it runs."""
    msg_id = kc.execute(f"import os, time\nprint('held', flush=True)\n"
                        f"while not os.path.exists({str(release)!r}): time.sleep(0.02)\ndone = True")
    wait_output(kc, msg_id, "held")
    return msg_id


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


async def arun(kernel, code: str, timeout: float = 60) -> Run:
    """`run` for a kernel of an in-process server (pytest-jupyter's jp_serverapp): a client of
    its own, the cell's output until the kernel is idle after it."""
    client = kernel.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=timeout)  # iopub subscribed: no output missed (a kernel just restarted)
        msg_id = client.execute(code)
        out = Run(reply={})
        deadline = time.monotonic() + timeout
        while True:
            msg = await client.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                out.reply = (await areply_to(client, msg_id, max(1.0, deadline - time.monotonic())))["content"]
                return out
            out.absorb(msg)
    finally:
        client.stop_channels()
