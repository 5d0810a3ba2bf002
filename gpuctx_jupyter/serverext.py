"""Loading gpuctx into jupyter_server: settings and the kernel start/restart hook."""
from __future__ import annotations

from .config import GpuctxServer
from .kernel_hook import KernelHook


def load(serverapp) -> None:
    cfg = GpuctxServer(parent=serverapp)
    hook = KernelHook(serverapp, cfg, serverapp.log)
    hook.install()
    serverapp.web_app.settings["gpuctx"] = {"config": cfg, "kernel_hook": hook}
    serverapp.log.info(
        "gpuctx: warming %s kernels (policy %s), device assignment %s%s",
        ", ".join(cfg.warm_kernelspecs) or "ipykernel", cfg.warm_policy, cfg.assign_devices,
        " — kernels behind a gateway are warmed by a first request" if hook.gateway else "",
    )
