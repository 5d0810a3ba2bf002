"""`%gpu workers` and `%%on_gpu all` in a real ipykernel, with real ipyparallel engines: two CPU
workers on gloo (no GPU here). The module's kernel keeps its workers from test to test; the
tests that end them come last and start new ones."""
from __future__ import annotations

import glob
import os
import re
import signal
import time

import psutil
import pytest

from .harness import kernels
from .harness.gpus import NO_GPU
from .harness.kernels import reply_to, run, wait_idle
from .harness.notebooks import notebook
from .harness.server import free_port
from .harness.waiting import wait_for
from .harness.workers import WHO, gone, kernel_pid, private_folder, stop_two, tree, whos

pytestmark = pytest.mark.timeout(600)
pytest.importorskip("ipyparallel")

# Two CPU workers: a count where no GPU is visible (CI), --cpu where one is (the GPU machine)
START = "%gpu workers start 2" if NO_GPU else "%gpu workers start 2 --cpu"
@pytest.fixture(scope="module")
def workers_kernel(tmp_path_factory):
    """A real kernel in its own folder with gpuctx loaded and two CPU workers started, for a
    notebook that imports numpy and trains with AdamW (what the workers' warm-up reads)."""
    folder = tmp_path_factory.mktemp("workers")
    notebook(folder / "train.ipynb", ["%load_ext gpuctx\n%gpu workers start 2", "import numpy as np",
                                      "%%on_gpu all\nimport torch\nopt = torch.optim.AdamW([torch.zeros(1)])"])
    km, kc = kernels.start(env={"JPY_SESSION_NAME": str(folder / "train.ipynb"), "GPUCTX_WARM": "0"},
                           cwd=str(folder))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        yield km, kc, folder, r
    finally:
        kernels.stop(km, kc)


def test_start_says_no_gpu_and_starts_two_gloo_workers_in_the_notebooks_folder(workers_kernel):
    km, kc, folder, started = workers_kernel
    if NO_GPU:
        assert "no GPU is visible (NVML reports:" in started.stdout and "starting 2 CPU workers with gloo" in started.stdout
    assert "gpuctx: 2 workers ready in" in started.stdout and "torch.distributed gloo, world size 2" in started.stdout
    r = run(kc, WHO)
    assert r.reply["status"] == "ok", r.text
    ranks = sorted(whos(r.text), key=lambda w: w["rank"])
    assert [w["RANK"] for w in ranks] == ["0", "1"] and [w["LOCAL_RANK"] for w in ranks] == ["0", "1"]
    assert {w["WORLD_SIZE"] for w in ranks} == {"2"} and {w["MASTER_ADDR"] for w in ranks} == {"127.0.0.1"}
    assert len({w["MASTER_PORT"] for w in ranks}) == 1 and all(w["initialized"] for w in ranks)
    assert {w["backend"] for w in ranks} == {"gloo"} and {w["CUDA_VISIBLE_DEVICES"] for w in ranks} == {""}
    assert {os.path.realpath(w["cwd"]) for w in ranks} == {os.path.realpath(folder)}
    # the workers are this kernel's own processes: the server finds a kernel's memory through them
    mine = {p.pid for p in tree(kernel_pid(kc))}
    assert {w["pid"] for w in ranks} <= mine


def test_each_worker_warmed_up_with_the_notebooks_plan(workers_kernel):
    _, kc, _, _ = workers_kernel
    r = run(kc, "%%on_gpu all\nfrom gpuctx_jupyter.kernel import worker_side\n"
                "w = worker_side._warmer\n{s.name: s.state for s in w.plan.steps}, w.status.state")
    assert r.reply["status"] == "ok", r.text
    steps, state = eval(r.data[-1]["text/plain"])  # rank 0's; every rank's in _ranks
    assert state == "skipped" and steps["import numpy"] == "done" and steps["import torch"] == "done"
    assert steps["optimizer step (AdamW) on the CPU"] == "done"  # no GPU: what still helps, on the CPU
    assert run(kc, "print(len({repr(v) for v in _ranks}))").stdout.strip() == "1"  # the same on both ranks


