"""The notebook warm plan in real ipykernel processes (jupyter_client), as the server's hook starts
them: `--ext=gpuctx` and GPUCTX_* in the environment, JPY_SESSION_NAME naming the notebook."""
from __future__ import annotations

import os
import pathlib
import re
import signal
import threading
import time

import pytest

from .harness.kernels import control, reply_to, run, start, stop, warm_up_ended
from .harness.warm_kernels import kernel, plan_of, warmup_now
from .harness.notebooks import notebook
from .harness.waiting import wait_for

# A package whose import blocks until the test creates the release file, then imports a submodule
# that needs the package. GPUCTX_TEST_RUNS counts how often the package's code runs.
SLOW_INIT = """import os, time
_flag = os.environ.get("GPUCTX_TEST_RELEASE", "")
_deadline = time.monotonic() + 60
while _flag and not os.path.exists(_flag) and time.monotonic() < _deadline:
    time.sleep(0.05)
with open(os.environ.get("GPUCTX_TEST_RUNS", os.devnull), "a") as _fh:
    _fh.write("run\\n")
BASE = 41
from . import sub
"""
SLOW_SUB = "from gpuctx_slowpkg import BASE\nVALUE = BASE + 1\n"
CELLS = ["import gpuctx_slowpkg", "from gpuctx_slowpkg.sub import VALUE\nprint(VALUE, gpuctx_slowpkg.BASE)"]


@pytest.fixture
def slow_kernel(tmp_path, site):
    """A kernel whose warm-up is held in `import gpuctx_slowpkg` until release() is called."""
    site("gpuctx_slowpkg", {"__init__.py": SLOW_INIT, "sub.py": SLOW_SUB})
    release, runs = tmp_path / "release", tmp_path / "runs"
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "slow.ipynb"
    notebook(nb, CELLS)
    km, kc = kernel(tmp_path, nb, site.path, policy="always", GPUCTX_TEST_RELEASE=str(release),
                    GPUCTX_TEST_RUNS=str(runs))
    try:
        deadline = time.monotonic() + 30
        while warmup_now(kc).get("phase") != "import gpuctx_slowpkg" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert warmup_now(kc)["phase"] == "import gpuctx_slowpkg", warmup_now(kc)
        yield kc, lambda after: threading.Timer(after, release.write_text, args=("go",)).start(), runs
    finally:
        release.write_text("go")
        stop(km, kc)


def _check(kc, ids, runs):
    replies = [reply_to(kc, i, timeout=60)["content"] for i in ids]
    assert all(r["status"] == "ok" for r in replies), replies
    out = plan_of(kc)
    step = next(s for s in out["plan"]["steps"] if s["name"] == "import gpuctx_slowpkg")
    assert step["state"] == "done" and step["where"] == "cell 1, line 1", step
    assert out["status"]["state"] == "done", out["status"]
    assert runs.read_text().splitlines() == ["run"]  # the package's code ran once


def test_run_all_while_the_warm_up_imports_a_slow_module(slow_kernel):
    kc, release, runs = slow_kernel
    ids = [kc.execute(c) for c in CELLS]  # Run All: every cell sent at once
    release(after=1.5)
    _check(kc, ids, runs)


def test_a_cell_importing_a_submodule_waits_for_the_warm_ups_import_of_its_package(slow_kernel):
    """A cell that starts while the warm-up imports waits for that import (Python's module locks
    and gpuctx's own wait both keep it from a half-imported package): no error, the package's
    code runs once, and the warm-up's step is done."""
    kc, release, runs = slow_kernel
    ids = [kc.execute(CELLS[1].replace(", gpuctx_slowpkg.BASE", ""))]
    release(after=1.5)
    _check(kc, ids, runs)


