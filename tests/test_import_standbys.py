"""Import-warm standbys (issue #24) in a real jupyter_server with real kernels, no GPU: a kernel
that has imported the server's import profile before a notebook asks for it, handed to a notebook
on open and on restart, indistinguishable from a fresh kernel for the notebook's code."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest

from .harness.faults import assert_clean, pool_of
from .harness.notebooks import notebook
from .harness.waiting import wait_for

# A standby imports torch at the lowest CPU priority: on a loaded 2-core machine, minutes.
pytestmark = pytest.mark.timeout(900)

AUTO = {"GPUCTX_SERVER_POOL": "auto"}  # the default (the suite's servers keep no pool otherwise)
PROBE = ("import json, os, sys\n"
         "print(json.dumps({'pid': os.getpid(), 'cwd': os.getcwd(), 'path0': sys.path[0], 'path': sys.path, 'argv': sys.argv,"
         " 'session': os.environ.get('JPY_SESSION_NAME'), 'dunder': globals().get('__session__'),"
         " 'modules': sorted(m for m in ('torch', 'torch._dynamo', 'gpuctx_slow_two') if m in sys.modules),"
         " 'pooled': getattr(get_ipython()._gpuctx, 'pooled', None) is not None, 'note': os.environ.get('GPUCTX_POOL_NOTE'),"
         " 'standby': os.environ.get('GPUCTX_STANDBY'), 'recipe': os.environ.get('GPUCTX_WARM_RECIPE'),"
         " 'history': len(list(get_ipython().history_manager.get_range())), 'frozen': __import__('gc').get_freeze_count()}))")


def site_with_a_slow_module(tmp_path) -> dict:
    """An installed package (a site-packages folder on the path) whose import takes 2 s."""
    site = tmp_path / "lib" / "site-packages"
    (site / "gpuctx_slow_two").mkdir(parents=True)
    (site / "gpuctx_slow_two" / "__init__.py").write_text("import time\ntime.sleep(2)\n")
    return {**AUTO, "PYTHONPATH": os.pathsep.join(p for p in [str(site), os.environ.get("PYTHONPATH")] if p)}


def imports_standby(srv, at_least: int = 3, timeout: float = 400) -> dict:
    """The ready imports standby once it has imported `at_least` modules."""
    return wait_for(lambda: next((s for s in (pool_of(srv) or {}).get("standbys", [])
                                  if s["kind"] == "imports" and s["ready"] and s["imports"] >= at_least), None),
                    timeout=timeout)


def probe(srv, kid: str) -> dict:
    ks = srv.channels(kid)
    try:
        r = ks.execute(PROBE)
        assert r.reply["status"] == "ok", r.stderr
        assert r.reply["execution_count"] == 1  # the hand-over was no cell
        return json.loads(r.stdout)
    finally:
        ks.close()


def test_an_imports_standby_starts_with_the_server_and_touches_no_cuda(server_factory):
    srv = server_factory(env=AUTO)
    standby = imports_standby(srv)
    status = pool_of(srv)
    assert status["import_profile"]["modules"][:3] == ["torch", "torch._dynamo", "torch.optim"]
    assert standby["cuda_driver"] is False and standby["memory"] is None  # nothing on a GPU
    assert standby["rss"] > 100 * 2**20 and status["host_memory"]["standbys"] >= standby["rss"]
    assert status["host_memory"]["standbys"] <= status["host_memory"]["budget"]
    assert srv.api("GET", "/api/kernels")[1] == []  # invisible
    assert psutil.Process(standby["pid"]).nice() == 0  # only its warm-up thread ran at the lowest priority


@pytest.mark.timeout(600)  # the standby's and its workers' imports run at the lowest priority first
def test_a_warm_imports_standby_uses_no_cpu_while_it_waits(server_factory):
    """Once its imports (and its workers' imports process's) are done, a standby waiting for a
    notebook costs the machine no CPU: within 180 s, a 10 s window in which the whole process tree
    used at most 25 ms of CPU (an idle plain kernel uses ~0; the workers' imports process waking
    10 times a second had used 50 ms)."""
    srv = server_factory(env=AUTO)
    pid = imports_standby(srv)["pid"]

    def the_workers_imports():
        return next((p for p in psutil.Process(pid).children()
                     if "imports" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE), None)

    zygote = wait_for(the_workers_imports, timeout=60)  # measured too: it is what used to wake

    def used() -> float:
        total = 0.0
        for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:  # a process that ended meanwhile used nothing more
                continue
            total += t.user + t.system
        return total

    def an_idle_window() -> bool:
        before = used()
        threading.Event().wait(10)  # the window measured (the condition waited on is its CPU)
        return used() - before <= 0.025

    wait_for(an_idle_window, timeout=180, every=0)
    assert zygote.is_running() and zygote.status() != psutil.STATUS_ZOMBIE  # it waited, it had not given up


def test_a_notebook_opened_after_its_imports_were_seen_finds_them_done_as_in_a_fresh_kernel(server_factory, tmp_path):
    env = site_with_a_slow_module(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)  # the folder the standby starts in, on PYTHONPATH too
    (tmp_path / "project").mkdir()
    notebook(tmp_path / "project" / "train.ipynb", ["import torch\nimport gpuctx_slow_two", "x = torch.ones(3)"])
    notebook(tmp_path / "project" / "plain.ipynb", "print('no GPU framework')")
    srv = server_factory(env=env)
    standby = imports_standby(srv, at_least=4)  # the root was read: the slow module is in the profile
    assert "gpuctx_slow_two" in pool_of(srv)["import_profile"]["modules"]
    kid = srv.start_kernel(path="project/train.ipynb")
    adopted = probe(srv, kid)
    fresh = probe(srv, srv.start_kernel(path="project/plain.ipynb"))  # no GPU framework: a fresh kernel
    assert adopted["pid"] == standby["pid"] and adopted["pooled"] and not fresh["pooled"]
    assert adopted["modules"] == ["gpuctx_slow_two", "torch", "torch._dynamo"]  # imported before its first cell
    project = str(tmp_path / "project")
    assert adopted["cwd"] == fresh["cwd"] == project and adopted["path0"] == fresh["path0"]
    assert adopted["path"] == fresh["path"] and str(tmp_path) in adopted["path"]  # PYTHONPATH's entry stays
    assert adopted["session"].endswith("train.ipynb") and adopted["dunder"] == adopted["session"]
    assert adopted["history"] == fresh["history"] == 1  # only this cell: the hand-over left none
    assert adopted["standby"] is None and adopted["recipe"] == fresh["recipe"] == "notebook"  # a notebook's settings
    connection = adopted["argv"][adopted["argv"].index("-f") + 1]  # the server's file for this kernel id
    assert connection.endswith(f"kernel-{kid}.json") and os.path.exists(connection)
    assert len(adopted["argv"]) == len(fresh["argv"])
    # the standby's imports were settled before the hand-over (settle.py): the notebook's full
    # collections leave them out; what the notebook makes is not frozen, its cycles are collected
    assert adopted["frozen"] > 10_000 and fresh["frozen"] == 0, (adopted["frozen"], fresh["frozen"])
    ks = srv.channels(kid)
    try:
        r = ks.execute("import gc, weakref\nclass Cycle: pass\nc = Cycle(); c.me = c; ref = weakref.ref(c)\ndel c\n"
                       "gc.collect()\nprint(ref() is None, gc.get_freeze_count())")
        freed, frozen = r.stdout.split()  # (no more frozen than before: a frozen object still goes when its
        assert freed == "True" and int(frozen) <= adopted["frozen"], (r.stdout, r.stderr)  # last reference does)
    finally:
        ks.close()
    # refilled at once, at the lowest CPU priority
    wait_for(lambda: any(s["kind"] == "imports" and s["pid"] != standby["pid"] for s in pool_of(srv)["standbys"]),
             timeout=60)


def test_what_a_notebook_takes_from_a_lazy_package_is_loaded_by_the_standby_too(server_factory, tmp_path):
    """`from pkg import Name` of a package that loads its parts on first access (as transformers
    does): the standby asks for the name, so the notebook's import cell finds the part loaded; a name
    the package lacks is forgotten, and the package stays in the profile."""
    site = tmp_path / "lib" / "site-packages"
    (site / "gpuctx_lazy").mkdir(parents=True)
    (site / "gpuctx_lazy" / "__init__.py").write_text(
        "import importlib\n"
        "def __getattr__(name):\n"
        "    if name == 'Heavy':\n"
        "        return importlib.import_module('gpuctx_lazy.heavy').Heavy\n"
        "    raise AttributeError(name)\n")
    (site / "gpuctx_lazy" / "heavy.py").write_text("import time\ntime.sleep(2)\nclass Heavy: pass\n")
    env = {**AUTO, "PYTHONPATH": os.pathsep.join(p for p in [str(site), os.environ.get("PYTHONPATH")] if p)}
    notebook(tmp_path / "lazy.ipynb", ["import torch\nfrom gpuctx_lazy import Heavy, Missing", "x = torch.ones(3)"])
    srv = server_factory(env=env)
    standby = imports_standby(srv, at_least=4)
    wait_for(lambda: pool_of(srv)["import_profile"]["names"] == {"gpuctx_lazy": ["Heavy"]}, timeout=60)
    assert "gpuctx_lazy" in pool_of(srv)["import_profile"]["modules"] and not pool_of(srv)["import_profile"]["dropped"]
    ks = srv.channels(srv.start_kernel(path="lazy.ipynb"))
    try:
        r = ks.execute("import os, sys\nprint(os.getpid(), 'gpuctx_lazy.heavy' in sys.modules)")
        assert r.stdout.split() == [str(standby["pid"]), "True"], r.stdout  # loaded before its first cell
    finally:
        ks.close()


def test_a_notebook_that_compiles_finds_torch_compiles_own_import_done_by_its_standby(server_factory, tmp_path):
    """torch.compile's first call imports inductor (1-2 s): a notebook that calls it puts that
    import into the profile, and the standby it adopts has done it."""
    from gpuctx_jupyter.contract import INDUCTOR_MODULE

    notebook(tmp_path / "compiles.ipynb", ["import torch", "f = torch.compile(torch.nn.Linear(4, 4))"])
    srv = server_factory(env=AUTO)
    standby = imports_standby(srv, at_least=4)
    assert INDUCTOR_MODULE in pool_of(srv)["import_profile"]["modules"]
    ks = srv.channels(srv.start_kernel(path="compiles.ipynb"))
    try:
        r = ks.execute(f"import os, sys; print(os.getpid(), {INDUCTOR_MODULE!r} in sys.modules)")
        assert r.stdout.split() == [str(standby["pid"]), "True"], (r.stdout, r.stderr)
    finally:
        ks.close()


def test_torch_compile_puts_inductor_into_the_profile_and_torchscript_does_not(tmp_path):
    import logging

    from gpuctx_jupyter.contract import INDUCTOR_MODULE
    from gpuctx_jupyter.contract import notebook as nbread
    from gpuctx_jupyter.server.import_profile import ImportProfile

    notebook(tmp_path / "script.ipynb", ["import torch", "m = torch.jit.script(torch.nn.Linear(2, 2))"])
    notebook(tmp_path / "compiles.ipynb", ["import torch", "@torch.compile\ndef f(x):\n    return x + 1"])
    profile = ImportProfile(None, logging.getLogger("test"), torch_installed=True)
    profile.learn(nbread.read(str(tmp_path / "script.ipynb")))
    assert INDUCTOR_MODULE not in profile.modules()
    profile.learn(nbread.read(str(tmp_path / "compiles.ipynb")))
    assert INDUCTOR_MODULE in profile.modules()


def learnt_profile(*modules, budget_s: float = 60.0):
    """An import profile (kept nowhere) that has learnt `modules` from a notebook."""
    import logging

    from gpuctx_jupyter.contract.notebook import Event, Facts, Where
    from gpuctx_jupyter.server.import_profile import ImportProfile

    profile = ImportProfile(None, logging.getLogger("test"), torch_installed=True, budget_s=budget_s)
    profile.learn(Facts(path="nb.ipynb", events=[Event("import", Where(1, 1), module=m) for m in modules]))
    return profile


def test_what_an_import_did_decides_whether_it_stays_in_the_profile():
    """A CUDA context or a failed import drops a module; starting the driver marks it; a standby
    whose import budget was spent before the import began (it stood paused for a long cell while
    its clock ran on) says nothing of the module, and one cut short after less than its own share
    of the budget, time paused not counted, neither: those stay (issue 24's review)."""
    mods = ("ctx_mod", "driver_mod", "late_mod", "cut_mod", "paused_mod", "hung_mod", "broken_mod")
    profile = learnt_profile(*mods, budget_s=60.0)
    profile.outcome("ctx_mod", "done", 1.0, "context")
    profile.outcome("driver_mod", "done", 2.5, "driver")
    profile.outcome("late_mod", "skipped", None, "", "the import budget (60 s) is spent", paused_s=300.0)
    budget_out = "TimeoutError: still importing after the import budget (60 s); left to finish in the background"
    profile.outcome("cut_mod", "failed", 4.0, "", budget_out)  # began with 4 s of the budget left
    profile.outcome("paused_mod", "failed", 50.0, "", budget_out, paused_s=45.0)  # 5 s its own
    profile.outcome("hung_mod", "failed", 58.0, "", budget_out, paused_s=2.0)
    profile.outcome("broken_mod", "failed", 0.1, "", "RuntimeError: broken on import")
    dropped = profile.as_dict()["dropped"]
    assert set(dropped) == {"ctx_mod", "hung_mod", "broken_mod"}, dropped
    assert "CUDA context" in dropped["ctx_mod"] and "failed (RuntimeError" in dropped["broken_mod"]
    assert dropped["hung_mod"].startswith("its import did not finish in 56 s")
    assert {"driver_mod", "late_mod", "cut_mod", "paused_mod"} <= set(profile.modules())
    assert profile.starts_driver(["driver_mod"]) and profile.entries["driver_mod"].seconds == 2.5


def test_a_module_missing_in_one_kernelspec_stays_for_the_others_and_drops_lapse_after_a_week(tmp_path):
    """What one kernelspec's environment lacks is left out for its standbys only; a drop (and a
    left-out) is tried again after DROP_EXPIRES_S, also for drops kept by a profile file."""
    from gpuctx_jupyter.server import import_profile

    profile = learnt_profile("only_in_python3", "broken_mod")
    profile.outcome("only_in_python3", "skipped", None, "", "not installed in this kernel", kernel_name="myenv")
    profile.outcome("broken_mod", "failed", 0.1, "", "ImportError: no")
    assert "only_in_python3" in profile.modules("python3") and "only_in_python3" in profile.modules()
    assert "only_in_python3" not in profile.modules("myenv")
    status = profile.as_dict()
    assert status["dropped"] == {"broken_mod": "its import failed (ImportError: no)"}
    assert status["left_out"] == {"myenv": {"only_in_python3": "not installed in this kernel"}}
    assert "broken_mod" not in profile.modules("python3")
    week_ago = import_profile.time.time() - import_profile.DROP_EXPIRES_S - 1
    profile.entries["broken_mod"].dropped_at = week_ago
    profile.left_out["myenv"]["only_in_python3"] = ("not installed in this kernel", week_ago)
    assert {"broken_mod", "only_in_python3"} <= set(profile.modules("myenv"))  # tried again
    # a profile file written before drops lapsed: its drops lapse a week from now
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 1, "entries": [{"module": "old_mod", "seen": 1, "last": 1.0,
                                                            "dropped": "its import failed"}]}))
    kept = import_profile.ImportProfile(str(path), profile.log, torch_installed=False)
    kept.load()
    assert kept.modules() == [] and kept.entries["old_mod"].dropped_at > week_ago


