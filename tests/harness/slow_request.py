"""A jupyter_server extension for tests: `GET /slow-request` blocks one of anyio's worker threads
until the file named by `?until=` exists, as jupyter_server's own file and nbconvert requests spend
their blocking part in those threads. It logs when its thread begins."""
from __future__ import annotations

import os
import time

import anyio
from jupyter_server.base.handlers import JupyterHandler
from tornado import web


def _wait_for(path: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


class SlowHandler(JupyterHandler):
    @web.authenticated
    async def get(self):
        until = self.get_argument("until")
        self.log.info("slow request: a worker thread waits for %s", until)
        await anyio.to_thread.run_sync(_wait_for, until)
        self.finish("done")


def _jupyter_server_extension_points():
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp):
    serverapp.web_app.add_handlers(".*$", [(serverapp.base_url + "slow-request", SlowHandler)])
