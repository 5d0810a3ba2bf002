"""Kernel replies without Nagle's wait: TCP_NODELAY on the kernels' websockets.

jupyter_server leaves Nagle's algorithm on for its websockets (tornado's default). A cell's reply
leaves the server a millisecond after the cell's `busy` and `execute_input` messages; with Nagle
on, the reply waits until the browser has acknowledged those, and Linux delays that
acknowledgement by 40 ms unless the connection was idle. So a short cell run right after another
(Run All, Shift+Enter in a row, a frontend's own requests) answered in ~45 ms instead of ~5
(`benchmarks/cell_latency.py`). What a kernel's websocket carries is small messages, each wanted
at once; a flood of output is already batched by the kernel (ipykernel's flush interval) and
rate-limited by the server, so nothing is gained by holding them back.

The seam is jupyter_server's own setting, `ServerApp.kernel_websocket_connection_class`: whatever
class is configured (the ZMQ channels, a gateway's) gets a subclass that turns Nagle off as the
websocket opens and does everything else as before.
"""
from __future__ import annotations

SETTING = "kernel_websocket_connection_class"


def install(settings: dict, log) -> bool:
    """Make the kernels' websockets send at once (True: installed; False: no class to extend, or
    installed already)."""
    base = settings.get(SETTING)
    if not isinstance(base, type) or getattr(base, "_gpuctx_nodelay", False):
        return False
    settings[SETTING] = with_nodelay(base, log)
    return True


def with_nodelay(base: type, log) -> type:
    """`base` whose `connect()` (called by the handler once the websocket is open) first turns
    Nagle's algorithm off on the websocket's TCP connection."""

    def connect(self):
        try:
            self.websocket_handler.set_nodelay(True)
        except Exception as exc:  # (a closed stream, a handler without one): the socket works as before
            log.debug("gpuctx: kernel websocket without TCP_NODELAY: %s", exc)
        return super(cls, self).connect()  # the handler awaits what it returns

    cls = type(base.__name__, (base,), {"connect": connect, "_gpuctx_nodelay": True,
                                        "__module__": __name__, "__doc__": base.__doc__})
    return cls
