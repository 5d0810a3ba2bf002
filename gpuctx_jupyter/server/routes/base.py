"""What every gpuctx handler shares: the API's state and a 404 for a kernel that does not exist."""
from __future__ import annotations

from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..gpu_api import GpuApi

AUTH_RESOURCE = "gpuctx"  # the GPU view; per-kernel routes use jupyter_server's "kernels"


class GpuctxHandler(APIHandler):
    def initialize(self, api: GpuApi):
        self.api = api

    def kernel_or_404(self, kernel_id: str):
        if kernel_id not in self.kernel_manager:
            raise web.HTTPError(404, f"no kernel {kernel_id!r} on this server (GET /api/kernels lists them)")
        return self.kernel_manager.get_kernel(kernel_id)
