"""Warming what is being typed on a real GPU (marked `gpu`): a new notebook's kernel, given its
cells as typed (PUT …/cells, as JupyterLab sends them), warms CUDA and the training steps on the
device before the cells run — the first training cell then finds autograd's engine and the
optimizer's first use done. About 20 s on an H200."""
from __future__ import annotations

import json

import pytest

from .harness.notebooks import notebook
from .harness.server import Server
from .harness.waiting import wait_for

pytestmark = pytest.mark.gpu

CELLS = ["import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\ndevice = 'cuda'",
         "model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)\n"
         "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\nx = torch.randn(1024, 256, device=device)\n"
         "y = torch.randint(0, 10, (1024,), device=device)",
         "for step in range(3):\n    loss = F.cross_entropy(model(x), y)\n    opt.zero_grad()\n    loss.backward()\n"
         "    opt.step()\nprint(f'loss {loss.item():.4f}')"]
PROBE = ("import json, sys, threading\n"
         "print(json.dumps({'cuda': 'torch' in sys.modules and sys.modules['torch'].cuda.is_initialized(),"
         " 'dynamo': 'torch._dynamo' in sys.modules,"
         " 'warming': [t.name for t in threading.enumerate() if t.name.startswith('gpuctx-warmup')]}))")


@pytest.mark.timeout(300)
def test_typed_training_cells_are_warmed_on_the_device_before_they_run(tmp_path):
    notebook(tmp_path / "new.ipynb", [])
    srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                 "--MappingKernelManager.default_kernel_name=python3"],
                 env={"GPUCTX_SERVER_POOL": "0"}).start()
    try:
        kid = srv.start_kernel(path="new.ipynb")
        ks = srv.channels(kid)
        ks.wait_ready()

        def view():
            status, answer = srv.api("GET", f"/gpuctx/api/kernels/{kid}")
            return answer if status == 200 and answer.get("status") == "ok" else None

        def settled(reading: str):
            v = view()
            plan = (v or {}).get("plan") or {}
            return v if reading in plan.get("reading", "") and v["warmup"]["state"] in ("done", "skipped",
                                                                                        "failed") else None

        assert wait_for(lambda: settled("a new notebook"), timeout=120)["plan"]["gpu"] is False  # no CUDA yet
        status, answer = srv.api("PUT", f"/gpuctx/api/kernels/{kid}/cells", {"cells": CELLS[:2]})
        assert status == 202 and answer["planned"] >= 3, answer
        done = wait_for(lambda: settled("as typed"), timeout=180, every=0.25)
        steps = {s["name"]: s for s in done["plan"]["steps"]}
        for name in ("cuda init", "matmul fp32", "backward", "optimizer step (AdamW)", "import torch._dynamo"):
            assert steps[name]["state"] == "done", (name, steps.get(name))
        assert done["warmup"]["state"] == "done" and done["warmup"]["device"] == 0, done["warmup"]
        probe = wait_for(lambda: (p := json.loads(ks.execute(PROBE).stdout))["warming"] == [] and p, timeout=30)
        assert probe == {"cuda": True, "dynamo": True, "warming": []}  # done, and its thread has exited
        for cell in CELLS:
            r = ks.execute(cell)
            assert r.reply["status"] == "ok", r.stderr
        status, answer = srv.api("PUT", f"/gpuctx/api/kernels/{kid}/cells", {"cells": CELLS})
        assert status == 202 and answer["planned"] == 0, answer  # the loop needs nothing new
    finally:
        srv.stop()


@pytest.mark.timeout(300)
def test_typed_cells_that_choose_a_device_are_warmed_on_it_once_that_cell_has_run(tmp_path):
    """A typed `%gpu use 0` has not run: nothing starts CUDA for it. Once its cell has run, the next
    message warms that device (the GPU work that waited is planned again, not left skipped)."""
    notebook(tmp_path / "new.ipynb", [])
    srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                 "--MappingKernelManager.default_kernel_name=python3"],
                 env={"GPUCTX_SERVER_POOL": "0"}).start()
    cells = ["%gpu use 0\nimport torch\nimport torch.nn as nn", CELLS[1]]
    try:
        kid = srv.start_kernel(path="new.ipynb")
        ks = srv.channels(kid)
        ks.wait_ready()

        def settled(after: int):
            status, v = srv.api("GET", f"/gpuctx/api/kernels/{kid}")
            plan = (v or {}).get("plan") or {} if status == 200 else {}
            steps = {s["name"]: s for s in plan.get("steps", [])}
            return (v if "as typed" in plan.get("reading", "") and len(steps) >= after
                    and v["warmup"]["state"] in ("done", "skipped", "failed") else None)

        status, answer = srv.api("PUT", f"/gpuctx/api/kernels/{kid}/cells", {"cells": cells})
        assert status == 202 and answer["status"] == "ok", answer
        first = wait_for(lambda: settled(2), timeout=180, every=0.25)
        init = next(s for s in first["plan"]["steps"] if s["name"] == "cuda init")
        assert init["state"] == "skipped" and "choose a device" in init["detail"], init
        assert json.loads(ks.execute(PROBE).stdout)["cuda"] is False  # nothing started CUDA for a line not run
        r = ks.execute(cells[0])
        assert r.reply["status"] == "ok", r.stderr
        status, answer = srv.api("PUT", f"/gpuctx/api/kernels/{kid}/cells", {"cells": cells})
        assert status == 202 and answer["planned"] >= 2, answer
        done = wait_for(lambda: (v := settled(2)) and any(s["name"] == "cuda init" and s["state"] == "done"
                                                         for s in v["plan"]["steps"]) and v,
                        timeout=180, every=0.25)
        steps = {s["name"]: s for s in done["plan"]["steps"]}
        for name in ("cuda init", "backward", "optimizer step (AdamW)"):
            assert steps[name]["state"] == "done", (name, steps.get(name))
        assert done["warmup"]["device"] == 0, done["warmup"]
    finally:
        srv.stop()
