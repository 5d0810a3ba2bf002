"""The GPU API's routes under <base_url>/gpuctx/api/, one module per resource: `devices` (the GPUs
and who holds them), `stream` (the same pushed over a websocket), `history` (the last hour), `kernels`
(one kernel's view and the actions on it), `suspend` (suspend and resume of one kernel), `cells`
(a notebook's cells as they are typed, for its kernel's warm plan) — the last two matched ahead of
the other actions. Every route is authenticated and authorised by jupyter_server's own
machinery."""
from __future__ import annotations

from jupyter_server.utils import url_path_join

from ..gpu_api import GpuApi
from .cells import CellsHandler
from .devices import DevicesHandler
from .history import HistoryHandler
from .kernels import KernelActionHandler, KernelHandler
from .stream import StreamHandler
from .suspend import SuspendHandler

KERNEL = r"(?P<kernel_id>[^/]+)"
ROUTES = [
    ("devices", DevicesHandler),
    ("stream", StreamHandler),
    ("history", HistoryHandler),
    (rf"kernels/{KERNEL}", KernelHandler),
    (rf"kernels/{KERNEL}/(?P<action>suspend|resume)", SuspendHandler),
    (rf"kernels/{KERNEL}/cells", CellsHandler),
    (rf"kernels/{KERNEL}/(?P<action>[^/]+)", KernelActionHandler),
]


def setup(web_app, api: GpuApi) -> None:
    base = url_path_join(web_app.settings["base_url"], "gpuctx", "api")
    web_app.add_handlers(".*$", [(url_path_join(base, path), handler, {"api": api}) for path, handler in ROUTES])
