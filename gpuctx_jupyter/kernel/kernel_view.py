"""The kernel's answer to "what are you doing on the GPU?", asked over the control channel.

The control channel is answered even while a cell runs, so a server (or a gateway in front of
a remote kernel) learns a busy kernel's device, allocator figures and warm-up state at once.
Message: `gpuctx_request` (empty content) → `gpuctx_reply` with `report()`'s content.

`gpuctx_adopt_request` → `gpuctx_adopt_reply`: the warm pool hands this kernel (a standby) to a
notebook: it moves into the notebook's folder and takes the environment a fresh kernel would have
had. Not a cell, so the warm-up and the user's first cell do not see it as one.

`gpuctx_release_request` → `gpuctx_release_reply`: the server's "Release cached memory" action
runs what `%gpu free` runs (oom.release_memory: drop the failed cell's references, gc, return the
frameworks' cached blocks) and replies with what went back. It runs on the control thread, also
while a cell runs: see oom.py for why that is safe. User variables are never touched.
"""
from __future__ import annotations

import logging
import os

from ..contract import (
    ADOPT_REPLY,
    ADOPT_REQUEST,
    POOLED,
    RELEASE_REPLY,
    RELEASE_REQUEST,
    REPLY,
    REQUEST,
    SESSION,
)
from ..core import frameworks as fws
from . import oom

log = logging.getLogger("gpuctx")


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
        "plan": magics.warmer.plan.as_dict() if magics.warmer.plan else None,  # the notebook's warm plan
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pooled": POOLED in os.environ,  # handed out by the server's warm kernel pool
        "last_oom": oom.last_oom,  # {time, framework, ordinal, requested} of its last out-of-memory error
    }


def adopt(ip, content: dict, then=None) -> dict:
    """Become the kernel of the notebook the warm pool hands this standby to; `then(previous)`
    (the notebook the standby was warmed for, or None) carries on with the new notebook's plan."""
    previous = os.environ.get(SESSION)
    os.chdir(content["cwd"])
    for name, value in (content.get("env") or {}).items():
        if value is None:  # the standby had it (its notebook); the new kernel must not
            os.environ.pop(str(name), None)
        else:
            os.environ[str(name)] = str(value)
    os.environ[POOLED] = str(content.get("pooled", ""))
    if SESSION in os.environ:
        ip.user_ns["__session__"] = os.environ[SESSION]
    else:
        ip.user_ns.pop("__session__", None)
    if then is not None:
        try:  # optional: a failure here must not undo the hand-over
            then(previous)
        except Exception as exc:  # noqa: BLE001
            log.warning("gpuctx: warming the adopting notebook's plan failed to start: %s: %s",
                        type(exc).__name__, exc)
    return {"status": "ok", "cwd": os.getcwd()}


def register(ip, magics, on_adopt=None) -> None:
    """Answer gpuctx's control-channel requests in the ipykernel running `ip`, if any;
    `on_adopt(previous)` runs once the warm pool has handed this kernel to a notebook."""
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

    def release(stream, ident, parent):
        try:
            content = oom.release_memory(ip).as_reply()
        except Exception as exc:  # the answer must come, whatever happens
            content = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        kernel.session.send(stream, RELEASE_REPLY, content, parent, ident)

    def adopted(stream, ident, parent):
        try:
            content = adopt(ip, parent.get("content") or {}, on_adopt)
        except Exception as exc:  # the pool then stops this standby and starts a fresh kernel
            content = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        kernel.session.send(stream, ADOPT_REPLY, content, parent, ident)

    handlers[REQUEST] = handle
    handlers[RELEASE_REQUEST] = release
    handlers[ADOPT_REQUEST] = adopted


def unregister(ip) -> None:
    handlers = getattr(getattr(ip, "kernel", None), "control_handlers", None)
    if handlers is not None:
        handlers.pop(REQUEST, None)
        handlers.pop(RELEASE_REQUEST, None)
        handlers.pop(ADOPT_REQUEST, None)
