"""The warm kernel pool in a real jupyter_server with real kernels (no GPU here)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import psutil

from gpuctx_jupyter.server.standby import Standby, differing_environment

from .harness.notebooks import notebook
from .harness.waiting import wait_for


def kernel_pids(srv) -> set[int]:
    """Every kernel process the server has started (listed kernels and standbys)."""
    return set(srv.kernel_processes())


def pool_status(srv) -> dict:
    """The pool as GET /gpuctx/api/devices shows it."""
    return srv.api("GET", "/gpuctx/api/devices")[1]["pool"]


def ready_standby(srv) -> set[int]:
    """The PIDs of the pool's standbys once one is ready (answers kernel_info; a loaded machine may
    take up to the pool's own READY_TIMEOUT_S and WARM_TIMEOUT_S)."""
    return wait_for(lambda: {s["pid"] for s in pool_status(srv)["standbys"]}
                    if pool_status(srv)["kernelspecs"]["python3"]["ready"] else None, timeout=240)


def listed(srv) -> list[str]:
    return [k["id"] for k in srv.api("GET", "/api/kernels")[1]]


def test_a_new_notebook_adopts_a_standby_in_its_own_directory(pool_server, tmp_path):
    (tmp_path / "project").mkdir()
    notebook(tmp_path / "project" / "train.ipynb", "import torch")
    srv = pool_server()
    standby = ready_standby(srv)
    assert listed(srv) == []  # the standby is invisible
    spec = pool_status(srv)["kernelspecs"]["python3"]
    assert (spec["ready"], spec["starting"], spec["error"], spec["reason"]) == (1, 0, None, None)
    kid = srv.start_kernel(path="project/train.ipynb")
    assert pool_status(srv)["kernelspecs"]["python3"]["reason"] in (  # why the reserve is empty now: refilling
        "a standby will start shortly", "a standby is starting", None)
    ks = srv.channels(kid)
    r = ks.execute("import os, json; print(json.dumps([os.getcwd(), os.environ.get('JPY_SESSION_NAME'), os.getpid()]))")
    cwd, session, pid = json.loads(r.stdout)
    assert pid in standby  # the request was served by the standby, not a fresh kernel
    assert r.reply["execution_count"] == 1  # the hand-over was no cell: the notebook's first is In [1]
    assert cwd == str(tmp_path / "project") and session.endswith("train.ipynb")
    assert "from gpuctx's warm pool" in ks.execute("%gpu status").text
    assert listed(srv) == [kid]
    wait_for(lambda: len(kernel_pids(srv)) == 2)  # refilled at once
    ks.close()


def test_standbys_are_exempt_from_the_culler_and_replaced_when_they_die(pool_server):
    srv = pool_server("--MappingKernelManager.cull_idle_timeout=1", "--MappingKernelManager.cull_interval=1")
    first = ready_standby(srv)
    assert srv.api("POST", "/api/kernels", {"name": "python3"})[0] == 201  # this one the culler ends
    wait_for(lambda: "Culling kernel" in srv.log() and not listed(srv), timeout=60)  # the culler ran past 1 s
    assert first <= kernel_pids(srv) and listed(srv) == []
    os.kill(next(iter(first)), signal.SIGKILL)
    second = wait_for(lambda: kernel_pids(srv) - first)
    assert second and not (second & first)


SLOW_ANSWERS = """\
import pathlib, time
kernel = get_ipython().kernel
def slowed(answer, seconds):
    def slow(*args):
        time.sleep(seconds)  # its thread held, as by imports holding the GIL on a loaded machine
        return answer(*args)
    return slow
kernel.shell_handlers['kernel_info_request'] = slowed(kernel.shell_handlers['kernel_info_request'], 1.5)
kernel.control_handlers['gpuctx_request'] = slowed(kernel.control_handlers['gpuctx_request'], 2.5)
pathlib.Path({marker!r}).touch()
"""