def test_restart_reads_the_notebook_again(tmp_path, site):
    site("gpuctx_alpha", {"__init__.py": ""})
    site("gpuctx_beta", {"__init__.py": ""})
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "nb.ipynb"
    notebook(nb, "import gpuctx_alpha")
    km, kc = kernel(tmp_path, nb, site.path, policy="always")
    try:
        first = plan_of(kc)
        assert [s["name"] for s in first["plan"]["steps"]] == ["import gpuctx_alpha"]
        assert first["status"]["state"] == "done" and "imported only" in first["status"]["detail"]
        notebook(nb, ["import gpuctx_alpha", "import gpuctx_beta"])
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        again = plan_of(kc)
        assert [s["name"] for s in again["plan"]["steps"]] == ["import gpuctx_alpha", "import gpuctx_beta"]
        assert all(s["state"] == "done" for s in again["plan"]["steps"])
        assert run(kc, "import sys; print('gpuctx_beta' in sys.modules)").stdout.strip() == "True"
    finally:
        stop(km, kc)


def test_failing_and_hanging_imports_are_recorded_and_the_kernel_works_on(tmp_path, site):
    site("gpuctx_broken", {"__init__.py": "raise RuntimeError('broken on purpose')\n"})
    site("gpuctx_hangs", {"__init__.py": SLOW_INIT.replace("from . import sub\n", "")})
    site("gpuctx_fine", {"__init__.py": ""})
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "nb.ipynb"
    notebook(nb, "import gpuctx_broken\nimport gpuctx_hangs\nimport gpuctx_fine")
    km, kc = kernel(tmp_path, nb, site.path, policy="always", config="c.GpuWarmup.import_budget = 2.0\n",
                    GPUCTX_TEST_RELEASE=str(tmp_path / "never"))
    try:
        out = plan_of(kc)
        state = {s["name"]: (s["state"], s["detail"]) for s in out["plan"]["steps"]}
        assert state["import gpuctx_broken"] == ("failed", "RuntimeError: broken on purpose")
        assert state["import gpuctx_hangs"][0] == "failed" and "still importing" in state["import gpuctx_hangs"][1]
        assert state["import gpuctx_fine"][0] == "skipped" and "budget" in state["import gpuctx_fine"][1]
        assert out["status"]["state"] == "failed"
        assert any("failed" in line and "gpuctx_broken" in line for line in out["lines"])
        assert run(kc, "6 * 7").text == "42"
        assert run(kc, "import gpuctx_fine; print('ok')").stdout.strip() == "ok"
    finally:
        stop(km, kc)


def test_time_the_kernel_stood_stopped_is_not_counted_against_the_import_budget(tmp_path, site):
    """A server on a machine with few cores stops a starting standby (SIGSTOP) while another
    notebook's cell runs: that time was counted against the import budget, and the import under way
    failed "still importing after the import budget" though it had run 0.3 s of its 2. (The
    budget leaves a loaded machine 4 s of room; the stop outlasts it.)"""
    started = tmp_path / "started"
    site("gpuctx_stopped_here", {"__init__.py": f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\n"
                                                "for _ in range(40):\n    time.sleep(0.05)  # 2 s of running\n"})
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "nb.ipynb"
    notebook(nb, "import gpuctx_stopped_here")
    km, kc = kernel(tmp_path, nb, site.path, policy="always", config="c.GpuWarmup.import_budget = 6.0\n")
    try:
        wait_for(started.exists, timeout=120)
        pid = km.provisioner.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(8)  # the pause's length: past the budget
        finally:
            os.kill(pid, signal.SIGCONT)
        state = {s["name"]: (s["state"], s["detail"]) for s in plan_of(kc)["plan"]["steps"]}
        assert state["import gpuctx_stopped_here"][0] == "done", state
    finally:
        stop(km, kc)


def test_work_of_a_framework_whose_import_did_not_complete_is_skipped_not_imported_anyway(tmp_path, site):
    """The import budget spent before `import torch`: its recipes imported torch all the same
    (3 s on an H200 host, past the budget, outside the cells' turns), and behind an import left
    running they would wait on its lock for good, refusing every suspend."""
    site("gpuctx_hangs", {"__init__.py": SLOW_INIT.replace("from . import sub\n", "")})
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "nb.ipynb"
    notebook(nb, ["import gpuctx_hangs\nimport torch",
                  "model = torch.nn.Linear(4, 4).cuda()\nopt = torch.optim.AdamW(model.parameters())\n"
                  "model(torch.randn(2, 4, device='cuda')).sum().backward()\nopt.step()"])
    km, kc = kernel(tmp_path, nb, site.path, policy="always", config="c.GpuWarmup.import_budget = 2.0\n",
                    GPUCTX_TEST_RELEASE=str(tmp_path / "never"))
    try:
        out = plan_of(kc)
        steps = {s["name"]: (s["state"], s["detail"]) for s in out["plan"]["steps"]}
        assert steps["import torch"][0] == "skipped" and "budget" in steps["import torch"][1], steps
        work = {n: st for n, st in steps.items() if not n.startswith("import ")}  # (imports: skipped for the budget)
        assert work and all(st == ("skipped", "import torch did not complete") for st in work.values()), steps
        assert run(kc, "import sys; print('torch' in sys.modules)").stdout.strip() == "False"
    finally:
        stop(km, kc)


