"""gpuctx in jupyter_server, assembled in one place: every server object is built here, once, and
given what it needs through its constructor. Read this file to see how the pieces fit.

  settings       config.GpuctxServer (c.GpuctxServer.*)
  notebooks      notebooks.Notebooks: the one notebook reader, off the event loop
  launch         launch.Launcher: what each kernel gets at launch (warm settings, device, gpuctx)
  suspend        suspend.SuspendManager: idle notebooks' GPU memory into host memory and back,
                 through the driver's checkpoint API (checkpointer.HelperCheckpointer)
  who holds      holders.Holders: the holders file, idle holders, the round its consumers run on
  warm pool      reserve.Reserve (which kernelspecs, memory floors), import_profile.ImportProfile
                 (what imports standbys import) and pool.Pool (the standbys, standby.py)
  provisioner    provisioner.attach: how local kernels are launched (from a standby when one fits)
  lifecycle      lifecycle.Lifecycle: the one chain around the kernel manager (one action per
                 kernel at a time — suspend and resume among them —, gateway warm-ups, shutdown order)
  consumers      release.PressureRelease and culling.GpuCuller, run after each holders round (their
                 releases, suspends and shutdowns in the background: one per kernel at a time)
  history        history.GpuHistory (the last hour for pages that connect), links.LinkReader
                 (PCIe/NVLink while a dashboard asks), usage.HostUsage (host memory and CPU)
  typed cells    typed_cells.TypedCells: a notebook's cells as they are typed, on their way to its
                 kernel (one message in flight per kernel, the latest waiting)
  API            gpu_api.GpuApi (the snapshot) and routes/ (REST and websocket), metrics.py
  exit           prompt_exit: once the server's loop has stopped, the threads of requests that
                 were in flight are told to end, so that the process exits
"""
from __future__ import annotations

import importlib.util
import weakref
from dataclasses import dataclass

from ..contract import (ADOPT_REPLY, ADOPT_REQUEST, CELLS_REPLY, CELLS_REQUEST, RELEASE_REPLY, RELEASE_REQUEST, REPLY,
                        REQUEST, SUSPEND_MESSAGES)
from ..core import inventory
from ..core.sampler import process_sampler
from ..core.trace import Replay
from . import jupyter_internals, kernel_client, metrics, nodelay, prompt_exit, provisioner, release, routes, suspend
from .checkpointer import HelperCheckpointer
from .config import GpuctxServer
from .culling import GpuCuller
from .gpu_api import GpuApi
from .history import GpuHistory, StreamHistory
from .holders import OOM_RELEASE_S, Holders, live_activity
from .launch import Launcher
from .links import LinkReader
from .lifecycle import Lifecycle
from .notebooks import Notebooks
from .import_profile import ImportProfile, profile_path
from .pool import Pool
from .reserve import Reserve
from .tasks import Background
from .typed_cells import TypedCells
from .usage import HostUsage

# What gpuctx's control-channel requests cause: the request, its reply, and the busy/idle status
# the kernel publishes with the request as parent. None of it is the user's activity.
UNTRACKED = (REQUEST, REPLY, RELEASE_REQUEST, RELEASE_REPLY, ADOPT_REQUEST, ADOPT_REPLY, CELLS_REQUEST, CELLS_REPLY,
             *SUSPEND_MESSAGES)

_servers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Server:
    """Every object gpuctx runs in one jupyter_server (for the log line, tests and diagnostics)."""

    cfg: GpuctxServer
    background: Background
    notebooks: Notebooks
    launcher: Launcher
    holders: Holders
    pool: Pool | None
    lifecycle: Lifecycle
    pressure: release.PressureRelease
    culler: GpuCuller
    api: GpuApi
    suspend: suspend.SuspendManager
    history: StreamHistory | None


def of(serverapp) -> Server | None:
    """The gpuctx objects of a running jupyter_server (None: gpuctx is not loaded there)."""
    return _servers.get(serverapp)


