"""Attention at the notebook's own shapes on a real GPU (marked `gpu`): a bf16 transformer's
problems, noted on its first run, are built on its next start — in the warm-up's thread, then
their forwards in the cells' thread — and the notebook trains after it as before."""
from __future__ import annotations

import pytest

from .harness.kernels import run, stop
from .harness.notebooks import notebook
from .harness.warm_kernels import kernel, plan_of
from .harness.waiting import wait_for

pytestmark = pytest.mark.gpu

CELLS = [
    "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F",
    "qkv = nn.Linear(256, 768).to(device='cuda', dtype=torch.bfloat16)\n"
    "opt = torch.optim.AdamW(qkv.parameters(), lr=1e-4)\n"
    "x = torch.randn(4, 96, 256, device='cuda', dtype=torch.bfloat16)",
    "for _ in range(2):\n"
    "    q, k, v = qkv(x).view(4, 96, 3, 8, 32).transpose(1, 3).unbind(2)\n"
    "    loss = F.scaled_dot_product_attention(q, k, v, is_causal=True).float().pow(2).mean()\n"
    "    opt.zero_grad(); loss.backward(); opt.step()\n"
    "print(torch.isfinite(loss).item())",
]
SHAPES = "attention at the notebook's own shapes (4×8×96×32 bfloat16, causal)"
CELLS_THREAD = "its forward in the cells' thread (4×8×96×32 bfloat16, causal)"


def steps(kc) -> dict:
    return {s["name"]: (s["state"], s["detail"]) for s in plan_of(kc)["plan"]["steps"]}


def run_all(kc) -> str:
    for cell in CELLS:
        r = run(kc, cell)
        assert r.reply["status"] == "ok", r.stderr
    return r.stdout.strip()


def test_a_transformers_attention_is_built_at_its_own_shapes_on_its_next_start(tmp_path):
    data = tmp_path / "jupyter-data"
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "attend.ipynb"
    notebook(nb, CELLS)
    env = {"JUPYTER_DATA_DIR": str(data)}
    km, kc = kernel(tmp_path, nb, policy="always", **env)
    try:
        assert SHAPES not in steps(kc)  # never run: nothing noted yet
        assert run_all(kc) == "True"
    finally:
        stop(km, kc)
    km, kc = kernel(tmp_path, nb, policy="always", **env)  # the next start (a restart, another day)
    try:
        assert steps(kc)[SHAPES][0] == "done", steps(kc)
        # (asked every second: each ask is a cell, after which the user's idle moment begins again)
        assert wait_for(lambda: steps(kc)[CELLS_THREAD][0] == "done", timeout=60, every=1.0), steps(kc)
        assert run_all(kc) == "True"  # it trains after it as before
    finally:
        stop(km, kc)
