"""Workers forked from the imports an imports standby did, on real GPUs (marked `gpu`;
scripts/gpu-check.sh runs them): the process that did the imports holds no GPU memory and
never starts CUDA; each forked worker sees its own GPU alone, as cuda:0, and trains on it."""
from __future__ import annotations

import re

import psutil
import pytest

from .harness import kernels
from .harness.kernels import run
from .harness.waiting import wait_for
from .harness.workers import WHO, gpus, nvml_pids, whos

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
pytest.importorskip("ipyparallel")

CHECK = ("%%on_gpu all\nimport torch, torch.distributed as dist\n"
         "t = torch.ones(1, device='cuda'); dist.all_reduce(t)\n"
         "print('SEES', torch.cuda.device_count(), str(torch.cuda.get_device_properties(0).uuid), int(t.item()))")


def test_forked_workers_each_see_their_own_gpu_and_the_imports_hold_none(tmp_path):
    env = {"GPUCTX_WARM": "always", "GPUCTX_WARM_RECIPE": "imports", "GPUCTX_WARM_IMPORTS": "numpy,torch",
           "GPUCTX_WARM_SOURCE": "the warm pool (imports standby)", "GPUCTX_STANDBY": "1", "GPUCTX_WORKER_IMPORTS": "1"}
    km, kc = kernels.start(env=env, extra_arguments=["--ext=gpuctx"], cwd=str(tmp_path))
    try:
        def imports_done():
            found = re.search(r"the workers' imports: imports done in process (\d+)", run(kc, "%gpu workers").text)
            return found and int(found.group(1))

        zygote = wait_for(imports_done, timeout=300, every=0.5)
        uuids = gpus()
        r = run(kc, "%gpu workers start all", timeout=600)
        assert r.reply["status"] == "ok" and "(forked with their imports done ahead)" in r.stdout, r.text
        assert f"{len(uuids)} worker" in r.stdout and "nccl" in r.stdout, r.stdout
        ranks = whos(run(kc, WHO).text)
        assert {psutil.Process(w["pid"]).ppid() for w in ranks} == {zygote}
        assert [w["CUDA_VISIBLE_DEVICES"] for w in ranks] == uuids  # rank r on the r-th GPU, by UUID
        seen = run(kc, CHECK, timeout=300)
        assert seen.reply["status"] == "ok", seen.text
        sees = sorted(line.split()[1:] for line in seen.text.splitlines() if line.startswith("SEES"))
        assert [s[0] for s in sees] == ["1"] * len(uuids) and {s[2] for s in sees} == {str(len(uuids))}
        assert sorted("GPU-" + s[1] if not s[1].startswith("GPU-") else s[1] for s in sees) == sorted(uuids)
        wait_for(lambda: {w["pid"] for w in ranks} <= nvml_pids(), timeout=30)
        listing = run(kc, "%gpu workers").text  # CUDA and the training steps warmed once the line ran
        assert "rank 0's warm-up: done on cuda:0" in listing and "optimizer" in listing, listing
        # It never started CUDA: no context (nothing in NVML), and its children started theirs, which
        # a driver started before the fork forbids ("initialization error"). libcuda may be mapped
        # (an import can load the library without calling cuInit; kernel/worker_zygote.py asks the
        # driver itself before it forks).
        assert zygote not in nvml_pids()
    finally:
        kernels.stop(km, kc)