def test_output_is_shown_per_rank_while_the_cell_runs(workers_kernel, tmp_path):
    _, kc, _, _ = workers_kernel
    release = tmp_path / "release"
    msg_id = kc.execute(f"%%on_gpu all\nimport os, time, torch.distributed as dist\n"
                        f"print(f'first from {{dist.get_rank()}}', flush=True)\n"
                        f"while not os.path.exists({str(release)!r}): time.sleep(0.02)\nprint('second')")
    shown = ""
    while not ("first from 0" in shown and "first from 1" in shown):  # before the cell can finish
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] in ("display_data",
                                                                                "update_display_data"):
            shown = msg["content"]["data"]["text/plain"]
    assert "── rank 0 · cpu · running" in shown and "── rank 1 · cpu · running" in shown
    assert "second" not in shown
    release.touch()
    reply = reply_to(kc, msg_id, timeout=60)
    assert reply["content"]["status"] == "ok"
    wait_idle(kc, msg_id)


def test_a_long_log_is_shown_by_its_last_lines_while_the_cell_runs_and_whole_at_its_end():
    """The per-rank display is sent again at every refresh (10 a second): a training loop's log on
    8 ranks was the whole text each time, megabytes a second to the browser."""
    from types import SimpleNamespace

    from gpuctx_jupyter.kernel import worker_cells

    log = "".join(f"step {i}\n" for i in range(1000))
    ars = {r: SimpleNamespace(metadata={"stdout": log, "stderr": ""}) for r in range(8)}
    chosen = [SimpleNamespace(rank=r, label=f"rank {r} · cpu") for r in range(8)]
    groups = worker_cells.Groups(chosen, ars, shell=None)
    streams = {r: groups._streams(r) for r in range(8)}
    live, _ = groups._render(streams, final=False)
    assert "step 999" in live and "step 959" not in live and "960 earlier lines (all shown when the cell ends)" in live
    assert len(live) < len(log)  # all eight ranks together, less than one rank's whole log
    whole, _ = groups._render(streams, final=True)
    assert whole.count("step 0\n") == 8


def test_a_worker_that_cannot_register_is_reported_by_what_happened_not_by_ipyparallels_advice(tmp_path):
    """A real ipyparallel engine that finds no controller: its output ends in an indented block
    of advice ("... or tunnel connections via ssh."); the line a failed start shows is the record
    that says what happened."""
    import json
    import subprocess
    import sys

    from gpuctx_jupyter.kernel.worker_processes import last_line

    (tmp_path / "profile").mkdir()
    port = free_port()  # nothing listens there
    (tmp_path / "engine.json").write_text(json.dumps({
        "key": "0123456789abcdef", "signature_scheme": "hmac-sha256", "location": "127.0.0.1", "ssh": "",
        "interface": "tcp://127.0.0.1", "registration": port, "pack": "json", "unpack": "json",
        "url": f"tcp://127.0.0.1:{port}"}))
    engine = subprocess.run([sys.executable, "-m", "ipyparallel.engine", f"--file={tmp_path / 'engine.json'}",
                             "--IPEngine.timeout=1", f"--profile-dir={tmp_path / 'profile'}"],
                            capture_output=True, text=True, timeout=120)
    out = engine.stdout + engine.stderr
    assert engine.returncode == 255 and out.rstrip().endswith("or tunnel connections via ssh."), out
    assert last_line(out) == "Registration timed out after 1.0 seconds", out