def test_a_standby_that_answers_slowly_every_time_still_becomes_ready(pool_server, tmp_path):
    """A loaded machine: the standby is up but answers each kernel_info in 1.5 s, and each of the
    pool's questions about its warm-up in 2.5 s. A reply to a try that gave up is lost, so the
    pool's tries wait longer each time: the standby is ready, as soon as its warm-up has ended
    (not after the pool's 180 s of waiting for a warm-up to end, nor given up at 60 s), and a
    restart it serves ends once the kernel answers (not after kernel_info_timeout's 60 s, with
    Interrupt and Shutdown queued behind it)."""
    startup, marker = tmp_path / "ipython" / "profile_default" / "startup", tmp_path / "slowed"
    startup.mkdir(parents=True)
    (startup / "slow.py").write_text(SLOW_ANSWERS.format(marker=str(marker)))
    srv = pool_server("--GpuctxServer.warm_policy=always", env={"IPYTHONDIR": str(tmp_path / "ipython")})
    spec = wait_for(lambda: (lambda s: s if s["ready"] or s["failures"] else None)(
        pool_status(srv)["kernelspecs"]["python3"]), timeout=150)
    assert (spec["ready"], spec["failures"], spec["error"]) == (1, 0, None), spec
    assert marker.exists()  # (both answers were slowed: gpuctx had registered its own before)
    kid = srv.start_kernel()
    standby = ready_standby(srv)  # the refill, which serves the restart
    assert srv.api("POST", f"/api/kernels/{kid}/restart", timeout=30)[0] == 200
    ks = srv.channels(kid)
    assert int(ks.execute("import os; print(os.getpid())").stdout) in standby
    ks.close()


def test_a_standby_taken_before_it_is_up_is_handed_over_once_it_is(pool_server, tmp_path):
    """A notebook opened while the only standby is still starting (its start takes 14 s here, as
    on a loaded machine) takes it: the hand-over waits for it to come up (what is left of its
    start's 60 s), where it gave up after 10 s, stopped it and started a fresh kernel."""
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "slow.py").write_text("import time\ntime.sleep(14)\n")
    srv = pool_server("--GpuctxServer.warm_policy=always", env={"IPYTHONDIR": str(tmp_path / "ipython")})
    standby = wait_for(lambda: kernel_pids(srv))  # launched, not up yet
    ks = srv.channels(srv.start_kernel())
    assert int(ks.execute("import os; print(os.getpid())").stdout) in standby
    ks.close()
    assert "handing a standby to kernel" not in srv.log()


def test_restart_is_served_from_the_pool_keeping_the_kernel_id_and_the_websocket(pool_server):
    srv = pool_server("--GpuctxServer.warm_policy=always")
    ready_standby(srv)
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    ks.execute("x = 1")
    standby = ready_standby(srv)  # the refill
    assert srv.api("POST", f"/api/kernels/{kid}/restart")[0] == 200
    r = ks.execute("import os; print(os.getpid(), 'x' in dir())")  # the same websocket
    pid, has_x = r.stdout.split()
    assert int(pid) in standby and has_x == "False"
    assert listed(srv) == [kid]
    ks.close()


def test_a_hung_kernel_replaced_by_a_standby_is_asked_to_stop_before_it_is_killed(pool_server, tmp_path):
    """A restart served by a standby stops the old process in the background. A hung one was given
    10 s, then SIGKILL, never SIGTERM: a stuck GPU notebook's memory stayed held 10 s into the new
    kernel's first cells, and the SIGTERM handlers of its code never ran. Now it is stopped as
    jupyter_client stops a kernel: SIGTERM half way through the shutdown wait, then SIGKILL."""
    srv = pool_server("--GpuctxServer.warm_policy=always")
    ready_standby(srv)
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    termed = tmp_path / "termed"
    old = int(ks.execute("import os; print(os.getpid())").stdout)
    ks.execute(f"import os, signal\nsignal.signal(signal.SIGTERM, lambda *_: (open({str(termed)!r}, 'w').close(), "
               "os._exit(0)))")
    # it does not exit when asked (as a kernel stuck on its control thread would not)
    ks.execute("async def ignored(*args, **kwargs):\n    pass\nget_ipython().kernel.control_handlers['shutdown_request'] = ignored")
    ready_standby(srv)  # the refill: the restart is served by it
    assert srv.api("POST", f"/api/kernels/{kid}/restart")[0] == 200
    def ended():
        try:
            return psutil.Process(old).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(ended, timeout=60)
    assert termed.exists()  # asked with SIGTERM first: its handler ran
    ks.close()


