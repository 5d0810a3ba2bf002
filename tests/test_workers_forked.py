"""Workers forked from imports done ahead (kernel/worker_zygote.py): an imports standby of the
warm pool also imports what `%gpu workers` engines import, in a process of its own, and the
workers are forked from it with those imports done. Real ipykernel processes started as the pool
starts an imports standby, a real jupyter_server with its pool, real ipyparallel engines (CPU
workers on gloo: no GPU in CI)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from .harness import kernels
from .harness.faults import pool_of
from .harness.gpus import NO_GPU
from .harness.kernels import reply_to, run, wait_idle
from .harness.notebooks import notebook
from .harness.waiting import wait_for
from .harness.workers import STATE, WHO, gone, kernel_pid, tree, whos, workers_state

pytestmark = pytest.mark.timeout(600)
pytest.importorskip("ipyparallel")

START = "%gpu workers start 2" if NO_GPU else "%gpu workers start 2 --cpu"
AUTO = {"GPUCTX_SERVER_POOL": "auto"}  # the suite's servers keep no pool otherwise


def standby_kernel(tmp_path, **extra):
    """A kernel started as the pool starts an imports standby that is asked for the workers' imports."""
    env = {"GPUCTX_WARM": "always", "GPUCTX_WARM_RECIPE": "imports", "GPUCTX_WARM_IMPORTS": "numpy,torch",
           "GPUCTX_WARM_SOURCE": "the warm pool (imports standby)", "GPUCTX_STANDBY": "1",
           "GPUCTX_WORKER_IMPORTS": "1", **extra}
    folder = tmp_path / "work"
    folder.mkdir(parents=True, exist_ok=True)
    km, kc = kernels.start(env=env, extra_arguments=["--ext=gpuctx"], cwd=str(folder))
    return km, kc, folder


def imports_ready(kc) -> dict:
    """The workers' imports, once `%gpu workers` says their process has done them."""
    def done():
        found = re.search(r"the workers' imports: imports done in process (\d+)", run(kc, "%gpu workers").text)
        return found and int(found.group(1))

    pid = wait_for(done, timeout=180, every=0.3)
    state = workers_state(kc)["imports"]
    assert state["pid"] == pid and state["imported"]
    return state


def zygotes_below(pid: int) -> list[psutil.Process]:
    """The process of kernel `pid` that does the workers' imports (what it forks has its command line too)."""
    found = []
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return []
    for p in children:
        try:
            if p.cmdline()[-2:-1] == ["imports"]:
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_workers_forked_from_the_imports_are_the_notebooks_and_end_with_it_even_when_it_is_killed(tmp_path):
    km, kc, folder = standby_kernel(tmp_path)
    try:
        zygote = imports_ready(kc)
        listing = run(kc, "%gpu workers").text
        assert f"the workers' imports: imports done in process {zygote['pid']}" in listing, listing
        assert "`%gpu workers start` forks its workers from it" in listing
        run(kc, "import os; os.environ['GPUCTX_TEST_NOTE'] = 'set by the notebook'")  # read by no import
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert "(forked with their imports done ahead)" in r.stdout and "gpuctx: 2 workers ready in" in r.stdout, r.stdout
        ranks = whos(run(kc, WHO).text)
        assert [w["rank"] for w in ranks] == [0, 1] and {w["backend"] for w in ranks} == {"gloo"}
        assert {psutil.Process(w["pid"]).ppid() for w in ranks} == {zygote["pid"]}  # forked, below the kernel
        assert {w["cwd"] for w in ranks} == {str(folder)} and {w["WORLD_SIZE"] for w in ranks} == {"2"}
        seen = run(kc, "%%on_gpu all\nimport os, torch\nimport torch.distributed as dist\n"
                       "t = torch.ones(1); dist.all_reduce(t)\n"
                       "print('SEEN', os.environ.get('GPUCTX_TEST_NOTE'), torch.get_num_threads(), int(t.item()))")
        assert seen.text.count("SEEN set by the notebook 1 2") == 2, seen.text  # OMP_NUM_THREADS=1 as spawned ones
        os.kill(ranks[1]["pid"], signal.SIGKILL)
        wait_for(lambda: not psutil.pid_exists(ranks[1]["pid"]))  # its parent collected it
        died = run(kc, "%%on_gpu all\n1")
        assert died.reply["status"] == "error", died.text
        assert f"rank 1 · cpu (pid {ranks[1]['pid']}) died since the last cell, killed by SIGKILL" in died.text, died.text  # its status came back
        r = run(kc, START, timeout=300)  # forked again: the imports stay for the kernel's life
        assert "(forked with their imports done ahead)" in r.stdout and "2 workers ready" in r.stdout, r.text
        pid = kernel_pid(kc)
        every = tree(pid)
        assert zygotes_below(pid)
        os.kill(pid, signal.SIGKILL)  # nothing ends them but their own watch on the kernel
        wait_for(lambda: gone(every), timeout=60)
    finally:
        kernels.stop(km, kc)


