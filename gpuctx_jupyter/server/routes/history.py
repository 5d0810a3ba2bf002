"""GET <base>/gpuctx/api/history?seconds=<s>: what the stream sends first, for any span the server
keeps (the GPU dashboard asks for an hour when it opens)."""
from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..history import asked_seconds
from .base import AUTH_RESOURCE, GpuctxHandler


class HistoryHandler(GpuctxHandler):
    """GET /gpuctx/api/history?seconds=<s>: what the stream sends first, for any span the server
    keeps (the GPU dashboard asks for an hour when it opens)."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self):
        history = self.api.history
        if history is None:
            raise web.HTTPError(404, "the GPU history is off on this server (c.GpuctxServer.history_seconds = 0)")
        seconds = asked_seconds(self.get_argument("seconds", str(history.seconds)), history.seconds, "seconds")
        self.set_header("Content-Type", "application/json")
        self.finish(history.message(seconds))
