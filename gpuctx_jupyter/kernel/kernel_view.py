"""The kernel's answer to "what are you doing on the GPU?", asked over the control channel.

The control channel is answered even while a cell runs, so a server (or a gateway in front of
a remote kernel) learns a busy kernel's device, allocator figures and warm-up state at once.
Message: `gpuctx_request` (empty content) → `gpuctx_reply` with `report()`'s content.

`gpuctx_adopt_request` → `gpuctx_adopt_reply`: the warm pool hands this kernel (a standby) to a
notebook (adoption.py). Not a cell, so the warm-up and the user's first cell do not see it as one.

`gpuctx_release_request` → `gpuctx_release_reply`: the server's "Release cached memory" action
runs what `%gpu free` runs (release.release_memory: drop the failed cell's references, gc, return the
frameworks' cached blocks) and replies with what went back. It runs on the control thread, also
while a cell runs: see release.py for why that is safe. User variables are never touched.
"""
from __future__ import annotations

import os

from ..contract import ADOPT_REPLY, ADOPT_REQUEST, POOLED, REPLY, REQUEST
from ..contract.holders import RELEASE_REPLY, RELEASE_REQUEST
from ..core import frameworks as fws
from . import adoption, oom, release



def report(state) -> dict:
    """The reply's content: what this kernel does on the GPU (`state`: its KernelState)."""
    choice = state.switcher.choice
    device, default = state.cell_thread_device or (None, None)
    memory = [f.as_dict() for f in fws.allocator_figures() if f.reserved or f.peak]
    warmer = state.warmer
    return {
        "status": "ok",
        "pid": os.getpid(),
        "device": choice.ordinal if choice else device,
        "device_source": choice.source if choice else "CUDA's default",
        "default_device": default,
        "cuda_started": [fw.name for fw in fws.loaded() if fw.initialized()],
        "frameworks": {fw.name: fw.loaded() for fw in fws.ALL},
        "memory": memory,
        "warmup": warmer.status.as_dict(),
        "plan": warmer.plan.as_dict() if warmer.plan else None,  # the notebook's warm plan
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pooled": POOLED in os.environ,  # handed out by the server's warm kernel pool
        "last_oom": oom.last_oom,  # {time, framework, ordinal, requested} of its last out-of-memory error
    }


def register(ip, state, on_adopt=None) -> None:
    """Answer gpuctx's control-channel requests in the ipykernel running `ip`, if any;
    `on_adopt(previous)` runs once the warm pool has handed this kernel to a notebook."""
    kernel = getattr(ip, "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None:
        return

    def handle(stream, ident, parent):
        try:
            content = report(state)
        except Exception as exc:  # the answer must come, whatever happens
            content = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        kernel.session.send(stream, REPLY, content, parent, ident)

    def release_cache(stream, ident, parent):
        try:
            content = release.release_memory(ip).as_reply()
        except Exception as exc:  # the answer must come, whatever happens
            content = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        kernel.session.send(stream, RELEASE_REPLY, content, parent, ident)

    def adopted(stream, ident, parent):
        try:
            content = adoption.adopt(ip, parent.get("content") or {}, on_adopt)
        except Exception as exc:  # the pool then stops this standby and starts a fresh kernel
            content = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        kernel.session.send(stream, ADOPT_REPLY, content, parent, ident)

    handlers[REQUEST] = handle
    handlers[RELEASE_REQUEST] = release_cache
    handlers[ADOPT_REQUEST] = adopted


def unregister(ip) -> None:
    handlers = getattr(getattr(ip, "kernel", None), "control_handlers", None)
    if handlers is not None:
        handlers.pop(REQUEST, None)
        handlers.pop(RELEASE_REQUEST, None)
        handlers.pop(ADOPT_REQUEST, None)
