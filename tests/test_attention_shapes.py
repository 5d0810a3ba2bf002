"""Attention at the notebook's own shapes (warm/attention.py), in real ipykernel processes started
as the server's hook starts them: the problems of the notebook's first attention cell are kept
for its next start (never a value), the watch ends after that cell and puts torch's function back,
calls from other threads are not the notebook's, a compiling notebook and the setting turned off
are never watched; work left to the cells' thread runs there, and never while a cell runs."""
from __future__ import annotations

import json
import os

import pytest

from gpuctx_jupyter.kernel.warm import attention

from .harness.kernels import reply_to, run, stop
from .harness.notebooks import notebook
from .harness.warm_kernels import kernel, plan_of
from .harness.waiting import wait_for

IMPORTS = "import torch\nimport torch.nn.functional as F"
BLOCK = """qkv = torch.nn.Linear(32, 96)
x = torch.randn(3, 10, 32)
def attend(x):
    q, k, v = qkv(x).view(3, 10, 3, 4, 8).transpose(1, 3).unbind(2)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)"""
TRAIN = "loss = attend(x).pow(2).mean()\nloss.backward()\nprint(round(float(loss), 6) >= 0)"
ORIGINAL = "print(F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention)"


def kept(data_dir) -> list[dict]:
    folder = data_dir / "gpuctx" / "attention"
    files = sorted(folder.glob("*.json")) if folder.exists() else []
    return [json.loads(f.read_text()) for f in files]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "jupyter-data"
    d.mkdir()
    return d


def open_kernel(tmp_path, data_dir, cells, config: str = ""):
    (tmp_path / "work").mkdir(exist_ok=True)
    nb = tmp_path / "work" / "attend.ipynb"
    notebook(nb, cells)
    km, kc = kernel(tmp_path, nb, policy="always", config=config, JUPYTER_DATA_DIR=str(data_dir))
    plan_of(kc)  # the plan is made (the watch armed by it), the warm-up over
    return nb, km, kc


def ok(kc, code: str) -> str:
    r = run(kc, code)
    assert r.reply["status"] == "ok", r.stderr
    return r.stdout


def test_the_first_attention_cell_is_kept_for_the_next_start_without_a_value(tmp_path, data_dir):
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS, BLOCK, TRAIN])
    try:
        ok(kc, IMPORTS)
        assert ok(kc, ORIGINAL).strip() == "False"  # watched: torch's function wrapped
        ok(kc, BLOCK)
        assert kept(data_dir) == []  # nothing ran attention yet
        assert ok(kc, TRAIN).strip() == "True"  # the user's result is as without gpuctx
        [record] = kept(data_dir)
        assert record["notebook"] == os.path.abspath(nb)
        [problem] = record["problems"]
        assert problem["q"] == {"size": [3, 4, 10, 8], "stride": [960, 8, 96, 1], "dtype": "float32"}
        assert problem["causal"] is True and problem["grad"] is True and problem["mask"] is None
        assert problem["grad_out"]["size"] == [3, 4, 10, 8]  # the gradient's layout, for the backward's graph
        # shapes and flags only: no number of the user's tensors is in the file
        text = json.dumps(record)
        values = ok(kc, "print(' '.join(f'{v:.4f}' for v in x.flatten()[:20].tolist()))").split()
        assert not any(v in text for v in values)
        # the watch ended with the cell: torch's own function is back, and later cells note nothing
        assert ok(kc, ORIGINAL).strip() == "True"
        ok(kc, "x = torch.randn(5, 10, 32)\nF.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None])")
        assert [p["q"]["size"] for p in kept(data_dir)[0]["problems"]] == [[3, 4, 10, 8]]
    finally:
        stop(km, kc)
    # the next start plans them (here without a GPU: said so; on a GPU it builds them, test_gpu_attention.py)
    km, kc = kernel(tmp_path, nb, policy="always", JUPYTER_DATA_DIR=str(data_dir))
    try:
        lines = [line.strip() for line in plan_of(kc)["lines"]]
        assert any(line.startswith("skipped  attention at the notebook's own shapes (3×4×10×8 float32, causal): "
                                   "no GPU is visible") for line in lines), lines
    finally:
        stop(km, kc)
    os.environ["JUPYTER_DATA_DIR"], saved = str(data_dir), os.environ["JUPYTER_DATA_DIR"]
    try:
        assert attention.remembered(str(nb.with_name("other.ipynb"))) == []  # per notebook
    finally:
        os.environ["JUPYTER_DATA_DIR"] = saved


