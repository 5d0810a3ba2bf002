"""The kernel's answer to "what are you doing on the GPU?", asked over the control channel.

The control channel is answered even while a cell runs, so a server (or a gateway in front of
a remote kernel) learns a busy kernel's device, allocator figures and warm-up state at once.
Message: `gpuctx_request` (empty content) → `gpuctx_reply` with `report()`'s content.
"""
from __future__ import annotations

import os

from ..contract import POOLED, REPLY, REQUEST
from ..core import frameworks as fws


def report(magics) -> dict:
    choice = magics.switcher.choice
    device, default = magics.cell_thread_device or (None, None)
    memory = [f.as_dict() for f in fws.allocator_figures() if f.reserved or f.peak]
    return {
        "status": "ok",
        "pid": os.getpid(),
        "device": choice.ordinal if choice else device,
        "device_source": choice.source if choice else "CUDA's default",
        "default_device": default,
        "cuda_started": [fw.name for fw in fws.loaded() if fw.initialized()],
        "frameworks": {fw.name: fw.loaded() for fw in fws.ALL},
        "memory": memory,
        "warmup": magics.warmer.status.as_dict(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pooled": POOLED in os.environ,  # handed out by the server's warm kernel pool
    }


def register(ip, magics) -> None:
    """Answer `gpuctx_request` on the control channel of the ipykernel running `ip`, if any."""
    kernel = getattr(ip, "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None:
        return

    def handle(stream, ident, parent):
        try:
            content = report(magics)
        except Exception as exc:  # the answer must come, whatever happens
            content = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        kernel.session.send(stream, REPLY, content, parent, ident)

    handlers[REQUEST] = handle


def unregister(ip) -> None:
    handlers = getattr(getattr(ip, "kernel", None), "control_handlers", None)
    if handlers is not None:
        handlers.pop(REQUEST, None)
