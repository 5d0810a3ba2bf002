"""The shared layer: NVML, the device model, inventory, the sampler, traces and framework adapters.

No IPython, tornado or jupyter_server here, and nothing heavy at import time."""
