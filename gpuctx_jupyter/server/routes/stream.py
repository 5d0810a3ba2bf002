"""<base>/gpuctx/api/stream?interval=S[&history=S][&throughput=1]: the devices snapshot pushed over a
websocket: a "hello" message first, the asked span of history (history.py), then a "snapshot" every
`interval` seconds from the process's one sampler."""
from __future__ import annotations

import json
import math
import re

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ...core.sampler import Sample
from ..gpu_api import GpuApi
from .base import AUTH_RESOURCE, write_json_error

_SECONDS = re.compile(r"[0-9]*\.?[0-9]+", re.ASCII)  # 1, 0.5, .5 — never 1_0, 1e3 or other digits


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    auth_resource = AUTH_RESOURCE
    write_error = write_json_error  # refusals before the upgrade are JSON, like the REST API's

    def initialize(self, api: GpuApi):
        self.api = api
        self.subscription: int | None = None
        self.writing = False

    def set_default_headers(self):
        """JupyterHandler's headers (CSP etc.) are for pages, not websockets."""

    @ws_authenticated
    async def get(self, *args, **kwargs):
        if not await ensure_async(self.authorizer.is_authorized(self, self.current_user, "read", AUTH_RESOURCE)):
            raise web.HTTPError(403, f"not authorised to read {AUTH_RESOURCE}")
        self.hello = self._interval()
        await super().get(*args, **kwargs)

    def _interval(self) -> dict:
        cfg, raw = self.api.cfg, self.get_argument("interval", "1.0")
        if not _SECONDS.fullmatch(raw.strip()) or not math.isfinite(float(raw)):  # (400 nines: inf)
            raise web.HTTPError(400, "interval=%r is not a number of seconds: ask for one between %g and %g, "
                                     "e.g. 1 or 0.5", raw, cfg.min_interval, cfg.max_interval)
        asked = float(raw)
        interval = min(max(asked, cfg.min_interval), cfg.max_interval)
        hello = {"type": "hello", "interval": interval, "requested": asked,
                 "min_interval": cfg.min_interval, "max_interval": cfg.max_interval}
        if interval != asked:
            bound = "min_interval" if interval > asked else "max_interval"
            hello["note"] = f"interval {asked:g} s is out of range: clamped to the server's {bound}, {interval:g} s"
        if self.api.history is not None:  # ?history=<seconds>: what the first message will hold
            hello["history"] = self.api.history.asked(self)
        return hello

    def open(self, *args, **kwargs):
        super().open()  # starts the keep-alive pings
        self.set_nodelay(True)  # the hello and the history go out together, not 40 ms apart (server/nodelay.py)
        self.loop = IOLoop.current()
        self.write_message(json.dumps(self.hello))
        if self.api.history is not None:  # the last minutes at once, before the first snapshot
            self.api.history.connect(self)
        self.subscription = self.api.sampler.subscribe(self._on_sample, self.hello["interval"])

    def on_message(self, message):
        """The stream only sends: what a client sends is ignored (no reply, no log)."""

    def _on_sample(self, sample: Sample) -> None:
        """Runs in the sampler thread: hand over to the event loop, which owns the socket."""
        self.loop.add_callback(self._send, sample)

    async def _send(self, sample: Sample) -> None:
        if self.subscription is None:
            return
        if self.writing:  # the client has not taken the last one yet: skip, never queue up
            return
        self.writing = True
        try:
            await self.write_message(self.api.stream_message(sample))
        except (WebSocketClosedError, StreamClosedError):
            self._stop()
        finally:
            self.writing = False

    def on_close(self):
        self._stop()
        if self.ping_callback is not None:
            # WebSocketMixin's keep-alive timer and this handler refer to each other: left as it
            # is, each closed client's handler waits for the next ping and then for a full
            # garbage collection (measured: ~14 kB per client that came and went).
            self.ping_callback.stop()
            self.ping_callback = None

    def _stop(self) -> None:
        if self.subscription is not None:
            self.api.sampler.unsubscribe(self.subscription)
            self.subscription = None
