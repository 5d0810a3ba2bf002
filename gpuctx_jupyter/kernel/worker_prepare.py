"""Workers started ahead for the notebook's `%gpu workers start ARGS` line: once the kernel's warm
plan has read the notebook, before the line runs (kernel/extension.py calls `prepare_for`). They
are ipyparallel engines like any worker (kernel/workers.py starts them), importing the notebook's
imports at the lowest CPU priority, with no CUDA and no GPU memory; the line adopts them when
they are what it asks for now, else stops them and says why.

`Preparing` is the half of GpuWorkers that does this: it uses the placement, the launch and the
teardown of kernel/workers.py.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass

from IPython.core.error import UsageError
from traitlets import Bool, Float
from traitlets.config import Configurable

from ..core import host_memory
from .commands import one_line
from .render import gib

PREPARED_RSS = 2**30  # a prepared worker's host memory, about (torch, torch._dynamo and ipyparallel imported)
# The kernel's environment changed since the workers were prepared, in a variable read when a
# library is imported or CUDA starts: the prepared workers (imports done) would not see it, so new
# ones start. Other changes are applied to the prepared workers' os.environ as they are adopted.
IMPORT_TIME_ENV = ("CUDA_", "PYTORCH_", "TORCH", "OMP_", "MKL_", "LD_", "PYTHON", "NVIDIA_", "XLA_", "JAX_",
                   "TF_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
# ... except these, read when they are used: torch sets TORCHINDUCTOR_CACHE_DIR itself (to its
# default) the first time inductor looks for its cache, in the kernel as in the workers.
READ_WHEN_USED = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def read_at_import(name: str) -> bool:
    return name.startswith(IMPORT_TIME_ENV) and name not in READ_WHEN_USED


def start_line(args: str) -> str:
    return f"%gpu workers start {args}".rstrip()


@dataclass
class Prepared:
    """Workers started ahead for the notebook's `%gpu workers start ARGS`, before the line runs."""

    args: str  # the notebook's ARGS
    where: str  # its line, "cell 2, line 1"
    count: int  # how many workers
    key: tuple  # what they were started for: GPU UUIDs (or the CPU count), warm
    environ: dict  # the kernel's environment then
    cwd: str
    since: float  # time.time() when they were started
    on: str  # "cuda:0, cuda:1", "the CPU"
    forked: bool = False  # forked from the workers' imports done ahead (kernel/worker_zygote.py)
    client: object = None  # ipyparallel's client to them: asked how far their imports are; the line's own

    @property
    def line(self) -> str:
        return start_line(self.args)


