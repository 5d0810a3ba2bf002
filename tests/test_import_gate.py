"""The warm-up's import under way stands still while a cell runs (kernel/warm/import_gate.py), in
real ipykernel processes started as the server's hook starts them: a cell sent at once shares the
GIL with nothing of ours, and a cell that needs the half-imported package, or forks, still works."""
from __future__ import annotations

import json
import os

import pytest

from gpuctx_jupyter.kernel.warm.import_gate import HOLD_MAX_S

from .harness.kernels import reply_to, run, stop
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

    def make(modules: int, init: str = INIT):
        site("gpuctx_manymods", {"__init__.py": init, **{f"m{i}.py": MODULE for i in range(modules)}})
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
from gpuctx_jupyter.kernel.warm.import_gate import GATE
t0 = time.monotonic()
while time.monotonic() - t0 < {seconds}:
    pass
print(json.dumps([t0, time.monotonic(), GATE._closed_at]))"""  # (and when the cell closed the gate)


def test_a_cell_sent_while_the_warm_up_imports_runs_beside_no_import_of_it(importing):
    kc, log = importing(modules=600)  # ~6 s of import at least
    r = run(kc, BUSY.format(seconds=1.0), timeout=60)
    t0, t1, _ = json.loads(r.stdout)
    during = [t for t in map(float, log.read_text().split()) if t0 < t < t1]
    assert len(during) <= 1, f"{len(during)} of the warm-up's modules ran during the cell"  # (one begun as it started)
    out = plan_of(kc, wait=120)  # afterwards the import goes on to the end, within its budget
    step = next(s for s in out["plan"]["steps"] if s["name"] == "import gpuctx_manymods")
    assert step["state"] == "done", step
    assert len(log.read_text().split()) == 600


def test_a_long_cell_holds_the_import_for_its_first_seconds_only(importing):
    """Then the import goes on beside it (a long cell: the warm-up's import is not put off for it)."""
    kc, log = importing(modules=1000)
    r = run(kc, BUSY.format(seconds=HOLD_MAX_S + 1.5), timeout=60)
    t0, t1, closed = json.loads(r.stdout)
    times = [float(t) for t in log.read_text().split()]
    assert len([t for t in times if t0 < t < closed + HOLD_MAX_S - 0.2]) <= 1
    assert len([t for t in times if closed + HOLD_MAX_S + 0.2 < t < t1]) >= 5


# The package's modules are imported by a function holding a lock (as a library's set-up may):
# a cell that needs the lock must get it once that import is done, never wait on a held import.
LOCKED_INIT = """import importlib, os, threading
LOCK = threading.Lock()
def _load():
    with LOCK:
        for i in range(int(os.environ["GPUCTX_TEST_MODULES"])):
            importlib.import_module(f"{__name__}.m{i}")
_load()
DONE = True
"""


def test_an_import_made_by_a_function_is_not_held_a_lock_it_holds_may_be_the_cells(importing):
    kc, log = importing(modules=1000, init=LOCKED_INIT)  # still importing when the cell runs, on a loaded machine too
    r = run(kc, BUSY.format(seconds=0.5) + "\nimport sys\nwith sys.modules['gpuctx_manymods'].LOCK:\n"
            "    print('got the lock')", timeout=60)
    assert r.reply["status"] == "ok" and "got the lock" in r.stdout, r.stdout + r.stderr
    t0, t1, _ = json.loads(r.stdout.splitlines()[0])
    assert len([t for t in map(float, log.read_text().split()) if t0 < t < t1]) >= 5  # not held


def test_a_cell_that_needs_the_half_imported_package_gets_it_whole(importing):
    """It looks like no import (the warm-up cannot tell it waits): the cell's import waits on the
    package's lock, which the held import holds; the gate lets the import finish instead."""
    kc, log = importing(modules=300)
    r = run(kc, "from gpuctx_jupyter.kernel.warm.import_gate import GATE\nheld = GATE.held()\n"
            + BUSY.format(seconds=0.3) + "\nm = __import__('gpuctx_manymods.m299').m299\n"
            "print(m.t > 0, __import__('gpuctx_manymods').DONE, GATE.held() - held)", timeout=120)
    assert r.reply["status"] == "ok", r.stderr
    whole, done, held = r.stdout.split("\n")[1].split()
    assert whole == done == "True", r.stdout
    assert float(held) < HOLD_MAX_S / 2, r.stdout  # it went on when the cell asked, not at the limit


# Imports made by C code (pickle here; an extension module's init alike) are not held: that code
# may hold a lock of its own the cell then waits for.
PICKLED_INIT = """import os, pickle
for _i in range(int(os.environ["GPUCTX_TEST_MODULES"])):
    pickle.loads(f"c{__name__}.m{_i}\\nt\\n.".encode())  # (protocol 0: the module's `t`, imported by C)
DONE = True
"""


def test_an_import_made_by_c_code_is_not_held(importing):
    kc, log = importing(modules=1000, init=PICKLED_INIT)
    r = run(kc, BUSY.format(seconds=0.5), timeout=60)
    t0, t1, _ = json.loads(r.stdout)
    assert len([t for t in map(float, log.read_text().split()) if t0 < t < t1]) >= 5


FORK = BUSY.format(seconds=0.5) + """
import os
f0 = time.monotonic()
pid = os.fork()
if pid == 0:
    os._exit(0)
f1 = time.monotonic()
os.waitpid(pid, 0)
while time.monotonic() - f1 < 1.0:
    pass
print(json.dumps([f0, f1, time.monotonic()]))"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_a_fork_lets_the_held_import_go_on_and_waits_no_longer_than_it_was_held(importing):
    """`!cmd` forks (pexpect), as DataLoader's workers do: the fork is not held up for the whole
    import, and the child finds it as far along as without the gate (it went on meanwhile)."""
    kc, log = importing(modules=1000)  # ~10 s of import: far longer than the cell holds it
    r = run(kc, FORK, timeout=120)
    assert r.reply["status"] == "ok", r.stderr
    (t0, _, closed), (f0, f1, end) = (json.loads(line) for line in r.stdout.split("\n")[:2])
    assert f1 - f0 < (f0 - closed) + 0.5, (f0 - closed, f1 - f0)  # waited at most as long as it held
    assert len([t for t in map(float, log.read_text().split()) if f1 < t < end]) >= 5  # and it went on


def test_a_cell_is_seen_to_import_a_package_whichever_way_its_import_is_written():
    """(Such a cell waits for the warm-up's import of it instead of competing with it.)"""
    from gpuctx_jupyter.kernel.warm.import_gate import imports_packages

    for source in ("import json, gpuctx_not_yet_imported", "x = 1; import gpuctx_not_yet_imported",
                   "%matplotlib inline\nfrom gpuctx_not_yet_imported.sub import y", "if True:\n    import gpuctx_not_yet_imported"):
        assert imports_packages(source), source
    for source in ("import json, os", "from . import x", "print('import gpuctx_not_yet_imported')", "%pip install x"):
        assert not imports_packages(source), source


def test_an_interrupt_while_a_cell_waits_for_the_warm_ups_import_stops_the_cell_as_interrupted(importing):
    """A cell importing a package waits for the warm-up's import under way; Interrupt then stops it
    as it stops any cell (KeyboardInterrupt, the cell's code not run) — no traceback of gpuctx's."""
    kc, log = importing(modules=3000)  # ~30 s of import left
    msg_id = kc.execute("import gpuctx_manymods\nprint('the cell ran')")
    waiting = wait_for(lambda: (w := warmup_now(kc))["cell_waits"] and w, timeout=30)  # (the control channel)
    assert waiting["cell_waits"] == "import gpuctx_manymods", waiting
    kc.control_channel.send(kc.session.msg("interrupt_request", {}))
    reply = reply_to(kc, msg_id, timeout=10)["content"]  # not once the import is done
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    printed, traceback = [], []
    while True:  # what the interrupted cell showed, up to its idle: as a frontend, the next cell is
        msg = kc.get_iopub_msg(timeout=30)  # sent after that (ipykernel aborts what comes earlier)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        printed.append(msg["content"].get("text", ""))
        traceback.extend(msg["content"].get("traceback", []))
    r = run(kc, "print(1 + 1)")  # the kernel works on
    assert r.reply["status"] == "ok" and r.stdout.strip() == "2", r.stderr
    assert "the cell ran" not in "".join(printed) and "Error in callback" not in "".join(printed), printed
    assert "KeyboardInterrupt" in traceback[-1] and "gpuctx_jupyter" not in "".join(traceback), traceback


def test_unloading_gpuctx_ends_the_warm_up_under_way(importing):
    """`%unload_ext gpuctx` while the warm-up imports: its thread ends (the import itself finishes
    in its own thread), and no step of it follows."""
    kc, log = importing(modules=3000)
    assert run(kc, "%unload_ext gpuctx").reply["status"] == "ok"
    probe = "import threading; print([t.name for t in threading.enumerate() if t.name == 'gpuctx-warmup'])"
    assert wait_for(lambda: run(kc, probe).stdout.strip() == "[]", timeout=10)
    status = run(kc, "import IPython; print(IPython.get_ipython().__dict__.get('_gpuctx'))").stdout.strip()
    assert status == "None"
