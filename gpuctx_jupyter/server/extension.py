"""Loading gpuctx into jupyter_server: settings, the kernel start/restart hook and the GPU API."""
from __future__ import annotations

from ..core.sampler import process_sampler
from ..core.trace import Replay
from . import jupyter_internals
from .config import GpuctxServer
from .handlers import setup_handlers
from .kernel_hook import KernelHook
from .pool import KernelPool
from .tasks import Background


def load(serverapp) -> None:
    cfg = GpuctxServer(parent=serverapp)
    replay = None
    if cfg.replay_trace:
        try:
            replay = Replay(cfg.replay_trace)
        except (OSError, ValueError) as exc:
            serverapp.log.error("gpuctx: replay_trace %s: %s; fix the path or unset it (serving live NVML)",
                                cfg.replay_trace, exc)
        else:
            process_sampler().set_source(replay.read)
            serverapp.log.warning("gpuctx: REPLAYING the recorded trace %s instead of live NVML", cfg.replay_trace)
    background = Background(serverapp.log)
    hook = KernelHook(serverapp, cfg, serverapp.log, background)
    hook.install()
    api = setup_handlers(serverapp.web_app, serverapp, cfg, replay)
    pool = None
    if cfg.pool_size > 0 and not hook.gateway:
        gone = jupyter_internals.missing()
        if gone:
            serverapp.log.error("gpuctx: the warm kernel pool is off: this jupyter_server lacks %s (checked "
                                "against %s)", ", ".join(gone), jupyter_internals.CHECKED_AGAINST)
        else:
            pool = KernelPool(serverapp, cfg, hook, serverapp.log, background)
            pool.install()  # wraps the hook's start: adopt a standby, else start (and warm) a fresh one
    serverapp.web_app.settings["gpuctx"] = {"config": cfg, "kernel_hook": hook, "api": api, "pool": pool,
                                            "background": background}
    serverapp.log.info(
        "gpuctx: warming %s kernels (policy %s), device assignment %s%s",
        ", ".join(cfg.warm_kernelspecs) or "ipykernel", cfg.warm_policy, cfg.assign_devices,
        " — kernels behind a gateway are warmed by a first request" if hook.gateway else "",
    )