def test_unreadable_notebook_is_said_and_the_kernel_works_as_without_gpuctx(tmp_path):
    nb = tmp_path / "broken.ipynb"
    nb.write_text("{ this is not json")
    km, kc = kernel(tmp_path, nb, policy="always", GPUCTX_WARM_FRAMEWORKS="torch", GPUCTX_WARM_IMPORTS="json")
    try:
        out = plan_of(kc)
        assert out["plan"]["recipe"] == "basic" and "cannot read the notebook" in out["plan"]["reading"]
        assert run(kc, "1 + 1").text == "2"
    finally:
        stop(km, kc)


def test_auto_training_notebook_warms_its_imports_and_training_and_load_ext_stays_quiet(tmp_path):
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "train.ipynb"
    notebook(nb, ["%load_ext gpuctx\nimport torch\nimport torch.nn as nn",
                  ("model = nn.Linear(8, 2)\nopt = torch.optim.AdamW(model.parameters())\n"
                   "loss = model(torch.randn(4, 8)).sum()\nloss.backward()\nopt.step()")])
    km, kc = kernel(tmp_path, nb)
    try:
        quiet = run(kc, "%load_ext gpuctx")  # the notebook's own first line, in a prepared kernel
        assert quiet.reply["status"] == "ok" and quiet.text == "", quiet.text
        out = plan_of(kc, wait=120)
        steps = {s["name"]: s for s in out["plan"]["steps"]}
        assert steps["import torch"]["state"] == "done" and steps["import torch"]["where"] == "cell 1, line 2"
        assert steps["import torch._dynamo"]["state"] == "done"  # what AdamW's first use imports
        assert steps["optimizer step (AdamW) on the CPU"]["state"] == "done"
        assert steps["cuda init"]["state"] == "skipped"  # no GPU here
        assert out["status"]["state"] == "skipped" and "no GPU is visible" in out["status"]["detail"]
        assert any("optimizer step (AdamW)" in line and "cell 2, line 2" in line for line in out["lines"])
        r = run(kc, "import sys; print('torch._dynamo' in sys.modules)")
        assert r.stdout.strip() == "True"
        status = run(kc, "%gpu status").text  # the plan, step by step with the notebook's lines
        assert "warm plan" in status and "import torch" in status and "cell 1, line 2" in status, status
        lines = status.split("warm plan (notebook)", 1)[1].splitlines()  # each step: its state, its time
        # once done, why, and its line
        assert any(re.match(r"\s+done\s+import torch \(\d+\.\d\d s\)\s+← cell 1, line 2: import torch$", line)
                   for line in lines), status
        assert any(re.match(r"\s+skipped\s+cuda init: no GPU is visible\s+← ", line) for line in lines), status
        assert "imported torch only;" in status, status  # each framework named once
        at = [next(i for i, line in enumerate(lines) if name in line)  # in the order the cells need them
              for name in ("import torch (", "import torch._dynamo", "cuda init", "optimizer step")]
        assert at == sorted(at), status
        request = kc.session.msg("gpuctx_request", {})  # and the kernel view the server asks for
        kc.control_channel.send(request)
        view = reply_to(kc, request["header"]["msg_id"], timeout=10, channel="control")["content"]
        assert any(step["name"] == "import torch" for step in view["plan"]["steps"])
        # a cell whose `%load_ext gpuctx` line never ran (an error before it) leaves gpuctx loaded
        assert run(kc, "1/0\n%load_ext gpuctx").reply["status"] == "error"
        gone = run(kc, "%unload_ext gpuctx\nprint(hasattr(get_ipython(), '_gpuctx'))")
        assert "not loaded" not in gone.text and gone.stdout.strip() == "False", gone.text
    finally:
        stop(km, kc)


