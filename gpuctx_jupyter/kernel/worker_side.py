"""What runs inside a worker of `%gpu workers`: an ipyparallel engine (or its controller) that
gpuctx starts as `python -m gpuctx_jupyter.kernel.worker_entry engine|controller ARGS`.

Before ipyparallel's own main runs, the entry

- watches the kernel that started it (ENV_PARENT) and ends its process tree once the kernel is
  gone, also after a SIGKILL: ipyparallel starts engines in a session of their own, so nothing
  else would end them (on another machine, ipyparallel's heartbeat ends an engine whose
  controller is gone);
- for engines that a profile's launcher starts (ENV_PLACE), picks this engine's GPU on its host
  from its local slot and names that GPU alone, by UUID, in CUDA_VISIBLE_DEVICES, before anything
  can start CUDA (the kernel names it itself for the engines it starts);
- starts the warm-up (the notebook's plan and a training step, kernel/warm/) in a background
  thread, so that imports and CUDA overlap the engine's own start and registration.

The kernel then calls `identity()`, `boot()` and, after every `%%on_gpu` cell, `after_cell()`
through ipyparallel's `apply`. Nothing here imports ipyparallel, torch or NVML at import time.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import reprlib
import signal
import socket
import sys
import threading
import time

from ..contract import SESSION
from . import rng

ENV_PARENT = "GPUCTX_WORKER_PARENT"  # "pid:start time:boot id" of the kernel: the worker ends with it
ENV_RANK = "GPUCTX_WORKER_RANK"  # the rank, for the engines the kernel starts itself
ENV_PLACE = "GPUCTX_WORKER_PLACE"  # "gpu" or "cpu": engines a launcher starts choose their own GPU
ENV_WARM = "GPUCTX_WORKER_WARM"  # "0": no warm-up; "prepare": imports only (at low priority) until boot()
ENV_FOLDER = "GPUCTX_WORKER_FOLDER"  # the controller's: the private profile folder to remove at the end
TRAINING_OPS = ("backward", "optimizer")  # workers train: warm a backward and an optimizer step too
# What MPI and Slurm tell a process about its place on its host, in the order they are tried.
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                   "SLURM_LOCALID")
WATCH_EVERY_S = 0.5
END_GRACE_S = 3.0

_warmer = None  # the warm-up this worker started at its start (kernel/warm/scheduler.Warmer)
PREPARED = "prepared ahead: no GPU work until the notebook's `%gpu workers start` line runs"
_placed: dict = {}  # what place() chose: slot, how, problem
_slot_lock: int | None = None  # the file descriptor that holds this engine's slot on its host


# -- the kernel that started us ----------------------------------------------------------------------
def boot_id() -> str:
    """Which running machine this is (Linux's boot id; elsewhere the host name)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return socket.gethostname()


def pid_namespace() -> str:
    """This process's PID namespace ("pid:[4026531836]"; "" where /proc does not say): two
    containers on one machine share its boot id, not their PIDs."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def parent_token(pid: int | None = None) -> str:
    """What a worker needs to know that process `pid` (default: this one) is still the same
    process: its PID, its start time (PIDs are reused) and the machine's boot id."""
    import psutil

    pid = os.getpid() if pid is None else pid
    return f"{pid}:{psutil.Process(pid).create_time():.3f}:{boot_id()}"


def alive(pid: int, created: float) -> bool:
    """Whether the process `pid` that started at `created` still runs (a zombie does not)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def watch_parent(token: str, every: float = WATCH_EVERY_S, folder: str = "") -> threading.Thread | None:
    """End this process and what it started once the process `token` names is gone (and remove
    `folder`, the cluster's private profile folder). None when that process is on another
    machine, or not visible from here (another PID namespace)."""
    try:
        pid_text, created_text, boot = token.split(":", 2)
        pid, created = int(pid_text), float(created_text)
    except ValueError:
        return None
    if boot != boot_id() or not alive(pid, created):
        return None

    def watch():
        while alive(pid, created):
            time.sleep(every)
        print(f"gpuctx worker {os.getpid()}: the kernel that started it (pid {pid}) is gone: ending",
              file=sys.__stderr__, flush=True)
        end_tree(folder=folder)

    thread = threading.Thread(target=watch, name="gpuctx-watch-kernel", daemon=True)
    thread.start()
    return thread


def end_tree(grace: float = END_GRACE_S, folder: str = "") -> None:
    """SIGTERM to this process and everything below it (ipyparallel stops cleanly on it), then,
    for whatever is still there after `grace` s (a cell stuck in C code), SIGKILL and exit,
    removing `folder` last."""
    import shutil

    import psutil

    me = psutil.Process()
    below = me.children(recursive=True)
    for proc in below:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    for proc in below:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(1)


# -- placing an engine a launcher started ------------------------------------------------------------
def local_slot(cluster_id: str) -> tuple[int, str]:
    """This engine's place among the engines of its cluster on its host, and how it was learnt:
    from MPI's or Slurm's local rank, else the first free slot lock in the temporary folder."""
    global _slot_lock
    for var in LOCAL_RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value), var
    import fcntl
    import tempfile

    for slot in range(4096):
        path = os.path.join(tempfile.gettempdir(), f"gpuctx-worker-{cluster_id}-{slot}.lock")
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _slot_lock = fd  # held as long as this process lives
        return slot, "slot lock"
    raise RuntimeError("no free slot lock in the temporary folder")


def place(kind: str) -> None:
    """Name this engine's one GPU in CUDA_VISIBLE_DEVICES (by UUID), or none for a CPU worker."""
    if kind != "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return
    from ..core import inventory

    slot, how = local_slot(os.environ.get("IPP_CLUSTER_ID", "default"))
    _placed.update(slot=slot, how=how)
    inv = inventory.take()
    if slot < len(inv.devices):
        os.environ["CUDA_VISIBLE_DEVICES"] = inv.devices[slot].record.uuid
        return
    why = inv.no_gpu_reason() or f"it has {len(inv.devices)} GPU{'s' if len(inv.devices) != 1 else ''}"
    _placed["problem"] = f"no GPU for local slot {slot} ({how}) on {socket.gethostname()}: {why}"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


# -- warming up ----------------------------------------------------------------------------------
def start_warm(prepare: bool = False) -> None:
    """The notebook's warm plan (what its cells run first) with a training step, on this
    worker's GPU, in a background thread (kernel/warm/scheduler.Warmer). `prepare`: a worker
    started ahead of the notebook's `%gpu workers start` line: its imports only, at the lowest
    CPU priority (the user's cells come first), no CUDA; boot() does the rest."""
    global _warmer
    from .warm import plan as notebook_plan
    from .warm.scheduler import Warmer

    path = os.environ.get(SESSION)

    def make_plan():
        plan = notebook_plan.derive(path, extra_ops=TRAINING_OPS)
        plan.devices, plan.device_where = [], ""  # a worker sees its one GPU as cuda:0
        if prepare:
            plan.gpu, plan.gpu_blocked = False, PREPARED
        return plan

    _warmer = Warmer()
    _warmer.nice = prepare
    _warmer.start_plan(make_plan, device=0, source="gpuctx workers (prepared)" if prepare else "gpuctx workers")


def warm_state() -> dict:
    """This worker's rank and warm-up, as `%gpu workers` shows prepared workers."""
    state = {"state": "off", "phase": "", "total": None, "detail": ""} if _warmer is None else _warmer.status.as_dict()
    return {**state, "rank": os.environ.get(ENV_RANK)}


def take_environment(update: dict, removed: list) -> None:
    """The kernel's environment as it is when prepared workers are adopted: what the notebook
    set or removed after they started (variables read at import time never come here: the
    kernel starts new workers for those)."""
    os.environ.update(update)
    for name in removed:
        os.environ.pop(name, None)


def main(argv: list[str]) -> None:
    """`worker_entry engine|controller ARGS`: the watch, the placement, the warm-up, then
    ipyparallel's own engine or controller with ARGS."""
    role, rest = (argv[0], argv[1:]) if argv else ("", [])
    if role not in ("engine", "controller"):
        raise SystemExit("usage: python -m gpuctx_jupyter.kernel.worker_entry engine|controller [ARGS]")
    token = os.environ.get(ENV_PARENT)
    if token:
        watch_parent(token, folder=os.environ.get(ENV_FOLDER, "") if role == "controller" else "")
    if role == "controller":
        _children_end_with_this_process()
        from ipyparallel.controller.app import IPController

        IPController.save_connection_dict = save_connection_dict
    if role == "engine":
        if os.environ.get(ENV_PLACE):
            place(os.environ[ENV_PLACE])
        if os.environ.get(ENV_WARM, "1") != "0":
            start_warm(prepare=os.environ.get(ENV_WARM) == "prepare")
        from ipyparallel.engine.app import main as run
    else:
        from ipyparallel.controller.app import main as run
    sys.argv = [f"ip{role}", *rest]
    folder = os.environ.get(ENV_FOLDER, "") if role == "controller" else ""
    try:
        run()
    finally:  # the controller writes its engines' state there as it stops: the folder goes after it
        if folder:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


def save_connection_dict(self, fname: str, cdict: dict) -> None:
    """IPController's, written whole: ipyparallel opened the file, then wrote it, and a worker that
    looked in between (forked with its imports done, it looks at once; its controller slowed by a
    loaded machine) read it empty and exited with a JSONDecodeError. A file of its own (0600, as
    mkstemp makes it) renamed over the name: the name only ever holds a whole file."""
    import json
    import tempfile

    path = os.path.join(self.profile_dir.security_dir, fname)
    self.log.info("writing connection info to %s", path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{fname}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(cdict, indent=2))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _children_end_with_this_process() -> None:
    """The controller's schedulers and heart monitor (processes it forks through multiprocessing)
    get SIGKILL when it ends: killed (the out-of-memory killer, a signal), it ended alone, and they
    ran on — relaying the cells of workers whose controller was gone, after their kernel too."""
    import ctypes
    import multiprocessing

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return
    forking = [0]

    def in_child():
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: sent when the thread that forked it ends
        if os.getppid() != forking[0]:  # it has ended already
            os._exit(1)

    os.register_at_fork(before=lambda: forking.__setitem__(0, os.getpid()), after_in_child=in_child)
    multiprocessing.set_start_method("fork", force=True)  # (forkserver, spawn: not forked from here)


# -- asked by the kernel through ipyparallel's apply ---------------------------------------------------
def identity() -> dict:
    """Who this worker is: where it runs, its GPU, and how it was placed."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    name = ""
    if gpu:
        from ..core import inventory

        inv = inventory.take()
        name = inv.devices[0].record.name if inv.devices else ""
    return {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id(), "pid_ns": pid_namespace(),
            "rank": os.environ.get(ENV_RANK), "slot": _placed.get("slot"), "slot_from": _placed.get("how", ""),
            "problem": _placed.get("problem", ""), "gpu": gpu or "", "gpu_name": name, "cwd": os.getcwd()}


def free_port() -> int:
    """A TCP port free on this host now, for torch.distributed's rendezvous (rank 0 asks)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def boot(rank: int, local_rank: int, world_size: int, local_world_size: int, master_addr: str,
         master_port: int, backend: str, ddp_step: bool = True) -> dict:
    """Once the warm-up is over: the variables torchrun sets, torch.distributed's process group,
    one collective (NCCL builds its communicators on the first) and a tiny DDP step. Seconds of
    each phase, and the warm-up's summary."""
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    warm = ""  # the warm-up's summary
    if _warmer is not None:
        prepared = os.environ.get(ENV_WARM) == "prepare"
        if prepared:
            _hurry()  # the line is waiting now for what is left of the imports
        status = _warmer.wait()
        if prepared:  # imports done ahead: now CUDA and the training steps
            phases["imports (prepared ahead)"] = status.total or 0.0
            os.environ[ENV_WARM] = "1"
            t = time.perf_counter()
            start_warm()
            status = _warmer.wait()
            phases["warm-up"] = time.perf_counter() - t
        else:
            phases["warm-up"] = status.total or (time.perf_counter() - t0)  # it ran beside the engine's start
        warm = status.summary()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(local_world_size), MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    t = time.perf_counter()
    import inspect

    import torch
    import torch.distributed as dist

    kwargs = {}
    if backend == "nccl":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        if "device_id" in inspect.signature(dist.init_process_group).parameters:
            kwargs["device_id"] = device  # NCCL starts its communicator now, not at the first step
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, **kwargs)
    ones = torch.ones(1, device=device)
    dist.all_reduce(ones)
    if int(ones.item()) != world_size:
        raise RuntimeError(f"all_reduce of ones gave {ones.item()}, not the world size {world_size}")
    phases["process group"] = time.perf_counter() - t
    if ddp_step:
        t = time.perf_counter()
        drawn = rng.save(cuda_may_start=True)  # the tiny model's weights and inputs: the notebook's draws stay its own
        try:
            _ddp_step(torch, device)
        finally:
            rng.restore(drawn)
        phases["DDP step"] = time.perf_counter() - t
    _explain_oom_on_this_worker()
    return {"phases": phases, "warm": warm, "device": str(device), "torch": torch.__version__,
            "backend": dist.get_backend()}


