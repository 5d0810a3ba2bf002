"""The processes behind `%gpu workers` (kernel/workers.py): a profile's launchers started with
gpuctx's entry, ipyparallel's results waited for with one-line errors, and the processes'
liveness (which one ended, and how) and end — apart from the workers' state and reports, which
workers.py keeps."""
from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import tempfile
import threading
import time

from IPython.core.error import UsageError

from . import worker_side
from .commands import one_line
from .worker_placement import COUNT, check_count

ENTRY = "gpuctx_jupyter.kernel.worker_entry"
STARTS_WAIT_S = 5.0  # a launcher's start (spawning a process, submitting a job) returns within it
NOTICE_S = 1.0  # ipyparallel notices a process's end on its event loop: at once, or nearly
# one of ipyparallel's log records: "2026-12-05 18:45:32.123 [IPEngine] CRITICAL | <its message>"
RECORD = re.compile(r"\d{4}-\d\d-\d\d[ T][\d:.,]+ \[[^\]]*\](?:\s*[A-Z]+ \|)?\s*(?P<message>.*)")


def profile_count(which, cluster, probe, profile: str, cpu: bool) -> int:
    which = (which or "all").strip()
    if COUNT.fullmatch(which):
        n = int(which)
        check_count(n)
        return n
    if which.lower() != "all":
        raise UsageError(f"with --profile give a count or all, not {which!r}")
    per_host = getattr(probe, "engines", None)  # the SSH launcher's {host: count or {"n": count}}
    n = cluster.n or getattr(probe, "engine_count", None) or (sum(
        v.get("n", 1) if isinstance(v, dict) else int(v) for v in per_host.values()) if per_host else 0)
    if not n:
        raise UsageError(f"profile {profile!r} sets no number of engines (c.Cluster.n, or the SSH launcher's "
                         f"engines): give one, "
                         f"`%gpu workers start 4 --profile {profile}`")
    return int(n)


def launch_profile(workers, ipp, which, profile: str, cpu: bool, warm: bool) -> int:
    """Engines started by profile `profile`'s launchers, wherever they put them; each picks its
    GPU on its host (worker_side.place). How many."""
    from IPython.core.profiledir import ProfileDir, ProfileDirError
    from IPython.paths import get_ipython_dir
    from ipyparallel.cluster.launcher import LocalControllerLauncher, LocalProcessLauncher, SSHLauncher

    if which and "," in which:
        raise UsageError(f"with --profile the profile's launchers place the workers: give a count or all, not "
                         f"GPUs ({which!r})")
    try:
        folder = (os.path.abspath(os.path.expanduser(profile)) if os.sep in profile
                  else ProfileDir.find_profile_dir_by_name(get_ipython_dir(), profile).location)
    except ProfileDirError:
        folder = ""
    if not folder or not os.path.isdir(folder):
        raise UsageError(f"there is no ipyparallel profile {profile!r}: create one with `ipython profile create "
                         f"--parallel --profile={profile}` and set its launchers (docs/workers.md)")
    cluster = workers._new_cluster(ipp, profile_dir=folder)
    workers.profile = profile
    probe = cluster.engine_launcher_class(parent=cluster, log=cluster.log, profile_dir=cluster.profile_dir,
                                          cluster_id=cluster.cluster_id)
    n = profile_count(which, cluster, probe, profile, cpu)
    engine_cmd = wrapped_command(list(probe.engine_cmd), "ipyparallel.engine", "engine", profile)
    # The kernel's own place on its host (it may run in a Slurm job step, or under mpiexec) is not
    # an engine's: inherited, every engine would take the same slot, and two ranks one GPU. A
    # launcher that places its engines (srun, mpiexec) sets these again for each.
    kernels_place = {var: "" for var in worker_side.LOCAL_RANK_VARS if var in os.environ}
    env = dict(kernels_place, **probe.environment, **workers._ours(), **{
        worker_side.ENV_PLACE: "cpu" if cpu else "gpu", worker_side.ENV_WARM: "1" if warm else "0"})
    kwargs = {}
    if issubclass(cluster.controller_launcher_class, LocalControllerLauncher):  # the kernel's own process
        ctl = cluster.controller_launcher_class(parent=cluster, log=cluster.log, profile_dir=cluster.profile_dir,
                                                cluster_id=cluster.cluster_id)
        kwargs["environment"] = dict(ctl.environment, **workers._ours())
        kwargs["controller_cmd"] = wrapped_command(list(ctl.controller_cmd), "ipyparallel.controller", "controller",
                                                   profile)
    cluster.start_controller_sync(**kwargs)
    if isinstance(cluster.controller, LocalControllerLauncher):
        workers._remember(cluster.controller)
    engine_set = cluster.engines[cluster.start_engines_sync(n, engine_cmd=engine_cmd, environment=env)]
    for launcher in [engine_set, *getattr(engine_set, "launchers", {}).values()]:
        if isinstance(launcher, LocalProcessLauncher) and not isinstance(launcher, SSHLauncher):
            workers._remember(launcher)  # a process here (an engine, mpiexec); not a remote PID
    return n


