"""Workers prepared for a notebook on real GPUs (marked `gpu`; scripts/gpu-check.sh runs them): no
GPU memory while prepared, their GPU once the line adopts them. A module of its own: no other
notebook's workers hold the GPUs meanwhile (those would be refused, and rightly)."""
from __future__ import annotations

import psutil
import pytest

from .harness import kernels
from .harness.kernels import run
from .harness.waiting import wait_for
from .harness.workers import gpus, imports_done, nvml_pids, prepared, start_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
pytest.importorskip("ipyparallel")


def test_workers_prepared_for_the_notebook_hold_no_gpu_memory_until_the_line_adopts_them(tmp_path):
    cells = ["%gpu workers start all", "import torch\nimport torch.distributed as dist",
             "%%on_gpu all\nimport torch\nopt = torch.optim.AdamW([torch.zeros(1, device='cuda')])"]
    km, kc, _ = start_kernel(tmp_path, cells=cells)
    try:
        prep = prepared(kc, workers=len(gpus()))
        engines = [p for p in prep["pids"] if "engine" in " ".join(psutil.Process(p).cmdline())]
        assert len(engines) == len(gpus())

        listing = imports_done(kc, workers=len(gpus()))  # the whole prepared warm-up is over: still no GPU
        assert not set(engines) & nvml_pids(), listing
        r = run(kc, "%gpu workers start all", timeout=600)
        assert r.reply["status"] == "ok" and "imports done)" in r.stdout and "nccl" in r.stdout, r.text
        wait_for(lambda: set(engines) <= nvml_pids(), timeout=30)  # the adopted engines, now on their GPUs
        listing = run(kc, "%gpu workers").text  # CUDA and the training steps warmed once the line ran
        assert "rank 0's warm-up: done on cuda:0" in listing and "optimizer" in listing, listing
    finally:
        kernels.stop(km, kc)
