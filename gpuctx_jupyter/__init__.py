"""gpuctx: the GPU as a visible, switchable, ready resource inside Jupyter.

This module only holds the entry points; nothing here touches NVML, CUDA or a framework.
"""
from ._version import __version__

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ip):
    """`%load_ext gpuctx`: register the magics and the per-cell hooks (twice is harmless)."""
    import time

    t0 = time.perf_counter()
    from .kernel.extension import load

    st = load(ip)
    if st.loaded_in is None:  # what loading added to the kernel's start (benchmarks/readiness.py)
        st.loaded_in = time.perf_counter() - t0


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