def _hurry() -> None:
    """Every thread of this worker back to its main thread's CPU priority (the prepared imports
    ran at 19); where raising a priority needs a privilege this process lacks, they stay as they are."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]
        main = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's: its id is the pid
    except (OSError, AttributeError):
        return
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, main)
        except (OSError, AttributeError):
            return


def _ddp_step(torch, device) -> None:
    """Two steps of a tiny DistributedDataParallel model: DDP's parameter broadcast, its reducer
    and its gradient all-reduce run once before the notebook's first step."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    nn = torch.nn
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        ddp(torch.randn(16, 32, device=device)).square().mean().backward()
        opt.step()
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _explain_oom_on_this_worker() -> None:
    """An out-of-memory error in a cell gets gpuctx's explanation under the rank's traceback,
    from here, where the GPU and its holders are seen (kernel/oom.py)."""
    ip = _shell()
    if ip is None or getattr(ip, "_gpuctx_oom_hook", False):
        return

    def after(result):
        error = getattr(result, "error_in_exec", None)
        if error is not None:
            from . import oom

            text = oom.explain(error)
            if text:
                print(text, file=sys.stderr)

    ip.events.register("post_run_cell", after)
    ip._gpuctx_oom_hook = True


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def after_cell(limit: int) -> tuple:
    """After a `%%on_gpu` cell: its last expression's value as `pack` gives it, and this
    worker's memory (allocators and NVML)."""
    ip = _shell()
    result = getattr(ip, "last_execution_result", None) if ip is not None else None
    return pack(getattr(result, "result", None), limit), memory()