def test_the_controllers_connection_file_is_never_seen_part_written(tmp_path):
    """A worker forked with its imports done reads the controller's connection file the moment it
    exists (CI, a loaded machine: "worker 0 exited (exit status 1): json.decoder.JSONDecodeError").
    Written as the workers' controller writes it (worker_side.save_connection_dict, installed over
    IPController's), a reader polling the name all along finds it absent or whole, never part
    written, and only its owner can read it."""
    import json
    import stat
    import threading
    from types import SimpleNamespace

    from gpuctx_jupyter.kernel import worker_side

    controller = SimpleNamespace(profile_dir=SimpleNamespace(security_dir=str(tmp_path)),
                                 log=SimpleNamespace(info=lambda *a: None))
    big = {f"key{i}": "x" * 64 for i in range(200_000)}  # tens of ms to serialize: a wide window
    path, seen, stop = tmp_path / "ipcontroller-engine.json", [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
                seen.append("whole")
            except ValueError:
                seen.append(f"part written ({len(text)} bytes)")

    def written_by(save):
        path.unlink(missing_ok=True)
        seen.clear()
        stop.clear()
        reader = threading.Thread(target=read)
        reader.start()
        save(controller, path.name, big)
        wait_for(lambda: seen, timeout=30)
        stop.set()
        reader.join()
        return set(seen)

    assert written_by(worker_side.save_connection_dict) == {"whole"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_in_a_terminal_a_last_line_without_its_newline_is_printed_once_the_cell_ends(capsys):
    from types import SimpleNamespace

    from gpuctx_jupyter.kernel import worker_cells

    ars = {0: SimpleNamespace(metadata={"stdout": "epoch 1\nloss 0.25", "stderr": ""})}
    groups = worker_cells.Groups([SimpleNamespace(rank=0, label="rank 0 · cpu")], ars, shell=None)
    groups.refresh()
    assert capsys.readouterr().out == "[rank 0] epoch 1\n"
    groups.refresh(final=True)
    assert capsys.readouterr().out == "[rank 0] loss 0.25\n"


def test_all_reduce_gives_every_rank_the_sum_and_rank_0s_value_comes_back(workers_kernel):
    _, kc, _, _ = workers_kernel
    r = run(kc, "%%on_gpu all\nimport torch, torch.distributed as dist\n"
                "t = torch.tensor([float(dist.get_rank() + 1)])\ndist.all_reduce(t)\n"
                "print(f'rank {dist.get_rank()} has {t.item()}')\nt.item() * (dist.get_rank() + 1)")
    assert r.reply["status"] == "ok", r.text
    shown = r.data[0]["text/plain"]  # one display, grouped per rank, in rank order
    assert shown.index("── rank 0 · cpu · done") < shown.index("rank 0 has 3.0") < shown.index("── rank 1 · cpu")
    assert shown.index("── rank 1 · cpu") < shown.index("rank 1 has 3.0")
    assert r.data[-1]["text/plain"] == "3.0"  # Out: rank 0's value
    r = run(kc, "print(_ranks)")
    assert r.stdout.strip() == "[3.0, 6.0]"
    r = run(kc, "%%on_gpu all\nt * 10")  # `t` from the earlier cell, on each rank
    assert r.reply["status"] == "ok" and "tensor([30.])" in r.data[-1]["text/plain"]


def test_workers_are_listed_and_counted_in_status(workers_kernel):
    _, kc, _, _ = workers_kernel
    r = run(kc, "%gpu workers")
    assert r.reply["status"] == "ok"
    lines = r.data[0]["text/plain"].splitlines()
    assert lines[0] == "workers (2)" and lines[1].split() == ["rank", "GPU", "pid", "state", "GPU", "memory"]
    assert lines[3].split()[:2] == ["0", "cpu"] and lines[3].split()[3] == "ready"
    assert lines[4].split()[:2] == ["1", "cpu"] and "torch.distributed: gloo, world size 2" in lines[5]
    r = run(kc, "%gpu status")
    assert "this notebook's workers" in r.text and "rendezvous 127.0.0.1:" in r.text


def test_an_exception_on_one_rank_shows_its_traceback_and_the_workers_go_on(workers_kernel):
    _, kc, _, _ = workers_kernel
    r = run(kc, "%%on_gpu all\nimport torch.distributed as dist\nprint('before', dist.get_rank())\n"
                "if dist.get_rank() == 1:\n    {}['missing']\n'fine'")
    assert r.reply["status"] == "error" and r.reply["ename"] == "RanksFailed"
    assert r.reply["evalue"] == "rank 1 of 2 failed: KeyError: 'missing'"
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(r.reply["traceback"]))  # without the colours
    assert "── rank 1 · cpu: KeyError" in tb and "{}['missing']" in tb and "rank 0 · cpu: " not in tb
    assert "the workers are ready for the next cell" in tb
    shown = r.data[0]["text/plain"]
    assert "── rank 0 · cpu · done" in shown and "── rank 1 · cpu · failed (KeyError)" in shown
    assert "before 0" in shown and "before 1" in shown
    r = run(kc, "print(_ranks)")
    assert r.stdout.strip() == "['fine', None]"
    r = run(kc, "%%on_gpu all\nprint('no closing parenthesis'")  # every rank fails alike: one traceback
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(r.reply["traceback"]))
    assert r.reply["evalue"].startswith("ranks 0, 1 of 2 failed: SyntaxError")
    assert tb.count("── ") == 1 and "── rank 0 · cpu, rank 1 · cpu: SyntaxError" in tb
    r = run(kc, "%%on_gpu all\nimport torch, torch.distributed as dist\nx = torch.ones(1)\ndist.all_reduce(x)\nx.item()")
    assert r.reply["status"] == "ok" and r.data[-1]["text/plain"] == "2.0"


