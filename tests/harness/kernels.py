"""Running code in a real ipykernel started through jupyter_client, the way a frontend does."""
from __future__ import annotations

import queue
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