def memory() -> dict:
    from ..core import frameworks as fws
    from ..core import inventory

    figures = [f.as_dict() for f in fws.allocator_figures() if f.reserved or f.peak]
    inv = inventory.take()
    nvml = sum(inventory.process_memory(inv).values()) if inv.devices else None
    return {"allocators": figures, "nvml": nvml or None}


_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 160, 160, 8, 8


def pack(value, limit: int) -> tuple | None:
    """A value to send back to the notebook: ("value", pickled bytes) when it pickles within
    `limit` bytes (tensors moved to the CPU first), else ("summary", repr, type, why)."""
    if value is None:
        return None
    value = _to_cpu(value)
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 — anything a user's object raises while pickling
        return ("summary", _short.repr(value), kind, f"it cannot be pickled ({type(exc).__name__}: {exc})")
    if len(data) > limit:
        return ("summary", _short.repr(value), kind,
                f"it is {len(data) / 2**20:.1f} MiB pickled, over the {limit / 2**20:.0f} MiB limit")
    return ("value", data)


def _to_cpu(value, depth: int = 0):
    """torch tensors moved to the CPU, also inside lists, tuples and dicts (a CUDA tensor would
    start CUDA in the notebook's kernel when it arrives)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if depth >= 3:
        return value
    if type(value) in (list, tuple):
        return type(value)(_to_cpu(v, depth + 1) for v in value)
    if type(value) is dict:
        return {k: _to_cpu(v, depth + 1) for k, v in value.items()}
    return value