def test_profile_writes_that_overlap_leave_the_newest_whole_and_a_failed_one_says_so(tmp_path, caplog):
    """Each notebook opened saves the profile from one of the server's executor threads: writes
    that overlap must neither garble the file (it was one temporary name for all) nor let an
    older snapshot replace a newer one."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuctx_jupyter.server import import_profile

    profile = learnt_profile(*[f"mod_{i}" for i in range(300)])
    profile.path = str(tmp_path / "gpuctx" / "import-profile.json")
    snapshots = []
    for i in range(40):
        profile.entries["mod_0"].seen = i
        snapshots.append(profile.snapshot())
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(profile.write, reversed(snapshots)))  # the newest first: the others come too late
    kept = import_profile.ImportProfile(profile.path, profile.log, torch_installed=False)
    kept.load()
    assert len(kept.entries) == 300 and kept.entries["mod_0"].seen == 39
    assert os.listdir(tmp_path / "gpuctx") == ["import-profile.json"]  # no temporary file left behind

    (tmp_path / "a-file").write_text("")
    profile.path = str(tmp_path / "a-file" / "import-profile.json")  # (no folder can be made there, even by root)
    with caplog.at_level("WARNING", logger="test"):
        profile.write(profile.snapshot())
        profile.write(profile.snapshot())
    said = [r.getMessage() for r in caplog.records if "import profile" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("gpuctx pool: cannot keep the import profile in "), said
    assert "no longer imported ahead" not in caplog.text


def test_a_profile_file_kept_under_older_rules_forgets_the_drops_todays_rules_do_not_make(tmp_path):
    """The profile file of a5ba1fa dropped a module for good when a standby's import budget ran out
    (paused or not) and when one environment lacked it; a later load (which gave drops a date)
    saved those again. Only a failed import and a CUDA context stay dropped."""
    from gpuctx_jupyter.server import import_profile

    old = {"late_mod": "its import did not finish in time (the import budget (60 s) is spent)",
           "missing_mod": "not installed in this kernel", "local_mod": "local code (a file in the notebook's folder)",
           "broken_mod": "its import failed (ImportError: no)",
           "ctx_mod": "its import created a CUDA context (GPU memory in a standby)"}
    entries = [{"module": m, "seen": 1, "last": 1.0, "seconds": None, "dropped": why, "driver": False}
               for m, why in old.items()]
    entries.append({"module": "saved_mod", "seen": 1, "last": 1.0, "dropped_at": time.time(),  # loaded, saved again
                    "dropped": "its import did not finish in time (TimeoutError: still importing after …)"})
    entries.append({"module": "hung_mod", "seen": 1, "last": 1.0, "dropped_at": time.time(),
                    "dropped": "its import did not finish in 25 s (TimeoutError: still importing after …)"})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 1, "entries": entries}))
    profile = import_profile.ImportProfile(str(path), learnt_profile().log, torch_installed=False)
    profile.load()
    assert set(profile.as_dict()["dropped"]) == {"broken_mod", "ctx_mod", "hung_mod"}
    assert set(profile.modules()) == {"late_mod", "missing_mod", "local_mod", "saved_mod"}
    assert all(profile.entries[m].dropped_at > 0 for m in ("broken_mod", "ctx_mod"))  # lapse a week from now


def test_the_names_a_standby_resolves_stay_put_while_notebooks_take_them_and_a_file_cannot_smuggle_others_in(tmp_path):
    """Names follow their module in a standby's list, at most MAX_NAMES. Two notebooks that take
    more than that between them, opened in turn, leave the list as it is (each change of it starts
    a new standby); a name no notebook has taken for NAME_STALE_S gives its place to a new one. A
    profile file's names that are not identifiers are not loaded."""
    from gpuctx_jupyter.contract.notebook import Event, Facts, Where
    from gpuctx_jupyter.server import import_profile

    def nb(path, names):
        return Facts(path=path, events=[Event("import", Where(1, 1), module="pkg", names=names)])

    profile = learnt_profile()
    a, b = tuple(f"A{i}" for i in range(6)), tuple(f"B{i}" for i in range(4))
    now = time.time()
    profile.learn(nb("a.ipynb", a), when=now)
    profile.learn(nb("b.ipynb", b), when=now + 1)
    first = profile.imports()
    assert first == ["torch", "torch._dynamo", "torch.optim", "pkg", *(f"pkg:{n}" for n in a + b[:2])]
    for i in range(2, 6):  # A, B, A, B opened in turn: nothing to start a standby for
        assert profile.learn(nb("ab"[i % 2] + ".ipynb", (a, b)[i % 2]), when=now + i) is False
        assert profile.imports() == first
    later = now + import_profile.NAME_STALE_S + 10  # B opened a day on, A not since: A's names give way
    assert profile.learn(nb("b.ipynb", b), when=later) is True
    assert set(profile.entries["pkg"].names) >= set(b) and len(profile.entries["pkg"].names) == import_profile.MAX_NAMES
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 1, "entries": [{"module": "pkg", "seen": 1, "last": 1.0,
                                                           "names": ["Good", "os.system('x')", 3, "a b"]}]}))
    loaded = import_profile.ImportProfile(str(path), profile.log, torch_installed=False)
    loaded.load()
    assert loaded.imports() == ["pkg", "pkg:Good"]