def test_an_import_time_setting_changed_since_the_imports_starts_the_workers_the_usual_way(tmp_path):
    km, kc, _ = standby_kernel(tmp_path)
    try:
        zygote = psutil.Process(imports_ready(kc)["pid"])
        run(kc, "import os; os.environ['TORCH_SHOW_CPP_STACKTRACES'] = '1'")
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert ("gpuctx: the workers were not forked from the imports done ahead: the kernel's "
                "TORCH_SHOW_CPP_STACKTRACES changed after the workers' imports were done") in r.stdout, r.stdout
        assert "forked with" not in r.stdout and "2 workers ready" in r.stdout
        wait_for(lambda: gone([zygote]), timeout=30)  # its memory goes back
        ranks = whos(run(kc, WHO).text)
        assert all("engine" in psutil.Process(w["pid"]).cmdline() for w in ranks)  # spawned as usual
        seen = run(kc, "%%on_gpu all\nimport os\nos.environ.get('TORCH_SHOW_CPP_STACKTRACES')")
        assert "'1'" in seen.text, seen.text
    finally:
        kernels.stop(km, kc)


def test_imports_that_do_not_finish_in_time_give_way_to_the_usual_start(tmp_path):
    site = tmp_path / "site"
    (site / "gpuctx_hangs_here").mkdir(parents=True)
    (site / "gpuctx_hangs_here" / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    km, kc, _ = standby_kernel(tmp_path, GPUCTX_WARM_IMPORTS="numpy,torch,gpuctx_hangs_here",
                               GPUCTX_WORKER_IMPORT_SECONDS="4",
                               PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    try:
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert "did not finish within 4 s (still importing gpuctx_hangs_here)" in r.stdout, r.stdout
        assert "gpuctx: 2 workers ready in" in r.stdout
        assert not zygotes_below(kernel_pid(kc))
        assert "did not finish within 4 s" in run(kc, "%gpu workers stop\n%gpu workers").text
    finally:
        kernels.stop(km, kc)


# The controller's fork held in the kernel until the test lets it go, as a loaded machine's slow
# answer would hold it (the process that did the workers' imports answers one request at a time):
# before the fork ("before": no process yet) or after it ("after": the process runs, its launcher
# does not know it yet).
HOLD = """
import os, pathlib, time
from gpuctx_jupyter.kernel import worker_zygote
zygote = worker_zygote.current()
fork = zygote.fork

def hold():
    pathlib.Path(%(holding)r).touch()
    while not os.path.exists(%(release)r):
        time.sleep(0.02)

def held(argv, *args, **kwargs):
    wait = "controller" in argv and not os.path.exists(%(release)r)
    if wait and %(when)r == "before":
        hold()
    pid = fork(argv, *args, **kwargs)
    if wait and %(when)r == "after":
        hold()
    return pid

zygote.fork = held
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_interrupted_start_leaves_no_worker_forked_for_it(tmp_path, when):
    """Interrupt while the line waits for a fork: the fork goes on in ipyparallel's thread while the
    line stops what it knows of; the process it gives is ended as the fork returns, whether it
    was forked after the stop or ran before it (its output open, ipyparallel not yet told), and
    the line works again."""
    holding, release = tmp_path / "holding", tmp_path / "release"
    km, kc, _ = standby_kernel(tmp_path)
    try:
        zygote = psutil.Process(imports_ready(kc)["pid"])
        hold = HOLD % {"holding": str(holding), "release": str(release), "when": when}
        assert run(kc, hold).reply["status"] == "ok"
        msg_id = kc.execute(START)
        wait_for(holding.exists, timeout=120)  # the controller's fork waits
        if when == "after":
            assert zygote.children(), "the controller was forked and runs"
        km.interrupt_kernel()
        if when == "before":
            release.touch()  # the fork is done as the line stops what it started
        reply = reply_to(kc, msg_id, timeout=120)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        wait_idle(kc, msg_id)
        if when == "after":
            release.touch()  # the line has stopped everything it knew of: the fork returns only now
        wait_for(lambda: workers_state(kc)["imports"]["forked"] >= 1 or not zygote.children(), timeout=120,
                 every=0.3)
        wait_for(lambda: not zygote.children(), timeout=30)
        r = run(kc, START, timeout=300)  # the line works after it, forked
        assert "(forked with their imports done ahead)" in r.stdout and "2 workers ready" in r.stdout, r.text
        stopped = run(kc, "%gpu workers stop").stdout.strip()
        assert stopped == "gpuctx: stopped 2 workers and their ipyparallel controller", stopped
        wait_for(lambda: not zygote.children(), timeout=60)
    finally:
        kernels.stop(km, kc)


def test_the_pool_keeps_the_imports_for_a_notebook_that_starts_workers_and_ends_them_for_others(server_factory,
                                                                                                tmp_path):
    notebook(tmp_path / "train.ipynb", [START, "import torch"])
    notebook(tmp_path / "plain.ipynb", ["import torch\nx = torch.ones(2)"])
    # no restart reserve for train.ipynb: once ready it ties with the imports standby for plain.ipynb
    # (both cover `import torch`), and either may serve it; this test is about the imports standby
    srv = server_factory("--GpuctxServer.pool_reserve_after=3600", env=AUTO)

    def standby_with_imports():
        for s in (pool_of(srv) or {}).get("standbys", []):
            if s["kind"] == "imports" and s["ready"] and zygotes_below(s["pid"]):
                return s
        return None

    standby = wait_for(standby_with_imports, timeout=240)
    zygote = zygotes_below(standby["pid"])[0]
    assert standby["rss"] > psutil.Process(standby["pid"]).memory_info().rss  # its imports' memory is counted
    kid = srv.start_kernel(path="train.ipynb")
    ks = srv.channels(kid)
    try:
        def forked():
            state = json.loads(ks.execute(STATE).stdout.strip().splitlines()[-1])
            prep = state and state.get("prepared")
            return prep if prep and prep["forked"] and len(prep["pids"]) == 3 else None

        try:
            prep = wait_for(forked, timeout=180, every=0.5)
        except AssertionError:
            raise AssertionError(ks.execute("%gpu workers\n%gpu status").text) from None
        assert {psutil.Process(p).ppid() for p in prep["pids"]} == {zygote.pid}  # the controller and both engines
        r = ks.execute(START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert "(prepared" in r.stdout and "for cell 1, line 1 and forked with their imports done)" in r.stdout, r.stdout
        assert "2 workers ready in" in r.stdout
    finally:
        ks.close()
    other = wait_for(lambda: (lambda s: s if s and s["pid"] != standby["pid"] else None)(standby_with_imports()),
                     timeout=240)
    plain = srv.start_kernel(path="plain.ipynb")
    ks = srv.channels(plain)
    try:
        assert ks.execute("import os; print(os.getpid())").stdout.strip() == str(other["pid"])  # from the pool
    finally:
        ks.close()
    wait_for(lambda: not zygotes_below(other["pid"]), timeout=60)  # no workers there: the memory goes back


STAGE = """
import threading, time
from gpuctx_jupyter.kernel import worker_zygote
end = threading.Event()
def imports():  # 1 s of running, in steps: a stop holds it where it is
    for _ in range(20):
        time.sleep(0.05)
    end.set()
threading.Thread(target=imports, daemon=True).start()
print("started", flush=True)
print(worker_zygote._within(end, 3.0), flush=True)
"""


def test_the_workers_imports_stage_leaves_out_time_its_process_stood_stopped():
    """The workers' imports done ahead run in a process of the standby's, which the server stops
    with it (SIGSTOP) while another notebook's cell runs on a machine with few cores: a stage of
    1 s given 3 s, stopped 4 s, was given up ("still importing torch after 60 s" on a real one)."""
    proc = subprocess.Popen([sys.executable, "-c", STAGE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(4)  # the pause's length: past the stage's seconds
        finally:
            proc.send_signal(signal.SIGCONT)
        assert proc.stdout.readline().strip() == "True"
    finally:
        proc.kill()
        proc.wait(10)
