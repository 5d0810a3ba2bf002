"""The CUDA driver's process checkpoint API (libcuda, driver ≥ 570), through ctypes.

The driver can move every GPU allocation of a process into that process's host memory and back
("checkpoint" and "restore"), acting on another process by its PID: lock the process's CUDA API,
checkpoint, and later restore and unlock. gpuctx uses it to suspend an idle notebook's GPU.

Nothing happens at import. `Driver` loads libcuda on first use; `support()` says whether this
driver has the API, and why not. The calls run in a separate helper process
(`python -m gpuctx_jupyter.checkpoint`, see `main`): a driver fault or a call that never returns
then costs a helper, never the server or a kernel, and a process can restore itself by starting
one. `suspend` and `resume` are the two compound steps the helper runs; each leaves the target
either where it started or where it was asked to go, never in between, wherever the driver allows.
"""
from __future__ import annotations

import ctypes
import enum
import fcntl
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

LIBCUDA = "libcuda.so.1"
LIBCUDA_ENV = "GPUCTX_LIBCUDA"  # another libcuda to load (tests load a stand-in built from C)
SYMBOLS = ("cuCheckpointProcessGetState", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
           "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock")
MIN_DRIVER = 570  # the first display driver with the API in libcuda


class State(enum.IntEnum):
    """CUprocessState: where a process's CUDA state is."""

    RUNNING = 0  # CUDA calls run
    LOCKED = 1  # CUDA calls block; GPU memory still on the GPU
    CHECKPOINTED = 2  # GPU memory in the process's host memory, GPU resources released
    FAILED = 3  # the driver failed a checkpoint or restore: the process's CUDA state is lost
    CHECKPOINTING = 4  # newer drivers report these two while a step is under way
    RESTORING = 5

    @property
    def label(self) -> str:
        return self.name.lower()


# What a failure of each kind means for a notebook, beside the driver's own words (the names are
# those driver 580 gave on an H200: scripts/checkpoint_probe.py).
_HINTS = {
    "CUDA_ERROR_NOT_SUPPORTED": "the driver cannot checkpoint this process (it uses managed (UVM) memory, "
                                "CUDA IPC or several processes on one context, or the GPU does not support it)",
    "CUDA_ERROR_NOT_READY": "the process stayed inside a CUDA call for the whole lock timeout (it is "
                            "computing on the GPU)",
    "CUDA_ERROR_TIMEOUT": "the process stayed inside a CUDA call for the whole lock timeout (it is "
                          "computing on the GPU)",
    "CUDA_ERROR_ILLEGAL_STATE": "the process is not in the state this step needs",
    "CUDA_ERROR_NOT_INITIALIZED": "the process has not started CUDA (it holds no GPU memory)",
    "CUDA_ERROR_OPERATING_SYSTEM": "the operating system refused: the process ended, or it is another "
                                   "user's",
    "CUDA_ERROR_NOT_PERMITTED": "no permission to act on that process (another user's?)",
    "CUDA_ERROR_OUT_OF_MEMORY": "not enough free GPU memory to bring it back: free memory on its GPU, then "
                                "try again",
    "CUDA_ERROR_NO_DEVICE": "this process sees no GPU (CUDA_VISIBLE_DEVICES hides them all)",
    "CUDA_ERROR_INVALID_VALUE": "the driver refused this process (seen when restoring a process that "
                                "imported another process's GPU memory through CUDA IPC)",
}
# gpuctx's own refusals, in the same fields as the driver's
CANCELLED = "GPUCTX_CANCELLED"  # the kernel took back its consent (a request came) before the lock
NO_ROOM = "GPUCTX_NO_ROOM"  # the GPU lacks the free memory a restore needs: not even tried


class CheckpointError(Exception):
    """A driver call failed; str() is one line: the step, the driver's error and what it means."""

    def __init__(self, step: str, code: int, name: str, text: str):
        hint = _HINTS.get(name)
        super().__init__(f"{step} failed: {name} ({text})" + (f": {hint}" if hint else ""))
        self.step, self.code, self.name, self.text = step, code, name, text