def test_ranks_still_running_after_a_failure_are_interrupted_and_the_failure_is_what_is_shown(workers_kernel):
    _, kc, _, _ = workers_kernel
    run(kc, "get_ipython()._gpuctx.workers.failure_grace = 1")  # c.GpuWorkers.failure_grace
    try:
        r = run(kc, "%%on_gpu all\nimport time, torch.distributed as dist\n"
                    "if dist.get_rank() == 1:\n    raise ValueError('rank 1 gives up')\n"
                    "time.sleep(120)  # as a rank waiting for it in a collective would", timeout=120)
    finally:
        run(kc, "get_ipython()._gpuctx.workers.failure_grace = 10")
    assert r.reply["ename"] == "RanksFailed" and r.reply["evalue"] == "rank 1 of 2 failed: ValueError: rank 1 gives up"
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(r.reply["traceback"]))
    assert "── rank 1 · cpu: ValueError" in tb and "── rank 0" not in tb
    assert re.search(r"rank 0 · cpu \(pid \d+\) was interrupted 1 s after it; the workers are ready", tb)
    r = run(kc, "%%on_gpu all\n'again'")
    assert r.reply["status"] == "ok"


def test_interrupt_reaches_every_rank_and_the_workers_go_on(workers_kernel, tmp_path):
    km, kc, _, _ = workers_kernel
    # each rank writes a file just before its sleep: the interrupt is sent once both exist
    msg_id = kc.execute(f"%%on_gpu all\nimport pathlib, time, torch.distributed as dist\n"
                        f"pathlib.Path({str(tmp_path)!r}, f'inside-{{dist.get_rank()}}').touch()\ntime.sleep(120)")
    wait_for(lambda: all((tmp_path / f"inside-{r}").exists() for r in (0, 1)), timeout=60)
    km.interrupt_kernel()
    reply = reply_to(kc, msg_id, timeout=60)  # long before the sleeps end
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    wait_idle(kc, msg_id)
    r = run(kc, "%%on_gpu all\nimport torch.distributed as dist\ndist.get_rank()")
    assert r.reply["status"] == "ok" and r.data[-1]["text/plain"] == "0"


def test_a_rank_past_its_timeout_is_interrupted_and_the_workers_go_on(workers_kernel):
    _, kc, _, _ = workers_kernel
    r = run(kc, "%%on_gpu all --timeout 10\nimport time, torch.distributed as dist\n"
                "if dist.get_rank() == 1:\n    time.sleep(120)\n'quick'", timeout=120)
    assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError"
    assert r.reply["evalue"].startswith("rank 1 · cpu (pid ")
    assert r.reply["evalue"].endswith("did not finish within 10 s (--timeout): interrupted; the workers are ready "
                                      "for the next cell")
    assert "\n" not in r.reply["evalue"]
    r = run(kc, "%%on_gpu all\n1 + 1")
    assert r.reply["status"] == "ok" and r.data[-1]["text/plain"] == "2"


def test_mistakes_are_one_line_usage_errors(workers_kernel):
    _, kc, _, _ = workers_kernel
    cases = {
        "%gpu workers start 2": "2 workers are running already",
        "%gpu workers start all --profile nowhere-profile": "2 workers are running already",
        "%gpu workers strat": "invalid choice: 'strat'",
        "%gpu workers stop 2": "%gpu workers stop takes no arguments",
        "%%on_gpu 0,7\npass": "no rank '7': the workers are rank 0 · cpu, rank 1 · cpu",
        "%%on_gpu 0,0\npass": "'0' names rank 0 twice",
        "%%on_gpu all --time\npass": "--default, --time and --mem are for one GPU of this kernel",
        "%%on_gpu 1 --timeout 5\npass": "--timeout is for the workers",
    }
    for code, says in cases.items():
        r = run(kc, code)
        assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError", (code, r.text)
        assert says in r.reply["evalue"] and "\n" not in r.reply["evalue"], (code, r.reply["evalue"])


