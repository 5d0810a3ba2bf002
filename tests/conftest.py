"""Fixtures over the real components of tests/harness/: an IPython shell with gpuctx loaded,
jupyter_server subprocesses (plain, with the warm pool, behind a Kernel Gateway), one Chromium per
browser-test module, NVML records for machines without a GPU, and the `gpu` marker's skip rule."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpuctx_jupyter.core import nvml

from .harness.gpus import NO_GPU
from .harness.server import Server, free_port


def pytest_collection_modifyitems(config, items):
    if NO_GPU is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test, no GPU here: {NO_GPU} (run scripts/gpu-check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shell():
    """The real IPython shell with gpuctx loaded; unloaded again afterwards."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "gpuctx")
    yield ip
    ip.run_line_magic("unload_ext", "gpuctx")
    ip.run_cell("pass")  # leave a clean last result


@pytest.fixture
def nvml_records(monkeypatch):
    """Make NVML report the given records (NVML is the driver's library, not ours)."""

    def install(records):
        monkeypatch.setattr(nvml, "read_records", lambda: list(records))
        monkeypatch.setattr(nvml, "driver_version", lambda: "580.159.03")
        monkeypatch.setattr(nvml, "cuda_driver_version", lambda: "13.0")

    return install


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(var, raising=False)
    return os.environ


@pytest.fixture
def server_factory(tmp_path):
    """Start real jupyter_servers with gpuctx enabled (python3 as the default kernel); all are
    stopped, and their kernels with them, when the test ends."""
    servers = []

    def make(*args, env=None):
        srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                     "--MappingKernelManager.default_kernel_name=python3", *args], env=env)
        servers.append(srv.start())
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def pool_server(server_factory):
    """A server with a warm pool of one standby per kernelspec."""
    return lambda *args, env=None: server_factory("--GpuctxServer.pool_size=1", *args, env=env)


@pytest.fixture
def kernel_gateway(tmp_path):
    """A real Jupyter Kernel Gateway on a free port; its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
                             f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
                             "--JupyterWebsocketPersonality.list_kernels=True"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    gw = Server(str(tmp_path))  # only for its api() helper
    gw.port, gw.token = port, None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if gw.api("GET", "/api", token=None)[0] == 200:
                break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(20)


@pytest.fixture(scope="module")
def browser():
    """One headless Debian Chromium per browser-test module."""
    from .harness.browser import Browser

    b = Browser()
    yield b
    b.close()
