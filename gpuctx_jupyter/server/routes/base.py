"""What every gpuctx handler shares: the API's state, a 404 for a kernel that does not exist, and
JSON errors whose message may hold what a client sent (a kernel id, a query argument) without
breaking the log: such values are the HTTPError's arguments, never part of its format (tornado logs
`log_message % args`, and a "%" in a format of the client's making would fail)."""
from __future__ import annotations

import json

from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..gpu_api import GpuApi

AUTH_RESOURCE = "gpuctx"  # the GPU view; per-kernel routes use jupyter_server's "kernels"


def write_json_error(handler, status_code: int, **kwargs) -> None:
    """An error as jupyter_server's API writes it ({"message", "reason"}), the HTTPError's arguments
    put into its message; tornado has logged the error once already (its line, with the reason)."""
    exc = (kwargs.get("exc_info") or (None, None, None))[1]
    if not isinstance(exc, web.HTTPError) or not exc.log_message:
        APIHandler.write_error(handler, status_code, **kwargs)
        return
    message = exc.log_message % exc.args if exc.args else exc.log_message
    handler.set_header("Content-Type", "application/json")
    handler.finish(json.dumps({"message": message, "reason": exc.reason}))


class GpuctxHandler(APIHandler):
    write_error = write_json_error

    def initialize(self, api: GpuApi):
        self.api = api

    def kernel_or_404(self, kernel_id: str):
        if kernel_id not in self.kernel_manager:
            raise web.HTTPError(404, "no kernel %r on this server (GET /api/kernels lists them)", kernel_id)
        return self.kernel_manager.get_kernel(kernel_id)