class CheckpointUnavailable(Exception):
    """This machine's driver has no usable checkpoint API; str() is the reason."""


@dataclass(frozen=True)
class Support:
    """What the driver offers, found without touching any process."""

    available: bool
    reason: str  # why not, or a one-line summary when available
    cuda_driver_version: int | None = None  # cuDriverGetVersion: 12080 for CUDA 12.8
    display_driver: str | None = None  # e.g. "580.65.06", from /proc/driver/nvidia/version
    missing: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


class _GpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", ctypes.c_ubyte * 16), ("newUuid", ctypes.c_ubyte * 16)]


class _RestoreArgs(ctypes.Structure):
    # 64 bytes in every cuda.h so far; the pairs' pointer and count lead, the rest must be zero.
    _fields_ = [("gpuPairs", ctypes.POINTER(_GpuPair)), ("gpuPairsCount", ctypes.c_uint),
                ("reserved", ctypes.c_char * 52)]


def display_driver_version(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The kernel module's version ("580.65.06"), or None without an NVIDIA driver."""
    try:
        with open(path) as fh:
            words = fh.readline().split()
    except OSError:
        return None
    return next((w for w in words if w[:1].isdigit() and "." in w), None)


def uuid_bytes(uuid: str) -> bytes:
    """NVML's "GPU-bf62cf5c-…" (or torch's prefix-less form) as the 16 bytes CUuuid holds."""
    digits = uuid.removeprefix("GPU-").replace("-", "")
    raw = bytes.fromhex(digits)
    if len(raw) != 16:
        raise ValueError(f"not a GPU UUID: {uuid!r}")
    return raw


class Driver:
    """libcuda's checkpoint calls. Loaded, and cuInit called, on first use; not thread-safe (the
    helper process is single-threaded)."""

    def __init__(self, path: str | None = None):
        self._path = path or os.environ.get(LIBCUDA_ENV) or LIBCUDA
        self._lib: ctypes.CDLL | None = None
        self._support: Support | None = None

    def support(self) -> Support:
        if self._support is None:
            self._support = self._detect()
        return self._support

    def _detect(self) -> Support:
        display = display_driver_version()
        try:
            lib = ctypes.CDLL(self._path)
        except OSError as e:
            return Support(False, f"no CUDA driver library here ({e})",
                           display_driver=display)
        version = ctypes.c_int(0)
        cuda_version = (version.value if hasattr(lib, "cuDriverGetVersion")
                        and lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None)
        missing = tuple(name for name in SYMBOLS if not hasattr(lib, name))
        if missing:
            return Support(False, f"this NVIDIA driver ({display or 'version unknown'}) has no process checkpoint "
                                  f"API (missing {', '.join(missing)}): it needs driver {MIN_DRIVER} or newer",
                           cuda_version, display, missing)
        status = lib.cuInit(0)
        if status != 0:
            name, text = self._error(lib, status)
            return Support(False, f"the CUDA driver does not start in this process: {name} ({text})",
                           cuda_version, display)
        self._lib = lib
        standin = f" — the stand-in {self._path} ({LIBCUDA_ENV})" if self._path != LIBCUDA else ""
        return Support(True, f"driver {display or '?'} (CUDA {_cuda_text(cuda_version)}): process checkpoint API "
                             f"present{standin}", cuda_version, display)

    @property
    def lib(self) -> ctypes.CDLL:
        support = self.support()
        if self._lib is None:
            raise CheckpointUnavailable(support.reason)
        return self._lib

    @staticmethod
    def _error(lib: ctypes.CDLL, status: int) -> tuple[str, str]:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        lib.cuGetErrorName(status, ctypes.byref(name))
        lib.cuGetErrorString(status, ctypes.byref(text))
        return ((name.value or b"").decode() or f"CUDA error {status}", (text.value or b"").decode() or "unknown error")

    def _call(self, step: str, fn: Callable[..., int], *args) -> None:
        status = fn(*args)
        if status != 0:
            name, text = self._error(self.lib, status)
            raise CheckpointError(step, status, name, text)

    def state(self, pid: int) -> State:
        value = ctypes.c_int(-1)
        self._call("get state", self.lib.cuCheckpointProcessGetState, pid, ctypes.byref(value))
        try:
            return State(value.value)
        except ValueError:
            raise CheckpointError("get state", -1, "GPUCTX_UNKNOWN_STATE",
                                  f"the driver reports process state {value.value}, which gpuctx does not know") from None

    def lock(self, pid: int, timeout_ms: int) -> None:
        """Block the process's CUDA calls; with timeout_ms > 0 give up (the process left running)
        when it stays inside a CUDA call that long."""
        args = _LockArgs(timeoutMs=max(0, int(timeout_ms)))
        self._call("lock", self.lib.cuCheckpointProcessLock, pid, ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._call("checkpoint", self.lib.cuCheckpointProcessCheckpoint, pid, None)

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        """Bring the GPU memory back; `gpu_pairs` ((old UUID, new UUID), every GPU the process
        used) restores onto other GPUs of the same chip."""
        if not gpu_pairs:
            self._call("restore", self.lib.cuCheckpointProcessRestore, pid, None)
            return
        pairs = (_GpuPair * len(gpu_pairs))()
        for pair, (old, new) in zip(pairs, gpu_pairs):
            pair.oldUuid[:] = list(uuid_bytes(old))
            pair.newUuid[:] = list(uuid_bytes(new))
        args = _RestoreArgs(gpuPairs=ctypes.cast(pairs, ctypes.POINTER(_GpuPair)), gpuPairsCount=len(gpu_pairs))
        self._call("restore", self.lib.cuCheckpointProcessRestore, pid, ctypes.byref(args))

    def unlock(self, pid: int) -> None:
        self._call("unlock", self.lib.cuCheckpointProcessUnlock, pid, None)


def _cuda_text(version: int | None) -> str:
    return f"{version // 1000}.{version % 1000 // 10}" if version else "?"


# -- the two compound steps, each serialised per target process --------------------------------

@dataclass
class Outcome:
    """What a compound step did: the state it left, each step's seconds, the error if any."""

    ok: bool
    state: str  # State.label, or "unknown"
    steps: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    error_name: str | None = None  # the driver's CUDA_ERROR_… name
    unwound: bool = False  # a failure was undone: the process runs as before

    def to_json(self) -> dict:
        return asdict(self)


def _folder() -> str:
    folder = os.path.join(tempfile.gettempdir(), f"gpuctx-checkpoint-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def folder_id() -> list[int]:
    """The lock folder as (device, inode): the kernel and the server's helpers must share it to
    take turns (a kernel with a TMPDIR of its own, or in another container, does not)."""
    st = os.stat(_folder())
    return [st.st_dev, st.st_ino]


@contextmanager
def target_lock(pid: int, timeout: float | None = None) -> Iterator[None]:
    """One compound step on a process at a time, across processes: the server's helpers and the
    kernel's own (a Resume click racing the next cell) take turns through this file lock. With a
    `timeout` (s), TimeoutError when another step still holds it then (its driver call hangs)."""
    with open(os.path.join(_folder(), f"{pid}.lock"), "a") as fh:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"another checkpoint step on process {pid} had not ended after {timeout:g} s "
                                       "(a driver call that hangs?)") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cancel(pid: int, token: str, timeout: float | None = None) -> None:
    """Withdraw the consent the kernel `pid` gave to the suspend `token`: a suspend helper that has
    not taken the target lock yet then refuses (CANCELLED). Waits while a compound step holds the
    lock (at most `timeout` s: TimeoutError), so that on return the suspend has either not begun
    (and never will) or ended. No CUDA call: the kernel runs this itself, also while checkpointed."""
    with target_lock(pid, timeout):
        with open(os.path.join(_folder(), f"{pid}.cancelled"), "w") as fh:
            fh.write(token)


def _cancelled(pid: int, token: str | None) -> bool:
    if not token:
        return False
    try:
        with open(os.path.join(_folder(), f"{pid}.cancelled")) as fh:
            return fh.read().strip() == token
    except OSError:
        return False


def _timed(steps: dict[str, float], name: str, fn: Callable[[], None]) -> None:
    start = time.perf_counter()
    try:
        fn()
    finally:
        steps[name] = round(time.perf_counter() - start, 4)


def _label(driver: Driver, pid: int) -> str:
    try:
        return driver.state(pid).label
    except (CheckpointError, CheckpointUnavailable):
        return "unknown"


def suspend(driver: Driver, pid: int, lock_timeout_ms: int, token: str | None = None) -> Outcome:
    """Lock, then checkpoint. On any failure the process is unlocked (and restored, should the
    driver have got as far) so that it runs as before; `unwound` says that happened. With a
    `token` (the kernel's consent), nothing is done if the kernel cancelled it (`cancel`)."""
    steps: dict[str, float] = {}
    with target_lock(pid):
        if _cancelled(pid, token):
            return Outcome(False, _label(driver, pid), steps, "the notebook received a request before the suspend "
                                                              "began: it keeps running", CANCELLED)
        try:
            state = driver.state(pid)
            if state != State.RUNNING:
                return Outcome(False, state.label, steps, f"the process is {state.label}, not running", None)
            _timed(steps, "lock", lambda: driver.lock(pid, lock_timeout_ms))
        except (CheckpointError, CheckpointUnavailable) as e:
            return Outcome(False, _label(driver, pid), steps, str(e), getattr(e, "name", None))
        try:
            _timed(steps, "checkpoint", lambda: driver.checkpoint(pid))
        except CheckpointError as e:
            return _unwind(driver, pid, steps, e)
        return Outcome(True, _label(driver, pid), steps)


def _unwind(driver: Driver, pid: int, steps: dict[str, float], error: CheckpointError) -> Outcome:
    """After a failed checkpoint: back to running from wherever the driver left the process."""
    state = _label(driver, pid)
    try:
        if state == State.CHECKPOINTED.label:
            _timed(steps, "restore", lambda: driver.restore(pid))
            state = State.LOCKED.label
        if state == State.LOCKED.label:
            _timed(steps, "unlock", lambda: driver.unlock(pid))
    except CheckpointError as e:
        return Outcome(False, _label(driver, pid), steps, f"{error}; undoing it failed too: {e}", error.name)
    state = _label(driver, pid)
    return Outcome(False, state, steps, str(error), error.name, unwound=state == State.RUNNING.label)


def resume(driver: Driver, pid: int, gpu_pairs: Sequence[tuple[str, str]] = (),
           need: dict[str, int] | None = None) -> Outcome:
    """Bring the process back to running from wherever it is: restore if checkpointed, unlock if
    locked, nothing if already running (a second resume is no error). `need` (GPU UUID -> bytes
    the restore puts back there): when NVML shows less free memory than that, the restore is not
    tried and the process stays checkpointed (NO_ROOM), with a message saying what to free."""
    steps: dict[str, float] = {}
    with target_lock(pid):
        try:
            state = driver.state(pid)
            short = room_short(need) if state == State.CHECKPOINTED and need else None
            if short:
                return Outcome(False, state.label, steps, short, NO_ROOM)
            if state == State.CHECKPOINTED:
                _timed(steps, "restore", lambda: driver.restore(pid, gpu_pairs))
                state = State.LOCKED
            if state == State.LOCKED:
                _timed(steps, "unlock", lambda: driver.unlock(pid))
            elif state != State.RUNNING:
                return Outcome(False, state.label, steps, f"the process is {state.label}: it cannot be resumed")
        except (CheckpointError, CheckpointUnavailable) as e:
            return Outcome(False, _label(driver, pid), steps, str(e), getattr(e, "name", None))
        return Outcome(True, _label(driver, pid), steps)


def room_short(need: dict[str, int]) -> str | None:
    """Why the GPUs named in `need` (UUID -> bytes) cannot take that much back now, or None (also
    when NVML cannot tell: then the driver decides)."""
    from . import nvml  # NVML only here, in the helper process

    try:
        records = {r.uuid.upper(): r for r in nvml.read_records()}
    except nvml.NvmlUnavailable:
        return None
    short = []
    for uuid, wanted in need.items():
        r = records.get(uuid.upper())
        if r is not None and r.memory_free is not None and r.memory_free < wanted:
            short.append(f"nvidia-smi {r.nvml_index} has {r.memory_free / 2**30:.2f} GiB free, "
                         f"it needs {wanted / 2**30:.2f} GiB back there")
    if not short:
        return None
    return ("not enough free GPU memory to resume: " + "; ".join(short)
            + " — free memory there (or wait for another notebook to finish), then run the cell again")


# -- the helper process ---------------------------------------------------------------------------

def helper_command(action: str, pid: int, *extra: str, python: str | None = None) -> list[str]:
    """The command line that runs one action in a helper process (see `main`)."""
    return [python or sys.executable, "-m", "gpuctx_jupyter.checkpoint", action, str(pid), *extra]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpuctx_jupyter.checkpoint support|state|suspend|resume|serve|lock|checkpoint|
    restore|unlock [PID] [--lock-timeout-ms N] [--token T] [--onto OLD=NEW …] [--need UUID=BYTES …]`:
    one action, one JSON line on stdout; exit status 0 when it did what was asked.

    `serve PID` is the waiting helper a suspended kernel keeps: it starts the driver at once, says
    {"ready": …} and waits for one line on stdin — `resume [--need …]` — which it runs and answers
    like `resume`; end of input (the kernel ended) ends it. A resume then costs no process start."""
    args = list(sys.argv[1:] if argv is None else argv)
    # The target's GPUs may be hidden from the caller (a kernel started with CUDA_VISIBLE_DEVICES
    # restoring itself, a server that shows no GPU): cuInit then fails with NO_DEVICE (seen on the
    # H200), so the helper always lets the driver see every GPU.
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    driver = Driver()
    if not args or args[0] == "support":
        support = driver.support()
        print(json.dumps(support.to_json()))
        return 0 if support.available else 1
    action, pid = args[0], int(args[1])
    if action == "serve":
        support = driver.support()
        if support.available:
            _start_nvml()
        print(json.dumps({"ready": support.available, "reason": support.reason}), flush=True)
        words = sys.stdin.readline().split()
        if words[:1] != ["resume"]:
            return 0
        args = ["resume", str(pid), *words[1:]]
        action = "resume"
    timeout_ms = int(_option(args, "--lock-timeout-ms") or 0)
    pairs = [tuple(p.split("=", 1)) for p in _options(args, "--onto")]
    need = {u: int(b) for u, b in (p.split("=", 1) for p in _options(args, "--need"))}
    try:
        if action == "suspend":
            outcome = suspend(driver, pid, timeout_ms, _option(args, "--token"))
        elif action == "resume":
            outcome = resume(driver, pid, pairs, need)
        else:
            steps: dict[str, float] = {}
            single = {"state": lambda: driver.state(pid), "lock": lambda: driver.lock(pid, timeout_ms),
                      "checkpoint": lambda: driver.checkpoint(pid), "restore": lambda: driver.restore(pid, pairs),
                      "unlock": lambda: driver.unlock(pid)}[action]
            try:
                _timed(steps, action, single)
                outcome = Outcome(True, _label(driver, pid), steps if action != "state" else {})
            except CheckpointError as e:
                outcome = Outcome(False, _label(driver, pid), steps, str(e), e.name)
    except CheckpointUnavailable as e:
        outcome = Outcome(False, "unknown", {}, str(e))
    print(json.dumps(outcome.to_json()), flush=True)
    return 0 if outcome.ok else 1


def _start_nvml() -> None:
    """NVML started while the kernel is suspended, so that the room check of its resume does not
    pay for it on the user's next cell (~0.1 s on the H200: the resume took that much longer than
    the driver's restore step)."""
    from . import nvml

    try:
        nvml.init()
    except nvml.NvmlUnavailable:
        pass  # the room check then lets the driver decide


def _option(args: list[str], name: str) -> str | None:
    values = _options(args, name)
    return values[-1] if values else None


def _options(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