AS_TORCH = """import pickle
from torch.nn.attention.bias import causal_lower_right
q = torch.randn(2, 4, 6, 8)
explicit = torch.ones(6, 6, dtype=torch.bool).tril()
same = torch.allclose(F.scaled_dot_product_attention(q, q, q, attn_mask=causal_lower_right(6, 6)),
                      F.scaled_dot_product_attention(q, q, q, attn_mask=explicit), atol=1e-6)
kept = pickle.loads(pickle.dumps(F.scaled_dot_product_attention))
try:
    F.scaled_dot_product_attention(q, q)
except TypeError as exc:
    said = str(exc)
print(same, torch.allclose(kept(q, q, q), F.scaled_dot_product_attention(q, q, q)), said)"""


def test_while_watched_torchs_function_answers_as_torchs(tmp_path, data_dir):
    """torch's own mask objects (which ask which function called them), pickling, torch's errors."""
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS, BLOCK, TRAIN])
    try:
        ok(kc, IMPORTS)
        assert ok(kc, ORIGINAL).strip() == "False"  # watched
        out = ok(kc, AS_TORCH).split(" ", 2)
        assert out[:2] == ["True", "True"] and "missing" in out[2] and "gpuctx" not in out[2], out
    finally:
        stop(km, kc)


def test_calls_from_other_threads_are_not_the_notebooks(tmp_path, data_dir):
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS, BLOCK, TRAIN])
    try:
        ok(kc, IMPORTS)
        ok(kc, BLOCK)
        ok(kc, "import threading\nt = threading.Thread(target=attend, args=(x,))\nt.start(); t.join()")
        assert kept(data_dir) == [] and ok(kc, ORIGINAL).strip() == "False"  # still watching
        ok(kc, TRAIN)
        assert len(kept(data_dir)) == 1
    finally:
        stop(km, kc)


@pytest.mark.parametrize("why", ["compiles", "setting off"])
def test_a_compiling_notebook_and_the_setting_off_are_never_watched(tmp_path, data_dir, why):
    cells = [IMPORTS, BLOCK, TRAIN] + (["fast = torch.compile(attend)"] if why == "compiles" else [])
    config = "c.GpuWarmup.attention_shapes = False\n" if why == "setting off" else ""
    nb, km, kc = open_kernel(tmp_path, data_dir, cells, config=config)
    try:
        for cell in (IMPORTS, BLOCK, TRAIN):
            ok(kc, cell)
            assert ok(kc, ORIGINAL).strip() == "True"
        assert kept(data_dir) == []
    finally:
        stop(km, kc)


def test_an_unreadable_or_odd_record_is_no_problem_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    nb = str(tmp_path / "a.ipynb")
    attention.remember(nb, [{"q": {"size": [1, 2, 3, 4], "stride": [24, 12, 4, 1], "dtype": "bfloat16"}}])
    assert attention.remembered(nb) == []  # not a whole problem: nothing to build
    path = attention._file(nb)
    for text in ("{", "[]", json.dumps({"notebook": nb, "problems": "x"}),
                 json.dumps({"notebook": "/elsewhere.ipynb", "problems": []})):
        with open(path, "w") as fh:
            fh.write(text)
        assert attention.remembered(nb) == []


# -- the cells' thread -------------------------------------------------------------------------------
HAND_OVER = """import threading, time
from gpuctx_jupyter.kernel.warm.plan import Step
w = get_ipython()._gpuctx.warmer
step, seen = Step("gpu", "probe"), []
ended = threading.Thread(target=lambda: None); ended.start(); ended.join()
w.cells_thread.add(step, lambda: seen.append(threading.current_thread() is threading.main_thread()))
w.cells_thread.hand_over(w, ended)
time.sleep(1.0)
print(seen, step.state, step.detail)"""


def test_work_left_to_the_cells_thread_runs_there_after_the_cell_not_during_it(tmp_path, data_dir):
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS])
    try:
        assert ok(kc, HAND_OVER).strip() == "[] planned", ok(kc, 'print(step.detail)')  # not while the cell runs (nor its 1 s)
        # (asked every second: a cell's end lets the user's idle moment begin again)
        assert wait_for(lambda: ok(kc, "print(seen, step.state)").strip() == "[True] done", timeout=30, every=1.0)
        assert ok(kc, "print(step.seconds is not None, 'probe' in w.status.phases)").strip() == "True True"
    finally:
        stop(km, kc)


