"""Loading gpuctx into jupyter_server: settings, the kernel start/restart hook and the GPU API."""
from __future__ import annotations

from ..contract import (
    ADOPT_REPLY,
    ADOPT_REQUEST,
    RELEASE_REPLY,
    RELEASE_REQUEST,
    REPLY,
    REQUEST,
)
from ..core.sampler import process_sampler
from ..core.trace import Replay
from . import jupyter_internals
from .actions import KernelActions
from .config import GpuctxServer
from .handlers import setup_handlers
from .history import install as install_history
from .holders import install as install_holders
from .kernel_hook import KernelHook
from .pool import KernelPool
from .tasks import Background

# What gpuctx's control-channel requests cause: the request, its reply, and the busy/idle status
# the kernel publishes with the request as parent. None of it is the user's activity.
UNTRACKED = (REQUEST, REPLY, RELEASE_REQUEST, RELEASE_REPLY, ADOPT_REQUEST, ADOPT_REPLY)


def load(serverapp) -> None:
    cfg = GpuctxServer(parent=serverapp)
    replay = None
    if cfg.replay_trace:
        try:
            replay = Replay(cfg.replay_trace, log=serverapp.log)
        except Exception as exc:  # a bad trace must not keep the extension from loading
            serverapp.log.error("gpuctx: replay_trace %s: %s; fix the path or unset it (serving live NVML)",
                                cfg.replay_trace, exc)
        else:
            process_sampler().set_source(replay.read)
            serverapp.log.warning("gpuctx: REPLAYING the recorded trace %s instead of live NVML", cfg.replay_trace)
    mkm = serverapp.kernel_manager
    untracked = getattr(mkm, "untracked_message_types", None)
    if untracked is not None:  # the idle culler must not see gpuctx's questions as use
        mkm.untracked_message_types = [*untracked, *(t for t in UNTRACKED if t not in untracked)]
    background = Background(serverapp.log)
    hook = KernelHook(serverapp, cfg, serverapp.log, background)
    hook.install()
    pool = None
    if (cfg.pool_size is None or cfg.pool_size > 0) and not hook.gateway:
        gone = jupyter_internals.missing()
        if gone:
            serverapp.log.error("gpuctx: the warm kernel pool is off: this jupyter_server lacks %s (checked "
                                "against %s)", ", ".join(gone), jupyter_internals.CHECKED_AGAINST)
        else:
            pool = KernelPool(serverapp, cfg, hook, serverapp.log, background)
            pool.install()  # wraps the hook's start: adopt a standby, else start (and warm) a fresh one
    actions = KernelActions(mkm)
    actions.install()  # outermost: one action per kernel at a time, whoever asks
    api = setup_handlers(serverapp.web_app, serverapp, cfg, replay, hook=hook, pool=pool, actions=actions)
    serverapp.web_app.settings["gpuctx"] = {"config": cfg, "kernel_hook": hook, "api": api, "pool": pool,
                                            "background": background, "actions": actions}
    # Who holds the GPU: the holders file kernels read when they run out of memory, idle holders in
    # the snapshot, the release route, automatic release under memory pressure, opt-in culling.
    install_holders(serverapp)
    # The last hour of every GPU for pages that connect, the dashboard's link throughput, host usage.
    install_history(serverapp, cfg.history_seconds)
    serverapp.log.info(
        "gpuctx: warming %s kernels (policy %s), device assignment %s%s%s",
        ", ".join(cfg.warm_kernelspecs) or "ipykernel", cfg.warm_policy, cfg.assign_devices,
        ("" if not pool else ", the automatic warm reserve" if pool.auto
         else f", warm pool of {cfg.pool_size} per kernelspec"),
        " — kernels behind a gateway are warmed by a first request" if hook.gateway else "",
    )
