"""The real components tests drive: IPython kernels through jupyter_client (kernels.py), a
jupyter_server subprocess over REST and websockets (server.py), JupyterLab in Debian's Chromium
(browser.py), notebooks and kernel configs (notebooks.py), H200-shaped NVML records (gpus.py) and
waiting on conditions (waiting.py). Fixtures built on them live in tests/conftest.py; test modules
import this package, never each other, and so do the benchmarks."""
