"""Wiring the kernel side into an IPython shell, and taking it out again."""
from __future__ import annotations

from .magics import GpuMagics

_ATTR = "_gpuctx_magics"


def load(ip) -> GpuMagics:
    magics = getattr(ip, _ATTR, None)
    if magics is not None:
        return magics
    magics = GpuMagics(ip)
    ip.register_magics(magics)
    ip.events.register("pre_run_cell", magics.pre_run_cell)
    ip.events.register("post_run_cell", magics.post_run_cell)
    magics.import_hook.install()
    setattr(ip, _ATTR, magics)
    return magics


def unload(ip) -> None:
    magics = getattr(ip, _ATTR, None)
    if magics is None:
        return
    ip.events.unregister("pre_run_cell", magics.pre_run_cell)
    ip.events.unregister("post_run_cell", magics.post_run_cell)
    magics.import_hook.remove()
    magics.switcher.use(None)  # hands torch's default device back if we had set it
    for kind, names in magics.magics.items():
        table = ip.magics_manager.magics[kind]
        for name in names:
            table.pop(name, None)
    ip.magics_manager.registry.pop(type(magics).__name__, None)
    delattr(ip, _ATTR)