def test_a_worker_that_dies_mid_cell_stops_the_others_and_leaves_nothing(workers_kernel):
    """Rank 1 is killed while rank 0 waits for it in a barrier: the process group cannot go on."""
    _, kc, _, _ = workers_kernel
    below = tree(kernel_pid(kc))
    r = run(kc, "%%on_gpu all\nimport os, signal, torch.distributed as dist\n"
                "if dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()", timeout=120)
    assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError"
    says = r.reply["evalue"]
    assert says.startswith("rank 1 · cpu (pid ") and "died mid-cell, killed by SIGKILL: the other workers were " \
        "stopped, as their process group lost a member; `%gpu workers start` starts new ones" in says
    wait_for(lambda: gone(below), timeout=60)
    r = run(kc, "%gpu workers")
    assert "none: `%gpu workers start all`" in r.text
    r = run(kc, "%%on_gpu all\npass")
    assert r.reply["ename"] == "UsageError" and r.reply["evalue"].startswith("no workers are running")


def test_a_rank_that_ignores_the_interrupt_gets_the_workers_stopped(workers_kernel):
    _, kc, _, _ = workers_kernel
    r = run(kc, START, timeout=300)
    assert r.reply["status"] == "ok", r.text
    below = tree(kernel_pid(kc))
    run(kc, "get_ipython()._gpuctx.workers.interrupt_grace = 1")  # c.GpuWorkers.interrupt_grace
    r = run(kc, "%%on_gpu all --timeout 1\nimport signal, time, torch.distributed as dist\n"
                "if dist.get_rank() == 0:\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    time.sleep(120)",
            timeout=120)
    assert r.reply["ename"] == "UsageError", r.text
    assert r.reply["evalue"].startswith("rank 0 · cpu (pid ") and r.reply["evalue"].endswith(
        "did not stop within 1 s of the timeout (stuck in C code or in a collective?): the workers were stopped; "
        "`%gpu workers start` starts new ones")
    wait_for(lambda: gone(below), timeout=60)


def test_without_ipyparallel_start_says_how_to_install_it_and_starts_nothing(workers_kernel):
    _, kc, _, _ = workers_kernel
    pid = kernel_pid(kc)
    before = {p.pid for p in tree(pid)}
    r = run(kc, "import sys\nsys.modules['ipyparallel'] = None  # what an import finds when it is not installed\n"
                "try:\n    get_ipython().run_line_magic('gpu', 'workers start 2')\n"
                "finally:\n    del sys.modules['ipyparallel']")
    assert r.reply["ename"] == "UsageError"
    assert r.reply["evalue"] == ("%gpu workers runs on ipyparallel, which is not installed in this kernel: pip install "
                                 "ipyparallel (or pip install 'gpuctx-jupyter[workers]'), then restart the kernel")
    assert {p.pid for p in tree(pid)} <= before


def test_a_controller_that_dies_mid_cell_is_one_line_at_once_and_leaves_nothing(tmp_path):
    """The workers' ipyparallel controller killed while a cell runs on them (the out-of-memory
    killer, say): its schedulers, which outlived it, went on relaying the cell; killed with it, the
    cell waited for the ranks' cell to end and ~50 s more (the engines' heartbeat misses), then
    blamed a rank. The schedulers ran on, nobody's, after the kernel too."""
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx\nkept = 42").reply["status"] == "ok"
        assert run(kc, START, timeout=300).reply["status"] == "ok"
        controller = psutil.Process(int(run(kc, "print(get_ipython()._gpuctx.workers.cluster.controller.pid)").stdout))
        every = [*tree(kernel_pid(kc)), *controller.children(recursive=True)]
        msg_id = kc.execute(f"%%on_gpu all\nimport pathlib, time, torch.distributed as dist\n"
                            f"pathlib.Path({str(tmp_path)!r}, f'inside-{{dist.get_rank()}}').touch()\ntime.sleep(600)")
        wait_for(lambda: all((tmp_path / f"inside-{r}").exists() for r in (0, 1)), timeout=60)
        controller.kill()
        reply = reply_to(kc, msg_id, timeout=60)["content"]  # long before the ranks' cell ends
        assert reply["status"] == "error" and reply["ename"] == "UsageError", reply
        says = reply["evalue"]
        assert says.startswith("the cell was cut off: the ipyparallel controller exited (killed by SIGKILL)"), says
        assert says.endswith("; the workers were stopped, as nothing reaches them or comes back from them without it; "
                             "`%gpu workers start` starts new ones") and "\n" not in says
        wait_idle(kc, msg_id)
        wait_for(lambda: gone(every), timeout=60)  # the ranks, and what the controller had started
        assert run(kc, "print(kept)").stdout.strip() == "42"  # the kernel goes on, with the notebook's names
        assert "none: `%gpu workers start all`" in run(kc, "%gpu workers").text
    finally:
        kernels.stop(km, kc)


