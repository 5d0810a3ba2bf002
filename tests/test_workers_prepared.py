"""Workers prepared ahead: a kernel whose notebook has a `%gpu workers start` line starts those
workers once it has read the notebook (imports only, no CUDA), and the line adopts them. Real
ipykernel processes started as the server's hook starts them, real ipyparallel engines (CPU
workers on gloo: no GPU in CI)."""
from __future__ import annotations

import os
import signal

import pytest

from .harness import kernels
from .harness.gpus import NO_GPU
from .harness.kernels import run
from .harness.waiting import wait_for
from .harness.workers import WHO, gone, imports_done, kernel_pid, prepared, processes, stop_two, tree, whos, workers_state
from .harness.workers import start_kernel as start_for

pytestmark = pytest.mark.timeout(600)
pytest.importorskip("ipyparallel")

START = "%gpu workers start 2" if NO_GPU else "%gpu workers start 2 --cpu"
CELLS = [START, "import numpy as np", "%%on_gpu all\nimport torch\nopt = torch.optim.AdamW([torch.zeros(1)])"]


def start_kernel(tmp_path, config: str = ""):
    return start_for(tmp_path, CELLS, config=config)


def test_the_notebooks_start_line_adopts_the_workers_prepared_for_it_and_they_see_its_environment(tmp_path):
    km, kc, folder = start_kernel(tmp_path)
    try:
        prep = prepared(kc)
        assert prep["line"] == START and prep["where"].startswith("cell 1")
        listing = run(kc, "%gpu workers").text
        assert f"prepared for `{START}` (cell 1" in listing and "no CUDA, no GPU memory" in listing
        listing = imports_done(kc)  # each worker's own word, asked through ipyparallel
        assert "rank 0: imports done in" in listing and "rank 1: imports done in" in listing, listing
        assert set(prep["pids"]) <= {p.pid for p in tree(kernel_pid(kc))}  # the kernel's own, ended with it
        run(kc, "import os; os.environ['GPUCTX_TEST_NOTE'] = 'set by the notebook'")  # read by no import
        # torch sets TORCHINDUCTOR_CACHE_DIR itself the first time inductor looks for its cache
        run(kc, "from torch._inductor.runtime.cache_dir_utils import cache_dir; cache_dir()")
        assert "TORCHINDUCTOR_CACHE_DIR" in run(kc, "print(sorted(os.environ))").stdout
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert "(prepared" in r.stdout and "for cell 1, line 1: imports done)" in r.stdout, r.stdout
        assert "gpuctx: 2 workers ready in" in r.stdout and "imports (prepared ahead)" in r.stdout, r.stdout
        ranks = whos(run(kc, WHO).text)
        assert {w["pid"] for w in ranks} < set(prep["pids"]) and {w["backend"] for w in ranks} == {"gloo"}
        notes = run(kc, "%%on_gpu all\nimport os\nos.environ.get('GPUCTX_TEST_NOTE')")
        assert notes.reply["status"] == "ok" and "set by the notebook" in notes.text, notes.text
        every = tree(kernel_pid(kc))
    finally:
        kernels.stop(km, kc)
    wait_for(lambda: gone(every), timeout=60)


def test_an_import_time_setting_made_after_preparing_gets_new_workers_and_the_old_ones_end(tmp_path):
    km, kc, _ = start_kernel(tmp_path)
    try:
        old = processes(prepared(kc)["pids"])
        run(kc, "import os; os.environ['TORCH_SHOW_CPP_STACKTRACES'] = '1'")
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert (f"stopping the workers prepared for `{START}`: the notebook set TORCH_SHOW_CPP_STACKTRACES after "
                "they had imported what reads it; starting new ones") in r.stdout, r.stdout
        wait_for(lambda: gone(old), timeout=60)
        ranks = whos(run(kc, WHO).text)
        assert len(ranks) == 2 and not {w["pid"] for w in ranks} & {p.pid for p in old}
        seen = run(kc, "%%on_gpu all\nimport os\nos.environ.get('TORCH_SHOW_CPP_STACKTRACES')")
        assert "'1'" in seen.text, seen.text
    finally:
        kernels.stop(km, kc)