HAND_OVER_TWO = """import threading, time, pathlib
from gpuctx_jupyter.kernel.warm.plan import Step
w = get_ipython()._gpuctx.warmer
order, flag = [], pathlib.Path({flag!r})
def job(name, hold):
    def fn():
        order.append(name)
        flag.write_text(name)
        time.sleep(hold)
    return fn
ended = threading.Thread(target=lambda: None); ended.start(); ended.join()
w.cells_thread.add(Step("gpu", "first"), job("first", 1.0))
w.cells_thread.add(Step("gpu", "second"), job("second", 0.0))
w.cells_thread.hand_over(w, ended)"""


def test_a_cell_sent_while_the_cells_thread_works_waits_for_one_job_not_all(tmp_path, data_dir):
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS])
    flag = tmp_path / "job-started"
    try:
        ok(kc, HAND_OVER_TWO.format(flag=str(flag)))
        wait_for(flag.exists, timeout=30)  # the first job runs (it holds the thread for a second)
        reply_to(kc, kc.execute("order.append('cell')"))
        assert wait_for(lambda: ok(kc, "print(order)").strip() == "['first', 'cell', 'second']", timeout=30,
                        every=1.0), ok(kc, "print(order)")
    finally:
        stop(km, kc)


ASKS = """import torch
cuda_asked = []
def _asking(name, fn):
    def asked(*args, **kwargs):
        cuda_asked.append(name)
        return fn(*args, **kwargs)
    return asked
for _name in ("is_available", "device_count", "init", "_lazy_init"):
    setattr(torch.cuda, _name, _asking(_name, getattr(torch.cuda, _name)))"""


def test_noting_never_asks_cuda(tmp_path, data_dir):
    """CUDA's driver, once started, keeps the environment of then: a notebook may set
    CUDA_VISIBLE_DEVICES after `import torch`, so watching its attention must not ask CUDA anything."""
    config = f"c.InteractiveShellApp.exec_lines = [{ASKS!r}]\n"
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS, BLOCK, TRAIN], config=config)
    try:
        for cell in (IMPORTS, BLOCK, TRAIN):
            ok(kc, cell)
        assert len(kept(data_dir)) == 1  # noted, and the watch over
        assert ok(kc, "print(cuda_asked)").strip() == "[]"
    finally:
        stop(km, kc)


FROM_A_THREAD = """import threading, time, pathlib
from gpuctx_jupyter.kernel.warm.plan import Step
w = get_ipython()._gpuctx.warmer
done, step = pathlib.Path({flag!r}), Step("cells", "probe")
def warm_up_thread():  # as the warm-up's thread does as it ends: after the cell, with nothing sent since
    time.sleep(0.5)
    w.cells_thread.add(step, lambda: done.write_text(str(threading.current_thread() is threading.main_thread())))
    w.cells_thread.hand_over(w, threading.current_thread())
threading.Thread(target=warm_up_thread).start()"""


def test_work_handed_over_from_the_warm_up_thread_runs_with_no_message_to_wake_the_kernel(tmp_path, data_dir):
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS])
    done = tmp_path / "ran"
    try:
        ok(kc, FROM_A_THREAD.format(flag=str(done)))
        wait_for(done.exists, timeout=30)  # no cell, no request: the kernel's event loop woke for it
        assert done.read_text() == "True"
    finally:
        stop(km, kc)


def test_work_left_to_the_cells_thread_is_given_up_for_the_users_own_gpu_cell(tmp_path, data_dir):
    nb, km, kc = open_kernel(tmp_path, data_dir, [IMPORTS])
    try:
        first = kc.execute(HAND_OVER.replace("time.sleep(1.0)\n", ""))
        gpu_cell = kc.execute("# the user's first GPU cell\ndevice = 'cuda'")  # sent at once, as Run All does
        for msg_id in (first, gpu_cell):
            assert reply_to(kc, msg_id)["content"]["status"] == "ok"
        assert wait_for(lambda: ok(kc, "print(seen, step.state, step.detail)").strip()
                        == "[] skipped your own GPU cell started first", timeout=30, every=1.0)
    finally:
        stop(km, kc)
