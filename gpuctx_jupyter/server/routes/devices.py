"""GET <base>/gpuctx/api/devices: every exposed GPU, who holds what on it, the warm pool."""
from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import AUTH_RESOURCE, GpuctxHandler


class DevicesHandler(GpuctxHandler):
    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self):
        self.finish(self.api.snapshot(await self.api.read()))
