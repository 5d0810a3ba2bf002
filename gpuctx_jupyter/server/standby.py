"""One standby kernel of the warm pool: what it is, whether it may serve a launch, and the moves of
its life — coming up, reporting what it imported, being paused for a running cell, being handed
over, being stopped.

Two kinds. An *imports* standby has imported the server's import profile and touched no CUDA: it
serves any GPU notebook of its kernelspec, which then warms its own GPU part. A *gpu* standby (the
restart reserve) ran one notebook's warm plan on that notebook's device: GPU-ready for that
notebook's restart, ~600 MiB of GPU memory held meanwhile.

A standby is a process the pool launched through a kernel manager of its own (never the
server's): in no kernel list, out of the culler's reach, with no restarter to revive it half-warm
when it dies. Its state changes only on the event loop: booting → ready → taken, or → stopping.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field

from jupyter_core.utils import ensure_async

from ..contract import ADOPT_REPLY, ADOPT_REQUEST, DEVICE, INDUCTOR_MODULE, REQUEST, SESSION
from ..contract.notebook import Facts
from ..core import host_memory, procs
from . import jupyter_internals as internals
from . import kernel_client

# Read once, when CUDA (or the framework) starts: a standby that has started CUDA with other
# values cannot serve a kernel that should have had these. One that has not started it takes them
# at the hand-over — except what the dynamic loader read when the process started.
CUDA_STARTUP_VARS = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "LD_LIBRARY_PATH",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
)
PROCESS_START_VARS = ("LD_LIBRARY_PATH",)
# Settings a notebook may make before its imports and still adopt an imports standby that has not
# started the CUDA driver: read only when CUDA (or JAX's backend) starts or on each call, never by an
# import (checked against torch's and JAX's sources). Any other setting may have been read already by
# what the standby imported — not only the notebook's own imports but what they import in turn (torch
# imported numpy, whose OpenBLAS read OMP_NUM_THREADS when it loaded), which nobody can list without
# importing them: such a notebook gets a fresh kernel.
READ_WHEN_CUDA_STARTS = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
)
LOADED_BEFORE_ANY_CODE = frozenset({"__future__", "builtins", "os", "sys"})  # importing them again reads nothing
READY_TIMEOUT_S = 60.0  # a standby that does not answer kernel_info by then is given up
WARM_TIMEOUT_S = 180.0  # a standby still warming up by then counts as ready anyway
ASK_MAX_S = 8.0  # the longest a try of a starting standby's kernel_info waits (until_ready)
HAND_OVER_TIMEOUT_S = 10.0
RSS_EVERY_S = 5.0  # a standby's memory is read at most this often (smaps_rollup: ms a process; off the loop)


class StandbyFailed(Exception):
    """A standby kernel could not be started or did not come up."""


@dataclass
class Standby:
    km: object  # the jupyter_client KernelManager that launched it (the pool's own)
    kernel_name: str
    env: dict  # the environment it was launched with (its kernelspec's variables merged in)
    started: float  # time.monotonic()
    kind: str = "gpu"  # gpu | imports
    state: str = "booting"  # booting | ready | taken | stopping
    notebook: str | None = None  # the notebook whose warm plan it ran (gpu kind)
    profile: tuple[str, ...] = ()  # what it was asked to import (imports kind; "module:name" for names)
    imports: list[str] = field(default_factory=list)  # what it has imported, as it reports
    resolved: list[str] = field(default_factory=list)  # the names it has resolved, as "module:name"
    driver: bool = False  # it has started the CUDA driver
    answered: bool = False  # it has answered kernel_info (until_ready): its process is up
    paused: bool = False  # stopped (SIGSTOP) while a cell runs elsewhere
    _paused_at: float = 0.0
    pauses: list[tuple[float, float]] = field(default_factory=list)  # (from, to), time.monotonic(): ended ones
    _rss: tuple[float, str, int | None] | None = None  # (when, state, bytes): the last reading

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def pid(self) -> int | None:
        return kernel_client.kernel_pid(self.km)

    def alive(self) -> bool:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return process is not None and process.poll() is None

    @property
    def ordinal(self) -> int:
        """The GPU it was warmed on, as planned: its settings' device, else CUDA's default."""
        try:
            return int(self.env.get(DEVICE) or 0)
        except ValueError:
            return 0

    def imported(self) -> set[str]:
        """What it has imported (what it was asked to, while it is still importing)."""
        return set(self.imports) or {m for m in self.profile if ":" not in m}

    def rss(self) -> int | None:
        """Its resident memory, with its processes' (the workers' imports, kernel/worker_zygote.py;
        inductor's compile workers, forked from one process: their shared pages count once, PSS),
        as last read: the pool's tick reads it again off the event loop (read_memory) after
        RSS_EVERY_S seconds or once its state has changed; read here only the first time."""
        if not self.pid:
            return None
        if self._rss is None:
            self._rss = (time.monotonic(), self.state, self.memory_now())
        return self._rss[2]

    def memory_stale(self) -> bool:
        return self._rss is None or time.monotonic() - self._rss[0] >= RSS_EVERY_S or self._rss[1] != self.state

    async def read_memory(self, state: str | None = None) -> int | None:
        """memory_now(), read in a thread (smaps_rollup of up to 32 compile workers: ~3 ms each on a
        loaded host, too long for the event loop every few seconds) and kept for rss() as the
        reading of `state` (default: the state it has now)."""
        if not self.pid:
            return None
        state = state or self.state
        value = await asyncio.get_running_loop().run_in_executor(None, self.memory_now)
        self._rss = (time.monotonic(), state, value)
        return value

    async def become_ready(self) -> bool:
        """A booting standby becomes ready, with its memory as it is now (what the next standby of its
        kind is counted at); False when it is no longer booting (stopped, or taken, meanwhile)."""
        if self.state != "booting":
            return False
        await self.read_memory(state="ready")
        if self.state != "booting":
            return False
        self.state = "ready"
        return True

    def memory_now(self) -> int | None:
        """rss(), read now (in a thread: read_memory)."""
        own = host_memory.rss(self.pid) if self.pid else None
        return None if own is None else own + sum(host_memory.pss(p) or 0 for p in procs.descendants(self.pid))

    # -- pausing for a running cell ------------------------------------------------------------------
    def pause(self) -> None:
        if not self.paused and self.state == "booting" and self.alive():
            try:
                os.kill(self.pid, signal.SIGSTOP)
                self.paused, self._paused_at = True, time.monotonic()
            except OSError:
                return
            self._signal_below(signal.SIGSTOP)

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.pauses.append((self._paused_at, time.monotonic()))
            try:
                os.kill(self.pid, signal.SIGCONT)
            except OSError:
                pass
            self._signal_below(signal.SIGCONT)

    @property
    def paused_s(self) -> float:
        """Seconds it stood paused, in all (its start's timeouts do not count them)."""
        return sum(to - since for since, to in self.pauses)

    def paused_between(self, start: float, end: float) -> float:
        """Seconds it stood paused between `start` and `end` (time.monotonic(), which is the
        machine's one clock: a plan step's start, as the kernel reports it, is on it too)."""
        spans = self.pauses + ([(self._paused_at, time.monotonic())] if self.paused else [])
        return sum(max(0.0, min(end, to) - max(start, since)) for since, to in spans)

    def _signal_below(self, sig: int) -> None:
        for pid in procs.descendants(self.pid):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def differing_environment(s: Standby, env: dict) -> list[str]:
    """The start-up variables that differ between a standby and a launch (empty: it can serve).
    An imports standby that has started the CUDA driver serves only a launch on its own device
    (GPUCTX_DEVICE: a gpu standby's is the pool's to compare); one that has not takes the launch's
    device at the hand-over (kernel/adoption.py)."""
    names = CUDA_STARTUP_VARS if (s.kind == "gpu" or s.driver) else PROCESS_START_VARS
    if s.kind == "imports" and s.driver:
        names = (*names, DEVICE)
    return [v for v in names if s.env.get(v) != env.get(v)]


def unsafe_setup(s: Standby, facts: Facts) -> str | None:
    """Why the notebook's set-up must run before what the standby has imported, if it must: a
    setting or change (environment, sys.path, working directory, installs) followed by any import
    (other than os and sys, loaded before any code runs). Which modules a later import loads, and
    which libraries read a variable when they load, cannot be known without importing them, so the
    standby's own list of imports proves nothing. The one exception: the settings CUDA reads when
    it starts, in an imports standby that has not started it (READ_WHEN_CUDA_STARTS)."""
    if s.kind == "gpu" and s.notebook and s.notebook == facts.path:
        return None  # warmed with this very notebook's plan, which applies or respects its set-up
    pending = None
    for ev in facts.events:
        if ev.kind == "env":
            name = (ev.env or ("", None))[0]
            if name in READ_WHEN_CUDA_STARTS and s.kind == "imports" and not s.driver:
                continue
            pending = pending or (f"the notebook sets {name or 'environment variables'} at {ev.where} before its "
                                  "imports, which a kernel with libraries imported ahead may have read already")
        elif ev.kind == "barrier":
            pending = pending or f"the notebook's set-up at {ev.where} ({ev.why}) comes before its imports"
        elif ev.kind == "import" and pending and ev.module.split(".")[0] not in LOADED_BEFORE_ANY_CODE:
            return pending
    return None


def shadowed(s: Standby, cwd: str) -> str | None:
    """A module the standby imported that the notebook's folder holds a file of its own for (the
    notebook would import that one): run off the event loop."""
    for module in sorted({m.split(".")[0] for m in s.imported()}):
        if any(os.path.exists(os.path.join(cwd, name)) for name in (f"{module}.py", os.path.join(module, "__init__.py"))):
            return f"{os.path.join(cwd, module)} is local code the notebook imports instead of the installed {module}"
    return None


def needed(facts: Facts) -> set[str]:
    """The notebook's top-level imports of modules beyond the standard library, and what its first
    torch.compile imports (as the import profile learns it)."""
    compiles = {INDUCTOR_MODULE} if "torch_compile" in facts.signals else set()
    return {e.module for e in facts.imports() if e.beyond_stdlib} | compiles


def paused_during(s: Standby, step: dict) -> float:
    """Seconds `s` stood paused during one of its plan steps, as it reports it (`started`, on
    time.monotonic(), and `seconds`); for a step without its start, the last `seconds` before now."""
    seconds = float(step.get("seconds") or 0.0)
    started = step.get("started")
    start = float(started) if isinstance(started, (int, float)) else time.monotonic() - seconds
    return s.paused_between(start, start + seconds)


def covered(s: Standby, wanted: set[str]) -> int:
    """How well `s` covers the modules wanted: one it imported itself counts twice, one whose
    package it imported once (that package may or may not import it: torch imports torch.nn, not
    inductor)."""
    have = s.imported()
    return sum(2 if m in have else 1 if m.split(".")[0] in have else 0 for m in wanted)


# -- its life ------------------------------------------------------------------------------------------
async def until_ready(s: Standby, closing) -> None:
    """Until a new standby answers kernel_info; StandbyFailed if its process exits first, it never
    answers, or the server shuts down meanwhile (`closing()`). Returns early once it is taken. Time
    paused for a running cell does not count. Each try waits longer for its answer (1 s, then up to
    ASK_MAX_S): a reply is lost once its try gives up, and on a loaded machine a kernel that is up
    may take more than a second to answer every time."""
    wait = 1.0
    while not closing() and s.state == "booting":
        if not s.alive():
            raise StandbyFailed(f"the kernel exited during start-up ({exit_status(s.km)})")
        if time.monotonic() - s.started - s.paused_s > READY_TIMEOUT_S and not s.paused:
            raise StandbyFailed(f"the kernel did not answer kernel_info within {READY_TIMEOUT_S:g} s")
        if s.paused:
            await asyncio.sleep(0.2)
            continue
        if await _ask(s, "shell", "kernel_info_request", wait, closing) is not None:
            s.answered = True
            return
        wait = min(ASK_MAX_S, wait * 2)
    if closing():
        raise StandbyFailed("the server is shutting down")


async def until_warmed(s: Standby, closing) -> dict:
    """Until a standby's warm-up has ended (its last report); a request still takes one that is
    warming: its first cell then waits only for what is left. Its tries wait longer after each
    that got no answer (2 s up to ASK_MAX_S; as until_ready: its control thread answers late while
    imports hold the GIL on a loaded machine)."""
    report: dict = {}
    wait = 2.0
    while not closing() and s.state == "booting":
        if time.monotonic() - s.started - s.paused_s > WARM_TIMEOUT_S and not s.paused:
            break
        if s.paused:
            await asyncio.sleep(0.2)
            continue
        reply = await _ask(s, "control", REQUEST, wait, closing)
        if reply is None:
            if not s.alive():
                raise StandbyFailed(f"the kernel exited while warming up ({exit_status(s.km)})")
            wait = min(ASK_MAX_S, wait * 2)
            continue
        report = reply.get("content", {})
        learn_report(s, report)
        if (report.get("warmup") or {}).get("state") != "running":
            return report
        await asyncio.sleep(0.2)
    if closing():
        raise StandbyFailed("the server is shutting down")
    return report


async def _ask(s: Standby, channel: str, msg_type: str, wait: float, closing) -> dict | None:
    """One try of a request to a starting standby: its reply, or None when none came within `wait`
    s, or the standby stopped starting (taken: the try ends then, so that its refill, counted as
    starting until this standby's start ends, is not held up by it) or its process exited meanwhile."""
    try:
        return await _request_while_alive(s, msg_type, {}, wait, channel,
                                          going=lambda: s.state == "booting" and not closing())
    except (kernel_client.NoReply, StandbyFailed):
        return None


def learn_report(s: Standby, report: dict) -> None:
    """What the standby's warm-up has done, from its answer to the GPU question."""
    steps = (report.get("plan") or {}).get("steps") or []
    s.imports = list(dict.fromkeys(m for m in (imported_module(st) for st in steps) if m))
    s.resolved = [item for st in steps for item in resolved_names(st)]
    s.driver = s.driver or any(st.get("cuda") for st in steps)


def named_import(step: dict) -> tuple[str, list[str]] | None:
    """What a plan step (as the kernel reports it) imports, read from its name: "import m" is
    (m, []), "from m import a, b" is (m, [a, b]); None for a step that imports nothing."""
    name = str(step.get("name", ""))
    if name.startswith("import "):
        return name.split()[1], []
    if name.startswith("from ") and " import " in name:
        module, names = name[5:].split(" import ", 1)
        return module.strip(), [n.strip() for n in names.split(",") if n.strip()]
    return None


def imported_module(step: dict) -> str | None:
    """The module a plan step imported, when it did."""
    if step.get("state") != "done" or step.get("kind") not in ("import", "framework", "cpu"):
        return None
    taken = named_import(step)
    return taken[0] if taken else None


def resolved_names(step: dict) -> list[str]:
    """The names a done `from module import a, b` step resolved, as "module:a", "module:b"."""
    taken = named_import(step) if imported_module(step) else None
    return [f"{taken[0]}:{n}" for n in taken[1]] if taken else []


async def hand_over(s: Standby, cwd: str, env: dict, connection_file: str) -> None:
    """Tell a taken standby it now serves this kernel, on its control channel: it moves into the
    notebook's folder and takes the environment and connection file a fresh kernel would have had
    (and, having started no CUDA, its CUDA settings). No cell runs. Raises when it cannot."""
    fixed = CUDA_STARTUP_VARS if (s.kind == "gpu" or s.driver) else PROCESS_START_VARS
    delta: dict[str, str | None] = {k: v for k, v in env.items() if s.env.get(k) != v and k not in fixed}
    delta.update({k: None for k in s.env if k not in env})  # e.g. the notebook it was warmed for
    content = {"cwd": cwd, "env": delta, "pooled": str(round(time.monotonic() - s.started, 1)),
               "connection_file": connection_file}
    s.resume()
    # one taken before it was up answers once it is: it has what is left of its start's time too
    starting = 0.0 if s.answered else max(0.0, READY_TIMEOUT_S - (time.monotonic() - s.started - s.paused_s))
    reply = await _request_while_alive(s, ADOPT_REQUEST, content, HAND_OVER_TIMEOUT_S + starting)
    answer = reply.get("content", {})
    if reply.get("msg_type") != ADOPT_REPLY or answer.get("status") != "ok":
        raise RuntimeError(f"the standby did not take the notebook: {answer.get('message') or reply.get('msg_type')}")
    internals.close_control(s.km)
    s.km.cleanup_connection_file()  # the server's kernel manager writes the kernel's own


async def _request_while_alive(s: Standby, msg_type: str, content: dict, timeout: float, channel: str = "control",
                               going=lambda: True) -> dict | None:
    """A request to a standby that fails at once when its process exits meanwhile (StandbyFailed),
    and is given up (None) once `going()` is false; NoReply after `timeout`."""
    request = asyncio.ensure_future(kernel_client.request(s.km, channel, msg_type, content, timeout))
    try:
        while not request.done():
            await asyncio.wait([request], timeout=0.1)
            if not request.done() and not s.alive():
                raise StandbyFailed(f"the standby's process exited ({exit_status(s.km)})")
            if not request.done() and not going():
                return None
        return request.result()
    finally:
        request.cancel()  # (given up, or the pool closing: its client's channels stop with it)


async def stop(s: Standby, log) -> None:
    """Stop a standby the pool owns (never one handed over), and remove its connection file."""
    if s.state == "stopping":
        return
    s.state = "stopping"
    s.resume()  # a stopped process cannot shut down
    try:
        await ensure_async(s.km.shutdown_kernel(now=True))
    except Exception as exc:
        if s.alive():
            log.warning("gpuctx pool: stopping standby %s: %s: %s", s.pid, type(exc).__name__, exc)
    finally:
        remove_connection_file(s.km)


def exit_status(km) -> str:
    process = getattr(getattr(km, "provisioner", None), "process", None)
    code = process.poll() if process is not None and hasattr(process, "poll") else None
    return "its process is gone" if code is None else f"exit code {code}"


def remove_connection_file(km) -> None:
    try:
        km.cleanup_connection_file()
    except Exception:
        pass


def with_session(env: dict, notebook: str | None) -> dict:
    env = dict(env)
    if notebook:
        env[SESSION] = notebook
    return env
