"""One kernel of this server: GET <base>/gpuctx/api/kernels/<id> (what it does on the GPU, asked
of the kernel itself on its control channel) and POST …/<id>/<action> (interrupt, restart,
shutdown, release of its cached GPU memory). Actions go through the lifecycle's one-action-per-
kernel rule: a second action while one is in flight answers 409, never queues or fails with 500."""
from __future__ import annotations

import time

from jupyter_server.auth.decorator import authorized
from tornado import web

from .. import kernel_query, release
from ..kernel_client import kernel_pid
from ..lifecycle import Busy, Gone
from ..suspend import ACTIONS as SUSPEND  # routes/suspend.py's
from .base import GpuctxHandler

# action -> the kernel manager's method (release is gpuctx's own: the kernel's control channel)
ACTIONS = {"interrupt": "interrupt_kernel", "restart": "restart_kernel", "shutdown": "shutdown_kernel",
           "release": None}


class KernelHandler(GpuctxHandler):
    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str):
        kernel = self.kernel_or_404(kernel_id)
        launched = self.api.launcher.launched.get(kernel_id) if self.api.launcher else None
        if launched is not None and launched.missing:  # left alone: it could not answer, so do not wait
            self.finish({"kernel_id": kernel_id, "status": "no-gpuctx",
                         "reason": f"{launched.missing}: install gpuctx-jupyter there to see this kernel's GPU use"})
            return
        answer = await kernel_query.ask(kernel, self.api.cfg.kernel_query_timeout)
        if answer.get("status") == "ok" and answer.get("pid"):
            self.api.remember_pid(kernel_id, kernel_pid(kernel), answer["pid"])
        self.finish({"kernel_id": kernel_id, **answer})


class KernelActionHandler(GpuctxHandler):
    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str):
        if action not in ACTIONS:
            raise web.HTTPError(400, "unknown action %r: use one of %s", action, ", ".join([*ACTIONS, *SUSPEND]))
        if not self.api.cfg.allow_actions:
            raise web.HTTPError(403, "kernel actions are turned off on this server "
                                     "(c.GpuctxServer.allow_actions = False)")
        kernel = self.kernel_or_404(kernel_id)
        actions = self.api.lifecycle.actions
        if action == "release":
            self.finish(await self._release(kernel_id, kernel, actions))
            return
        try:
            await actions.run(ACTIONS[action], kernel_id, wait=False)  # a restart: until the new kernel answers
        except Busy as exc:  # one action per kernel at a time: say so rather than queue or fail
            raise web.HTTPError(409, "%s", str(exc)) from None
        except Gone:
            raise web.HTTPError(404, "kernel %r was shut down meanwhile", kernel_id) from None
        except web.HTTPError:
            raise
        except Exception as exc:  # the kernel manager's own failure, as a JSON answer
            self.log.error("gpuctx: %s of kernel %s failed: %s: %s", action, kernel_id, type(exc).__name__, exc)
            raise web.HTTPError(500, "%s failed: %s: %s", action, type(exc).__name__, exc) from None
        finally:
            self.api.reported.pop(kernel_id, None)
        self.finish({"status": "ok", "kernel_id": kernel_id, "action": action})

    async def _release(self, kernel_id: str, kernel, actions) -> dict:
        """The kernel's release reply as JSON; 409 while another action is in flight on it."""
        busy = actions.busy(kernel_id)
        if busy:
            raise web.HTTPError(409, f"an action on this kernel is in progress ({busy.replace('_kernel', '')}): "
                                     "try again once it has finished")
        t0 = time.perf_counter()
        answer = await release.release(kernel, self.api.cfg.release_timeout)
        if answer.get("status") == "ok":
            if self.api.holders is not None:
                self.api.holders.forget(kernel_id)  # its figures changed: the next round asks again
            self.log.info("gpuctx: released %s of cached GPU memory in kernel %s in %.2f s (asked through the API)",
                          release.gib(answer.get("released_total")), kernel_id, time.perf_counter() - t0)
        return {"kernel_id": kernel_id, **answer}