class Preparing(Configurable):
    """Settable as `c.GpuWorkers.<trait>`."""

    prepare = Bool(
        True, help="""Start the workers a notebook's `%gpu workers start` line asks for once the kernel has
        read the notebook, before the line runs: engines registered and the notebook's imports done (at low
        CPU priority), no CUDA and no GPU memory; the line then only warms CUDA and joins torch.distributed.
        Local workers only (not --profile); they end with the kernel like any worker.""",
    ).tag(config=True)

    prepare_memory_share = Float(
        0.2, help="""Prepared workers start only where their host memory (about 1 GiB each) fits in this share
        of the memory available to the kernel (its container's limit where one applies).""",
    ).tag(config=True)

    stop_wait = 10.0  # seconds `%gpu workers stop` waits for a prepare under way (then it stops them itself)

    def _init_prepared(self) -> None:
        self.prepared: Prepared | None = None  # the workers started ahead for the notebook's line
        self.prepare_note = ""  # why none were, or what became of them
        self._prepare_thread: threading.Thread | None = None
        self._environ_diff: tuple[dict, list] = ({}, [])  # what the kernel's environment gained, lost since
        self.fork_note = ""  # why the workers' imports done ahead were not used
        self._asked_by_hand = False  # `%gpu workers start` or `stop` ran: no workers are prepared again
        self._preparing = ""  # the line whose workers the prepare under way starts ("" once it has ended)
        self._stop_prepared = False  # `%gpu workers stop` came while they were being prepared

    def prepare_for(self, args: str, where: str = "") -> bool:
        """Start, in the background, the workers the notebook's `%gpu workers start ARGS` (at
        `where`) asks for: registered, imports done, no CUDA. False when none start (already
        running or prepared, or turned off)."""
        if not self.prepare:
            self.prepare_note = "not prepared ahead (c.GpuWorkers.prepare is off)"
            return False
        with self._lock:  # (the line's start or stop takes it too: a prepare starts before them, or never)
            if (self._asked_by_hand  # (a plan carried out again, after a suspend, names the line still)
                    or self.running or self.cluster is not None or self._prepare_thread is not None):
                return False
            self._preparing = start_line(args)
            self._prepare_thread = threading.Thread(target=self._prepare, args=(args, where),
                                                    name="gpuctx-workers-prepare", daemon=True)
            self._prepare_thread.start()
        return True

    def _prepare(self, text: str, where: str) -> None:
        line = start_line(text)
        try:
            from . import commands as cmds

            args = cmds.parse(cmds.lookup("workers"), ["start", *cmds.split(text)])
            if args.profile:
                self.prepare_note = (f"`{line}` ({where}) is not prepared ahead: with --profile, ipyparallel's "
                                     "launchers start the workers when the line runs")
                return
            from .workers import require_ipyparallel  # (it imports this module)

            ipp = require_ipyparallel()
            placement = self._local_placement(args.which, args.cpu, args.share)
            n = placement.count
            room = host_memory.available()
            if room is not None and n * PREPARED_RSS > self.prepare_memory_share * room.available:
                self.prepare_note = (f"`{line}` ({where}) is not prepared ahead: {n} workers need about "
                                     f"{gib(n * PREPARED_RSS)} of host memory, more than "
                                     f"{self.prepare_memory_share:.0%} of the {gib(room.available)} available "
                                     "(c.GpuWorkers.prepare_memory_share)")
                return
            warm = not args.no_warm
            environ, cwd = dict(os.environ), os.getcwd()

            def launch():
                forked = self._launch(ipp, placement.gpus, n, warm, prepared=True, zygote=self._forking(say=False))
                return forked, self._connect(time.monotonic() + self.start_timeout)

            forked, client = _as_in_a_cell(launch)
            on = ", ".join(f"cuda:{d.ordinal}" for d in placement.gpus) or "the CPU"
            self.prepared = Prepared(text, where, n, self._key(placement.gpus, n, warm), environ, cwd, time.time(), on,
                                     forked=forked, client=client)
            self.prepare_note = ""
        except UsageError as exc:
            self.prepare_note = one_line(f"`{line}` ({where}) is not prepared ahead: {exc}")
        except Exception as exc:  # noqa: BLE001 — the line itself starts them then, and says what fails
            self.prepare_note = one_line(f"`{line}` ({where}) is not prepared ahead: {type(exc).__name__}: {exc}")
        finally:
            self._end_prepare(line)

    def _end_prepare(self, line: str) -> None:
        """Nothing half-started stays, nor what `%gpu workers stop` asked meanwhile to stop; then
        the prepare is over (decided under the lock the line's start and stop wait on)."""
        while True:
            with self._lock:
                stop = self._stop_prepared
                if not ((self.prepared is None or stop) and self.cluster is not None and not self.running):
                    self._preparing = ""
                    break
            self._teardown()
        if stop:
            self.prepare_note = f"the workers prepared for `{line}` were stopped by `%gpu workers stop`"

    def _forking(self, say: bool):
        """The workers' imports done ahead to fork the workers from (kernel/worker_zygote.py), or
        None: there are none, or the kernel's environment has changed since they were done (then
        they end, and why is said: printed with `say`, else in `%gpu workers`)."""
        from . import worker_zygote

        zygote = worker_zygote.current()
        if zygote is None:
            return None
        why = zygote.unsuited()
        if why:
            self.fork_note = f"the workers were not forked from the imports done ahead: {why}"
            if say:
                print(f"gpuctx: {self.fork_note}", flush=True)
            worker_zygote.stop()
            return None
        zygote.timeout = self.start_timeout
        return zygote

    def _launch(self, ipp, gpus, n: int, warm: bool, prepared: bool = False, zygote=None, say: bool = False) -> bool:
        """Start the local workers, forked from `zygote` where given (True then); when forking
        fails, what it started ends, why is noted (printed with `say`) and they start the usual way."""
        if zygote is not None:
            from . import worker_zygote

            try:
                self._launch_local(ipp, gpus, n, warm, prepared=prepared, zygote=zygote)
                return True
            except worker_zygote.ForkError as exc:
                try:
                    self._teardown()
                finally:
                    worker_zygote.stop()
                self.fork_note = one_line(f"the workers could not be forked from the imports done ahead ({exc}): "
                                          "they start the usual way")
                if say:
                    print(f"gpuctx: {self.fork_note}", flush=True)
        self._launch_local(ipp, gpus, n, warm, prepared=prepared)
        return False

    def imports_line(self) -> str:
        """What `%gpu workers` says of the workers' imports done ahead, or why they were not used."""
        from . import worker_zygote

        zygote = worker_zygote.current()
        return zygote.line() if zygote is not None else self.fork_note

    @staticmethod
    def imports_data() -> dict | None:
        from . import worker_zygote

        zygote = worker_zygote.current()
        return None if zygote is None else {"pid": zygote.pid, "imported": zygote.imported(), "forked": zygote.forked}

    def _await_prepare(self, deadline: float, stopping: bool = False) -> str:
        """The user asked by hand (`%gpu workers start` or `stop`): nothing is prepared from now on,
        and a prepare under way is waited for, until `deadline` (Interrupt ends the wait): its
        workers are then adopted or stopped. Nothing else starts beside one still under way then:
        a start is a UsageError; a stop leaves it to stop what it started as it ends, and gets the
        line it was for ("" when none is under way)."""
        with self._lock:
            self._asked_by_hand = True
            thread = self._prepare_thread
        if thread is None:
            return ""
        thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            under_way = self._preparing
            if not under_way:
                self._prepare_thread = None
                return ""
            self._stop_prepared = self._stop_prepared or stopping
        if stopping:
            return under_way
        raise UsageError(f"the workers prepared ahead for `{under_way}` are still starting after "
                         f"{self.start_timeout:g} s (c.GpuWorkers.start_timeout): run the line again once "
                         "`%gpu workers` lists them, or `%gpu workers stop` them")

    @staticmethod
    def _key(gpus, n: int, warm: bool) -> tuple:
        return (tuple(d.record.uuid for d in gpus) if gpus else n, warm)

    def _adopt(self, key: tuple) -> Prepared | None:
        """The prepared workers, when they are what this start asks for and the kernel's working
        directory and environment are as they were (changes read at import time are not); else
        they are stopped (and why is said) and None."""
        prep = self.prepared
        if prep is None or self.cluster is None:
            return None
        ended = self.ended()
        if ended:
            self._drop_prepared(ended)
            return None
        if prep.key != key:
            self._drop_prepared(f"they were started for `{prep.line}` ({prep.where})")
            return None
        if os.getcwd() != prep.cwd:
            self._drop_prepared(f"the kernel's working directory changed since ({prep.cwd} → {os.getcwd()})")
            return None
        now = dict(os.environ)
        changed = sorted(k for k in set(now) | set(prep.environ) if now.get(k) != prep.environ.get(k))
        late = [k for k in changed if read_at_import(k)]
        if late:
            self._drop_prepared(f"the notebook set {', '.join(late[:4])}{' …' if len(late) > 4 else ''} after they "
                                "had imported what reads it")
            return None
        self._environ_diff = ({k: now[k] for k in changed if k in now}, [k for k in changed if k not in now])
        self.client = prep.client
        return prep

    def _drop_prepared(self, why: str) -> None:
        if self.prepared is None:
            return
        print(f"gpuctx: stopping the workers prepared for `{self.prepared.line}`: {why}; starting new ones", flush=True)
        self.prepare_note = f"the prepared workers were stopped: {why}"
        self._teardown()

    def prepared_line(self) -> str:
        """What was started ahead for the notebook's `%gpu workers start` line, or why nothing was."""
        prep = self.prepared
        if prep is not None:
            ended = self.ended()
            if ended:
                return (f"prepared for `{prep.line}` ({prep.where}) {time.time() - prep.since:.0f} s ago, but {ended}: "
                        "the line stops them and starts new ones")
            how = "forked with imports done ahead" if prep.forked else "the notebook's imports at low CPU priority"
            return (f"prepared for `{prep.line}` ({prep.where}) {time.time() - prep.since:.0f} s ago: {prep.count} worker"
                    f"{'s' if prep.count != 1 else ''} for {prep.on} ({how}), no CUDA, no GPU memory until the line "
                    f"adopts them — {self._ranks_state(prep)}")
        under_way = self._preparing
        if under_way:
            if self._stop_prepared:
                return f"the workers being prepared for `{under_way}` stop as soon as their start ends"
            return "preparing the workers the notebook's `%gpu workers start` line asks for …"
        return self.prepare_note

    @staticmethod
    def _ranks_state(prep: Prepared, wait: float = 1.0) -> str:
        """How far each prepared worker's imports are, as the workers say it (within `wait` s)."""
        from . import worker_side

        ids = sorted(prep.client.ids)
        if len(ids) < prep.count:
            return f"{len(ids)} of {prep.count} registered"
        try:
            states = prep.client[ids].apply_async(worker_side.warm_state).get(timeout=wait)
        except Exception as exc:  # noqa: BLE001 — a busy or ending worker: say so, never fail the status
            return f"no answer from the workers within {wait:g} s ({type(exc).__name__})"
        said = []
        for st in sorted(states, key=lambda st: int(st["rank"] or 0)):
            if st["state"] == "running":
                doing = f"importing ({st['phase']})" if st["phase"] else "importing"
            elif st["state"] == "failed":
                doing = f"warm-up failed: {st['detail']}"
            elif st["state"] == "off":
                doing = "no warm-up"
            else:
                doing = f"imports done in {st['total']:.1f} s" if st["total"] is not None else "imports done"
            said.append(f"rank {st['rank']}: {doing}")
        return "; ".join(said)


def _as_in_a_cell(fn):
    """fn() with an asyncio loop running in this thread, as a cell runs in a kernel: ipyparallel's
    `_sync` calls then run on the cluster's own thread and loop, which live as long as the cluster,
    and its launchers notice their processes' ends (called from a thread without one, they ran on a
    loop closed once the call returned: a prepared worker that died was never noticed)."""
    async def call():
        return fn()

    return asyncio.run(call())