def test_resolving_names_counts_in_the_import_budget_and_a_name_that_hangs_is_forgotten():
    """What resolving a name took counts with its module's import against import_profile_seconds
    (a lazy package's parts are most of its time); a name that hangs or fails is forgotten, one the
    budget left no time for stays."""
    from gpuctx_jupyter.contract.notebook import Event, Facts, Where

    profile = learnt_profile(budget_s=60.0)
    profile.learn(Facts(path="a.ipynb", events=[Event("import", Where(1, 1), module="lazy", names=("Big", "Hangs", "Late")),
                                                Event("import", Where(1, 2), module="after")]))
    profile.outcome("lazy", "done", 5.0, "")
    profile.outcome("after", "done", 10.0, "")
    assert {"after", "lazy"} <= set(profile.modules())
    profile.name_outcome("lazy", "Big", "done", 50.0, "")
    assert "after" in profile.modules() and "lazy" not in profile.modules()  # 10 s, then 5 + 50 s: past 60 s
    budget_out = "TimeoutError: still importing after the import budget (60 s); left to finish in the background"
    profile.name_outcome("lazy", "Hangs", "failed", 30.0, "", budget_out)
    profile.name_outcome("lazy", "Late", "skipped", None, "", "the import budget (60 s) is spent")
    assert profile.entries["lazy"].names == ["Big", "Late"] and not profile.entries["lazy"].dropped
    # a notebook opened again does not bring a name that failed back (each time, a new standby)
    small = learnt_profile(budget_s=60.0)
    opened = Facts(path="b.ipynb", events=[Event("import", Where(1, 1), module="pkg", names=("Fine", "Broken"))])
    small.learn(opened)
    small.outcome("pkg", "done", 1.0, "")
    small.name_outcome("pkg", "Broken", "failed", 0.5, "", "AttributeError: no Broken")
    assert small.learn(opened) is False
    assert small.imports() == ["torch", "torch._dynamo", "torch.optim", "pkg", "pkg:Fine"]


