"""`%load_ext gpuctx` works through this module; everything lives in gpuctx_jupyter."""
from gpuctx_jupyter import load_ipython_extension, unload_ipython_extension  # noqa: F401


def monitor(*specs, interval: float = 1.0, history: float = 60.0, replay: str | None = None):
    """Display a live GPU monitor in the notebook and return it (`.stop()` freezes it, `.close()`
    removes it); `replay=PATH` shows a recorded trace instead, labelled as a replay. Without a
    notebook frontend (IPython in a terminal) it prints one line of one sample and returns None."""
    from gpuctx_jupyter.kernel.monitor import monitor as _monitor

    return _monitor(*specs, interval=interval, history=history, replay=replay)