def wrapped_command(cmd: list[str], module: str, role: str, profile: str) -> list[str]:
    """The profile's command for ipyparallel's `module`, running gpuctx's entry instead (which
    then runs that module's main)."""
    if module not in cmd:
        raise UsageError(one_line(f"profile {profile!r} starts the {role} with {' '.join(cmd)!r}, not "
                                  f"`python -m {module}`: gpuctx cannot watch and place its workers that way"))
    i = cmd.index(module)
    return [*cmd[:i], ENTRY, role, *cmd[i + 1:]]


def wait_results(ars: list, deadline: float, workers, doing: str) -> list:
    """The results of ipyparallel AsyncResults, waiting until `deadline`; a worker that dies, an
    error, or the deadline is a one-line UsageError."""
    pending = list(ars)
    while pending:
        done, _ = concurrent.futures.wait(pending, timeout=0.2)
        for ar in done:
            pending.remove(ar)
            exc = ar.exception()
            if exc is not None:
                raise UsageError(one_line(f"a worker failed to {doing}: {error_text(exc)}")) from None
        failed = failure(workers.cluster, workers._processes)
        if failed:
            raise UsageError(one_line(failed))
        if pending and time.monotonic() > deadline:
            raise UsageError(f"the workers did not {doing} within {workers.start_timeout:g} s "
                             "(c.GpuWorkers.start_timeout)")
    return [ar.get() for ar in ars]


def error_text(exc) -> str:
    """An ipyparallel error in one line: `EngineError: Engine 1 died … (engine 1)`. A result of
    several engines fails with a CompositeError, whose own name and value are None: its first
    engine's error is said."""
    elist = getattr(exc, "elist", None)
    if elist:
        ename, evalue, _tb, info = elist[0]
    else:
        ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
        info = getattr(exc, "engine_info", None)
    engine = (info or {}).get("engine_id")
    return f"{ename or type(exc).__name__}: {evalue or exc}" + (f" (engine {engine})" if engine is not None else "")


def exit_words(engine_set, wait: float = 1.0) -> str:
    """How the process of ipyparallel's `engine_set` ended, as ", killed by SIGKILL" (or "" when
    unknown), waiting up to `wait` s for ipyparallel to notice the end."""
    deadline = time.monotonic() + wait
    code = None
    while engine_set is not None:
        code = (engine_set.stop_data or {}).get("exit_code")
        if code is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    how = code_words(code)
    return f", {how}" if how else ""


def code_words(code) -> str:
    """An exit code as "killed by SIGKILL" or "exit status 1" ("" when unknown)."""
    if not isinstance(code, int):
        return ""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def failure(cluster, processes=(), controller_only: bool = False) -> str:
    """Which process of `cluster` ipyparallel started has ended — the controller or a worker —
    with how it ended and its last line ("the ipyparallel controller exited (killed by SIGKILL)"),
    or "" while they all run. `processes` (the local ones, psutil) are read directly as well:
    ipyparallel's own notice comes later, from its event loop."""
    if cluster is None:
        return ""
    gone = {p.pid for p in processes if not runs(p)}
    deadline = time.monotonic() + NOTICE_S
    while True:
        ended = _ended(cluster, gone, controller_only)
        if ended is None:
            return ""
        name, launcher, data = ended
        if data is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # its end not noticed yet: how it ended comes with the notice
    how = code_words((data or {}).get("exit_code"))
    out = last_line(launcher.get_output()) if launcher is not None else ""
    return f"{name} exited" + (f" ({how})" if how else "") + (f": {out}" if out else "")


