"""`%load_ext gpuctx` works through this module; everything lives in gpuctx_jupyter."""
from gpuctx_jupyter import load_ipython_extension, unload_ipython_extension  # noqa: F401