def test_a_notebook_that_cannot_be_read_gets_a_fresh_kernel_and_status_says_why(pool_server, tmp_path):
    """Under warm_policy=always a notebook is not read to decide whether to warm it, and one that
    could not be read (invalid JSON, too large, a read that timed out) skipped the check of its
    set-up lines: a notebook that sets OMP_NUM_THREADS before `import torch` got a standby whose
    torch had read the wrong value."""
    (tmp_path / "broken.ipynb").write_text('{"cells": [{"cell_type": "code", "source": "import os\\nos.environ[')
    srv = pool_server("--GpuctxServer.warm_policy=always")
    standby = ready_standby(srv)
    kid = srv.start_kernel(path="broken.ipynb")
    ks = srv.channels(kid)
    assert int(ks.execute("import os; print(os.getpid())").stdout) not in standby  # a fresh kernel
    status = ks.execute("%gpu status").text
    assert "started fresh, not from the warm pool: cannot read the notebook" in status, status
    ks.close()
    standby = ready_standby(srv)  # a console's session names no file: it has no set-up to check
    code, model = srv.api("POST", "/api/sessions", {"path": "Console 1", "type": "console", "name": "Console 1",
                                                   "kernel": {"name": "python3"}})
    assert code == 201, model
    ks = srv.channels(model["kernel"]["id"])
    assert int(ks.execute("import os; print(os.getpid())").stdout) in standby
    ks.close()


def test_server_shutdown_leaves_no_kernel_process(pool_server):
    srv = pool_server()
    wait_for(lambda: kernel_pids(srv))
    srv.start_kernel()
    pids = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(kernel_pids(srv)))
    srv.stop()

    def running():
        alive = []
        for p in pids:
            try:
                if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        return alive

    wait_for(lambda: not running(), timeout=20)