def test_workers_started_and_stopped_again_and_again_leave_no_thread_behind(tmp_path):
    """Each start made ipyparallel start a thread and loop for its `_sync` calls, which it never
    stops: every start and stop left one more thread in the kernel, holding the stopped cluster."""
    km, kc = kernels.start(cwd=str(tmp_path))
    count = ("import gc, threading; gc.collect()\n"
             "from ipyparallel import Cluster\n"
             "print(len(threading.enumerate()), sum(isinstance(o, Cluster) for o in gc.get_objects()))")
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        seen = []
        for _ in range(3):
            assert run(kc, START, timeout=300).reply["status"] == "ok"
            assert run(kc, "%gpu workers stop", timeout=120).reply["status"] == "ok"
            seen.append(run(kc, count).stdout.split())
        assert seen[2] == seen[1], seen  # threads, clusters alive (the first start may leave the kernel its own)
    finally:
        kernels.stop(km, kc)


# The controller's spawn slowed, as a loaded machine slows it: the process runs, ipyparallel's
# launcher (on its own thread) learns its pid only when the test lets it go.
HOLD_SPAWN = """
import os, pathlib, time
from ipyparallel.cluster import launcher
spawn = launcher.Popen

def held(args, *more, **kwargs):
    proc = spawn(args, *more, **kwargs)
    if "controller" in args and not os.path.exists(%(release)r):
        pathlib.Path(%(holding)r).touch()
        while not os.path.exists(%(release)r):
            time.sleep(0.02)
    return proc

launcher.Popen = held
"""


def test_a_start_interrupted_before_ipyparallel_knows_its_controller_leaves_it_not_running(tmp_path):
    """Interrupted as the controller's spawn returns: the line's stop did not know the process yet
    (ipyparallel learns its pid on its own thread), and the controller ran for the kernel's life."""
    holding, release = tmp_path / "holding", tmp_path / "release"
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        assert run(kc, HOLD_SPAWN % {"holding": str(holding), "release": str(release)}).reply["status"] == "ok"
        pid = kernel_pid(kc)
        msg_id = kc.execute(START)
        wait_for(holding.exists, timeout=120)
        started = tree(pid)
        assert any("controller" in p.cmdline() for p in started), [p.cmdline() for p in started]
        km.interrupt_kernel()
        reply = reply_to(kc, msg_id, timeout=120)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        wait_idle(kc, msg_id)
        release.touch()  # ipyparallel's launcher learns of the controller only now
        wait_for(lambda: gone(started), timeout=60)
        assert run(kc, START, timeout=300).reply["status"] == "ok"  # the line works after it
        stop_two(kc)
    finally:
        kernels.stop(km, kc)


# The stop held on its way, as ipyparallel's stop takes seconds after an interrupted start.
HOLD_STOP = """
import os, pathlib, time
from gpuctx_jupyter.kernel import worker_processes
stop_cluster = worker_processes.stop_cluster

def held(cluster, *args, **kwargs):
    pathlib.Path(%(holding)r).touch()
    while not os.path.exists(%(release)r):
        time.sleep(0.02)
    return stop_cluster(cluster, *args, **kwargs)

worker_processes.stop_cluster = held
"""


def test_an_interrupt_while_the_workers_stop_still_leaves_nothing_running(tmp_path):
    """A second press of Interrupt while the workers stop (after an interrupted start, a cell cut
    off): the stop was abandoned halfway, the workers forgotten but still running."""
    holding, release = tmp_path / "holding", tmp_path / "release"
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        assert run(kc, START, timeout=300).reply["status"] == "ok"
        every, folder = tree(kernel_pid(kc)), private_folder(kc)
        assert run(kc, HOLD_STOP % {"holding": str(holding), "release": str(release)}).reply["status"] == "ok"
        msg_id = kc.execute("%gpu workers stop")
        wait_for(holding.exists, timeout=60)
        km.interrupt_kernel()
        release.touch()
        reply = reply_to(kc, msg_id, timeout=120)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        wait_idle(kc, msg_id)
        wait_for(lambda: gone(every) and not os.path.exists(folder), timeout=60)
        assert "none: `%gpu workers start all`" in run(kc, "%gpu workers").text
    finally:
        kernels.stop(km, kc)


