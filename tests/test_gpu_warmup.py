"""Pre-warming on a real GPU (marked `gpu`)."""
from __future__ import annotations

import json

import pytest

from .harness.kernels import run, start, stop
from .harness.notebooks import STATUS, kernel_config_env
from .harness.notebooks import warm_status as status
from .harness.server import Server

pytestmark = pytest.mark.gpu

PHASES = {"import torch", "cuda init", "alloc", "elementwise", "matmul fp32", "matmul bf16", "conv", "sync"}


def test_every_phase_completes_and_the_first_gpu_cell_finds_cuda_ready(tmp_path):
    km, kc = start(env=kernel_config_env(tmp_path))
    try:
        st = json.loads(run(kc, STATUS.format(wait=120)).stdout.strip().splitlines()[-1])
        assert st["state"] == "done", st
        assert PHASES <= set(st["phases"]), st["phases"]
        r = run(kc, "import torch\nready = torch.cuda.is_initialized()\n"
                    "y = torch.ones(512, 512, device='cuda') @ torch.ones(512, 512, device='cuda')\nprint(ready)")
        assert r.stdout.strip() == "True"  # the first GPU cell did not start CUDA itself
        r = run(kc, "%gpu status")
        assert "warm-up: done on cuda:0" in r.text
    finally:
        stop(km, kc)


@pytest.mark.parametrize("mode", ["round-robin", "least-used"])
def test_assigned_device_is_current_and_warmed(tmp_path, mode):
    import torch

    n = torch.cuda.device_count()
    srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                 "--MappingKernelManager.default_kernel_name=python3",
                                 "--GpuctxServer.warm_policy=always", f"--GpuctxServer.assign_devices={mode}"]).start()
    try:
        seen = []
        for _ in range(min(n, 2)):
            ks = srv.channels(srv.start_kernel())
            st = status(ks, wait=120)
            r = ks.execute("import torch\nprint(torch.cuda.current_device())\n%gpu status")
            current = int(r.stdout.split()[0])
            assert st["state"] == "done" and st["device"] == current
            assert f"chosen by the server ({mode})" in r.text
            seen.append(current)
            ks.close()
        if mode == "round-robin":
            assert seen == list(range(min(n, 2)))
    finally:
        srv.stop()