FAILS_LATE = """
import json
from gpuctx_jupyter.kernel.warm import plan as plans
from gpuctx_jupyter.kernel.warm.scheduler import Warmer
w = Warmer()
w.start_plan(lambda: plans.imports_only(["gpuctx_fails_late", "gpuctx_fails_late:A", "gpuctx_fails_late:B"]), source="t")
w.wait(timeout=120)
print(json.dumps([[s.name, s.state, s.detail] for s in w.plan.steps]))
"""


def test_a_module_whose_import_fails_is_not_imported_again_for_each_name_taken_from_it(tmp_path):
    """A standby whose module fails at the end of its import (after its seconds of work) skips the
    names taken from it, saying why, instead of running that import once more per name."""
    import subprocess
    import sys

    from gpuctx_jupyter.contract import STANDBY as STANDBY_ENV

    site = tmp_path / "lib" / "site-packages"
    (site / "gpuctx_fails_late").mkdir(parents=True)
    runs = tmp_path / "runs.txt"
    (site / "gpuctx_fails_late" / "__init__.py").write_text(
        f"open({str(runs)!r}, 'a').write('x')\nraise RuntimeError('broken at the end')\n")
    env = {**os.environ, STANDBY_ENV: "1", "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", FAILS_LATE], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    steps = json.loads(out.stdout.strip().splitlines()[-1])
    assert steps[0][:2] == ["import gpuctx_fails_late", "failed"], steps
    assert [s[1:] for s in steps[1:]] == [["skipped", "import gpuctx_fails_late failed"]] * 2, steps
    assert runs.read_text() == "x"  # imported once


