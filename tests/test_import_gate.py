"""The warm-up's import under way stands still while a cell runs (kernel/warm/import_gate.py), in
real ipykernel processes started as the server's hook starts them: a cell sent at once shares the
GIL with nothing of ours, and a cell that needs the half-imported package, or forks, still works."""
from __future__ import annotations

import json
import os

import pytest

from .harness.kernels import run, stop
from .harness.notebooks import notebook
from .harness.waiting import wait_for
from .harness.warm_kernels import kernel, plan_of, warmup_now

# A package whose import is Python work in many modules: each spins 10 ms (as module code holds the
# GIL), then writes down when it began, on the kernel's clock (time.monotonic).
INIT = """import importlib, os
for _i in range(int(os.environ["GPUCTX_TEST_MODULES"])):
    importlib.import_module(f"{__name__}.m{_i}")
DONE = True
"""
MODULE = """import os, time
t = time.monotonic()
while time.monotonic() - t < 0.01:
    pass
with open(os.environ["GPUCTX_TEST_LOG"], "a") as _f:
    _f.write(f"{t}\\n")
"""


@pytest.fixture
def importing(tmp_path, site):
    """A kernel whose warm-up is part-way through importing the package (modules: how many)."""
    kernels = []

    def make(modules: int):
        site("gpuctx_manymods", {"__init__.py": INIT, **{f"m{i}.py": MODULE for i in range(modules)}})
        log = tmp_path / "log"
        (tmp_path / "work").mkdir()
        nb = tmp_path / "work" / "many.ipynb"
        notebook(nb, ["import gpuctx_manymods"])
        km, kc = kernel(tmp_path, nb, site.path, policy="always", GPUCTX_TEST_LOG=str(log),
                        GPUCTX_TEST_MODULES=str(modules))
        kernels.append((km, kc))
        def the_warm_up_imports_the_package():
            return log.exists() and len(log.read_text().split()) >= 5
        wait_for(the_warm_up_imports_the_package, timeout=60)
        assert warmup_now(kc)["phase"] == "import gpuctx_manymods"
        return kc, log

    yield make
    for km, kc in kernels:
        stop(km, kc)


BUSY = """import json, time
t0 = time.monotonic()
while time.monotonic() - t0 < {seconds}:
    pass
print(json.dumps([t0, time.monotonic()]))"""


def test_a_cell_sent_while_the_warm_up_imports_runs_beside_no_import_of_it(importing):
    kc, log = importing(modules=600)  # ~6 s of import at least
    r = run(kc, BUSY.format(seconds=1.0), timeout=60)
    t0, t1 = json.loads(r.stdout)
    during = [t for t in map(float, log.read_text().split()) if t0 < t < t1]
    assert len(during) <= 1, f"{len(during)} of the warm-up's modules ran during the cell"  # (one begun as it started)
    out = plan_of(kc, wait=120)  # afterwards the import goes on to the end, within its budget
    step = next(s for s in out["plan"]["steps"] if s["name"] == "import gpuctx_manymods")
    assert step["state"] == "done", step
    assert len(log.read_text().split()) == 600


def test_a_cell_that_needs_the_half_imported_package_gets_it_whole(importing):
    """It looks like no import (the warm-up cannot tell it waits): the cell's import waits on the
    package's lock, which the held import holds; the gate lets the import finish instead."""
    kc, log = importing(modules=300)
    r = run(kc, BUSY.format(seconds=0.3) + "\nm = __import__('gpuctx_manymods.m299').m299\n"
            "print(m.t > 0, __import__('gpuctx_manymods').DONE)", timeout=120)
    assert r.reply["status"] == "ok", r.stderr
    assert r.stdout.split("\n")[1] == "True True", r.stdout


FORK = BUSY.format(seconds=0.3) + """
import os, time
pid = os.fork()
if pid == 0:  # (an import the warm-up cannot see in the cell, as a library's own would be)
    os._exit(0 if getattr(__import__("gpuctx_manymods"), "DONE", False) else 3)
deadline, status = time.monotonic() + 60, None
while status is None and time.monotonic() < deadline:
    done, code = os.waitpid(pid, os.WNOHANG)
    status = os.waitstatus_to_exitcode(code) if done else None
    time.sleep(0.05)
if status is None:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print("child:", status)"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_a_cell_that_forks_gives_its_child_the_package_whole(importing):
    """A fork waits for the held imports (a child must not inherit a half-imported package, whose
    lock would be held by a thread it does not have)."""
    kc, log = importing(modules=150)
    r = run(kc, FORK, timeout=120)
    assert r.reply["status"] == "ok", r.stderr
    assert r.stdout.split("\n")[1] == "child: 0", r.stdout