def test_the_warm_up_starts_after_the_first_kernel_info_reply(tmp_path):
    """Readiness first: the thread begins once the kernel has answered kernel_info."""
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "nb.ipynb"
    notebook(nb, "import json")
    km, kc = kernel(tmp_path, nb, policy="always")
    try:
        st = plan_of(kc)["status"]
        assert st["state"] == "done" and st["source"] == "server hook"
        hooked = run(kc, "k = get_ipython().kernel\n"
                         "print(getattr(k.shell_handlers['kernel_info_request'], '_gpuctx', False))")
        assert hooked.stdout.strip() == "False"  # the one-shot hook has put the handler back
    finally:
        stop(km, kc)


# Installed as sitecustomize: records on the kernel's clock each time the process opens its notebook.
OPENS = """import os, sys, time
_nb, _log = os.environ["JPY_SESSION_NAME"], os.environ["GPUCTX_TEST_OPENS"]
def _hook(event, args):
    if event == "open" and args and str(args[0]) == _nb:
        with open(_log, "a") as f:
            f.write(f"{time.monotonic()}\\n")
sys.addaudithook(_hook)
"""


@pytest.mark.parametrize("cells", [["import torch"], ["print('no GPU framework here')"]])
def test_the_kernel_reads_its_notebook_only_once_it_has_answered(tmp_path, site, cells):
    """Under policy auto, whether the notebook uses a GPU framework is read by the warm-up thread,
    after the first kernel_info reply: a notebook of megabytes of outputs takes tens of ms to read,
    which readiness never waits for. A notebook that uses none ends with the warm-up off, saying why."""
    (pathlib.Path(site.path) / "sitecustomize.py").write_text(OPENS)
    opens = tmp_path / "opens"
    (tmp_path / "work").mkdir()
    nb = tmp_path / "work" / "nb.ipynb"
    notebook(nb, cells)
    km, kc = kernel(tmp_path, nb, site.path, GPUCTX_TEST_OPENS=str(opens))
    try:
        def ended():
            now = warmup_now(kc)
            return now if now["state"] != "running" else None

        st = wait_for(ended, timeout=240)
        first_read = min(float(t) for t in opens.read_text().split())
        assert st["started"] is not None and first_read >= st["started"], (first_read, st)
        if cells[0].startswith("print"):
            assert st["state"] == "off" and "uses no GPU framework" in st["detail"], st
            assert "warm-up: off" in run(kc, "%gpu status").text
        else:
            assert st["state"] in ("done", "skipped") and "no GPU is visible" in st["detail"], st
    finally:
        stop(km, kc)


def test_a_kernel_warmed_by_its_own_config_takes_the_servers_settings_when_they_come(tmp_path):
    """Behind a gateway a kernel may load gpuctx from its own config (policy auto) where it cannot
    read the notebook: it decides so at once, and the server's request that follows (its settings
    in the environment, extension.warm_from_env) is carried out."""
    (tmp_path / "work").mkdir()
    km, kc = start(env={"JPY_SESSION_NAME": str(tmp_path / "work" / "remote.ipynb"), "GPUCTX_WARM": "auto"},
                   extra_arguments=["--ext=gpuctx"], cwd=str(tmp_path / "work"))
    try:
        own = warmup_now(kc)
        assert own["state"] == "off" and "cannot read the notebook" in own["detail"], own
        r = run(kc, "import os\nos.environ.update(GPUCTX_WARM='always', GPUCTX_WARM_SOURCE='server hook')\n"
                    "from gpuctx_jupyter.kernel.extension import warm_from_env\nwarm_from_env(get_ipython())")
        assert r.reply["status"] == "ok", r.stderr
        st = plan_of(kc)["status"]
        assert st["source"] == "server hook" and st["state"] in ("done", "skipped"), st
    finally:
        stop(km, kc)