def test_a_profile_files_numbers_of_the_wrong_kind_are_taken_as_unknown(tmp_path):
    """A string, a NaN, an infinity or an integer past any float where the profile file keeps a
    number (edited by hand, or written by a broken tool) neither breaks the standbys' list nor turns
    the import budget off; a time in the future counts as now (it would pin a module first for years)."""
    import logging

    from gpuctx_jupyter.server.import_profile import ImportProfile

    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 1, "entries": [
        {"module": "text_seconds", "seen": "3", "last": "yesterday", "seconds": "2", "memory": "1 GiB"},
        {"module": "nan_names", "seen": 1, "last": 2.0, "seconds": 1.0, "names": ["X", "X"],
         "name_seconds": {"X": float("nan")}, "name_last": {"X": "now"}},
        {"module": "inf_names", "seen": 1, "last": 3.0, "seconds": 1.0, "names": ["Y"], "name_seconds": {"Y": float("inf")},
         "dropped_at": -5, "driver": "yes"},
        {"module": "too_slow", "seen": 1, "last": 4.0, "seconds": 1e9},
        {"module": "huge_int", "seen": 1, "last": 10**400, "seconds": 10**400},
        {"module": "future", "seen": 1, "last": time.time() + 1e9, "seconds": 1.0},
        {"module": 7}, "not an entry"]}))
    profile = ImportProfile(str(path), logging.getLogger("test"), torch_installed=False, budget_s=60.0)
    profile.load()
    assert profile.modules() == ["future", "inf_names", "nan_names", "huge_int", "text_seconds"]  # too_slow: past the budget
    assert profile.entries["future"].last <= time.time()
    assert profile.imports() == ["future", "inf_names", "inf_names:Y", "nan_names", "nan_names:X", "huge_int", "text_seconds"]
    assert profile.entries["text_seconds"].seconds is None and profile.entries["inf_names"].driver is False


def test_only_the_time_an_import_stood_paused_is_taken_off_its_own(monkeypatch):
    """An imports standby paused for 300 s by an earlier cell, then 10 s during an import that hung
    for 58 s: the import's own time is 48 s, past a third of the budget, so it is dropped (the
    standby's whole paused time would have made it -252 s and kept it for ever)."""
    import asyncio
    from types import SimpleNamespace

    from gpuctx_jupyter.server.pool import Pool
    from gpuctx_jupyter.server.standby import Standby
    from gpuctx_jupyter.server.tasks import Background

    now = time.monotonic()
    s = Standby(None, "python3", {}, now - 1000, kind="imports", profile=("hung_mod", "quick_mod"))
    s.pauses = [(now - 900, now - 600), (now - 50, now - 40)]  # 310 s paused in all
    s.paused, s._paused_at = True, now - 1  # paused again now, after both imports
    assert s.paused_between(now - 60, now - 2) == 10.0 and s.paused_between(now - 2, now + 10) >= 1.0
    budget_out = "TimeoutError: still importing after the import budget (60 s); left to finish in the background"
    steps = [{"kind": "import", "name": "import hung_mod", "state": "failed", "seconds": 58.0, "started": now - 60,
              "detail": budget_out},
             {"kind": "import", "name": "import quick_mod", "state": "failed", "seconds": 15.0, "started": now - 52,
              "detail": budget_out}]  # 15 s, 10 of them paused: 5 s its own (cut short, not hung)
    pool = SimpleNamespace(profile=learnt_profile("hung_mod", "quick_mod"), background=Background(None))
    pool._save_profile = lambda: Pool._save_profile(pool)  # (the pool's own, on this namespace)

    async def learn():
        Pool._learn_outcomes(pool, s, {"plan": {"steps": steps}})
        await pool.background.drain()

    asyncio.run(learn())
    assert pool.profile.as_dict()["dropped"] == {"hung_mod": f"its import did not finish in 48 s ({budget_out})"}


