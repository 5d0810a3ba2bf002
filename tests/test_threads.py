"""The kernel's device follows into the threads a notebook starts (no GPU needed).

The Switcher is given a recording framework adapter: it keeps one device per thread, as CUDA and
torch do, and records which thread asked for what. Threads are real threads; tests wait on events
and joins, never on fixed sleeps.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from gpuctx_jupyter.core.frameworks import Framework
from gpuctx_jupyter.kernel.switching import Choice, Switcher

from .harness.gpus import h200

ORIGINAL_START = threading.Thread.start  # before any test loads gpuctx
TIMEOUT = 30


class Recording(Framework):
    """A framework adapter with a per-thread current device that records every call."""

    mod = None  # the framework's module: only the CUDA-starting path reaches into it

    def __init__(self, name="torch", started=True, fail=False, loaded=True):
        self.name = name
        self.module = self.package = f"gpuctx_test_fake_{name}"  # never in sys.modules
        self.started, self.fail, self.is_loaded = started, fail, loaded
        # (method, ordinal, threading.get_ident(), the Thread object: idents are reused once a thread ends)
        self.calls: list[tuple[str, int | None, int, threading.Thread]] = []
        self._here = threading.local()  # like CUDA's current device and torch's default device

    def _record(self, method, ordinal):
        self.calls.append((method, ordinal, threading.get_ident(), threading.current_thread()))

    def loaded(self):
        return self.is_loaded

    def gpu_reason(self):
        return None

    def initialized(self):
        return self.started

    def current(self):
        return getattr(self._here, "device", 0)

    def set_current(self, ordinal):
        self._record("set_current", ordinal)
        if self.fail:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self._here.device = ordinal

    def default_device(self):
        d = getattr(self._here, "default", None)
        return None if d is None else f"cuda:{d}"

    def set_default(self, ordinal, previous=None):
        before = self.default_device()
        self._record("set_default", ordinal)
        if ordinal is None and previous:
            ordinal = int(str(previous).split(":")[1])
        self._here.default = ordinal
        return before

    def in_thread(self, thread: threading.Thread) -> list[tuple[str, int | None]]:
        return [(method, ordinal) for method, ordinal, _, t in self.calls if t is thread]


@pytest.fixture
def follow():
    """A Switcher over recording frameworks with its thread hook installed; removed afterwards."""
    made = []

    def make(*frameworks):
        frameworks = frameworks or (Recording(),)
        sw = Switcher(frameworks=frameworks)
        sw.threads.install()
        made.append(sw)
        return sw, frameworks[0]

    yield make
    for sw in reversed(made):
        sw.threads.remove()
    assert threading.Thread.start is ORIGINAL_START


def run_thread(target=lambda: None, name=None) -> threading.Thread:
    t = threading.Thread(target=target, name=name)
    t.start()
    t.join(TIMEOUT)
    assert not t.is_alive()
    return t


class Parked:
    """A thread that runs until released, so reports can see it alive."""

    def __init__(self, name, fw=None):
        self.running, self.release = threading.Event(), threading.Event()
        self.device = None
        self.fw = fw
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        assert self.running.wait(TIMEOUT)

    def _run(self):
        if self.fw is not None:
            self.device = self.fw.current()
        self.running.set()
        self.release.wait(TIMEOUT)

    def stop(self):
        self.release.set()
        self.thread.join(TIMEOUT)


# -- the hook goes in with the extension and comes out exactly ---------------------------------
def test_load_ext_installs_the_hook_and_unload_restores_thread_start_exactly(shell):
    threads = shell._gpuctx.switcher.threads
    assert threads.installed and threading.Thread.start is not ORIGINAL_START
    assert threading.Thread.start.__wrapped__ is ORIGINAL_START
    shell.run_line_magic("unload_ext", "gpuctx")
    assert threading.Thread.__dict__["start"] is ORIGINAL_START
    assert not threads.installed
    assert "not installed" in threads.report()[0]
    shell.run_line_magic("load_ext", "gpuctx")  # the fixture unloads it again
    assert shell._gpuctx.switcher.threads.installed


def test_remove_under_another_wrapper_keeps_it_and_passes_through(follow):
    sw, fw = follow()
    ours = threading.Thread.start

    def theirs(thread):
        return ours(thread)

    threading.Thread.start = theirs
    try:
        sw.threads.remove()
        assert threading.Thread.start is theirs  # not torn out from under the other tool
        sw.use(Choice(1))
        fw.calls.clear()
        t = run_thread()
        assert fw.in_thread(t) == []
    finally:
        threading.Thread.start = ORIGINAL_START


# -- a thread begins on the starting thread's choice -------------------------------------------
def test_thread_started_under_a_choice_switches_in_the_new_thread(follow):
    sw, fw = follow()
    sw.use(Choice(1))
    assert fw.in_thread(threading.current_thread()) == [("set_current", 1)]  # the main thread, by `use`
    fw.calls.clear()
    seen = {}
    t = run_thread(lambda: seen.update(ident=threading.get_ident(), device=fw.current()))
    assert seen["ident"] != threading.get_ident()
    assert fw.calls == [("set_current", 1, seen["ident"], t)]  # in the new thread, before its target
    assert seen["device"] == 1
    assert t.ident == seen["ident"]


def test_default_device_follows_for_torch_only(follow):
    torch, cupy = Recording("torch"), Recording("cupy")
    sw, _ = follow(cupy, torch)
    sw.use(Choice(1, default=True))
    seen = {}
    t = run_thread(lambda: seen.update(default=torch.default_device()))
    assert torch.in_thread(t) == [("set_current", 1), ("set_default", 1)]
    assert cupy.in_thread(t) == [("set_current", 1)]
    assert seen["default"] == "cuda:1"


def test_the_threads_own_device_wins(follow):
    sw, fw = follow()
    sw.use(Choice(1))
    seen = {}

    def target():
        fw.set_current(0)  # the user's own torch.cuda.set_device(0)
        seen["device"] = fw.current()

    t = run_thread(target)
    assert fw.in_thread(t) == [("set_current", 1), ("set_current", 0)]
    assert seen["device"] == 0


def test_on_gpu_block_and_nested_threads_carry_the_starting_threads_choice(follow):
    sw, fw = follow()
    sw.use(Choice(1))
    block_over, seen = threading.Event(), {}

    def outer():
        seen["outer"] = fw.current()
        block_over.wait(TIMEOUT)  # the %%on_gpu block has ended in the main thread
        seen["inner_thread"] = run_thread(lambda: seen.update(inner=fw.current()))

    with sw.scoped(Choice(0, source="%%on_gpu")):
        run_thread(lambda: seen.update(inside=fw.current()))
        parent = threading.Thread(target=outer)
        parent.start()
    block_over.set()
    parent.join(TIMEOUT)
    after = run_thread(lambda: seen.update(after=fw.current()))
    assert seen["inside"] == 0 and seen["outer"] == 0
    assert seen["inner"] == 0  # started after the block, by a thread that runs on cuda:0
    assert fw.in_thread(seen["inner_thread"]) == [("set_current", 0)]
    assert seen["after"] == 1 and fw.in_thread(after) == [("set_current", 1)]
    assert fw.current() == 1  # the main thread is restored as before


def test_thread_subclasses_and_timers_follow(follow):
    sw, fw = follow()
    sw.use(Choice(2))
    seen = {}

    class Worker(threading.Thread):
        def run(self):
            seen["worker"] = fw.current()

    w = Worker()
    w.start()
    w.join(TIMEOUT)
    timer = threading.Timer(0, lambda: seen.update(timer=fw.current()))
    timer.start()
    timer.join(TIMEOUT)
    assert seen == {"worker": 2, "timer": 2}
    assert "run" not in w.__dict__ and "run" not in timer.__dict__  # the wrapper is gone afterwards


def test_pool_workers_follow_the_device_in_force_when_they_are_created(follow):
    sw, fw = follow()
    pool = ThreadPoolExecutor(max_workers=4)  # made before the choice: workers start lazily
    try:
        sw.use(Choice(0))
        busy, release = threading.Event(), threading.Event()

        def first():
            busy.set()
            release.wait(TIMEOUT)
            return threading.current_thread(), fw.current()

        f1 = pool.submit(first)
        assert busy.wait(TIMEOUT)
        sw.use(Choice(1))
        # The first worker is busy: the pool grows, and its new worker starts on cuda:1.
        worker2, device2 = pool.submit(lambda: (threading.current_thread(), fw.current())).result(TIMEOUT)
        release.set()
        worker1, device1 = f1.result(TIMEOUT)
        assert worker1 is not worker2
        assert (device1, device2) == (0, 1)
        assert fw.in_thread(worker1) == [("set_current", 0)]
        assert fw.in_thread(worker2) == [("set_current", 1)]
        results = list(pool.map(lambda _: fw.current(), range(8)))
        assert set(results) <= {0, 1}  # existing workers keep the device they started on
    finally:
        pool.shutdown(wait=True)


# -- turning it off, frameworks not loaded, gpuctx's own threads --------------------------------
def test_follow_threads_false_leaves_threads_alone(follow):
    sw, fw = follow()
    assert sw.follow_threads is True
    sw.use(Choice(1))
    sw.follow_threads = False
    t = run_thread()
    assert fw.in_thread(t) == []
    assert "do not follow" in sw.threads_report()[0]
    sw.follow_threads = True
    t = run_thread()
    assert fw.in_thread(t) == [("set_current", 1)]


def test_frameworks_not_loaded_and_gpuctx_threads_are_not_touched(follow):
    absent, present = Recording("cupy", loaded=False), Recording("torch")
    sw, _ = follow(absent, present)
    sw.use(Choice(1))
    absent.calls.clear()
    t = run_thread()
    own = run_thread(name="gpuctx-warmup")
    assert absent.calls == []
    assert present.in_thread(t) == [("set_current", 1)]
    assert present.in_thread(own) == []


def test_no_choice_and_nothing_loaded_is_a_plain_start(follow):
    sw, _ = follow(Recording(loaded=False))
    t = threading.Thread(target=lambda: None)
    t.start()
    assert "run" not in t.__dict__ and t not in sw.threads._live
    t.join(TIMEOUT)


def test_hook_imports_no_framework(tmp_path):
    code = textwrap.dedent("""
        import sys, threading
        from concurrent.futures import ThreadPoolExecutor
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "gpuctx")
        from gpuctx_jupyter.kernel.switching import Choice
        sw = ip._gpuctx.switcher
        assert sw.threads.installed
        sw.use(Choice(1))  # as if `%gpu use 1` (no GPU here): frameworks are not imported
        t = threading.Thread(target=lambda: None); t.start(); t.join()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(abs, range(4)))
        print(sorted(m for m in ("torch", "cupy", "numba", "numba.cuda", "jax") if m in sys.modules))
        print(sw.threads_report()[0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "[]"
    assert lines[-1].startswith("threads: follow")


# -- faults: never an exception in the user's thread ---------------------------------------------
def test_failing_switch_records_one_warning_and_the_target_still_runs(follow, monkeypatch):
    broken, fine = Recording("cupy", fail=True), Recording("torch")
    sw, _ = follow(broken, fine)
    sw.use(Choice(1))  # the main thread's switch of `broken` fails too: reported by `use` as today
    hooks = []
    monkeypatch.setattr(threading, "excepthook", hooks.append)
    ran = []
    a = run_thread(lambda: ran.append(fine.current()), name="loader-1")
    run_thread(lambda: ran.append(fine.current()), name="loader-2")
    assert ran == [1, 1] and hooks == []
    assert broken.in_thread(a) == [("set_current", 1)]  # tried once, not retried
    assert len(sw.thread_warnings) == 2
    assert sw.thread_warnings[0].startswith("thread 'loader-1' could not be switched to cuda:1 (cupy: RuntimeError")
    assert "it runs on its default device" in sw.thread_warnings[0]
    assert "'loader-2'" in sw.thread_warnings[1]


def test_a_fault_in_the_hook_itself_never_reaches_either_thread(follow, monkeypatch):
    sw, _ = follow()
    hooks, ran = [], []
    monkeypatch.setattr(threading, "excepthook", hooks.append)
    monkeypatch.setattr(sw.threads, "_per_thread", lambda: 1 / 0)  # a bug of ours, in the starting thread
    run_thread(lambda: ran.append("started"), name="starter")
    monkeypatch.undo()
    monkeypatch.setattr(threading, "excepthook", hooks.append)
    sw.use(Choice(1))
    monkeypatch.setattr(sw.threads, "_enter", lambda thread, record: 1 / 0)  # ... and in the new thread
    run_thread(lambda: ran.append("victim"), name="victim")
    assert ran == ["started", "victim"] and hooks == []
    assert "'starter'" in sw.thread_warnings[0] and "ZeroDivisionError" in sw.thread_warnings[0]
    assert "'victim'" in sw.thread_warnings[1] and "ZeroDivisionError" in sw.thread_warnings[1]


def test_a_thread_without_init_fails_as_it_would_without_gpuctx(follow):
    sw, _ = follow()
    sw.use(Choice(1))

    class Broken(threading.Thread):
        def __init__(self):  # forgets Thread.__init__
            pass

    with pytest.raises(RuntimeError, match="thread.__init__\\(\\) not called"):
        Broken().start()
    assert sw.thread_warnings == []


def test_starting_a_thread_twice_still_raises_and_leaves_nothing_behind(follow):
    sw, _ = follow()
    sw.use(Choice(1))
    t = run_thread()
    with pytest.raises(RuntimeError, match="threads can only be started once"):
        t.start()
    assert "run" not in t.__dict__ and t not in sw.threads._live


# -- CUDA not started yet: nothing is started, and the report says what did not follow -------------
def test_before_cuda_started_nothing_switches_and_the_report_says_so(follow):
    sw, fw = follow(Recording(started=False))
    sw.use(Choice(1))
    early = Parked("early-1", fw)
    try:
        assert fw.in_thread(early.thread) == []  # switching would start CUDA
        report = sw.threads_report()
        assert any(line.startswith("threads started before CUDA started keep CUDA's device 0") and "'early-1'" in line
                   for line in report), report
        fw.started = True  # CUDA starts
        t = run_thread()
        assert fw.in_thread(t) == [("set_current", 1)]
    finally:
        early.stop()


def test_while_the_warm_up_starts_cuda_a_new_thread_waits_for_it_and_switches():
    set_device = []
    fw = Recording(started=False)
    fw.mod = SimpleNamespace(cuda=SimpleNamespace(set_device=lambda n: set_device.append(
        (n, threading.current_thread()))))
    sw = Switcher(cuda_starting=lambda: True, frameworks=(fw,))
    sw.threads.install()
    try:
        sw.use(Choice(1))
        t = run_thread()
    finally:
        sw.threads.remove()
    assert set_device == [(1, t)]  # torch.cuda.set_device blocks on torch's lazy-init lock


def test_only_torchs_cuda_init_in_the_warm_up_makes_cells_and_threads_wait_for_cuda():
    """While the warm-up imports (`from x import y` too), reads its plan or checks the GPU, a cell or
    thread that set its device would start CUDA itself: only torch's lazy init counts as starting."""
    from gpuctx_jupyter.kernel.state import KernelState
    from gpuctx_jupyter.kernel.warm.plan import Plan

    st = KernelState()
    st.warmer.schedule(lambda: Plan(), within=600)  # a warm-up under way (scheduled, not begun)
    try:
        for phase in ("starting", "reading the plan", "from transformers import AutoModel", "the GPU check",
                      "import torch._dynamo", "optimizer step (AdamW) on the CPU"):
            st.warmer.status.phase = phase
            assert st.switcher.cuda_starting() is False, phase
        from gpuctx_jupyter.kernel.warm.plan import Step

        seen = []  # the turn of torch's CUDA start (taken under the cells' lock) until the step has run
        st.warmer._phase(Step("gpu", "cuda init", op="cuda_init"), lambda: seen.append(st.switcher.cuda_starting()))
        assert seen == [True] and st.switcher.cuda_starting() is False
    finally:
        st.warmer.cancel_scheduled()


def test_a_cell_that_starts_before_a_scheduled_warm_up_begins_is_not_forgotten():
    """Run All right after opening: the first cell may start in the moment between the kernel's
    first answer and the warm-up's start. That it does GPU work (none of ours follows it) and that
    it ran beside the warm-up (`%gpu status` says how long it waited) outlive the start."""
    from gpuctx_jupyter.kernel.warm import plan as plans
    from gpuctx_jupyter.kernel.warm.scheduler import Warmer

    w = Warmer()
    w.schedule(lambda: plans.imports_only([]), within=600)
    w.cell_started("x = torch.ones(3, device='cuda')")
    assert w.go()
    w.cell_finished()
    assert w.wait(30).state == "done"
    assert w.user_gpu and w.status.first_cell_overlap is not None, w.status
    assert "your first cell waited for it at most" in w.status.summary()
    # a later plan (typed cells) beside a later cell: that cell is not "your first cell"
    import threading

    reading = threading.Event()
    assert w.start_plan(lambda: (reading.wait(30), plans.imports_only([]))[1], source="typed cells")
    w.cell_started("pass")  # while the plan is being read
    w.cell_finished()
    reading.set()
    w.wait(30)
    assert "the first cell beside it waited for it at most" in w.status.summary(), w.status


def test_a_warm_up_thread_ending_leaves_the_next_ones_plans_alone(monkeypatch):
    """A new warm-up may start once the last one has taken its last plan, before that one has
    finished ending (typed cells arriving as a plan ends): the ending thread must not drop the plan
    queued for the new one, nor stop its helper at the kernel's priority."""
    import threading

    from gpuctx_jupyter.kernel.warm import plan as plans
    from gpuctx_jupyter.kernel.warm import side_threads as side
    from gpuctx_jupyter.kernel.warm.scheduler import Warmer

    ending, go_on, second = threading.Event(), threading.Event(), threading.Event()
    close = side.Unniced.close

    def slow_close(self):  # the first thread, ending, is held here
        if not ending.is_set():
            ending.set()
            go_on.wait(30)
        close(self)

    monkeypatch.setattr(side.Unniced, "close", slow_close)
    w = Warmer()
    w.nice = True
    assert w.start_plan(lambda: plans.imports_only([]), source="first")
    assert ending.wait(30)
    first = w._thread

    def held_plan():
        second.wait(30)
        return plans.imports_only([])

    assert w.start_plan(held_plan, source="second")
    assert not w.replan(lambda previous: plans.imports_only([]), "typed cells")  # queued for the second
    go_on.set()  # the first thread ends
    first.join(30)
    second.set()
    assert w.wait(30).state == "done" and w.status.source == "typed cells", w.status


def test_numba_imported_by_the_warm_up_gets_the_device_in_the_cells_thread(follow):
    """The server assigned cuda:1; the warm-up's thread imports Numba (whose device is per thread):
    the switch waits for the next cell and happens in its thread — made in the warm-up's thread,
    it left the cells on cuda:0."""
    sw, torch = follow(Recording("torch"), Recording("numba", loaded=False))
    numba = sw.frameworks[1]
    sw.assign(Choice(1))
    numba.is_loaded = True
    warm = run_thread(lambda: sw.on_import(numba.module), name="gpuctx-warmup-import")
    assert numba.in_thread(warm) == []
    sw.enforce()  # the next cell
    assert numba.in_thread(threading.main_thread()) == [("set_current", 1)]


def test_a_later_plan_warms_the_gpu_again_after_the_users_gpu_cell_has_ended():
    """A GPU cell of the user's stops the plan under way from doing GPU work (two sets of library
    handles); a later plan (typed cells) taken up by the same thread does its GPU work after that
    cell, as one started afresh does: the flag was kept, and its GPU steps were all skipped."""
    import threading

    from gpuctx_jupyter.kernel.warm import plan as plans
    from gpuctx_jupyter.kernel.warm.scheduler import Warmer

    w, reading, seen = Warmer(), threading.Event(), []
    assert w.start_plan(lambda: (reading.wait(30), plans.imports_only([]))[1])
    w.cell_started("x = torch.ones(3, device='cuda')")  # while the first plan is read
    w.cell_finished()
    assert w.user_gpu
    assert not w.replan(lambda previous: (seen.append(w.user_gpu), plans.imports_only([]))[1], "typed cells")
    reading.set()
    assert w.wait(30).state == "done" and w.status.source == "typed cells"
    assert seen == [False]


def test_report_names_live_threads_on_another_device(follow):
    sw, fw = follow()
    before = Parked("worker-1", fw)  # started before any choice
    sw.use(Choice(0))
    under0 = [Parked(f"pool-{i}", fw) for i in range(6)]
    sw.use(Choice(1))
    on1 = Parked("on-one", fw)
    try:
        assert before.device == 0 and under0[0].device == 0 and on1.device == 1
        report = sw.threads_report()
        assert report[0].startswith("threads: follow")
        assert "thread 'worker-1' runs on cuda:0, not cuda:1 (started before `%gpu use 1`)" in report
        assert ("threads 'pool-0', 'pool-1', 'pool-2', 'pool-3' and 2 more run on cuda:0, not cuda:1 "
                "(started under `%gpu use 0`)") in report
        assert not any("on-one" in line for line in report)
    finally:
        for p in [before, *under0, on1]:
            p.stop()
    assert sw.threads_report() == report[:1]  # finished threads are forgotten


# -- in a real IPython shell, through the magics ------------------------------------------------------
def test_magics_carry_use_and_on_gpu_into_threads(shell, nvml_records, clean_env, monkeypatch):
    nvml_records([h200(0), h200(1)])
    fw = Recording("torch")
    switcher = shell._gpuctx.switcher
    monkeypatch.setattr(switcher, "frameworks", (fw,))
    shell.run_line_magic("gpu", "use 1 --default")
    cell = ("import threading\n"
            "seen = {}\n"
            "t = threading.Thread(target=lambda: seen.update(thread=threading.current_thread()), name='cell-thread')\n"
            "t.start(); t.join()\n")
    assert shell.run_cell(cell).success
    assert fw.in_thread(shell.user_ns["seen"]["thread"]) == [("set_current", 1), ("set_default", 1)]
    assert shell.run_cell("%%on_gpu 0\n" + cell).success
    assert fw.in_thread(shell.user_ns["seen"]["thread"]) == [("set_current", 0)]
    assert switcher.choice.ordinal == 1 and fw.current() == 1  # the main thread is restored
    assert switcher.threads_report()[0].startswith("threads: follow")
    shell.run_line_magic("gpu", "use --no-default")


def test_a_device_assigned_at_the_hand_over_reaches_jax_and_cupy_with_the_first_cell_not_before():
    """Switching JAX or CuPy starts their GPU backend: a standby handed over on the server's device
    (on the control channel, within the hand-over's time) leaves that to the first cell, which a
    fresh kernel's import cell would have paid too; torch's switch is queued for its CUDA start."""
    torch, jax = Recording("torch", started=False), Recording("jax", started=None)
    sw = Switcher(frameworks=(torch, jax))
    sw.assign(Choice(1, source="the server (round-robin)"))
    assert [c[:2] for c in jax.calls] == []  # nothing of JAX's touched at the hand-over
    sw.enforce()  # the first cell
    assert [c[:2] for c in jax.calls] == [("set_current", 1)]
    sw.enforce()  # once only
    assert [c[:2] for c in jax.calls] == [("set_current", 1)]
