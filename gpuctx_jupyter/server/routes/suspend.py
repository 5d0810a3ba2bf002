"""POST <base>/gpuctx/api/kernels/<id>/suspend and …/resume: an idle notebook's GPU memory into
host memory and back (suspend.py). The answer says what moved and how long it took; a refusal is a
one-line 4xx {"message"} (403 actions off, 404 unknown kernel, 409 everything else: unavailable
here with the driver's reason, busy, a standby, another action in flight on the kernel)."""
from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .. import suspend
from .base import GpuctxHandler


class SuspendHandler(GpuctxHandler):
    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str):
        if not self.api.cfg.allow_actions:
            raise web.HTTPError(403, "kernel actions are turned off on this server "
                                     "(c.GpuctxServer.allow_actions = False)")
        if self.api.suspend is None or self.api.lifecycle is None:
            raise web.HTTPError(409, "suspend is not set up on this server (see the server's log)")
        try:
            answer = await suspend.run(self.api.lifecycle.actions, action, kernel_id, by="api")
        except suspend.Refused as exc:
            raise web.HTTPError(exc.status, "%s", exc.message) from None
        self.finish({"kernel_id": kernel_id, "action": action, **answer})
