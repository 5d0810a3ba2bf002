"""The server's GPU API: REST and websocket routes under <base_url>/gpuctx/api/, and /metrics series.

Every route is authenticated and authorised by jupyter_server's own machinery. NVML is read in
the process's one sampler thread (or an executor), never on the event loop of a request; the
websocket clients of the server share that sampler and, per tick, one serialised snapshot.

Every read path (REST, stream, /metrics) is as fault-tolerant as the sampler: a read or a snapshot
that fails becomes a snapshot that says why (`gpu: false`, `reason`), logged once per distinct
error, never a 500 or a traceback per tick.
"""
from __future__ import annotations

import asyncio
import json
import math
import time

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..core import inventory
from ..core.sampler import Sample, process_sampler
from . import kernel_query, metrics, snapshot
from .actions import Busy, KernelActions
from .config import GpuctxServer
from .history import HistoryHandler
from .kernel_client import kernel_pid

AUTH_RESOURCE = "gpuctx"  # the GPU view; per-kernel routes use jupyter_server's "kernels"
ACTIONS = {"interrupt": "interrupt_kernel", "restart": "restart_kernel", "shutdown": "shutdown_kernel"}


class GpuApi:
    """What the routes share: settings, the process's sampler, and PIDs kernels reported."""

    def __init__(self, serverapp, cfg: GpuctxServer, replay=None, hook=None, pool=None, actions=None):
        self.serverapp, self.cfg = serverapp, cfg
        self.sampler = process_sampler()
        self.replay = replay  # a trace.Replay: read from it, and label every snapshot
        self._read = replay.read if replay else inventory.take
        self.hook, self.pool = hook, pool
        self.actions = actions or KernelActions(serverapp.kernel_manager)
        self.reported: dict[str, tuple[int | None, int]] = {}  # kernel id -> (local pid, own pid)
        self._message: tuple[Sample | None, str] = (None, "")
        self._logged: set[str] = set()  # errors already logged (each once)
        self.history = None  # the GPU history (history.install), sent to each stream client first

    def log_once(self, what: str, exc: Exception) -> str:
        """`what failed: Type: message`, logged the first time it happens (not at every tick)."""
        line = f"{what} failed: {type(exc).__name__}: {exc}"
        if line not in self._logged and len(self._logged) < 100:
            self._logged.add(line)
            self.serverapp.log.error("gpuctx: %s (logged once)", line)
        return line

    def _take(self) -> inventory.Inventory:
        try:
            return self._read()
        except Exception as exc:  # as the sampler does: show it, keep serving
            return inventory.Inventory(nvml_error=self.log_once("reading the GPUs", exc))

    def remember_pid(self, kernel_id: str, local_pid: int | None, own_pid: int) -> None:
        """Keep the PID a kernel reported; entries of kernels gone meanwhile are dropped here."""
        live = set(self.serverapp.kernel_manager.list_kernel_ids())
        for gone in [k for k in self.reported if k not in live]:
            del self.reported[gone]
        self.reported[kernel_id] = (local_pid, own_pid)

    def _fresh(self) -> Sample | None:
        """The sampler's latest sample if no older than the fastest rate a client may ask for."""
        sample = self.sampler.latest
        return sample if sample and time.time() - sample.t <= self.cfg.min_interval else None

    async def read(self) -> Sample:
        sample = self._fresh()
        if sample is None:
            t = time.time()
            sample = Sample(t, await asyncio.get_running_loop().run_in_executor(None, self._take))
        return sample

    def read_now(self) -> Sample:
        """For /metrics, which jupyter_server serves synchronously: NVML is µs per field."""
        return self._fresh() or Sample(time.time(), self._take())

    def snapshot(self, sample: Sample) -> dict:
        try:
            snap = snapshot.build(sample.inventory, sample.t, self.cfg.expose_gpus,
                                  lambda: snapshot.list_kernels(self.serverapp, self.reported))
        except Exception as exc:  # a record of an unexpected shape: say so, as an answer
            snap = {"gpu": False, "reason": self.log_once("building the GPU snapshot", exc), "time": sample.t,
                    "devices": [], "hidden": [], "notes": []}
        if self.replay is not None:
            snap["replay"] = self.replay.label
        snap["pool"] = self.pool_status()
        return snap

    def pool_status(self) -> dict | None:
        """The warm pool's status (None without a pool); never an exception."""
        if self.pool is None:
            return None
        try:
            return self.pool.status()
        except Exception as exc:
            return {"error": self.log_once("reading the pool's status", exc)}

    def stream_message(self, sample: Sample) -> str:
        """One serialised message per sample, whatever the number of clients."""
        if self._message[0] is not sample:
            self._message = (sample, json.dumps({"type": "snapshot", **self.snapshot(sample)}))
        return self._message[1]


