"""`%gpu workers`: this notebook's warm data-parallel workers, one per GPU, on ipyparallel.

ipyparallel starts, signals and stops the processes (its Cluster API, launchers, engines and
controller); gpuctx chooses the GPUs as `%gpu use` numbers them, pins each engine to its GPU
(CUDA_VISIBLE_DEVICES naming that GPU alone, by UUID), warms it with the notebook's plan and
starts torch.distributed on all of them (NCCL on GPUs, gloo on the CPU; RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set as torchrun sets them).

Without `--profile` the engines and their controller are local processes started by this kernel
(so the server counts them as the notebook's, through its descendants), in the kernel's working
directory and environment, each watching the kernel and ending with it (kernel/worker_side.py).
With `--profile P`, the launchers of ipyparallel's profile P start them (MPI, SSH, Slurm, ...),
and each engine picks its GPU from its place on its host. `%%on_gpu all` runs cells on them:
kernel/worker_cells.py.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from IPython.core.error import UsageError
from IPython.display import display
from traitlets import Float, Int

from ..core import inventory
from ..core.procs import descendants, ns_pids
from . import worker_processes, worker_side
from .commands import one_line
from .render import Report, Section, ago, gib
from .worker_placement import Placement, check_free, choose, select_ranks
from .worker_prepare import Preparing
from .worker_processes import ENTRY

log = logging.getLogger("gpuctx.workers")
# ipyparallel's own messages (each engine's output when it stops, at WARNING; its clean-up, at
# ERROR) would land in the cell: gpuctx reports what went wrong itself, in one line.
log.setLevel(logging.CRITICAL)
# ipyparallel's hub accepts an engine only after its heart monitor has seen the engine's heart in
# two beats: at its 3 s default that is ~5.7 s of every start, for engines already connected. Ours
# (local, beside the kernel) beat every 0.5 s and are unregistered after as long a silence as the
# default's (60 misses, 30 s).
HEARTBEAT_ARGS = ("--HeartMonitor.period=500", "--HeartMonitor.max_heartmonitor_misses=60")
# ipyparallel's nanny (a process per engine, started before the engine registers) relays signals
# from afar: the kernel signals its local workers by PID.
LOCAL_ENGINE_ARGS = ("--IPEngine.enable_nanny=False",)
CONNECT_TRY_S = 10.0  # one try of ipyparallel's client to reach the controller's hub (its default)
INSTALL = "pip install ipyparallel (or pip install 'gpuctx-jupyter[workers]'), then restart the kernel"


def require_ipyparallel():
    """The ipyparallel module, or a one-line UsageError that says how to install it."""
    try:
        import ipyparallel
    except ImportError:
        raise UsageError(f"%gpu workers runs on ipyparallel, which is not installed in this kernel: {INSTALL}") from None
    return ipyparallel


# -- the workers --------------------------------------------------------------------------------------
@dataclass
class Worker:
    """One rank: its ipyparallel engine, where it runs and on which GPU."""

    rank: int
    engine: int
    pid: int
    host: str
    local: bool  # on this kernel's machine: its GPU memory is read here, through NVML
    local_rank: int = 0
    uuid: str = ""  # its GPU; "" for a CPU worker
    gpu_name: str = ""
    ordinal: int | None = None  # this kernel's CUDA ordinal of that GPU, when it sees it
    state: str = "starting"  # starting | ready | busy (died: read from its process, `died()`)
    warm: str = ""  # its warm-up's summary
    memory: dict = field(default_factory=dict)  # as it last reported (allocators, nvml)
    phases: dict = field(default_factory=dict)

    @property
    def device(self) -> str:
        """Its GPU as this notebook numbers it: cuda:1 (NVIDIA H200); cpu for a CPU worker."""
        if not self.uuid:
            return "cpu"
        if self.ordinal is not None:
            return f"cuda:{self.ordinal}" + (f" ({self.gpu_name})" if self.gpu_name else "")
        return f"{self.gpu_name or 'GPU'} {self.uuid[:12]}"

    @property
    def label(self) -> str:
        return f"rank {self.rank} · {self.device}"


class GpuWorkers(Preparing):
    """This notebook's workers (settable as `c.GpuWorkers.<trait>` in the kernel's config)."""

    start_timeout = Float(
        300.0, help="""Seconds `%gpu workers start` waits for every worker to be ready (registered,
        warmed, in the process group) before it stops them and says why.""",
    ).tag(config=True)

    interrupt_grace = Float(
        10.0, help="""Seconds a rank gets to stop after an Interrupt (or a --timeout) before the workers
        are stopped: a rank stuck in C code or in a collective never sees the interrupt.""",
    ).tag(config=True)

    failure_grace = Float(
        10.0, help="""Seconds the other ranks get to finish after one rank's cell failed, before they are
        interrupted (in DDP they usually wait in a collective for the rank that failed).""",
    ).tag(config=True)

    result_limit = Int(
        16 * 2**20, help="""Largest value (pickled, in bytes) of a cell's last expression that comes back
        from each rank; a larger one comes back as its repr.""",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cluster = None
        self.client = None
        self.ranks: list[Worker] = []
        self.backend = ""
        self.rendezvous = ""
        self.profile = ""  # the ipyparallel profile, "" for gpuctx's own local workers
        self.started: float | None = None  # time.time() when they were ready
        self.ready_in: float | None = None
        self.cells = 0
        self._private_profile: str | None = None  # the folder gpuctx made for its own cluster
        self._processes: list = []  # psutil.Process of every local process ipyparallel started
        self._lock = threading.Lock()
        self._atexit = False
        self._registered_in = 0.0
        self._init_prepared()

    @property
    def running(self) -> bool:
        return self.client is not None

    # -- %gpu workers ... ------------------------------------------------------------------------------
    def command(self, args) -> None:
        action = args.action or "list"
        if action == "start":
            self.start(args.which, profile=args.profile, cpu=args.cpu, share=args.share, warm=not args.no_warm,
                       master_addr=args.master_addr)
        elif args.which or args.profile or args.cpu or args.share or args.no_warm or args.master_addr:
            raise UsageError(f"%gpu workers {action} takes no arguments (`%gpu help workers`)")
        elif action == "stop":
            print(self.stop())
        else:
            display(self.report())

    def start(self, which: str | None = None, profile: str | None = None, cpu: bool = False, share: bool = False,
              warm: bool = True, master_addr: str | None = None) -> None:
        ipp = require_ipyparallel()
        if self.running:
            raise UsageError(f"{len(self.ranks)} workers are running already (`%gpu workers` lists them): "
                             "`%gpu workers stop` first")
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.start_timeout
        self._await_prepare(deadline)
        try:
            if profile:
                self._drop_prepared("the line asks for ipyparallel profile " + repr(profile))
                n = worker_processes.launch_profile(self, ipp, which, profile, cpu, warm)
                place = "cpu" if cpu else "gpu"
                gpus: tuple = ()
            else:
                placement = self._local_placement(which, cpu, share)
                n, gpus, place = placement.count, placement.gpus, ""
                if placement.note:
                    print(f"gpuctx: {placement.note}")
            where = ", ".join(f"cuda:{d.ordinal}" for d in gpus) if gpus else (
                f"the hosts of profile {profile!r}" if profile else "the CPU")
            adopted = not profile and self._adopt(self._key(gpus, n, warm))
            zygote = None if profile or adopted else self._forking(say=True)
            how = (f" (prepared {time.time() - adopted.since:.0f} s ago for {adopted.where}"
                   f"{' and forked with their' if adopted.forked else ':'} imports done)" if adopted
                   else " (forked with their imports done ahead)" if zygote else "")
            print(f"gpuctx: starting {n} worker{'s' if n > 1 else ''} on {where}{how} …", flush=True)
            if not profile and not adopted:
                self._launch(ipp, gpus, n, warm, zygote=zygote, say=True)
            registered = self._wait_registered(n, deadline)
            self._registered_in = time.perf_counter() - t0
            if adopted and any(self._environ_diff):
                ar = self.client[:].apply_async(worker_side.take_environment, *self._environ_diff)
                worker_processes.wait_results([ar], deadline, self, "take the kernel's environment")
            self._identify(registered, place, deadline)
            self._boot(master_addr, warm, deadline)
        except BaseException:
            self._teardown()
            raise
        self.ready_in = time.perf_counter() - t0
        self.started = time.time()
        self.prepared = None
        print(self._ready_line())

    def stop(self) -> str:
        """Stop every worker and the controller; what was stopped, in one line."""
        under_way = self._await_prepare(time.monotonic() + self.stop_wait, stopping=True)
        if under_way:
            return f"gpuctx: the workers being prepared for `{under_way}` stop as soon as their start ends"
        if not self.running and self.cluster is None:
            return "gpuctx: no workers are running"
        if not self.running and self.prepared is not None:
            line = self.prepared.line
            self._teardown()
            self.prepare_note = f"the workers prepared for `{line}` were stopped by `%gpu workers stop`"
            return f"gpuctx: stopped the workers prepared for `{line}` and their ipyparallel controller"
        n = len(self.ranks)
        self._teardown()
        return f"gpuctx: stopped {n} worker{'s' if n != 1 else ''} and their ipyparallel controller"

    # -- starting ------------------------------------------------------------------------------------
    def _local_placement(self, which, cpu: bool, share: bool) -> Placement:
        from importlib.util import find_spec

        placement = choose(which, inventory.take(), cpu)
        if placement.gpus and not share:
            check_free(placement.gpus, inventory.take())
        if find_spec("torch") is None:
            raise UsageError("the workers run torch.distributed, and torch is not installed in this kernel's "
                             "environment: install torch (a CUDA build for GPUs)")
        return placement

    def _new_cluster(self, ipp, **kwargs):
        self.cluster = ipp.Cluster(shutdown_atexit=False, log=log, **kwargs)
        if not self._atexit:
            atexit.register(self._at_exit)
            self._atexit = True
        return self.cluster

    def _ours(self) -> dict[str, str]:
        return {worker_side.ENV_PARENT: worker_side.parent_token()}

    def _launch_local(self, ipp, gpus, n: int, warm: bool, prepared: bool = False, zygote=None) -> None:
        """The controller and one engine set per worker, each with its own environment: its rank
        and, by UUID, its one GPU. The engines do not wait for the controller's connection info,
        so their imports and warm-up overlap the controller's start. With `zygote`, the engines
        are forked from the imports it did (kernel/worker_zygote.py)."""
        self._private_profile = tempfile.mkdtemp(prefix="gpuctx-workers-")
        from .worker_launchers import launchers

        cluster = self._new_cluster(ipp, profile_dir=self._private_profile, load_profile=False, cluster_file="",
                                    send_engines_connection_env=False,  # no cluster file: nothing to reconnect to
                                    controller_args=[*HEARTBEAT_ARGS, self._registration_arg()],
                                    **launchers(forked=zygote is not None))
        own = dict(self._ours(), **{worker_side.ENV_FOLDER: self._private_profile})  # removed when the kernel is gone
        cluster.start_controller_sync(controller_cmd=[sys.executable, "-m", ENTRY, "controller"], environment=own)
        self._remember(cluster.controller)
        common = dict(self._ours(), **{worker_side.ENV_WARM: ("prepare" if prepared else "1") if warm else "0"})
        if n > 1 and "OMP_NUM_THREADS" not in os.environ:
            common["OMP_NUM_THREADS"] = "1"  # as torchrun does: N processes, not N × cores threads
        for rank in range(n):
            env = dict(common, **{worker_side.ENV_RANK: str(rank),
                                  "CUDA_VISIBLE_DEVICES": gpus[rank].record.uuid if gpus else ""})
            set_id = cluster.start_engines_sync(
                1, engine_set_id=f"rank{rank}", environment=env, engine_cmd=[sys.executable, "-m", ENTRY, "engine"],
                # (registration too: ipyparallel's own 5 s ended an engine whose controller, on a
                # loaded machine, answered later, after the engine's imports were done ahead)
                engine_args=[f"--IPEngine.wait_for_url_file={self.start_timeout:g}",
                             f"--IPEngine.timeout={self.start_timeout:g}", *LOCAL_ENGINE_ARGS])
            for launcher in cluster.engines[set_id].launchers.values():
                self._remember(launcher)

    def _registration_arg(self) -> str:
        """The controller waits for a registered worker's heart as long as the start waits (its own
        30 s dropped a worker that built its kernel slowly, its imports' thread holding the GIL on
        a loaded machine: the start then waited its whole start_timeout for it)."""
        return f"--IPController.registration_timeout={max(30, math.ceil(self.start_timeout))}"

    def _remember(self, launcher) -> None:
        """A local process ipyparallel started: ended at teardown even if ipyparallel cannot."""
        import psutil

        pid = getattr(launcher, "pid", -1)
        if isinstance(pid, int) and pid > 0:
            try:
                self._processes.append(psutil.Process(pid))
            except psutil.Error:
                pass

    def _connect(self, deadline: float):
        """ipyparallel's client to the workers' controller. Its hub may answer late on a loaded
        machine (ipyparallel's client gives up after 10 s): asked again while the controller runs,
        until `deadline`; a controller that ended is a one-line UsageError saying how."""
        while True:
            try:
                try_s = max(1.0, min(CONNECT_TRY_S, deadline - time.monotonic()))
                return self.cluster.connect_client_sync(timeout=try_s)
            except TimeoutError:
                failed = self.ended(controller_only=True)
                if failed or time.monotonic() >= deadline:
                    raise UsageError(one_line(failed or f"the workers' controller did not answer within "
                                              f"{self.start_timeout:g} s (c.GpuWorkers.start_timeout)")) from None

    def _wait_registered(self, n: int, deadline: float) -> list[int]:
        """Connect a client and wait until `n` engines have registered; a worker that exits first,
        or the deadline, is a one-line UsageError with the last line the worker wrote."""
        if self.client is None:
            self.client = self._connect(deadline)
        waiting = self.client.wait_for_engines(n, block=False, timeout=max(1.0, deadline - time.monotonic()),
                                               interactive=False)
        while True:
            try:
                waiting.result(timeout=0.2)
                return sorted(self.client.ids)
            except concurrent.futures.TimeoutError:  # (since 3.11 the built-in one: the poll's, or the wait's own)
                if waiting.done():
                    raise UsageError(f"{len(self.client.ids)} of {n} workers started within {self.start_timeout:g} s "
                                     f"(c.GpuWorkers.start_timeout): "
                                     f"{self._last_words() or 'no word from the others'}") from None
            except Exception as exc:  # ipyparallel's EngineError: a worker stopped before it registered
                raise UsageError(one_line(self.ended() or f"{type(exc).__name__}: {exc}")) from None
            failed = self.ended()
            if failed:
                raise UsageError(one_line(failed))

    def ended(self, controller_only: bool = False) -> str:
        """Which process of the workers has ended (their controller, a worker), and how; or ""."""
        return worker_processes.failure(self.cluster, self._processes, controller_only)

    def _last_words(self) -> str:
        for engine_set in self.cluster.engines.values():
            out = worker_processes.last_line(engine_set.get_output())
            if out:
                return out
        return ""

    def _identify(self, engines: list[int], place: str, deadline: float) -> None:
        """Ask every engine who it is; ranks: as the kernel gave them, else by host (in the order
        the hosts' first engines registered) and local slot."""
        ar = self.client[engines].apply_async(worker_side.identity)
        infos = dict(zip(engines, worker_processes.wait_results([ar], deadline, self, "say who they are")[0], strict=True))
        me = (worker_side.boot_id(), worker_side.pid_namespace())  # its PIDs are ours: this machine, this container
        problems = [i["problem"] for i in infos.values() if i["problem"]]
        if problems:
            raise UsageError(one_line(problems[0]))
        if place or any(i["rank"] is None for i in infos.values()):
            hosts = list(dict.fromkeys(infos[e]["host"] for e in engines))
            order = sorted(engines, key=lambda e: (hosts.index(infos[e]["host"]), infos[e]["slot"] or 0, e))
        else:
            order = sorted(engines, key=lambda e: int(infos[e]["rank"]))
        inv = inventory.take()
        by_uuid = {d.record.uuid: d.ordinal for d in inv.devices}
        local_ranks: dict[str, int] = {}
        self.ranks, on = [], {}
        for rank, engine in enumerate(order):
            info = infos[engine]
            local_rank = local_ranks.get(info["host"], 0)
            local_ranks[info["host"]] = local_rank + 1
            local = (info["boot_id"], info.get("pid_ns", "")) == me
            self.ranks.append(Worker(rank, engine, info["pid"], info["host"], local, local_rank, info["gpu"],
                                     info["gpu_name"], by_uuid.get(info["gpu"]) if local else None))
            if info["gpu"] in on:  # (a UUID names one GPU on every machine)
                raise UsageError(one_line(
                    f"ranks {on[info['gpu']]} and {rank} were both given GPU {info['gpu']} on {info['host']} (local "
                    f"slot {info['slot']}, from {info['slot_from']}): one rank per GPU — the profile's launcher must "
                    "give each engine on a host a local rank of its own"))
            if info["gpu"]:
                on[info["gpu"]] = rank
        kinds = {bool(w.uuid) for w in self.ranks}
        if len(kinds) > 1:
            lacking = [str(w.rank) for w in self.ranks if not w.uuid]
            raise UsageError(f"ranks {', '.join(lacking)} found no GPU while the others have one: every worker needs "
                             "one (or start them all with --cpu)")
        self.backend = "nccl" if kinds == {True} else "gloo"

    def _boot(self, master_addr: str | None, warm: bool, deadline: float) -> None:
        """torch.distributed on every rank at once (worker_side.boot), once each has warmed up."""
        hosts = {w.host for w in self.ranks}
        addr = master_addr or ("127.0.0.1" if len(hosts) == 1 else self.ranks[0].host)
        first = self.ranks[0]
        port = worker_processes.wait_results([self.client[first.engine].apply_async(worker_side.free_port)], deadline, self,
                            "pick a port")[0]
        self.rendezvous = f"{addr}:{port}"
        per_host = {h: sum(1 for w in self.ranks if w.host == h) for h in hosts}
        ars = [self.client[w.engine].apply_async(worker_side.boot, w.rank, w.local_rank, len(self.ranks),
                                                 per_host[w.host], addr, port, self.backend, warm)
               for w in self.ranks]
        for w, result in zip(self.ranks, worker_processes.wait_results(ars, deadline, self, "join torch.distributed"), strict=True):
            w.state, w.phases, w.warm = "ready", result["phases"], result["warm"]

    def _ready_line(self) -> str:
        n = len(self.ranks)
        who = ", ".join(w.label for w in self.ranks[:8]) + (f", … ({n - 8} more)" if n > 8 else "")
        slowest: dict[str, float] = {"start-up": self._registered_in}
        for w in self.ranks:
            for phase, seconds in w.phases.items():
                slowest[phase] = max(slowest.get(phase, 0.0), seconds)
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in slowest.items())
        return (f"gpuctx: {n} worker{'s' if n > 1 else ''} ready in {self.ready_in:.1f} s — {who}; "
                f"torch.distributed {self.backend}, world size {n}" + (f" ({phases})" if phases else "")
                + "; `%%on_gpu all` runs a cell on them")

    # -- stopping -----------------------------------------------------------------------------------------
    def _teardown(self) -> None:
        """Stop the workers and the controller through ipyparallel, then end whatever local
        process it started that still runs. That takes seconds after an interrupted start, and
        runs in a thread of its own: another interrupt meanwhile (a second press) is raised once
        it is done, never halfway, with the workers already forgotten and still running."""
        with self._lock:
            cluster, client, processes = self.cluster, self.client or getattr(self.prepared, "client", None), self._processes
            self.cluster, self.client, self._processes, self.ranks = None, None, [], []
            self.backend = self.rendezvous = self.profile = ""
            self.started = self.ready_in = self.prepared = None
            private, self._private_profile = self._private_profile, None
        if cluster is None and client is None and not processes and not private:
            return
        if cluster is not None:  # ipyparallel is loaded: a process still starting for it ends as it starts
            from .worker_launchers import abandon

            abandon(cluster.cluster_id)
        ending = threading.Thread(target=self._end, args=(cluster, client, processes, private),
                                  name="gpuctx-workers-teardown", daemon=True)
        ending.start()
        interrupted = False
        while ending.is_alive():
            try:
                ending.join()
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt

    @staticmethod
    def _end(cluster, client, processes, private) -> None:
        """What `_teardown` took: stopped and removed; never raises."""
        if cluster is not None:
            worker_processes.stop_cluster(cluster)  # then the folder can go: ipyparallel has read their logs
        if client is not None:
            try:
                client.close(linger=0)
            except Exception:  # noqa: BLE001
                pass
        worker_processes.end_processes(processes)
        if private:
            shutil.rmtree(private, ignore_errors=True)
        if cluster is not None:
            for path in worker_processes.slot_locks(cluster.cluster_id):
                try:
                    os.remove(path)
                except OSError:
                    pass

    def _at_exit(self) -> None:
        """The kernel exits (shutdown, restart): end the workers at once; no waiting on ipyparallel."""
        client, processes = self.client, self._processes
        if client is not None and any(not w.local for w in self.ranks):
            try:
                client.shutdown(targets="all", hub=False, block=False)
            except Exception:  # noqa: BLE001
                pass
        for proc in processes:
            try:
                proc.send_signal(signal.SIGTERM)
            except Exception:  # noqa: BLE001
                pass
        if self._private_profile:  # once they are gone: ipyparallel writes there as it stops
            import psutil

            psutil.wait_procs(processes, timeout=3)
            shutil.rmtree(self._private_profile, ignore_errors=True)

    def died(self) -> list[Worker]:
        """The ranks whose process is gone (local: its PID; remote: unregistered)."""
        if self.client is None:
            return []
        ids = set(self.client.ids)
        gone = []
        for w in self.ranks:
            if w.engine not in ids or (w.local and not worker_processes.pid_runs(w.pid)):
                gone.append(w)
        return gone

    def exit_words(self, w: Worker, wait: float = 1.0) -> str:
        """How a local worker's process ended, as ", killed by SIGKILL" (or "" when unknown)."""
        engine_set = self.cluster.engines.get(f"rank{w.rank}") if self.cluster is not None else None
        return worker_processes.exit_words(engine_set, wait)

    # -- listing ---------------------------------------------------------------------------------------
    def rows(self) -> tuple[list[str], list[list[str]]]:
        inv = inventory.take() if any(w.local and w.uuid for w in self.ranks) else None
        dead = {w.rank for w in self.died()}
        multi = len({w.host for w in self.ranks}) > 1
        header = ["rank", *(["host"] if multi else []), "GPU", "pid", "state", "GPU memory"]
        rows = []
        for w in self.ranks:
            state = "died" if w.rank in dead else w.state
            rows.append([str(w.rank), *([w.host] if multi else []), w.device, str(w.pid), state, self._memory(w, inv)])
        return header, rows

    def _memory(self, w: Worker, inv) -> str:
        if not w.uuid:
            return "– (CPU)"
        used = None
        if inv is not None and w.local:
            pids = {w.pid, *descendants(w.pid)}
            pids |= {alias for p in list(pids) for alias in ns_pids(p)}
            found = [p.used_memory or 0 for d in inv.devices for p in d.record.processes if p.pid in pids]
            used = sum(found) if found else 0
        elif w.memory.get("nvml") is not None:
            used = w.memory["nvml"]
        torch = [f for f in w.memory.get("allocators", []) if f.get("framework") == "torch"]
        text = gib(used) if used is not None else "–"
        if torch:
            text += f" (torch {gib(torch[0]['allocated'])} allocated, {gib(torch[0]['reserved'])} reserved"
            text += ", at its last cell)" if not w.local else ")"
        return text

    def summary_lines(self) -> list[str]:
        lines = [f"torch.distributed: {self.backend}, world size {len(self.ranks)}, rendezvous {self.rendezvous}"]
        cut_off = self.ended(controller_only=True)
        if cut_off:  # (the next cell stops them and says so)
            lines.insert(0, f"{cut_off}: nothing reaches the workers; `%gpu workers stop`, then `%gpu workers start`")
        if self.started:
            lines.append(f"ready in {self.ready_in:.1f} s, {ago(time.time() - self.started)}; {self.cells} "
                         f"cell{'s' if self.cells != 1 else ''} run with %%on_gpu")
        if self.ranks and self.ranks[0].warm:
            lines.append(f"rank 0's warm-up: {self.ranks[0].warm}")
        lines.append(f"started by ipyparallel profile {self.profile!r}" if self.profile
                     else "local processes of this kernel: they end with it")
        lines.append("`%%on_gpu all` runs a cell on every rank; `%gpu workers stop` ends them")
        return lines

    def report(self) -> Report:
        if not self.running:
            extra = [line for line in (self.prepared_line(), self.imports_line()) if line]
            prep = self.prepared
            return Report([Section("workers", lines=["none: `%gpu workers start all` starts one per GPU "
                                                     "(a count for CPU workers)"] + extra)],
                          data={"workers": [], "prepared": None if prep is None else {
                              "line": prep.line, "where": prep.where, "since": prep.since, "on": prep.on,
                              "pids": [p.pid for p in self._processes], "forked": prep.forked},
                              "prepare_note": self.prepare_note, "imports": self.imports_data()})
        header, rows = self.rows()
        return Report([Section(f"workers ({len(self.ranks)})", header, rows, lines=self.summary_lines())],
                      data={"workers": [w.__dict__ | {"device": w.device} for w in self.ranks],
                            "backend": self.backend, "rendezvous": self.rendezvous})

    def extend_status(self, report: Report) -> Report:
        """`%gpu status` with a section on the workers, when there are any."""
        if self.running:
            header, rows = self.rows()
            report.sections.append(Section("this notebook's workers", header, rows, lines=self.summary_lines()[:1]))
            report.data["workers"] = [{"rank": w.rank, "device": w.device, "pid": w.pid, "host": w.host}
                                      for w in self.ranks]
        elif line := self.prepared_line():
            report.sections.append(Section("this notebook's workers", lines=[line]))
        return report

    # -- %%on_gpu all ---------------------------------------------------------------------------------
    def select(self, spec: str) -> list[Worker]:
        """The ranks `%%on_gpu SPEC` runs on: all of them, or those on the GPUs named (as this
        notebook numbers them; for CPU or remote workers, numbers are ranks)."""
        if not self.running:
            raise UsageError("no workers are running: `%gpu workers start all` starts one per GPU "
                             "(`%gpu workers start 2` two CPU workers without a GPU)")
        return select_ranks(self.ranks, spec)

    def run_cell(self, args, cell: str):
        from .worker_cells import CellRun

        if args.default or args.time or args.mem:
            raise UsageError("--default, --time and --mem are for one GPU of this kernel; on the workers time and "
                             "measure inside the cell")
        chosen = self.select(args.spec)
        return CellRun(self, chosen, cell, timeout=args.timeout).run()