def test_an_interrupt_while_unloading_stops_the_workers_and_still_unloads_everything(tmp_path):
    """`%unload_ext gpuctx` stops the workers first; Interrupt pressed while they stop ended the
    unload there: the import hook, the suspend gate and the magics stayed, half unloaded, and IPython
    counted gpuctx as loaded. The unload goes on to its end instead."""
    holding, release = tmp_path / "holding", tmp_path / "release"
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        assert run(kc, START, timeout=300).reply["status"] == "ok"
        every = tree(kernel_pid(kc))
        assert run(kc, HOLD_STOP % {"holding": str(holding), "release": str(release)}).reply["status"] == "ok"
        msg_id = kc.execute("%unload_ext gpuctx")
        wait_for(holding.exists, timeout=60)
        km.interrupt_kernel()
        release.touch()
        assert reply_to(kc, msg_id, timeout=120)["content"]["status"] == "ok"
        wait_idle(kc, msg_id)
        wait_for(lambda: gone(every), timeout=60)
        r = run(kc, "print(hasattr(get_ipython(), '_gpuctx'), 'gpu' in get_ipython().magics_manager.magics['line'])")
        assert r.stdout.strip() == "False False", r.stdout  # unloaded, all of it
        r = run(kc, "%load_ext gpuctx\n%gpu workers")
        assert r.reply["status"] == "ok", r.text  # and loads again
    finally:
        kernels.stop(km, kc)


def test_an_error_of_several_workers_is_said_by_its_first_worker():
    """A result asked of several workers fails with ipyparallel's CompositeError, whose own name and
    value are None: the line said `a worker failed to say who they are: None: None`."""
    from ipyparallel import error

    from gpuctx_jupyter.kernel import worker_processes

    died = error.CompositeError("one or more exceptions raised in: identity", [
        ("EngineError", "Engine 1 died while running task 'abc'", "traceback", {"engine_id": 1, "method": "apply"})])
    assert worker_processes.error_text(died) == "EngineError: Engine 1 died while running task 'abc' (engine 1)"
    assert worker_processes.error_text(ValueError("plain")) == "ValueError: plain"


def test_workers_end_with_the_extension_and_their_kernel_on_restart_and_on_sigkill(tmp_path):
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        assert run(kc, START, timeout=300).reply["status"] == "ok"
        below = tree(kernel_pid(kc))
        assert run(kc, "%unload_ext gpuctx").reply["status"] == "ok"  # undoes everything loading did
        wait_for(lambda: gone(below), timeout=60)
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        assert run(kc, START, timeout=300).reply["status"] == "ok"
        below = tree(kernel_pid(kc))
        assert len(below) >= 3  # the controller and two engines (and what they started)
        folder = private_folder(kc)
        km.restart_kernel(now=False)  # a shutdown request, as JupyterLab's Restart sends
        kc.wait_for_ready(timeout=60)
        wait_for(lambda: gone(below) and not os.path.exists(folder), timeout=60)
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        assert run(kc, START, timeout=300).reply["status"] == "ok"
        pid, folder = kernel_pid(kc), private_folder(kc)
        below = tree(pid)
        os.kill(pid, signal.SIGKILL)  # no clean-up of its own: each worker watches its kernel
        wait_for(lambda: gone(below) and not os.path.exists(folder), timeout=60)
    finally:
        kernels.stop(km, kc)


def test_workers_that_do_not_register_in_time_are_a_one_line_error_and_leave_nothing(tmp_path):
    """c.GpuWorkers.start_timeout spent (a queue that does not start them, a controller out of
    reach): since Python 3.11 the wait's own timeout was taken for the 0.2 s poll's, and the start
    spun at 100% of a core until interrupted."""
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx\n%config GpuWorkers.start_timeout = 0.5").reply["status"] == "ok"
        before = {p.pid for p in tree(kernel_pid(kc))}
        r = run(kc, START, timeout=120)
        assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError", r.text
        assert "\n" not in r.reply["evalue"], r.reply["evalue"]
        wait_for(lambda: {p.pid for p in tree(kernel_pid(kc))} <= before, timeout=60)
    finally:
        kernels.stop(km, kc)