COMPILE_CELL = ("import torch\nfrom torch._dynamo.utils import counters\nbefore = dict(counters['inductor'])\n"
                "model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))\n"
                "compiled = torch.compile(model)\ncompiled(torch.randn(32, 64)).sum().backward()\n"
                "after = counters['inductor']\n"
                "print({k: after[k] - before.get(k, 0) for k in ('fxgraph_cache_hit', 'fxgraph_cache_miss')})")


def test_the_compile_warm_up_runs_on_the_cpu_and_leaves_the_users_graph_as_it_compiled_before(tmp_path):
    """Without a GPU, the compile step runs inductor's CPU backend (dynamo, inductor's import and
    code generation, the C++ compiler's first use). A notebook compiled yesterday then finds its
    graphs in inductor's cache on disk: the warm-up's own compile must not change the user's graph
    (through nn.Sequential it made dynamo compile the user's nn.Sequential with a dynamic batch
    size — another graph, built again instead of read)."""
    nb = tmp_path / "nb.ipynb"
    notebook(nb, ["import torch", COMPILE_CELL])
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    # yesterday: the notebook ran in a plain kernel, without gpuctx (which once imported
    # multiprocessing before torch: pickle then named torch's memory formats after the user's
    # namespace, and inductor's keys for the same graph differed)
    km, kc = start(env=cache, cwd=str(tmp_path))
    try:
        r = run(kc, COMPILE_CELL, timeout=300)
        assert r.reply["status"] == "ok", r.stderr
    finally:
        stop(km, kc)
    km, kc = kernel(tmp_path, nb, **cache)  # today: warmed, its compile step done before the cell
    try:
        out = plan_of(kc, wait=240)
        step = next(s for s in out["plan"]["steps"] if s["name"].startswith("compile a tiny model"))
        assert step["state"] == "done" and step["name"].endswith("on the CPU"), step
        r = run(kc, COMPILE_CELL, timeout=300)
        assert r.reply["status"] == "ok", r.stderr
        assert r.stdout.strip().splitlines()[-1] == "{'fxgraph_cache_hit': 2, 'fxgraph_cache_miss': 0}", r.stdout
    finally:
        stop(km, kc)


SEEDED = "import torch\ntorch.manual_seed(0)"
# Draws as a notebook's next cell makes them (random inputs, a new model's initial weights), then
# the same draws right after seeding again: equal only if nothing drew in between.
DRAWS = ("a, w = torch.randn(4).tolist(), torch.nn.Linear(3, 2).weight.tolist()\ntorch.manual_seed(0)\n"
         "print(a == torch.randn(4).tolist(), w == torch.nn.Linear(3, 2).weight.tolist())")