def test_a_notebook_created_after_the_server_started_is_learnt_when_it_is_opened(server_factory, tmp_path):
    """The profile learns at every open, not only from the start-up scan of the root. No standby
    fits the memory share given here: the open alone is what teaches it."""
    notebook(tmp_path / "old.ipynb", "import torch\nimport gpuctx_seen_at_start")
    srv = server_factory("--GpuctxServer.standby_memory_fraction=0.0001", env=AUTO)

    def profile():
        return (pool_of(srv) or {}).get("import_profile") or {"modules": []}

    wait_for(lambda: "gpuctx_seen_at_start" in profile()["modules"])  # the start-up scan is over
    notebook(tmp_path / "new.ipynb", "import torch\nimport gpuctx_seen_when_opened")
    assert "gpuctx_seen_when_opened" not in profile()["modules"]
    srv.start_kernel(path="new.ipynb")
    assert "gpuctx_seen_when_opened" in wait_for(lambda: profile()["modules"] if "gpuctx_seen_when_opened"
                                                 in profile()["modules"] else None, timeout=30)


def test_the_profile_is_remembered_across_server_restarts(server_factory, tmp_path):
    env = site_with_a_slow_module(tmp_path)
    notebook(tmp_path / "train.ipynb", ["import torch\nimport gpuctx_slow_two"])
    first = server_factory(env=env)
    first.start_kernel(path="train.ipynb")
    imports_standby(first, at_least=4)
    first.stop()
    (tmp_path / "train.ipynb").unlink()  # only the profile kept in Jupyter's data folder knows it now
    second = server_factory(env=env)
    assert "gpuctx_slow_two" in wait_for(lambda: (pool_of(second).get("import_profile") or {}).get("modules"))
    imports_standby(second, at_least=4)


def test_an_import_that_fails_or_hangs_is_dropped_and_the_standby_still_serves(server_factory, tmp_path):
    site = tmp_path / "lib" / "site-packages"
    for name, code in (("gpuctx_broken_mod", "raise RuntimeError('broken on import')\n"),
                       ("gpuctx_hanging_mod", "import time\ntime.sleep(3600)\n")):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(code)
    env = {**AUTO, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    notebook(tmp_path / "nb.ipynb", ["import torch\nimport gpuctx_broken_mod\nimport gpuctx_hanging_mod"])
    # the hanging import must run a third of the budget on its own to count as hung (torch's take < 8 s)
    srv = server_factory("--GpuctxServer.import_profile_seconds=16", env=env)
    profile = wait_for(lambda: (lambda p: p if len(p.get("dropped", {})) == 2 else None)(
        pool_of(srv).get("import_profile") or {}), timeout=180)
    assert "failed" in profile["dropped"]["gpuctx_broken_mod"]
    assert profile["dropped"]["gpuctx_hanging_mod"].startswith("its import did not finish in ")
    assert not {"gpuctx_broken_mod", "gpuctx_hanging_mod"} & set(profile["modules"])
    log = srv.log()
    assert log.count("gpuctx_broken_mod is no longer imported ahead") == 1
    standby = wait_for(lambda: next((s for s in pool_of(srv)["standbys"] if s["kind"] == "imports" and s["ready"]
                                     and s["imports"] >= 3), None), timeout=180)
    kid = srv.start_kernel(path="nb.ipynb")
    assert probe(srv, kid)["pid"] == standby["pid"]


def test_set_up_before_the_imports_gets_a_fresh_kernel_and_status_says_why(server_factory, tmp_path):
    notebook(tmp_path / "nb.ipynb", ["import os\nos.environ['HF_HOME'] = '/data/hf'", "import torch"])
    srv = server_factory(env=AUTO)
    standby = imports_standby(srv)
    kid = srv.start_kernel(path="nb.ipynb")
    seen = probe(srv, kid)
    assert seen["pid"] != standby["pid"] and not seen["pooled"]
    assert "sets HF_HOME at cell 1, line 2 before its imports" in seen["note"]
    ks = srv.channels(kid)
    assert "started fresh, not from the warm pool: the notebook sets HF_HOME" in ks.execute("%gpu status").text
    ks.close()
    # CUDA's own settings are read when CUDA starts: a standby that has not started it takes them
    notebook(tmp_path / "cuda.ipynb", ["import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'", "import torch"])
    kid = srv.start_kernel(path="cuda.ipynb")
    assert probe(srv, kid)["pid"] == standby["pid"]


def test_a_local_module_shadowing_a_pre_imported_one_gets_a_fresh_kernel(server_factory, tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "torch.py").write_text("raise SystemExit('the local one')\n")
    notebook(tmp_path / "proj" / "nb.ipynb", "import numpy")  # no GPU framework: served fresh anyway
    notebook(tmp_path / "proj" / "gpu.ipynb", ["%gpu list", "import numpy"])
    srv = server_factory(env=AUTO)
    standby = imports_standby(srv)
    seen = probe(srv, srv.start_kernel(path="proj/gpu.ipynb"))
    assert seen["pid"] != standby["pid"] and "local code" in seen["note"]


def test_concurrent_opens_and_restarts_share_no_standby_and_leave_nothing(faulty, tmp_path):
    for i in range(4):
        notebook(tmp_path / f"nb{i}.ipynb", "import torch")
    srv = faulty(env=AUTO)
    standby = imports_standby(srv)
    results = {}

    def open_one(i):
        results[i] = srv.start_kernel(path=f"nb{i}.ipynb")

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert len(results) == 4 and not any(t.is_alive() for t in threads)
    pids = [probe(srv, kid)["pid"] for kid in results.values()]
    assert len(set(pids)) == 4 and pids.count(standby["pid"]) == 1  # one of them got it, none twice
    restarts = [threading.Thread(target=lambda k=kid: srv.api("POST", f"/api/kernels/{k}/restart"))
                for kid in results.values()]
    for t in restarts:
        t.start()
    for t in restarts:
        t.join(240)
    assert not any(t.is_alive() for t in restarts)
    after = [probe(srv, kid)["pid"] for kid in results.values()]
    assert len(set(after)) == 4 and not set(after) & set(pids)
    assert_clean(srv, timeout=120)


def test_a_standby_killed_while_being_handed_over_gives_a_fresh_kernel(faulty, tmp_path):
    notebook(tmp_path / "nb.ipynb", "import torch")
    srv = faulty(env=AUTO)
    standby = imports_standby(srv)
    os.kill(standby["pid"], signal.SIGSTOP)  # it takes the hand-over request and cannot answer
    opened = {}
    opening = threading.Thread(target=lambda: opened.update(kid=srv.start_kernel(path="nb.ipynb")))
    opening.start()
    wait_for(lambda: all(s["pid"] != standby["pid"] for s in pool_of(srv)["standbys"]))  # taken
    os.kill(standby["pid"], signal.SIGKILL)
    opening.join(240)  # (the hand-over's timeout, then a fresh kernel's start on a loaded machine)
    assert "kid" in opened, "the notebook did not open"
    seen = probe(srv, opened["kid"])
    assert seen["pid"] != standby["pid"] and not seen["pooled"]
    assert "handing a standby to kernel" in srv.log()
    assert_clean(srv, timeout=120)


def test_no_standby_beyond_its_share_of_host_memory_and_the_pool_says_so(server_factory):
    srv = server_factory("--GpuctxServer.standby_memory_fraction=0.0001", env=AUTO)
    status = wait_for(lambda: (lambda p: p if "standby_memory_fraction" in json.dumps(p["kernelspecs"]) else None)(
        pool_of(srv)), timeout=60)
    assert status["standbys"] == [] and status["host_memory"]["budget"] < 2**30


def test_a_kernelspec_of_its_own_gets_its_own_standby_never_another(server_factory, tmp_path):
    import sys

    spec = tmp_path / "jupyter-data" / "kernels" / "myenv"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "My env", "language": "python", "env": {"MY_ENV": "1"}}))
    notebook(tmp_path / "nb.ipynb", "import torch")
    notebook(tmp_path / "nb2.ipynb", "import torch")
    srv = server_factory("--GpuctxServer.pool_reserve_after=0", env={**AUTO, "JUPYTER_PATH": str(tmp_path / "jupyter-data")})
    python3 = imports_standby(srv)
    first = probe(srv, srv.start_kernel(name="myenv", path="nb.ipynb"))
    assert first["pid"] != python3["pid"]  # the python3 standby never serves another kernelspec
    mine = wait_for(lambda: next((s for s in pool_of(srv)["standbys"] if s["kernel_name"] == "myenv"
                                  and s["kind"] == "imports" and s["ready"]), None), timeout=180)
    others = {s["pid"] for s in pool_of(srv)["standbys"] if s["kernel_name"] == "myenv"}
    second = probe(srv, srv.start_kernel(name="myenv", path="nb2.ipynb"))
    assert second["pid"] in others | {mine["pid"]} and second["pid"] != python3["pid"]


