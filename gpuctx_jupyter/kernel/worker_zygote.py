"""The workers' imports, done before the notebook asks: a process that has imported what an
engine of `%gpu workers` imports (torch, torch._dynamo, torch.distributed, ipyparallel's engine,
the server's import profile), with no CUDA, and forks a worker on request. A forked worker starts
with those imports done: registration, CUDA and the process group are what is left of its start.

An imports standby of the server's warm pool starts it (the pool asks, `ENV_WANTED`), so that a
notebook opened and run at once finds its workers' imports done as it finds its own. It is a
child of the kernel (its workers count as the notebook's, as any worker does) in a session of
its own (an interrupt of the kernel does not reach it), and ends with the kernel. The hand-over
keeps it for a notebook that starts workers and ends it for any other (its memory goes back).

Forking is safe here because this process never starts CUDA and forks from its one thread (the
imports ran in a thread that has ended; what numpy's BLAS started handles fork itself), as a
DataLoader's fork workers do. The kernel's side is `Zygote`; ipyparallel's launcher that forks
instead of spawning is in kernel/worker_launchers.py.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..contract import WARM_IMPORT_BUDGET, WORKER_IMPORTS
from .warm.stood_still import STOOD

ENV_WANTED = WORKER_IMPORTS  # "1" in an imports standby: start the workers' imports too
ENV_SECONDS = "GPUCTX_WORKER_IMPORT_SECONDS"  # how long the profile's imports may take (after BASE) before it gives up
ENV_IMPORTS = "GPUCTX_WORKER_IMPORT_LIST"  # comma-separated: what this process imports besides BASE
BASE = ("numpy", "torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel", "torch.optim",
        "ipyparallel.engine.app", "ipyparallel.controller.app", "psutil", "gpuctx_jupyter.kernel.worker_side", "gpuctx_jupyter.kernel.warm.plan",
        "gpuctx_jupyter.kernel.warm.scheduler", "gpuctx_jupyter.core.inventory")
# Read when CUDA starts, not at import: a worker forked from here still takes them. OMP_NUM_THREADS
# sizes torch's thread pool, which the forked worker sets again (torch.set_num_threads).
TAKEN_LATER = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS")
ENTRY_MODULE = "gpuctx_jupyter.kernel.worker_entry"  # what is forked runs `ENTRY_MODULE engine|controller ARGS`
RSS = 2**30  # about, with a CUDA build of torch
BASE_SECONDS = 60.0  # for BASE; the profile then has the standby's import budget (GPUCTX_WARM_IMPORT_BUDGET)
MEMORY_SHARE = 0.2  # started only where RSS fits in this share of the host memory available
# A request wakes the loop at once; these bound how late it sees a worker end (its exit status
# written for its launcher) and the kernel end. Idle, it wakes once a second: a standby's workers'
# imports cost no CPU while they wait (10 wake-ups a second had cost 0.5% of a core).
REAP_EVERY_S = 0.1  # while forked workers run
IDLE_EVERY_S = 1.0  # while none does


class ForkError(RuntimeError):
    """The process could not fork a worker: the caller starts it the usual way."""


# -- the process ---------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    """`python -m gpuctx_jupyter.kernel.worker_entry imports SOCKET`: listen on SOCKET at once (a request
    waits while the imports run), import at the lowest CPU priority, then fork on request until
    the kernel that started this process is gone."""
    from . import worker_side

    t0 = time.perf_counter()
    path = argv[0]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    token = os.environ.get(worker_side.ENV_PARENT, "")
    profile = [m for m in os.environ.get(ENV_IMPORTS, "").split(",") if m]
    budget = _seconds(os.environ.get(ENV_SECONDS), _seconds(os.environ.get(WARM_IMPORT_BUDGET), 60.0))
    done, failed = _import_all([(list(BASE), BASE_SECONDS), (profile, budget)])
    if done is None:  # a thread still importing: forking now could copy a held lock
        print(f"gpuctx worker imports: the imports did not finish within {failed[1]} "
              f"(still importing {failed[0]}): ending; workers start the usual way", flush=True)
        os._exit(3)
    print(f"gpuctx worker imports: {len(done)} modules imported in {time.perf_counter() - t0:.1f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    from ..core import cuda_driver

    touched = cuda_driver.touched()
    if touched:  # a fork would inherit it: refuse every request, say why
        print(f"gpuctx worker imports: an import started CUDA ({touched}): no worker is forked", flush=True)
    parent = _parent(token)
    children: dict[int, str] = {}  # pid → the file its exit status goes to
    while parent is None or worker_side.alive(*parent):
        ready, _, _ = select.select([listener], [], [], REAP_EVERY_S if children else IDLE_EVERY_S)
        _reap(children)
        if not ready:
            continue
        conn, _ = listener.accept()
        with conn:
            try:
                request = _read_request(conn)
                if touched:
                    raise ForkError(f"the workers' imports started CUDA ({touched})")
                pid = os.fork()
                if pid == 0:
                    _become_worker(listener, conn, request)  # never returns
                children[pid] = request["output"] + ".exit"
                reply = {"pid": pid}
            except Exception as exc:  # noqa: BLE001 — the kernel starts that worker itself then
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass
    print("gpuctx worker imports: the kernel is gone: ending", flush=True)


def _seconds(text, default: float) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return default


def _import_all(stages: list[tuple[list[str], float]]) -> tuple[list[str] | None, list[str]]:
    """Import each stage's modules in a thread at nice 19 (the user's cells come first), each
    stage within its own seconds: a slow machine's torch does not eat the notebook's budget. The
    main thread keeps its priority, and so do the workers forked from it. (None, [the module,
    "N s"]) when a stage did not end in time."""
    done: list[str] = []
    failed: list[str] = []
    now = [""]
    ended = [threading.Event() for _ in stages]

    def run():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        seen: set[str] = set()
        for (modules, _), end in zip(stages, ended):
            for name in modules:
                if name in seen:
                    continue
                seen.add(name)
                now[0] = name
                try:
                    __import__(name)
                    done.append(name)
                except BaseException as exc:  # noqa: BLE001 — a worker imports it itself, and says so
                    failed.append(f"{name} ({type(exc).__name__})")
            end.set()

    importing = threading.Thread(target=run, name="gpuctx-worker-imports", daemon=True)
    importing.start()
    for (_, seconds), end in zip(stages, ended):
        if not _within(end, seconds):
            return None, [now[0], f"{seconds:.0f} s"]
    importing.join(5.0)  # ended: a fork copies no thread of ours in the middle of anything
    return done, failed


def _within(end: threading.Event, seconds: float) -> bool:
    """`end.wait(seconds)`, leaving out time the process stood still: paused with its standby for
    another notebook's cell (server/giving_way.py), its imports did not run (warm/stood_still.py)."""
    base, deadline = STOOD.seconds, time.monotonic() + seconds
    while not STOOD.wait(end, 0.1):
        if time.monotonic() >= deadline + STOOD.seconds - base:
            return False
    return True