def test_a_start_up_variable_that_differs_refuses_adoption():
    """A GPU-warm standby has started CUDA: every variable CUDA read then must match. An imports
    standby has not: only what the process read when it started (LD_LIBRARY_PATH) must."""
    env = {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib"}
    gpu = Standby(None, "python3", env, 0.0, kind="gpu")
    assert differing_environment(gpu, dict(env, PATH="/bin")) == []  # other variables are set at adoption
    assert differing_environment(gpu, dict(env, CUDA_VISIBLE_DEVICES="1")) == ["CUDA_VISIBLE_DEVICES"]
    assert differing_environment(gpu, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib"}) == ["CUDA_VISIBLE_DEVICES"]
    imports = Standby(None, "python3", env, 0.0, kind="imports")
    assert differing_environment(imports, dict(env, CUDA_VISIBLE_DEVICES="1")) == []  # taken at the hand-over
    assert differing_environment(imports, dict(env, LD_LIBRARY_PATH="/elsewhere")) == ["LD_LIBRARY_PATH"]
    imports.driver = True  # an import started the driver: CUDA's variables are fixed now
    assert differing_environment(imports, dict(env, CUDA_VISIBLE_DEVICES="1")) == ["CUDA_VISIBLE_DEVICES"]
    assert gpu.pid is None


def test_notebooks_that_must_not_start_cuda_get_a_fresh_kernel(pool_server, tmp_path):
    """auto: a notebook without a GPU framework, or one that opts out, never gets a warmed standby."""
    notebook(tmp_path / "plain.ipynb", "print('no GPU here')")
    notebook(tmp_path / "optout.ipynb", "import torch", metadata={"gpuctx": {"warm": False}})
    srv = pool_server()
    standby = ready_standby(srv)  # (ready: the one a launch would take first)
    for name in ("plain", "optout"):
        ks = srv.channels(srv.start_kernel(path=f"{name}.ipynb"))
        pid = int(ks.execute("import os; print(os.getpid())").stdout)
        assert pid not in standby
        assert "warm pool" not in ks.execute("%gpu status").text
        ks.close()
    assert standby <= kernel_pids(srv)  # the standby still waits for a GPU notebook



# -- the pool's decisions, without a server ------------------------------------------------------------
GIB = 2**30


class Spawns:
    """The pool's background: what it would start (the coroutines are closed, nothing runs)."""

    def __init__(self):
        self.names: list[str] = []

    def spawn(self, coro, name):
        if hasattr(coro, "close"):
            coro.close()
        self.names.append(name)


def pool_alone(monkeypatch, gpu_free: float = 0.5, host_available: int = 8 * GIB, pool_size: int | None = None):
    """A Pool in auto mode (or of `pool_size` GPU-warm standbys) with an imports profile, a real
    Reserve and a GPU that has `gpu_free` of its memory free, on a host with `host_available` bytes
    available, and no server."""
    import logging
    from types import SimpleNamespace

    from gpuctx_jupyter.core import host_memory
    from gpuctx_jupyter.server.config import GpuctxServer
    from gpuctx_jupyter.server.import_profile import ImportProfile
    from gpuctx_jupyter.server.pool import Pool
    from gpuctx_jupyter.server.reserve import Reserve

    monkeypatch.setattr(host_memory, "available",
                        lambda *a, **k: host_memory.HostMemory(host_available, 2 * host_available, "machine"))
    cfg = GpuctxServer(pool_size=pool_size, import_standbys=True, warm_policy="auto")
    mkm = SimpleNamespace(default_kernel_name="python3", list_kernel_ids=lambda: [])
    launcher = SimpleNamespace(launched={})
    total = 140 * GIB
    gpu = SimpleNamespace(ordinal=0, record=SimpleNamespace(memory_total=total, memory_free=int(gpu_free * total)))
    holders = SimpleNamespace(inventory=SimpleNamespace(devices=[gpu]), latest=(None, {}))
    log = logging.getLogger("test.pool")
    profile = ImportProfile(None, log, torch_installed=True)
    return Pool(mkm, cfg, launcher, Reserve(mkm, cfg, launcher, holders), log, Spawns(), profile)


def booting_standby(pool, rss: int, profile: tuple[str, ...] = (), kind: str = "imports") -> Standby:
    """A starting imports standby (no process of its own: this one's PID, a kernel manager that
    only pretends) that holds `rss` bytes."""
    from types import SimpleNamespace

    process = SimpleNamespace(pid=os.getpid(), poll=lambda: None)
    km = SimpleNamespace(provisioner=SimpleNamespace(process=process), shutdown_kernel=lambda now=False: None,
                         cleanup_connection_file=lambda: None)
    s = Standby(km, "python3", {}, time.monotonic(), kind=kind, profile=profile or tuple(pool.profile.modules()))
    s._rss = (float("inf"), "booting", rss)  # read once, as if just now
    pool.standbys.append(s)
    pool._all.append(s)
    return s


def test_an_imports_standby_starts_on_a_full_gpu_it_holds_no_memory_of(monkeypatch):
    """A GPU below pool_min_free_fraction keeps the GPU reserve out, not the imports standby: only
    the host's memory does (review of issue 24)."""
    import asyncio

    pool = pool_alone(monkeypatch, gpu_free=0.05)
    asyncio.run(pool._tick())
    assert pool._starting == {("python3", "imports"): 1}, pool.status()["kernelspecs"]
    assert pool._short.startswith("cuda:0 would have less than 10% free")


def test_a_standby_that_outgrows_its_memory_share_while_starting_is_not_started_again_every_tick(monkeypatch):
    """Stopped for holding more than standby_memory_fraction while it started, it counts as a
    failure (backoff) at the size it reached: the pool neither starts it again at the next tick
    nor, with nothing measured to leave out, once the backoff is over (review of issue 24)."""
    import asyncio

    pool = pool_alone(monkeypatch)  # budget: 20% of 8 GiB available + what standbys hold
    booting_standby(pool, 3 * GIB)

    async def ticks(n):
        for _ in range(n):
            await pool._tick()

    asyncio.run(ticks(3))
    assert pool.standbys == [] and not pool._starting.get(("python3", "imports")), pool.background.names
    spec = pool.status()["kernelspecs"]["python3"]
    assert spec["failures"] == 1 and "reached 3.00 GiB, more than the standbys' share" in spec["error"]
    pool.health[("python3", "imports")].retry_at = 0.0  # the backoff is over
    asyncio.run(ticks(1))
    assert not pool._starting.get(("python3", "imports")) and pool.background.names == []


def test_a_standby_that_outgrows_its_memory_share_leaves_its_heaviest_imports_out_next_time(monkeypatch, caplog):
    """What each import added is measured as the standby imports; one that outgrew the budget gets
    a successor without its heaviest learnt modules (for its kernelspec only, logged once)."""
    import asyncio
    import logging

    from gpuctx_jupyter.contract.notebook import Event, Facts, Where

    pool = pool_alone(monkeypatch)
    pool.profile.learn(Facts(path="nb.ipynb", events=[Event("import", Where(1, 1), module=m)
                                                      for m in ("big_mod", "small_mod")]))
    pool.profile.entries["big_mod"].memory, pool.profile.entries["small_mod"].memory = 2 * GIB, 50 * 2**20
    booting_standby(pool, 3 * GIB)
    with caplog.at_level(logging.INFO, logger="test.pool"):
        asyncio.run(pool._tick())
        pool.health[("python3", "imports")].retry_at = 0.0
        asyncio.run(pool._tick())
    assert pool._starting == {("python3", "imports"): 1}
    assert "big_mod" not in pool.profile.modules("python3") and "small_mod" in pool.profile.modules("python3")
    assert "big_mod" in pool.profile.modules("another")
    assert caplog.text.count("big_mod is no longer imported ahead by python3 standbys: its import adds 2048 MiB") == 1


def test_what_resolving_a_name_adds_counts_for_its_module_not_the_next_import(monkeypatch):
    """A standby reports its steps as it imports; the memory `from transformers import Trainer`
    added is transformers' (a trimmed profile leaves the right module out), not that of the
    module imported after it — and only where this standby measured transformers itself, not on
    top of what an earlier one measured."""
    from gpuctx_jupyter.contract.notebook import Event, Facts, Where
    from gpuctx_jupyter.core import host_memory, procs
    from gpuctx_jupyter.server.standby import learn_report

    pool = pool_alone(monkeypatch)
    pool.profile.learn(Facts(path="nb.ipynb", events=[Event("import", Where(1, 1), module="transformers", names=("Trainer",)),
                                                      Event("import", Where(2, 1), module="datasets")]))
    s = booting_standby(pool, GIB)
    rss = {"now": GIB}
    monkeypatch.setattr(host_memory, "rss", lambda pid: rss["now"])
    monkeypatch.setattr(procs, "descendants", lambda pid: [])
    steps = []

    def after(step: str, grew_mib: int):
        steps.append({"kind": "import", "name": step, "state": "done"})
        rss["now"] += grew_mib * 2**20
        learn_report(s, {"plan": {"steps": steps}})
        asyncio.run(pool.mem.look(s))

    asyncio.run(pool.mem.look(s))  # the first look: where it starts from
    after("import transformers", 200)
    after("from transformers import Trainer", 600)
    after("import datasets", 50)
    memory = {m: pool.profile.entries[m].memory // 2**20 for m in ("transformers", "datasets")}
    assert memory == {"transformers": 800, "datasets": 50}, memory
    s = booting_standby(pool, GIB)  # the next one: transformers already imported at its first look
    steps[:] = [{"kind": "import", "name": "import transformers", "state": "done"}]
    learn_report(s, {"plan": {"steps": steps}})
    asyncio.run(pool.mem.look(s))
    after("from transformers import Trainer", 600)
    assert pool.profile.entries["transformers"].memory // 2**20 == 800


def test_the_processes_an_import_starts_count_in_its_memory(monkeypatch):
    """Importing torch.compile's own module starts inductor's compile workers (tens of processes):
    their memory is that import's, so that a standby over its share can leave it out — counted
    for no module, the trim found nothing to leave out and no standby started again."""
    from gpuctx_jupyter.contract import INDUCTOR_MODULE
    from gpuctx_jupyter.contract.notebook import Event, Facts, Where
    from gpuctx_jupyter.core import host_memory, procs
    from gpuctx_jupyter.server.standby import learn_report

    pool = pool_alone(monkeypatch)
    pool.profile.learn(Facts(path="nb.ipynb", events=[Event("import", Where(1, 1), module="torch")],
                             signals={"torch_compile": Where(2, 1)}))
    s = booting_standby(pool, GIB)
    workers: list[int] = []
    monkeypatch.setattr(host_memory, "rss", lambda pid: GIB)
    monkeypatch.setattr(procs, "descendants", lambda pid: list(workers))
    monkeypatch.setattr(host_memory, "pss", lambda pid: 100 * 2**20)
    asyncio.run(pool.mem.look(s))
    workers[:] = range(1000, 1032)  # 32 compile workers
    learn_report(s, {"plan": {"steps": [{"kind": "import", "name": f"import {INDUCTOR_MODULE}", "state": "done"}]}})
    asyncio.run(pool.mem.look(s))
    assert pool.profile.entries[INDUCTOR_MODULE].memory == 32 * 100 * 2**20


def test_an_import_left_out_to_fit_comes_back_once_the_host_has_memory_for_it(monkeypatch, caplog):
    """Left out because the host was short (another program's data), an import is not kept out for
    a week: once the standbys' budget has twice its size free again, the next standby imports it,
    and a ready standby without it is replaced."""
    import asyncio
    import logging

    from gpuctx_jupyter.contract.notebook import Event, Facts, Where
    from gpuctx_jupyter.core import host_memory

    pool = pool_alone(monkeypatch)  # budget: 20% of 8 GiB available
    pool.profile.learn(Facts(path="nb.ipynb", events=[Event("import", Where(1, 1), module="big_mod")]))
    pool.profile.entries["big_mod"].memory = 2 * GIB
    booting_standby(pool, 3 * GIB)
    asyncio.run(pool._tick())
    assert "big_mod" not in pool.profile.modules("python3")

    def host(available):
        monkeypatch.setattr(host_memory, "available",
                            lambda *a, **k: host_memory.HostMemory(available, 2 * available, "machine"))

    ready = booting_standby(pool, 1 * GIB, profile=tuple(pool.profile.modules("python3")))
    ready.state = "ready"
    host(24 * GIB)  # budget ~5 GiB: the ready standby (1) + the next (1) + big_mod (2) fit, twice its size not
    asyncio.run(pool._tick())
    assert "big_mod" not in pool.profile.modules("python3")
    host(64 * GIB)  # budget ~13 GiB
    with caplog.at_level(logging.INFO, logger="test.pool"):
        pool.health[("python3", "imports")].retry_at = 0.0
        asyncio.run(pool._tick())
    assert "big_mod" in pool.profile.modules("python3") and pool.mem.seen == 3 * GIB  # counted back in, once
    assert "big_mod is imported ahead by python3 standbys again" in caplog.text
    assert pool.mem.regrow(pool.standbys) == []  # nothing left to take back
    assert pool._outdated(ready) and pool._starting == {("python3", "imports"): 1}  # its successor has big_mod


def test_a_standby_the_pool_stops_while_a_launch_chooses_is_not_handed_to_it(monkeypatch):
    """Choosing awaits reads (a local module shadowing the standby's imports); the pool's tick may
    stop the standby meanwhile (its age, host memory): the launch then starts a fresh kernel — it
    raised, and a restart was left with no kernel (review of issue 24)."""
    import asyncio
    from types import SimpleNamespace

    from gpuctx_jupyter.contract.notebook import Facts

    pool = pool_alone(monkeypatch)
    booting_standby(pool, GIB).state = "ready"

    async def facts(path):
        return Facts(path=path or "")

    async def refusal(standby, env, facts, cwd):
        await pool._stop(standby)  # meanwhile
        return None

    pool.launcher.notebooks = SimpleNamespace(facts=facts)
    monkeypatch.setattr(pool, "_refusal", refusal)
    assert asyncio.run(pool.take("python3", {}, "/", restart=False)) == (None, "")
    assert pool.standbys == []


def test_backoff_is_per_kind_and_only_a_ready_standby_clears_it(monkeypatch):
    """A kernelspec's GPU-warm standbys failing does not hold its imports standby back, and a
    standby that has been starting for a while is no proof that starts work: failures kept
    counting (the backoff grows) until one is ready (review of issue 24)."""
    import asyncio

    pool = pool_alone(monkeypatch)
    pool._failed("python3", "gpu", "it broke")
    asyncio.run(pool._tick())
    assert pool._starting == {("python3", "imports"): 1}
    pool._starting.clear()
    pool._failed("python3", "imports", "its process died")
    slow = booting_standby(pool, GIB)
    slow.started -= 600  # starting for ten minutes
    pool._starting[("python3", "imports")] = 1  # (as the spawn that started it counts it)
    asyncio.run(pool._tick())
    assert pool.health[("python3", "imports")].failures == 1
    assert pool.status()["kernelspecs"]["python3"]["failures"] == 1
    slow.state = "ready"
    asyncio.run(pool._tick())
    assert pool.health[("python3", "imports")].failures == 0


def test_a_fixed_pool_refills_every_standby_at_once(monkeypatch):
    """pool_size=2: a standby still starting counted twice (in the list and among the starts),
    so the second refill waited for the first to be ready (review of issue 24)."""
    import asyncio

    pool = pool_alone(monkeypatch, pool_size=2)
    pool.cfg.pool_kernelspecs = ["python3"]
    booting_standby(pool, 100 * 2**20, kind="gpu")
    pool._starting[("python3", "gpu")] = 1
    asyncio.run(pool._tick())
    assert pool._starting[("python3", "gpu")] == 2


def test_a_kernelspec_without_a_gpu_framework_is_not_tried_again_every_second(monkeypatch, caplog):
    """Its GPU notebooks' kernels run on: each tick put it back on the list of kernelspecs that get
    an imports standby, and each launch said once more that none is started (review of issue 24)."""
    import asyncio
    import logging
    from types import SimpleNamespace

    pool = pool_alone(monkeypatch)

    async def nothing(*_a, **_k):
        return None

    async def no_framework(_name):
        return False

    pool.launcher = SimpleNamespace(launched={"k1": SimpleNamespace(kernel_name="bare")}, settings=nothing,
                                    without_gpuctx=lambda _n: None, unlaunchable=nothing,
                                    has_gpu_framework=no_framework)
    pool.reserve.launcher = pool.launcher
    monkeypatch.setattr(pool.reserve, "update", nothing)
    pool.reserve.notebooks = {"bare": [SimpleNamespace(kernel_id="k1", path="nb.ipynb", device="")]}

    async def ticks():
        for _ in range(3):
            await pool._tick()
            for (name, kind), n in list(pool._starting.items()):
                if name == "bare" and kind == "imports" and n:
                    pool._starting[(name, kind)] = 0
                    await pool._launch(name, kind)  # (what the spawn does first)

    with caplog.at_level(logging.INFO, logger="test.pool"):
        asyncio.run(ticks())
    assert caplog.text.count("no imports standby for bare: no GPU framework is installed there") == 1


def test_a_standby_paused_for_a_long_cell_is_not_taken_for_warmed_half_way(monkeypatch):
    """A machine with few cores pauses a starting standby while a notebook's cell runs: a cell of
    several minutes must not make it look warmed when only part of its imports are done (its
    memory then taken for a whole standby's)."""
    import asyncio

    from gpuctx_jupyter.server import standby as sb

    pool = pool_alone(monkeypatch)
    s = booting_standby(pool, GIB)
    s.started -= sb.WARM_TIMEOUT_S + 60
    s.paused, s._paused_at = True, s.started + 30  # paused since 30 s after its start, still

    async def waiting():
        task = asyncio.ensure_future(sb.until_warmed(s, lambda: False))
        await asyncio.sleep(1.0)
        still = not task.done()
        s.state = "taken"  # (ends the wait)
        await task
        return still

    assert asyncio.run(waiting())


def test_a_notebook_that_compiles_is_handed_the_standby_that_imported_inductor():
    """Two standbys import torch; the one that has also done torch.compile's own import covers a
    notebook that compiles better than one that merely imported the package it lives in."""
    from types import SimpleNamespace

    from gpuctx_jupyter.contract import INDUCTOR_MODULE
    from gpuctx_jupyter.contract.notebook import facts_from_sources
    from gpuctx_jupyter.server import standby as sb

    wanted = sb.needed(facts_from_sources(["import torch", "f = torch.compile(torch.nn.Linear(4, 4))"]))
    plain = SimpleNamespace(imported=lambda: {"torch", "torch._dynamo", "torch.optim"})
    compiled = SimpleNamespace(imported=lambda: {"torch", "torch._dynamo", "torch.optim", INDUCTOR_MODULE})
    assert INDUCTOR_MODULE in wanted and sb.covered(compiled, wanted) > sb.covered(plain, wanted)
    assert INDUCTOR_MODULE not in sb.needed(facts_from_sources(["import torch", "x = torch.ones(3)"]))


def test_a_notebook_opened_again_keeps_its_names_imported_ahead_across_a_server_restart(monkeypatch, tmp_path):
    """Opening a notebook again changes no import (nothing to start a standby for), but when it
    was opened counts: a name no notebook took for a day gives way to a new one. Kept only in
    memory, that went with a restart, and the notebook opened just before it lost its names to
    the next notebook opened after it."""
    import asyncio
    from types import SimpleNamespace

    from gpuctx_jupyter.contract.notebook import Event, Facts, Where
    from gpuctx_jupyter.server import import_profile

    clock = [time.time() - 3 * import_profile.NAME_STALE_S]
    monkeypatch.setattr(import_profile, "time", SimpleNamespace(time=lambda: clock[0], monotonic=time.monotonic))
    pool = pool_alone(monkeypatch)
    pool.profile.path = str(tmp_path / "profile.json")
    writes = []
    pool.background = SimpleNamespace(spawn=lambda done, name: writes.append(done))

    def nb(path, names):
        return Facts(path=path, events=[Event("import", Where(1, 1), module="pkg", names=names)])

    a, b = nb("a.ipynb", tuple(f"A{i}" for i in range(6))), nb("b.ipynb", tuple(f"B{i}" for i in range(4)))

    async def open_at(t, *notebooks):
        clock[0] = t
        for facts in notebooks:
            pool.opened(facts)
        await asyncio.gather(*writes)
        writes.clear()

    start = clock[0]
    asyncio.run(open_at(start, a, b))  # six of A's names, two of B's: the module's eight
    asyncio.run(open_at(start + import_profile.NAME_STALE_S + 10, a))  # A again, a day on
    restarted = import_profile.ImportProfile(pool.profile.path, pool.log, torch_installed=True)
    restarted.load()
    clock[0] = start + import_profile.NAME_STALE_S + 20
    restarted.learn(b)  # B after the restart: A's names were taken 10 s ago, not a day
    assert {f"A{i}" for i in range(6)} <= set(restarted.entries["pkg"].names)
