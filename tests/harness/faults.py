"""What a fault may leave behind, and how tests look for it: kernel processes and connection files
that neither the server nor its warm pool tracks, tracebacks and warnings from gpuctx in the
server's log; plus the moves fault tests make (many requests at one moment, a broken kernelspec,
a cell that holds the interpreter, a request caught in flight)."""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import psutil

from .waiting import wait_for

BUSY = "an action on this kernel is in progress"


def hold_the_interpreter(ks, marker) -> None:
    """Send a cell that holds the GIL in C for hours (a regular expression backtracking): the kernel's
    control thread cannot answer meanwhile. Returns once the cell has begun: it writes `marker`
    (a path) right before it (IOPub would not get out: its thread needs the GIL too)."""
    code = f"import re, pathlib; pathlib.Path({str(marker)!r}).touch(); re.match(r'(a+)+$', 'a' * 64 + 'b')"
    ks.send("execute_request", {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                                "allow_stdin": False})
    wait_for(lambda: os.path.exists(marker), timeout=60)


def kernel_processes(srv) -> dict[int, str]:
    return srv.kernel_processes()


def connection_files(srv) -> set[str]:
    return set(glob.glob(os.path.join(srv.runtime, "kernel-*.json")))


def pool_of(srv) -> dict | None:
    return srv.api("GET", "/gpuctx/api/devices")[1].get("pool")


def listening_ports(pid: int) -> set[int]:
    try:
        return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        return set()


def files_by_port(files) -> dict[int, str]:
    """Shell port -> connection file (a file being written is skipped this time round)."""
    out = {}
    for f in files:
        try:
            with open(f) as fh:
                out[json.load(fh)["shell_port"]] = f
        except (OSError, ValueError, KeyError):
            continue
    return out


def leftovers(srv) -> list[str]:
    """What no one tracks: kernel processes beyond the listed kernels and the pool's standbys,
    processes without a connection file, connection files without a process. A process is matched
    to its file by the ports it listens on (a standby handed to a notebook keeps its process, and
    the server's file for that kernel names the process's ports)."""
    procs, files = kernel_processes(srv), connection_files(srv)
    kernels = srv.api("GET", "/api/kernels")[1]
    pool = pool_of(srv)
    standbys = len(pool["standbys"]) if pool else 0
    starting = sum(s["starting"] for s in pool["kernelspecs"].values()) if pool else 0
    by_port = files_by_port(files)
    owned: dict[int, str] = {}
    for pid in procs:
        match = [by_port[p] for p in listening_ports(pid) if p in by_port]
        if match:
            owned[pid] = match[0]
    problems = [f"process {pid} has no connection file (started with {cf})" for pid, cf in procs.items()
                if pid not in owned]
    problems += [f"connection file {f} without a process" for f in sorted(files - set(owned.values()))]
    if len(procs) != len(kernels) + standbys or starting:
        problems.append(f"{len(procs)} kernel processes for {len(kernels)} kernels, {standbys} standbys "
                        f"and {starting} starting")
    return problems


def settled(srv, timeout: float = 60) -> None:
    """Wait until nothing is left that no one tracks (stopping a replaced kernel takes a moment)."""
    last = []

    def clean():
        last[:] = leftovers(srv)
        return not last

    try:
        wait_for(clean, timeout=timeout, every=0.2)
    except AssertionError:
        raise AssertionError(f"left behind: {last}") from None


def gpuctx_tracebacks(srv) -> list[str]:
    return [line for line in srv.log().splitlines() if re.search(r'File ".*gpuctx_jupyter', line)]


def gpuctx_warnings(srv) -> list[str]:
    """gpuctx's lines at WARNING and above. jupyter_server's access log of a 4xx answer is not one:
    it logs every 4xx at WARNING, also a 404 gpuctx's API answers for a kernel that is gone."""
    return [line for line in srv.log().splitlines() if line.startswith(("[W", "[E", "[C")) and "gpuctx" in line
            and not ACCESS_4XX.search(line)]


ACCESS_4XX = re.compile(r"\] 4\d\d (GET|POST|PUT|PATCH|DELETE) /")


def assert_clean(srv, timeout: float = 60) -> None:
    assert srv.api("GET", "/api/status")[0] == 200
    assert srv.api("GET", "/gpuctx/api/devices")[0] == 200
    settled(srv, timeout)
    assert not gpuctx_tracebacks(srv), gpuctx_tracebacks(srv)


def ready_standbys(srv, n: int = 1):
    return wait_for(lambda: (lambda p: p if p and len(p["standbys"]) >= n and not any(
        s["starting"] for s in p["kernelspecs"].values()) else None)(pool_of(srv)), timeout=90)


def concurrently(calls, workers: int = 20) -> list:
    """Run the callables at the same moment (released together), in threads; their results."""
    gate = threading.Barrier(len(calls))

    def go(call):
        gate.wait()
        return call()

    with ThreadPoolExecutor(max(workers, len(calls))) as ex:
        return list(ex.map(go, calls))


def restart_storm(srv, kid: str, n: int = 12) -> list[tuple[str, int, dict]]:
    """`n` restarts of one kernel at once, half through jupyter_server's route, half gpuctx's."""
    routes = [f"/api/kernels/{kid}/restart", f"/gpuctx/api/kernels/{kid}/restart"]
    calls = [lambda r=routes[i % 2]: (r, *srv.api("POST", r)) for i in range(n)]
    return concurrently(calls)


def check_storm(results) -> None:
    for route, code, body in results:
        if route.startswith("/gpuctx"):
            assert code in (200, 409), (code, body)
            if code == 409:
                assert body["message"].startswith(BUSY), body
        else:
            assert code == 200, (code, body)  # jupyter_server's route joins the restart in flight


def control_port(srv, pid: int) -> int:
    """The control port of the kernel process `pid`, from its connection file."""
    with open(srv.kernel_processes()[pid]) as fh:
        return json.load(fh)["control_port"]


def server_connections_to(srv, port: int) -> int:
    """TCP connections the server process holds to a local port (a ZMQ client per request)."""
    return sum(1 for c in psutil.Process(srv.proc.pid).net_connections("tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def stop_and_check(srv, pids) -> None:
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(30)
    wait_for(lambda: not [p for p in pids if psutil.pid_exists(p)
                          and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], timeout=20)
    assert connection_files(srv) == set()
    assert not gpuctx_tracebacks(srv), gpuctx_tracebacks(srv)


def kernelspec(root, name: str, argv: list[str]) -> None:
    folder = root / "kernels" / name
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))