def _parent(token: str) -> tuple[int, float] | None:
    try:
        pid, created, _ = token.split(":", 2)
        return int(pid), float(created)
    except ValueError:
        return None


def _read_request(conn: socket.socket) -> dict:
    conn.settimeout(10)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ForkError("the request ended early")
        data += chunk
    request = json.loads(data)
    argv = request["argv"]
    if ENTRY_MODULE not in argv or argv[argv.index(ENTRY_MODULE) + 1:][:1] not in (["engine"], ["controller"]):
        raise ForkError(f"only the workers' engines and controller are forked, not {' '.join(argv)!r}")
    return request


def _reap(children: dict[int, str]) -> None:
    """Collect the workers that ended and write each one's exit status where its launcher reads it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = children.pop(pid, None)
        if path:
            try:
                with open(path, "w") as fh:
                    fh.write(str(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass


def _become_worker(listener: socket.socket, conn: socket.socket, request: dict) -> None:
    """In the forked child: the worker's own session, output, directory and environment, then
    the engine, as `python -m worker_entry engine ARGS` would run it; exits with its status."""
    code = 1
    try:
        listener.close()
        conn.close()
        os.setsid()
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        old = os.getcwd()
        os.chdir(request["cwd"])
        sys.path[:] = [request["cwd"] if entry in (old, "") else entry for entry in sys.path]
        os.environ.clear()
        os.environ.update(request["env"])
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            import torch

            torch.set_num_threads(int(threads))
        from . import worker_side

        argv = request["argv"]
        worker_side.main(argv[argv.index(ENTRY_MODULE) + 1:])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 — said in the worker's output, which the kernel reads
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# -- the kernel's side ---------------------------------------------------------------------------------
class Zygote:
    """The process of this kernel that has done the workers' imports (one per kernel)."""

    def __init__(self, imports=()):
        from . import worker_side

        self.folder = tempfile.mkdtemp(prefix="gpuctx-worker-imports-")
        self.socket = os.path.join(self.folder, "fork.sock")
        self.log = os.path.join(self.folder, "imports.log")
        self.environ = dict(os.environ)  # what its imports saw
        self.started = time.time()
        self.forked = 0
        self.timeout = 300.0  # seconds a fork request waits for the imports (c.GpuWorkers.start_timeout)
        env = dict(self.environ, **{worker_side.ENV_PARENT: worker_side.parent_token(),
                                    ENV_IMPORTS: ",".join(imports)})
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", ENTRY_MODULE, "imports", self.socket], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def imported(self) -> bool:
        """Whether its imports are done (it said so in its log)."""
        try:
            with open(self.log) as fh:
                return "modules imported in" in fh.read()
        except OSError:
            return False

    def unsuited(self, environ=None) -> str:
        """Why workers started with the kernel's environment `environ` must not be forked from it
        (a variable read at import time changed since it imported), or ""."""
        if not self.alive():
            return f"the process that did the workers' imports has ended ({self.last_words() or 'no word from it'})"
        from .worker_prepare import read_at_import

        environ = os.environ if environ is None else environ
        changed = sorted(k for k in set(environ) | set(self.environ)
                         if read_at_import(k) and k not in TAKEN_LATER
                         and environ.get(k) != self.environ.get(k))
        if changed:
            return (f"the kernel's {', '.join(changed[:4])}{' …' if len(changed) > 4 else ''} changed after the "
                    "workers' imports were done")
        return ""

    def fork(self, argv: list[str], env: dict, cwd: str, output: str, timeout: float) -> int:
        """A worker running `argv` (gpuctx's engine entry) in `cwd` with `env`, its output in
        `output`; its pid. Waits while the imports are still running (up to `timeout` s)."""
        request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd, "output": output}).encode() + b"\n"
        deadline = time.monotonic() + timeout
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                conn.connect(self.socket)
                conn.sendall(request)
                data = b""
                while not data.endswith(b"\n"):
                    if not self.alive():
                        break
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
        except OSError as exc:
            data, failure = b"", f"{type(exc).__name__}: {exc}"
        else:
            failure = "no reply"
        if not data:
            try:
                self.proc.wait(2)  # it is ending: its last words say why
            except subprocess.TimeoutExpired:
                raise ForkError(failure) from None
            raise ForkError(f"its process ended: {self.last_words() or failure}")
        reply = json.loads(data)
        if "error" in reply:
            raise ForkError(reply["error"])
        self.forked += 1
        return int(reply["pid"])

    def exit_status(self, output: str) -> int | None:
        try:
            with open(output + ".exit") as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None

    def last_words(self) -> str:
        try:
            with open(self.log) as fh:
                lines = [line.strip() for line in fh if line.strip()]
        except OSError:
            return ""
        return lines[-1][-300:] if lines else ""

    def line(self) -> str:
        """What `%gpu workers` says of it."""
        state = "imports done" if self.imported() else "importing"
        rss = _rss(self.pid)
        return (f"the workers' imports: {state} in process {self.pid} ({rss / 2**30:.1f} GiB resident)"
                f"{f', {self.forked} workers forked from it' if self.forked else ''}: "
                "`%gpu workers start` forks its workers from it")

    def stop(self) -> None:
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.folder, ignore_errors=True)