def test_the_hand_over_moves_the_start_directory_and_pythonpaths_relative_entries_and_nothing_else(monkeypatch):
    from gpuctx_jupyter.kernel.adoption import _rebased

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["src", "/opt/libs", "/srv/root"]))
    path = ["/srv/root", "/srv/root/src", "/opt/libs", "/srv/root", "/usr/lib/python3"]
    assert _rebased(path, "/srv/root", "/home/me/project") == [
        "/home/me/project", "/home/me/project/src", "/opt/libs", "/srv/root", "/usr/lib/python3"]


def test_the_hand_over_brings_back_a_pth_files_entry_that_pythonpaths_empty_entry_hid(tmp_path, monkeypatch):
    """An editable install of the code in the standby's start directory (a .pth file naming it)
    with an empty PYTHONPATH entry (the start directory): site added that directory once, for the
    empty entry, so moving the empty entry to the notebook's folder lost it — and the package with
    it. sys.path is compared with a fresh process's in the notebook's folder."""
    import subprocess
    import sys

    from gpuctx_jupyter.kernel.adoption import _rebased

    root, sub, tools, sitedir = tmp_path / "root", tmp_path / "root" / "sub", tmp_path / "tools", tmp_path / "site"
    for d in (sub, tools, sitedir):
        d.mkdir(parents=True)
    (tools / "gpuctx_showpath.py").write_text(
        f"import json, site, sys\nsite.addsitedir({str(sitedir)!r})\nprint(json.dumps(sys.path))\n")
    (sitedir / "_editable_impl_mine.pth").write_text(f"{root}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep + str(tools)}  # the empty entry first

    def path_in(cwd) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "gpuctx_showpath"], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        return json.loads(out.stdout)

    standby, fresh = path_in(root), path_in(sub)
    assert str(root) in fresh and standby.count(str(root)) == 2  # [0] and the empty entry; the .pth's hidden
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    assert _rebased(standby, str(root), str(sub), sitedirs=[str(sitedir)]) == fresh
    assert _rebased(fresh, str(sub), str(root), sitedirs=[str(sitedir)]) == standby  # and back


