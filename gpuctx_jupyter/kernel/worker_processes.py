"""The processes behind `%gpu workers` (kernel/workers.py): a profile's launch commands wrapped
in gpuctx's entry, ipyparallel's results waited for with one-line errors, and the processes'
liveness and end — apart from the workers' state and reports, which workers.py keeps."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import tempfile
import time

from IPython.core.error import UsageError

from .commands import one_line
from .worker_placement import COUNT, check_count

ENTRY = "gpuctx_jupyter.kernel.worker_entry"


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
        if workers.cluster is not None:
            failed = workers._launcher_failure()
            if failed:
                raise UsageError(one_line(failed))
        if pending and time.monotonic() > deadline:
            raise UsageError(f"the workers did not {doing} within {workers.start_timeout:g} s "
                             "(c.GpuWorkers.start_timeout)")
    return [ar.get() for ar in ars]


def error_text(exc) -> str:
    ename, evalue = getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", str(exc))
    engine = (getattr(exc, "engine_info", None) or {}).get("engine_id")
    return f"{ename}: {evalue}" + (f" (engine {engine})" if engine is not None else "")


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
    if not isinstance(code, int):
        return ""
    if code < 0:
        try:
            return f", killed by {signal.Signals(-code).name}"
        except ValueError:
            return f", killed by signal {-code}"
    return f", exit status {code}"


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


def pid_runs(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
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