def controller_of(kpid: int):
    """The kernel's workers' controller and their profile folder, once the controller has written
    the workers' connection file (its output goes to its log in that folder)."""
    for p in tree(kpid):
        if p.ppid() == kpid and "controller" in p.cmdline():
            logs = [f.path for f in p.open_files() if f.path.endswith(".log")]
            folder = os.path.dirname(os.path.dirname(logs[0])) if logs else ""
            if folder and glob.glob(os.path.join(folder, "security", "*engine.json")):
                return p, folder
    return None


def registering(folder: str, workers: int = 2) -> bool:
    """Whether every worker has asked the controller to register it (its log says so)."""
    logs = glob.glob(os.path.join(folder, "log", "*engine*.log"))

    def asked(log):
        with open(log) as fh:
            return "Registering with controller" in fh.read()
    return len(logs) == workers and all(asked(log) for log in logs)


def start_with_the_controller_stopped(tmp_path, config: str, while_stopped) -> None:
    """`START` in a fresh kernel (gpuctx loaded, then `config`), its workers' controller stopped
    (SIGSTOP) once it has written their connection file, for as long as `while_stopped(folder)`
    takes; the start then ends with two workers ready (stopped again afterwards)."""
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, f"%load_ext gpuctx\n{config}").reply["status"] == "ok"
        kpid = kernel_pid(kc)
        msg_id = kc.execute(START)
        process, folder = wait_for(lambda: controller_of(kpid), timeout=120)
        process.send_signal(signal.SIGSTOP)
        try:
            while_stopped(folder)
        finally:
            process.send_signal(signal.SIGCONT)
        reply = reply_to(kc, msg_id, timeout=300)["content"]
        assert reply["status"] == "ok", reply
        listed = run(kc, "%gpu workers").text
        assert len(re.findall(r"^[01]\s+cpu\s+\d+\s+ready\b", listed, re.M)) == 2, listed
        stop_two(kc)
    finally:
        kernels.stop(km, kc)


def test_workers_whose_controller_answers_late_still_start(tmp_path):
    """A loaded machine: the controller answers the workers' registration and the kernel's client
    seconds late (here it stands stopped until both workers have asked, then 11 s more).
    ipyparallel's own 5 s wait ended each worker ("Registration timed out", exit 255), and its
    client's 10 s the start: they wait up to c.GpuWorkers.start_timeout."""
    def late(folder):
        wait_for(lambda: registering(folder), timeout=120)
        time.sleep(11)  # the fault's length: past ipyparallel's own 5 s (workers) and 10 s (its client)

    start_with_the_controller_stopped(tmp_path, "", late)


def test_workers_that_go_on_late_after_the_controller_answered_still_start(tmp_path):
    """A loaded machine: the controller answered the workers' registration, and they took 35 s
    to build their kernel before their heart began (here a start-up file of their profile sleeps:
    on a loaded machine, their imports' thread holding the GIL). The controller's own 30 s dropped
    them, and the start waited its whole start_timeout for workers it would never count: the
    controller waits as long as the start."""
    def slow_workers(folder):  # (written while no worker can register yet)
        os.makedirs(os.path.join(folder, "startup"), exist_ok=True)
        with open(os.path.join(folder, "startup", "00-late.py"), "w") as fh:
            fh.write("import time\ntime.sleep(35)\n")  # past ipyparallel's 30 s

    start_with_the_controller_stopped(tmp_path, "%config GpuWorkers.start_timeout = 120", slow_workers)


def test_the_ddp_example_trains_on_two_gloo_workers_and_their_weights_agree(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    nb = nbformat.read(os.path.join(repo, "examples", "ddp.ipynb"), as_version=4)
    NotebookClient(nb, timeout=300, km=kernels.manager("python3"),
                   resources={"metadata": {"path": os.path.join(repo, "examples")}}).execute()
    nbformat.write(nb, tmp_path / "ddp-run.ipynb")  # for a person to look at when this fails
    code = [c for c in nb.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs)
    assert ("starting 2 CPU workers with gloo" if NO_GPU else "torch.distributed nccl") in text
    assert " workers ready in" in text
    losses = [float(m) for m in re.findall(r"epoch \d: loss ([0-9.]+)", text)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 10  # it learns
    assert re.search(r"\d+ ranks?, one set of weights:", text)  # DDP kept the ranks' weights equal
    assert "this notebook's workers" in text and re.search(
        r"gpuctx: stopped \d+ workers? and their ipyparallel controller$", text.rstrip())