def _ended(cluster, gone: set[int], controller_only: bool):
    """(what, its launcher, its stop data or None while not noticed) of the first process of
    `cluster` that has ended (ipyparallel noticed it, or its PID is in `gone`), or None."""
    ctl = cluster.controller
    if ctl is not None and (ctl.state == "after" or getattr(ctl, "pid", None) in gone):
        return "the ipyparallel controller", ctl, ctl.stop_data if ctl.state == "after" else None
    if controller_only:
        return None
    for set_id, engine_set in cluster.engines.items():
        name = f"worker {set_id.removeprefix('rank')}" if set_id.startswith("rank") else "a worker"
        stopped = list(((engine_set.stop_data or {}).get("engines") or {}).values())
        if engine_set.state == "after" or stopped:
            return name, engine_set, (stopped[0] if stopped else engine_set.stop_data)
        launchers = [engine_set, *getattr(engine_set, "launchers", {}).values()]
        if any(getattr(x, "pid", None) in gone for x in launchers):
            return name, engine_set, None
    return None


def stop_cluster(cluster, wait: float = 30.0) -> None:
    """Stop `cluster` through ipyparallel (in a thread of its own, at most `wait` s), once a start
    still under way has returned; then wait a little for it to notice the ends: it reads each
    process's log then. Never raises."""
    _starts_returned(cluster)
    done = threading.Event()

    def stop():
        try:
            cluster.stop_cluster_sync()
        except Exception as exc:  # noqa: BLE001 — the processes are ended by the caller in any case
            cluster.log.warning("gpuctx: stopping the workers' cluster: %s: %s", type(exc).__name__, exc)
        finally:
            done.set()

    threading.Thread(target=stop, name="gpuctx-workers-stop", daemon=True).start()
    done.wait(wait)
    launchers = [cluster.controller, *cluster.engines.values()]
    deadline = time.monotonic() + 5
    while any(x is not None and x.state == "running" for x in launchers) and time.monotonic() < deadline:
        time.sleep(0.05)
    # The thread and loop ipyparallel starts for `_sync` calls made from a running loop (a cell's,
    # the prepare's) live on after the cluster, holding it and its launchers' output: one more per
    # start for the kernel's life. Its launchers have noticed the ends by now.
    thread, loop = getattr(cluster, "_async_thread", None), getattr(cluster, "_thread_loop", None)
    if thread is not None and loop is not None:
        loop.add_callback(loop.stop)
        thread.join(2.0)


def _starts_returned(cluster, wait: float = STARTS_WAIT_S) -> None:
    """Wait (at most `wait` s) for a start under way on ipyparallel's thread to return. A cell's
    `_sync` calls run there, and a launcher knows its process only once its start returns: an
    interrupt of the line just before lets the stop (in another thread) miss a process that then
    runs for the kernel's life. One held longer is ended as it returns (worker_launchers.abandon)."""
    thread, loop = getattr(cluster, "_async_thread", None), getattr(cluster, "_thread_loop", None)
    if thread is None or loop is None or not thread.is_alive() or thread is threading.current_thread():
        return
    passed = threading.Event()
    try:
        loop.add_callback(passed.set)  # runs once the callback on the loop now has returned
    except RuntimeError:  # its loop is closed
        return
    passed.wait(wait)


def last_line(text: str) -> str:
    """What a process said last: its last line, or, where that is a log record, the record's
    message. An indented last line continues a record's block of advice (ipyparallel's after
    "Registration timed out": "... or tunnel connections via ssh."): then the last record whose
    message is on its own line says what happened."""
    lines = [line.rstrip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    chosen = lines[-1]
    if chosen[:1].isspace():
        said = [line for line in lines if (m := RECORD.fullmatch(line)) and m["message"].strip()]
        chosen = said[-1] if said else chosen
    record = RECORD.fullmatch(chosen)
    return (record["message"] if record else chosen).strip()[-300:]


def pid_runs(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def runs(proc) -> bool:
    """Whether the process `proc` (psutil, with its start time) still runs (a zombie does not)."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_processes(processes) -> None:
    """SIGKILL what of `processes` (psutil.Process, with their start time) still runs, and below."""
    import psutil

    for proc in processes:
        try:
            if not proc.is_running():
                continue
            tree = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
    psutil.wait_procs([p for p in processes if alive(p)], timeout=5)


def alive(proc) -> bool:
    try:
        return proc.is_running()
    except Exception:  # noqa: BLE001
        return False


def slot_locks(cluster_id: str) -> list[str]:
    import glob

    return glob.glob(os.path.join(tempfile.gettempdir(), f"gpuctx-worker-{glob.escape(cluster_id)}-*.lock"))