class GpuctxHandler(APIHandler):
    def initialize(self, api: GpuApi):
        self.api = api

    def kernel_or_404(self, kernel_id: str):
        if kernel_id not in self.kernel_manager:
            raise web.HTTPError(404, f"no kernel {kernel_id!r} on this server (GET /api/kernels lists them)")
        return self.kernel_manager.get_kernel(kernel_id)


class DevicesHandler(GpuctxHandler):
    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self):
        self.finish(self.api.snapshot(await self.api.read()))


class KernelHandler(GpuctxHandler):
    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str):
        kernel = self.kernel_or_404(kernel_id)
        missing = self.api.hook.missing.get(kernel_id) if self.api.hook else None
        if missing:  # the hook left it alone: it could not answer, so do not wait for it
            self.finish({"kernel_id": kernel_id, "status": "no-gpuctx",
                         "reason": f"{missing}: install gpuctx-jupyter there to see this kernel's GPU use"})
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
            raise web.HTTPError(400, f"unknown action {action!r}: use one of {', '.join(ACTIONS)}")
        if not self.api.cfg.allow_actions:
            raise web.HTTPError(403, "kernel actions are turned off on this server "
                                     "(c.GpuctxServer.allow_actions = False)")
        self.kernel_or_404(kernel_id)
        try:
            done = await self.api.actions.run(ACTIONS[action], kernel_id, wait=False)
            if isinstance(done, asyncio.Future):  # a restart: answer once the new kernel is up
                await done
        except Busy as exc:  # one action per kernel at a time: say so rather than queue or fail
            raise web.HTTPError(409, str(exc)) from None
        except web.HTTPError:
            raise
        except Exception as exc:  # the kernel manager's own failure, as a JSON answer
            self.log.error("gpuctx: %s of kernel %s failed: %s: %s", action, kernel_id, type(exc).__name__, exc)
            raise web.HTTPError(500, f"{action} failed: {type(exc).__name__}: {exc}") from None
        finally:
            self.api.reported.pop(kernel_id, None)
        self.finish({"status": "ok", "kernel_id": kernel_id, "action": action})


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """Pushes a snapshot every `interval` seconds: a "hello" message first, then "snapshot"s."""

    auth_resource = AUTH_RESOURCE
    write_error = APIHandler.write_error  # refusals before the upgrade are JSON, like the REST API's

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
        try:
            asked = float(raw)
        except ValueError:
            asked = float("nan")
        if not math.isfinite(asked):
            raise web.HTTPError(400, f"interval={raw!r} is not a number of seconds: "
                                     f"ask for one between {cfg.min_interval:g} and {cfg.max_interval:g}")
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
        self.loop = IOLoop.current()
        self.write_message(json.dumps(self.hello))
        if self.api.history is not None:  # the last minutes at once, before the first snapshot
            self.api.history.connect(self)
        self.subscription = self.api.sampler.subscribe(self._on_sample, self.hello["interval"])

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


def setup_handlers(web_app, serverapp, cfg: GpuctxServer, replay=None, hook=None, pool=None,
                   actions=None) -> GpuApi:
    """Add the routes and the /metrics collector; returns the state they share."""
    api = GpuApi(serverapp, cfg, replay, hook, pool, actions)
    base = url_path_join(web_app.settings["base_url"], "gpuctx", "api")
    kernel = r"(?P<kernel_id>[^/]+)"
    routes = [
        ("devices", DevicesHandler),
        ("stream", StreamHandler),
        ("history", HistoryHandler),
        (rf"kernels/{kernel}", KernelHandler),
        (rf"kernels/{kernel}/(?P<action>[^/]+)", KernelActionHandler),
    ]
    web_app.add_handlers(".*$", [(url_path_join(base, path), handler, {"api": api}) for path, handler in routes])
    private = bool(getattr(serverapp, "authenticate_prometheus", True)) or cfg.metrics_kernel_labels
    metrics.install(lambda: api.snapshot(api.read_now()), kernel_labels=private, log_once=api.log_once)
    return api