def test_a_different_count_gets_fresh_workers_and_stop_ends_prepared_ones(tmp_path):
    km, kc, _ = start_kernel(tmp_path)
    try:
        old = processes(prepared(kc)["pids"])
        one = START.replace("start 2", "start 1")
        r = run(kc, one, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert f"they were started for `{START}` (cell 1, line 1)" in r.stdout and "1 worker ready in" in r.stdout
        wait_for(lambda: gone(old), timeout=60)
        assert "stopped 1 worker" in run(kc, "%gpu workers stop").stdout
    finally:
        kernels.stop(km, kc)
    km, kc, _ = start_kernel(tmp_path / "again")
    try:
        old = processes(prepared(kc)["pids"])
        assert run(kc, "%gpu workers stop").stdout.strip() == (
            f"gpuctx: stopped the workers prepared for `{START}` and their ipyparallel controller")
        wait_for(lambda: gone(old), timeout=60)
        assert "were stopped by `%gpu workers stop`" in run(kc, "%gpu workers").text
        # the notebook's plan carried out again (after a suspend that did not happen, say) names the
        # line still: what the user stopped is not started again behind their back
        again = run(kc, f"print(get_ipython()._gpuctx.workers.prepare_for({START.split('start ', 1)[1]!r}))")
        assert again.stdout.strip() == "False" and workers_state(kc)["prepared"] is None, again.text
    finally:
        kernels.stop(km, kc)


def test_turned_off_nothing_is_prepared_and_the_listing_says_so(tmp_path):
    km, kc, _ = start_kernel(tmp_path, config="c.GpuWorkers.prepare = False\n")
    try:
        def said():
            state = workers_state(kc)
            return state and state["prepare_note"]
        assert wait_for(said, timeout=120, every=0.3) == "not prepared ahead (c.GpuWorkers.prepare is off)"
        assert workers_state(kc)["prepared"] is None
        assert not [p for p in tree(kernel_pid(kc)) if "worker_entry" in " ".join(p.cmdline())]
    finally:
        kernels.stop(km, kc)


def test_a_prepared_worker_that_dies_is_said_and_the_line_starts_new_ones(tmp_path):
    """A prepared worker killed before the line runs (the out-of-memory killer, say): ipyparallel's
    launchers of prepared workers never noticed an end (they ran on a loop closed once the workers
    were started), `%gpu workers` kept asking the dead worker how far its imports were, and the line
    adopted the rest and failed half a minute later with `None: None`."""
    km, kc, _ = start_kernel(tmp_path)
    try:
        prep = prepared(kc)
        old = processes(prep["pids"])  # the controller, rank 0, rank 1
        imports_done(kc)
        os.kill(prep["pids"][2], signal.SIGKILL)

        def said():
            text = run(kc, "%gpu workers").text
            return "killed by SIGKILL" in text and text
        listing = wait_for(said, timeout=60, every=0.3)
        assert f"prepared for `{START}` (cell 1, line 1)" in listing, listing
        assert "but worker 1 exited (killed by SIGKILL)" in listing, listing
        assert "the line stops them and starts new ones" in listing
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert f"gpuctx: stopping the workers prepared for `{START}`: worker 1 exited (killed by SIGKILL)" in r.stdout
        assert "; starting new ones" in r.stdout and "gpuctx: 2 workers ready in" in r.stdout, r.stdout
        wait_for(lambda: gone(old), timeout=60)
        ranks = whos(run(kc, WHO).text)
        assert len(ranks) == 2 and not {w["pid"] for w in ranks} & set(prep["pids"])
        every = tree(kernel_pid(kc))
    finally:
        kernels.stop(km, kc)
    wait_for(lambda: gone(every), timeout=60)


def worker_processes_below(kc) -> list:
    """The workers' controllers and engines below the kernel (not the controllers' own children)."""
    found = []
    for p in tree(kernel_pid(kc)):
        try:
            cmd = p.cmdline()
            if "gpuctx_jupyter.kernel.worker_entry" in cmd and "worker_entry" not in " ".join(p.parent().cmdline()):
                found.append(cmd[cmd.index("gpuctx_jupyter.kernel.worker_entry") + 1])
        except Exception:  # noqa: BLE001 — (a process that ended meanwhile)
            pass
    return sorted(found)


def test_the_line_run_while_its_workers_are_still_being_prepared_never_starts_a_second_set(tmp_path):
    """The line runs while the workers prepared for it are still starting, longer than
    c.GpuWorkers.start_timeout (their imports forked from a process still importing, say): the line
    stopped waiting and started a second set beside them, which the prepare then overwrote — two
    controllers and four engines, one folder left behind. The prepare is held here in its launch,
    where the kernel runs it, as long as the test says."""
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx\n%gpu workers").reply["status"] == "ok"
        held = run(kc, "import threading\nw = get_ipython()._gpuctx.workers\nhold = threading.Event()\n"
                       "launch = w._launch_local\n"
                       "def held(*args, **kwargs):\n"
                       "    if threading.current_thread().name == 'gpuctx-workers-prepare':\n"
                       "        hold.wait(600)\n"
                       "    return launch(*args, **kwargs)\n"
                       "w._launch_local = held\nw.start_timeout = 2\nw.stop_wait = 0.5\n"
                       f"print(w.prepare_for({START.split('start ', 1)[1]!r}, 'cell 1, line 1'))")
        assert held.stdout.strip() == "True", held.text
        r = run(kc, START, timeout=120)
        assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError", r.text
        assert r.reply["evalue"] == (f"the workers prepared ahead for `{START}` are still starting after 2 s "
                                     "(c.GpuWorkers.start_timeout): run the line again once `%gpu workers` lists them, "
                                     "or `%gpu workers stop` them")
        assert worker_processes_below(kc) == []  # nothing started beside them
        said = run(kc, "%gpu workers stop").stdout.strip()
        assert said == f"gpuctx: the workers being prepared for `{START}` stop as soon as their start ends", said
        assert "stop as soon as their start ends" in run(kc, "%gpu workers").text
        run(kc, "hold.set()")  # their start ends: what it started stops
        wait_for(lambda: "were stopped by `%gpu workers stop`" in run(kc, "%gpu workers").text, timeout=120, every=0.3)
        wait_for(lambda: worker_processes_below(kc) == [], timeout=60)
        run(kc, "w.start_timeout = 300")
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok" and "gpuctx: 2 workers ready in" in r.stdout, r.text
        assert worker_processes_below(kc) == ["controller", "engine", "engine"]
        stop_two(kc)
    finally:
        kernels.stop(km, kc)


# A prepare asked for by the warm-up's plan (another thread) just as the line starts: the prepare
# is held where it takes the workers' lock, and let go once the line waits for that lock too, or
# has gone past where it would (it then waits until the prepare was started or refused).
RACE = """
import threading, time
w = get_ipython()._gpuctx.workers
lock, waiting, placing, asked = w._lock, set(), threading.Event(), threading.Event()

class Watched:
    def __enter__(self):
        waiting.add(threading.current_thread().name)
        lock.acquire()
        waiting.discard(threading.current_thread().name)

    def __exit__(self, *exc):
        lock.release()

w._lock = Watched()
lock.acquire()
threading.Thread(target=lambda: (w.prepare_for(%r, 'cell 1, line 1'), asked.set()), name='plan').start()
while 'plan' not in waiting:
    time.sleep(0.005)

def let_go():
    while 'MainThread' not in waiting and not placing.is_set():
        time.sleep(0.005)
    lock.release()

threading.Thread(target=let_go).start()
placement = w._local_placement

def placed(*args, **kwargs):
    placing.set()
    asked.wait(60)
    return placement(*args, **kwargs)

w._local_placement = placed
"""


def test_a_prepare_asked_for_as_the_line_starts_is_either_adopted_or_never_started(tmp_path):
    """The warm-up's plan asks for the notebook's workers (another thread) just as the line starts:
    the prepare read "not asked by hand" before the line said so, and started its own set after the
    line had looked for one — two controllers and four engines, one folder left behind."""
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx\n%gpu workers").reply["status"] == "ok"
        assert run(kc, RACE % START.split("start ", 1)[1]).reply["status"] == "ok"
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok" and "gpuctx: 2 workers ready in" in r.stdout, r.text
        wait_for(lambda: run(kc, "print(w._prepare_thread is None or not w._prepare_thread.is_alive())").stdout.strip()
                 == "True", timeout=120, every=0.3)
        assert worker_processes_below(kc) == ["controller", "engine", "engine"]
        stop_two(kc)
    finally:
        kernels.stop(km, kc)
