"""Device switching on 2+ GPUs (marked `gpu`; skipped where fewer than two GPUs are visible)."""
from __future__ import annotations

import json
import threading

import pytest

from .harness.kernels import run, start, stop

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def two_gpus():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two visible GPUs")


LIST = """
%load_ext gpuctx
import json, torch
from gpuctx_jupyter.core import inventory
torch.cuda.init()
rows = get_ipython().magics_manager.registry['GpuMagics']._list_report(inventory.take()).data["devices"]
truth = ["GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
print(json.dumps({"rows": [[r["ordinal"], r["nvidia_smi_index"], r["uuid"]] for r in rows], "truth": truth}))
"""

PREDICT = """
%load_ext gpuctx
import json
from gpuctx_jupyter.core import inventory
rows = get_ipython().magics_manager.registry['GpuMagics']._list_report(inventory.take()).data["devices"]
print(json.dumps([r["uuid"] for r in rows]))
import torch; torch.cuda.init()
print(json.dumps(["GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]))
"""


def _smi_uuids():
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout
    return [u.strip() for u in out.split()]


@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": "1,0"}, {"CUDA_VISIBLE_DEVICES": "uuid1"},
                                 {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, {"CUDA_VISIBLE_DEVICES": "prefix1"}])
def test_list_numbers_devices_as_torch_does(env):
    uuids = _smi_uuids()
    env = {k: (uuids[1] if v == "uuid1" else uuids[1][:10] if v == "prefix1" else v) for k, v in env.items()}
    km, kc = start(env=env)
    try:
        r = run(kc, PREDICT)
        predicted, truth = (json.loads(line) for line in r.stdout.strip().splitlines()[-2:])
        assert predicted == truth, (env, r.stdout, r.stderr)  # predicted before CUDA started
        r = run(kc, LIST)
        data = json.loads(r.stdout.strip().splitlines()[-1])
        assert [u for _, _, u in data["rows"]] == data["truth"]
        for ordinal, smi_index, uuid in data["rows"]:
            assert uuids[smi_index] == uuid
    finally:
        stop(km, kc)


def test_use_1_moves_every_framework_and_later_imports():
    km, kc = start()
    try:
        r = run(kc, "%load_ext gpuctx\nimport torch, cupy\n%gpu use 1")
        assert "cuda:1" in r.stdout and "torch" in r.stdout and "cupy" in r.stdout, r.stderr
        r = run(kc, "import numba.cuda, jax, jax.numpy as jnp\n"  # imported after the switch
                    "print(torch.ones(1, device='cuda').device, cupy.ones(1).device.id, "
                    "numba.cuda.get_current_device().id, jnp.ones(1).devices().pop().id)")
        assert r.stdout.split() == ["cuda:1", "1", "1", "1"], r.stderr
    finally:
        stop(km, kc)


def test_on_gpu_1_lands_there_and_0_comes_back_also_after_errors_and_interrupts():
    km, kc = start()
    try:
        run(kc, "%load_ext gpuctx\nimport torch\ntorch.cuda.init()")
        r = run(kc, "%%on_gpu 1\na = torch.ones(2, device='cuda')\nb = torch.ones(2)\nprint(a.device, b.device)")
        assert r.stdout.split() == ["cuda:1", "cpu"]
        r = run(kc, "%%on_gpu 1 --default\nc = torch.ones(2)\nprint(c.device)")
        assert r.stdout.split() == ["cuda:1"]
        r = run(kc, "print(torch.cuda.current_device(), torch.ones(1).device)")
        assert r.stdout.split() == ["0", "cpu"]
        r = run(kc, "%%on_gpu 1 --default\nd = torch.ones(2)\nraise ValueError('x')")
        assert r.reply["status"] == "error"
        r = run(kc, "print(d.device, torch.cuda.current_device(), torch.ones(1).device)")
        assert r.stdout.split() == ["cuda:1", "0", "cpu"]
        threading.Timer(2.0, km.interrupt_kernel).start()
        r = run(kc, "%%on_gpu 1 --default\nimport time\ne = torch.ones(2)\ntime.sleep(30)")
        assert r.reply["ename"] == "KeyboardInterrupt"
        r = run(kc, "print(e.device, torch.cuda.current_device(), torch.ones(1).device)")
        assert r.stdout.split() == ["cuda:1", "0", "cpu"]
    finally:
        stop(km, kc)


def test_use_auto_picks_most_free_and_mixed_devices_hint():
    km, kc = start()
    try:
        r = run(kc, "%load_ext gpuctx\nimport torch\nhog = torch.empty(20 * 1024**3, dtype=torch.uint8, device='cuda:0')\n"
                    "%gpu use auto")
        assert "cuda:1" in r.stdout, r.stdout + r.stderr
        run(kc, "model_trunk = torch.ones(4, 4, device='cuda:0')")
        run(kc, "%%on_gpu 1\nhead = torch.ones(4, 4, device='cuda')")
        r = run(kc, "model_trunk @ head")
        assert r.reply["status"] == "error"
        assert "mixes tensors on cuda:0 and cuda:1" in r.stderr, r.stderr
        r = run(kc, "(model_trunk @ head.to(model_trunk.device)).device")
        assert "index=0" in r.text
    finally:
        stop(km, kc)