@pytest.mark.parametrize("cores", ["few", "many"])
def test_a_starting_standby_gives_way_to_a_notebooks_running_cell(server_factory, tmp_path, cores):
    """No standby's start slows a running cell: a standby that is starting is stopped while a
    notebook's cell runs, for as long as it runs on a machine with few cores, and for the first
    `standby_yield_s` s elsewhere, where it then goes on at the lowest priority (a cell that trains
    for hours does not keep the pool empty)."""
    site = tmp_path / "lib" / "site-packages"
    (site / "gpuctx_slow_thirty").mkdir(parents=True)
    (site / "gpuctx_slow_thirty" / "__init__.py").write_text("import time\ntime.sleep(30)\n")  # keeps it starting
    env = {**AUTO, "PYTHONPATH": os.pathsep.join(p for p in [str(site), os.environ.get("PYTHONPATH")] if p)}
    notebook(tmp_path / "train.ipynb", "import torch\nimport gpuctx_slow_thirty")
    notebook(tmp_path / "plain.ipynb", "print('no GPU framework')")
    pause = (["--GpuctxServer.standby_pause_cores=4096"] if cores == "few" else
             ["--GpuctxServer.standby_pause_cores=0", "--GpuctxServer.standby_yield_s=2"])
    srv = server_factory(*pause, env=env)

    def standby():
        return next((s for s in (pool_of(srv) or {}).get("standbys", []) if s["kind"] == "imports"), None)

    pid = wait_for(lambda: (standby() or {}).get("state") == "booting" and standby()["pid"])
    ks = srv.channels(srv.start_kernel(path="plain.ipynb"))  # no GPU framework: a fresh kernel, not the standby
    try:
        wait_for(lambda: (standby() or {}).get("state") == "booting")  # going on while no cell runs
        cell = threading.Thread(target=ks.execute, args=("import time; time.sleep(10)",), kwargs={"timeout": 60})
        t0 = time.monotonic()
        cell.start()
        seen = []  # (s into the cell, the standby's state, its process stopped) while the cell runs
        while cell.is_alive():
            seen.append((time.monotonic() - t0, (standby() or {}).get("state"),
                         psutil.Process(pid).status() == psutil.STATUS_STOPPED))
        cell.join()
    finally:
        ks.close()
    during = [(state, stopped) for t, state, stopped in seen if t < 9]  # surely within the 10 s cell (a loaded
    # machine answers the pool's status late: the 2 s of giving way may end some seconds into the cell)
    assert ("paused", True) in during, seen  # stopped once the cell ran
    after_pause = during[during.index(("paused", True)):]
    if cores == "few":
        assert set(after_pause) == {("paused", True)}, seen  # as long as the cell runs
    else:
        assert ("booting", False) in after_pause, seen  # going on after 2 s of the cell, at the lowest priority
    # once the cell has ended it goes on (and may be done: its slow import sleeps 30 s from its start)
    wait_for(lambda: standby()["state"] in ("booting", "ready") and psutil.Process(pid).status() != psutil.STATUS_STOPPED)


def test_torch_creating_a_cuda_context_on_import_is_dropped_from_what_standbys_import():
    """torch is imported by every standby without being learnt; where its import creates a CUDA
    context (a site hook that starts CUDA), the log said it was dropped but every later standby
    imported it again and failed the same way. Now it, and the base modules under it, are left
    out until the drop lapses, and the profile says why."""
    profile = learnt_profile("pandas", "torch.nn.functional", "torchvision")
    assert profile.modules()[:3] == ["torch", "torch._dynamo", "torch.optim"]
    profile.outcome("torch", "done", 3.0, "context")
    assert set(profile.modules()) == {"pandas", "torchvision"}  # (torchvision is dropped when its own import shows it)
    assert "CUDA context" in profile.as_dict()["dropped"]["torch"]


def test_only_a_standby_no_notebook_has_taken_settles_its_objects(monkeypatch):
    """settle.py freezes what a standby's imports left, once: never in a kernel a notebook has
    taken (the hand-over removed GPUCTX_STANDBY), never while the hand-over is under way."""
    import gc

    from gpuctx_jupyter.contract import STANDBY
    from gpuctx_jupyter.kernel.warm import settle

    settle._over.clear()  # (a hand-over tested earlier in this process marked it taken)
    gc.freeze()  # a process that froze objects of its own before (the GPU machine's kernels: 375)
    base = gc.get_freeze_count()
    made = [[i] for i in range(20_000)]  # what the standby's imports made since
    try:
        monkeypatch.delenv(STANDBY, raising=False)
        assert settle.settle() is None and gc.get_freeze_count() == base  # a notebook's kernel
        monkeypatch.setenv(STANDBY, "1")
        outcome = []
        with settle.LOCK:  # a hand-over under way: settle waits for its end, then finds it taken
            waiting = threading.Thread(target=lambda: outcome.append(settle.settle()))
            waiting.start()
            waiting.join(0.5)
            assert waiting.is_alive() and gc.get_freeze_count() == base
            monkeypatch.delenv(STANDBY)
        waiting.join(60)
        assert outcome == [None] and gc.get_freeze_count() == base
        monkeypatch.setenv(STANDBY, "1")
        with settle.LOCK:  # a hand-over that kept the variable (a server started with it set): it still counts
            settle.handed_over()
        assert settle.settle() is None and gc.get_freeze_count() == base
        settle._over.clear()  # a standby no notebook has taken: everything alive is frozen
        frozen = settle.settle()  # (a frozen object still goes when its last reference does)
        assert frozen >= base + len(made) and 0 <= frozen - gc.get_freeze_count() < 1000
        assert settle.settle() is None  # once
    finally:
        gc.unfreeze()
        settle._over.clear()