def _rss(pid: int) -> int:
    from ..core import host_memory

    return host_memory.rss(pid) or 0


_current: Zygote | None = None
_lock = threading.Lock()


def current() -> Zygote | None:
    """This kernel's workers' imports, while their process runs."""
    z = _current
    return z if z is not None and z.alive() else None


def start_for_standby(imports=()) -> str:
    """In an imports standby the pool asked for them (ENV_WANTED): start the workers' imports,
    where ipyparallel and torch are installed and their memory fits. Why not, or ""."""
    global _current
    from importlib.util import find_spec

    missing = [m for m in ("ipyparallel", "torch") if find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed"
    from ..core import host_memory

    room = host_memory.available()
    if room is not None and RSS > MEMORY_SHARE * room.available:
        return (f"about {RSS / 2**30:.0f} GiB of host memory is more than {MEMORY_SHARE:.0%} of the "
                f"{room.available / 2**30:.1f} GiB available")
    with _lock:
        if _current is None:
            _current = Zygote(imports)
            atexit.register(stop)
    return ""


def stop(why: str = "") -> None:
    global _current
    with _lock:
        z, _current = _current, None
    if z is not None:
        z.stop()


def after_adoption(path: str | None) -> None:
    """The standby became the kernel of notebook `path`: keep the workers' imports when it starts
    workers (`%gpu workers start`), else end them (in the background: the hand-over goes on).
    What the hand-over changed in the environment was the pool's to judge, as for the kernel's
    own imports: only what the notebook changes from now on makes them unsuited."""
    if _current is None:
        return
    _current.environ = dict(os.environ)

    def decide():
        from ..contract import notebook as nbread

        facts = nbread.read(path) if path else None
        if facts is None or not any(ev.kind == "workers" for ev in facts.events):
            stop()

    threading.Thread(target=decide, name="gpuctx-worker-imports-keep", daemon=True).start()