def load(serverapp) -> Server:
    log, mkm = serverapp.log, serverapp.kernel_manager
    cfg = GpuctxServer(parent=serverapp)
    replay = _replay(cfg, log)
    gateway = bool(getattr(getattr(serverapp, "gateway_config", None), "gateway_enabled", False))
    untracked = getattr(mkm, "untracked_message_types", None)
    if untracked is not None:  # the idle culler must not see gpuctx's questions as use
        mkm.untracked_message_types = [*untracked, *(t for t in UNTRACKED if t not in untracked)]

    background = Background(log)
    notebooks = Notebooks()
    reported: dict = {}  # kernel id -> (local pid, own pid) as kernels report them: the holders round, suspend, API
    suspender = suspend.SuspendManager(serverapp, cfg, HelperCheckpointer(timeout=cfg.suspend_timeout, log=log),
                                       replay.read if replay else inventory.take, reported, log)
    holders = Holders(serverapp, reported, query_timeout=cfg.kernel_query_timeout, suspend=suspender)
    # a gateway's kernels run elsewhere: no holders file to share with them
    launcher = Launcher(cfg, log, serverapp.kernel_spec_manager, notebooks, background,
                        holders_file=None if gateway else holders.path, gateway=gateway, kernel_manager=mkm)
    pool = _pool(serverapp, cfg, launcher, holders, background, gateway)
    if not gateway:
        why = provisioner.attach(mkm, launcher, pool, background, log)
        if why:
            log.warning("gpuctx: %s", why)
            pool = None
    if pool is not None:
        holders.standbys = lambda: pool.standbys
    history = _history(serverapp, cfg, replay)
    lifecycle = Lifecycle(mkm, launcher, background, pool, gateway, suspend=suspender,
                          on_shutdown=[holders.stop, suspender.stop, notebooks.close, lambda: provisioner.detach(mkm),
                                       *([history.stop] if history else []),
                                       lambda: prompt_exit.end_workers_after_stop(log)])
    lifecycle.install()
    jupyter_internals.shutdown_all_at_stop(serverapp)

    async def release_kernel(kernel_id: str) -> dict:
        kernel = kernel_client.find(mkm, kernel_id)
        if kernel is None:
            return {"status": "gone", "reason": "the kernel was shut down meanwhile"}
        return await release.release(kernel, cfg.release_timeout)

    # with pressure_action / cull_idle_gpu_kernels_action = "suspend", idle holders are suspended instead
    pressure = release.PressureRelease(cfg.release_below_free_fraction, cfg.release_idle_seconds,
                                       cfg.release_idle_after,
                                       suspend.pressure(lifecycle.actions) if cfg.pressure_action == "suspend"
                                       else release_kernel, pool.evict if pool else None, log=log,
                                       recent_oom=lambda ordinal: holders.oom_within(ordinal, OOM_RELEASE_S),
                                       action=cfg.pressure_action, background=background, idle_release=release_kernel)
    culler = GpuCuller(cfg.cull_idle_gpu_kernels_after,
                       suspend.culling(lifecycle.actions) if cfg.cull_idle_gpu_kernels_action == "suspend"
                       else mkm.shutdown_kernel, log=log, warning_s=cfg.cull_warning_seconds,
                       action=cfg.cull_idle_gpu_kernels_action, background=background, busy=lifecycle.actions.busy,
                       live=lambda kernel_id: live_activity(mkm, kernel_id))
    holders.consumers += [pressure, culler]

    typed = TypedCells(cfg.kernel_query_timeout, background)
    api = GpuApi(serverapp, cfg, replay, launcher, pool, lifecycle, holders, pressure, culler, history, suspender,
                 reported, typed)
    routes.setup(serverapp.web_app, api)
    if cfg.kernel_websocket_nodelay:
        nodelay.install(serverapp.web_app.settings, log)
    private = bool(getattr(serverapp, "authenticate_prometheus", True)) or cfg.metrics_kernel_labels
    metrics.install(lambda: api.snapshot(api.read_now()), kernel_labels=private, log_once=api.log_once)

    holders.start(api.read)
    suspender.start(background)
    if history is not None:
        history.start()
    if pool is not None:
        pool.start()
    server = Server(cfg, background, notebooks, launcher, holders, pool, lifecycle, pressure, culler, api, suspender,
                    history)
    _servers[serverapp] = server
    log.info("gpuctx: warming %s kernels (policy %s), device assignment %s%s%s",
             ", ".join(cfg.warm_kernelspecs) or "ipykernel", cfg.warm_policy, cfg.assign_devices,
             ("" if not pool else ", the automatic warm reserve" if pool.auto
              else f", warm pool of {cfg.pool_size} per kernelspec"),
             " — kernels behind a gateway are warmed by a first request" if gateway else "")
    return server


def _history(serverapp, cfg: GpuctxServer, replay) -> StreamHistory | None:
    """The last hour of every GPU, the dashboard's link readings and the host's usage (None: off)."""
    if cfg.history_seconds <= 0:
        return None
    history = GpuHistory(cfg.history_seconds)
    links = LinkReader(history, replay=replay is not None, log=serverapp.log)
    usage = HostUsage(serverapp, history, watched=lambda: process_sampler().running)
    return StreamHistory(history, links, usage)


def _replay(cfg: GpuctxServer, log) -> Replay | None:
    if not cfg.replay_trace:
        return None
    try:
        replay = Replay(cfg.replay_trace, log=log)
    except Exception as exc:  # a bad trace must not keep the extension from loading
        log.error("gpuctx: replay_trace %s: %s; fix the path or unset it (serving live NVML)", cfg.replay_trace, exc)
        return None
    process_sampler().set_source(replay.read)
    log.warning("gpuctx: REPLAYING the recorded trace %s instead of live NVML", cfg.replay_trace)
    return replay


def _pool(serverapp, cfg, launcher, holders, background, gateway) -> Pool | None:
    """The warm pool, unless it is off (pool_size 0), the kernels run behind a gateway, or this
    jupyter_server lacks what re-pointing a restarted kernel's websockets needs."""
    if cfg.pool_size == 0 or gateway:
        return None
    gone = jupyter_internals.missing()
    if gone:
        serverapp.log.error("gpuctx: the warm kernel pool is off: this jupyter_server lacks %s (checked against %s)",
                            ", ".join(gone), jupyter_internals.CHECKED_AGAINST)
        return None
    mkm = serverapp.kernel_manager
    reserve = Reserve(mkm, cfg, launcher, holders)
    profile = ImportProfile(profile_path(serverapp.root_dir), serverapp.log,
                            torch_installed=importlib.util.find_spec("torch") is not None,
                            max_modules=cfg.import_profile_modules, budget_s=cfg.import_profile_seconds)
    return Pool(mkm, cfg, launcher, reserve, serverapp.log, background, profile, serverapp.root_dir)
