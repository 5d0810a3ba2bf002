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

`gpuctx_cells_request` → `gpuctx_cells_reply`: the notebook's code cells as the frontend holds
them, unsaved edits included; the warm-up re-plans from them (warm/typed.py). Answered at once,
with counts only: the warm-up does the work in its own thread, when it is its turn.

Suspend (contract.SUSPEND_PREPARE_REQUEST, SUSPEND_DONE_REQUEST, RESUME_REQUEST) is answered by
the kernel's suspend gate (suspend.py, `state.suspend`); while the kernel is suspended the GPU
question is answered from what it knew before and the release request is refused, so that nothing
touches a GPU library until the kernel is back.
"""
from __future__ import annotations

import os

from ..contract import (
    ADOPT_REPLY,
    ADOPT_REQUEST,
    CELLS_REPLY,
    CELLS_REQUEST,
    RELEASE_REPLY,
    RELEASE_REQUEST,
    REPLY,
    REQUEST,
    RESUME_REPLY,
    RESUME_REQUEST,
    SUSPEND_DONE_REPLY,
    SUSPEND_DONE_REQUEST,
    SUSPEND_PREPARE_REPLY,
    SUSPEND_PREPARE_REQUEST,
)
from ..core import frameworks as fws

# adoption, oom, release and warm.typed are imported when a request needs them: this module is
# loaded with every kernel the server starts, before it answers (readiness).


def report(state) -> dict:
    """The reply's content: what this kernel does on the GPU (`state`: its KernelState)."""
    from . import oom

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
        "pooled": state.pooled is not None,  # handed out by the server's warm kernel pool
        "last_oom": oom.last_oom,  # {time, framework, ordinal, requested} of its last out-of-memory error
    }


def register(ip, state, on_adopt=None) -> None:
    """Answer gpuctx's control-channel requests in the ipykernel running `ip`, if any;
    `on_adopt(previous)` runs once the warm pool has handed this kernel to a notebook."""
    kernel = getattr(ip, "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None:
        return

    def answering(reply_type: str, answer):
        """A control handler that replies `answer(request content)`, or the error as the answer
        (after a failed hand-over the pool stops this standby and starts a fresh kernel)."""
        def handle(stream, ident, parent):
            try:
                content = answer(parent.get("content") or {})
            except Exception as exc:  # the answer must come, whatever happens
                content = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
            try:
                kernel.session.send(stream, reply_type, content, parent, ident)
            except (TypeError, ValueError) as exc:  # content the packer cannot write: say so instead
                kernel.session.send(stream, reply_type, {"status": "error", "message": f"the answer could not be "
                                                         f"sent: {type(exc).__name__}: {exc}"}, parent, ident)
        return handle

    def gpu_question(_content):
        gate = state.suspend
        return (gate.answer() if gate is not None else None) or report(state)

    def release_cache(_content):
        if state.suspend is not None and state.suspend.suspended:
            return {"status": "error", "message": "this kernel is suspended: its GPU memory is in host memory, "
                                                  "nothing of it is cached on the GPU"}
        from . import release

        return release.release_memory(ip).as_reply()

    def suspend_step(step):
        def answer(content):
            gate = state.suspend
            if gate is None:  # gpuctx is loaded outside an ipykernel's shell hooks
                return {"status": "refused", "message": "this kernel cannot resume itself (no suspend gate)"}
            return step(gate, content)
        return answer

    def adopt(content):
        from . import adoption

        return adoption.adopt(ip, content, on_adopt)

    def cells(content):
        from .warm import typed

        return typed.accept(state, ip, content)

    handlers[REQUEST] = answering(REPLY, gpu_question)
    handlers[RELEASE_REQUEST] = answering(RELEASE_REPLY, release_cache)
    handlers[ADOPT_REQUEST] = answering(ADOPT_REPLY, adopt)
    handlers[CELLS_REQUEST] = answering(CELLS_REPLY, cells)
    handlers[SUSPEND_PREPARE_REQUEST] = answering(SUSPEND_PREPARE_REPLY, suspend_step(
        lambda gate, content: gate.prepare(str(content.get("token") or ""))))
    handlers[SUSPEND_DONE_REQUEST] = answering(SUSPEND_DONE_REPLY, suspend_step(lambda gate, content: gate.done(content)))
    handlers[RESUME_REQUEST] = answering(RESUME_REPLY, suspend_step(
        lambda gate, _c: gate.resume(by="the server", wait=False)))  # (the control thread must stay free)


def unregister(ip) -> None:
    handlers = getattr(getattr(ip, "kernel", None), "control_handlers", None)
    if handlers is not None:
        for name in (REQUEST, RELEASE_REQUEST, ADOPT_REQUEST, CELLS_REQUEST, SUSPEND_PREPARE_REQUEST, SUSPEND_DONE_REQUEST,
                     RESUME_REQUEST):
            handlers.pop(name, None)
