"""gpuctx: the GPU as a visible, switchable, ready resource inside Jupyter.

This module only holds the entry points; nothing here touches NVML, CUDA or a framework.
"""
from ._version import __version__

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ip):
    """`%load_ext gpuctx`: register the magics and the per-cell hooks (twice is harmless)."""
    from .kernel.extension import load

    load(ip)


def unload_ipython_extension(ip):
    """`%unload_ext gpuctx`: remove every magic, hook and import hook that loading added."""
    from .kernel.extension import unload

    unload(ip)


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "gpuctx-jupyterlab"}]


def _jupyter_server_extension_points():
    return [{"module": "gpuctx_jupyter"}]


def _load_jupyter_server_extension(serverapp):
    """jupyter_server calls this once at start-up (enabled by jupyter-config on install)."""
    from .server.extension import load

    load(serverapp)