def test_a_warm_up_step_between_a_seeding_cell_and_the_next_leaves_the_next_cells_numbers_as_seeded(tmp_path):
    """`torch.manual_seed(0)`, then the warm-up's compile step (a tiny model's initial weights and
    input, drawn from torch's generator), then the user's draws: they are those of the seed, as in a
    kernel without gpuctx. The cells reach the kernel as JupyterLab sends typed cells, after the
    seeding cell ran, so the step runs between the two cells."""
    nb = tmp_path / "new.ipynb"
    notebook(nb, [])
    km, kc = kernel(tmp_path, nb, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    try:
        assert run(kc, SEEDED, timeout=120).reply["status"] == "ok"
        assert control(kc, "gpuctx_cells_request", {"cells": [SEEDED, COMPILE_CELL, DRAWS]})["planned"] >= 1
        # waiting over the control channel: a cell that waited would overlap the step it waits for
        view = wait_for(lambda: warm_up_ended(kc, "compile a tiny model"), timeout=300, every=0.5)
        step = next(s for s in view["plan"]["steps"] if s["name"].startswith("compile a tiny model"))
        assert step["state"] == "done" and "cell started" not in step["detail"], step
        r = run(kc, DRAWS, timeout=120)
        assert r.reply["status"] == "ok", r.stderr
        assert r.stdout.strip() == "True True", r.stdout
    finally:
        stop(km, kc)


SETS = "torch.set_default_dtype(torch.float64)\ntorch.use_deterministic_algorithms(True)\ntorch.manual_seed(1234)"
SETTINGS = "print(torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(), torch.initial_seed())"


def test_a_cell_that_sets_what_the_warm_ups_compile_puts_back_keeps_it(tmp_path):
    """Dynamo saves the default dtype, deterministic mode and the generators' states as it starts
    compiling and puts them back as it ends: a cell that set them while the warm-up's compile ran
    lost them (float32 again, deterministic off, the seed gone) for every later cell."""
    nb = tmp_path / "new.ipynb"
    notebook(nb, [])
    km, kc = kernel(tmp_path, nb, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    try:
        assert run(kc, "import torch", timeout=120).reply["status"] == "ok"
        assert control(kc, "gpuctx_cells_request", {"cells": ["import torch", COMPILE_CELL]})["planned"] >= 1
        wait_for(lambda: warmup_now(kc).get("phase", "").startswith("compile a tiny model"), timeout=300, every=0.05)
        assert run(kc, SETS, timeout=300).reply["status"] == "ok"  # sent while the warm-up compiles
        view = wait_for(lambda: warm_up_ended(kc, "compile a tiny model"), timeout=300, every=0.5)
        step = next(s for s in view["plan"]["steps"] if s["name"].startswith("compile a tiny model"))
        assert step["state"] == "done" and "cell started" in step["detail"], step  # it came during the step
        r = run(kc, SETTINGS)
        assert r.stdout.strip() == "torch.float64 True 1234", r.stdout
    finally:
        stop(km, kc)


LOADING_CELL = ("%load_ext gpuctx\nimport time\nt0 = time.monotonic()\n"
                "while time.monotonic() - t0 < 3:  # a cell that runs on after loading gpuctx\n    pass\n"
                "loaded_cell_end = time.monotonic()")


def test_a_warm_up_started_by_a_cells_load_ext_waits_for_that_cell(tmp_path):
    """`%load_ext gpuctx` in a cell (after `%unload_ext`, or where the server's hook set the policy):
    the loading cell had begun before gpuctx could count it, so the warm-up took the kernel for idle
    and ran its steps beside it — and gave the generators back their state from before each step,
    undoing a seed the cell set meanwhile."""
    nb = tmp_path / "train.ipynb"
    notebook(nb, ["import torch\nmodel = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)"])
    km, kc = start(env={"JPY_SESSION_NAME": str(nb), "GPUCTX_WARM": "always", "GPUCTX_WARM_SOURCE": "server hook"},
                   cwd=str(tmp_path))
    try:
        assert run(kc, LOADING_CELL, timeout=120).reply["status"] == "ok"
        view = wait_for(lambda: warm_up_ended(kc, "import torch"), timeout=300, every=0.5)
        began = [s["name"] for s in view["plan"]["steps"] if s.get("started") is not None]
        assert began, view["plan"]
        r = run(kc, "print(min(s.started for s in get_ipython()._gpuctx.warmer.plan.steps if s.started is not None)"
                    " >= loaded_cell_end)")
        assert r.stdout.strip() == "True", (r.stdout, began)
    finally:
        stop(km, kc)


def test_gpuctx_loaded_by_a_silent_request_leaves_no_cell_counted(tmp_path):
    """A silent execute (the gateway's warm-up request, an IPython start-up file) gets no
    post_run_cell: counted as a running cell, it stayed one for good and the warm-up waited for
    "your cells" forever."""
    nb = tmp_path / "train.ipynb"
    notebook(nb, ["import torch"])
    km, kc = start(env={"JPY_SESSION_NAME": str(nb), "GPUCTX_WARM": "always", "GPUCTX_WARM_SOURCE": "server hook"},
                   cwd=str(tmp_path))
    try:
        msg_id = kc.execute("%load_ext gpuctx", silent=True)
        assert reply_to(kc, msg_id, timeout=60)["content"]["status"] == "ok"
        assert run(kc, "print(get_ipython()._gpuctx.cells_running)").stdout.strip() == "1"  # this cell only
        assert wait_for(lambda: warm_up_ended(kc, "import torch"), timeout=300, every=0.5)
    finally:
        stop(km, kc)
