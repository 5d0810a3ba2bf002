"""When the warm-up runs, and how it gives way to the user: the one warm-up thread of a kernel.

The thread carries out a plan (`plan.py`): by default what the kernel's notebook will run first,
or the fixed `basic` recipe; what each framework's GPU steps do is its recipe's (`recipes/`). Then
it exits: its cuBLAS and cuDNN handles go back to torch's pools, so it leaves no extra GPU memory;
what is kept per thread is then done in the cells' thread (cells_thread.py).

A plan may be followed by another one while the thread runs (`replan`: the cells a frontend holds
as they are typed, contract/cells.py): the thread takes it up after the batch of steps in hand, the
latest one asked for winning, and its steps done before are not done again (warm/typed.py).

It gives way to the user. It starts after the kernel's first kernel_info reply (readiness is not
delayed); it starts no step while a cell runs (its imports under way stand still: import_gate.py),
no heavy step (an import, torch._dynamo) until the user has been idle a moment; a cell importing
while the warm-up imports waits for that import (never a partially initialised module); once a
cell of the user's does GPU work, the warm-up does no more of its own. Failures: logged, not raised.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import threading
import time

from ...contract import DEFAULT_OPS, STANDBY
from ...core import cuda_driver, preload
from ...core import frameworks as fws
from .. import rng
from . import plan as plans
from . import side_threads as side
from .cells_thread import CellsThread
from .devices import cpu_batch, devices_of, gpu_batch, why_no_gpu_work, without_framework
from .import_gate import GATE, imports_packages
from .plan import Plan, Step
from .status import WarmState
from .stood_still import STOOD

log = logging.getLogger("gpuctx")
# A cell naming one of these does its own first GPU work: the warm-up does no more (two threads would each keep handles)
_GPU_CELL = re.compile(r"\b(?:cuda|cupy|jax|jnp|numba|on_gpu)\b|\.to\(\s*device\b|\bdevice\s*=")
# After a kernel_info reply, the warm-up starts once the kernel has had this long without another: a frontend
# connecting sends several, and an import holding the GIL must not delay the one that makes it say "ready".
START_GRACE_S = 0.25
LIGHT_IDLE_S = 0.2  # after a cell: the user idle this long before a light step (one GPU op)
HEAVY_IDLE_S = 1.0  # ... and this long before a heavy one (an import, torch._dynamo)


class Warmer:
    """Owns the one warm-up thread of this kernel, its plan and its record."""

    def __init__(self, switcher=None):
        self.switcher = switcher
        self.status = WarmState()
        self.plan: Plan | None = None  # what the running or last warm-up does (as_dict(), lines())
        self.import_budget = plans.IMPORT_BUDGET_S
        # set from the turn of torch's CUDA start (the cuda_init step) until it has run: a cell or thread that starts
        # meanwhile waits for it (torch's init lock), then takes its device (switching.py, threads.py); set under
        # the cells' lock, so no cell starts unseen between
        self.starting_cuda = threading.Event()
        self._stop_asked = False  # this warm-up takes no further step (stop()): `_stopped` says why
        self._stopped, self._for_good = "", False  # for good: gpuctx unloaded, no later plan starts
        self.held = lambda: False  # no plan starts while true: a suspend under way (kernel/suspend.py)
        self._thread: threading.Thread | None = None
        self._pending: tuple | None = None  # a start scheduled for the kernel's first kernel_info reply
        self._grace: threading.Timer | None = None
        self._on_start = None
        self._under_way = threading.Event()  # set when the thread's first step has begun (or it ended)
        self._cell_waits = False  # the running cell waits on the warm-up: it does not pause for it
        self._lock, self._cond = threading.Lock(), threading.Condition()
        self._cells = 0  # cells executing now
        self._cells_started = 0  # cells started in all
        self._last_cell_end: float | None = None
        self._waiters = 0  # threads in wait(): the warm-up does not pause for them
        self._user_gpu = False  # a cell of the user's does GPU work: no more GPU work of ours
        self._holds_handles = False  # this thread holds library handles: it steps aside for a GPU cell
        self._importing: threading.Event | None = None  # set when the import in flight ends
        self._import_deadline = self._gate_base = 0.0  # (and the time held or stood still then: _deadline)
        self._cell_started: float | None = None
        self._background: list[threading.Event] = []  # imports running in the background
        self._flights: dict[threading.Event, float] = {}  # every import thread still running: when it began
        self._ordinals: list[int] | None = None  # the devices this warm-up works on
        self._next: tuple | None = None  # (make_plan(previous), source): the plan to carry out next
        self._exiting = False  # the thread has taken its last plan: a new one needs a new thread
        self.on_plan = None  # called with each plan once its set-up is applied (the workers it names are prepared)
        self.on_end = lambda: None  # called as each plan's steps have ended; never raises
        self.nice = False  # the thread yields the CPU to every other (a prepared worker's, a standby's)
        self._unniced: side.Unniced | None = None  # while it does: a thread that starts processes at the kernel's priority
        self.cells_thread = CellsThread()  # work left to the cells' thread (its loop: set by extension.load)

    @property
    def running(self) -> bool:
        return self._pending is not None or (self._thread is not None and self._thread.is_alive())

    # -- starting ----------------------------------------------------------------------------------
    def start(self, frameworks=("torch",), ops=DEFAULT_OPS, device: int | None = None, source: str = "%gpu warm",
              imports=()) -> bool:
        """Start the basic recipe now (False when a warm-up is already running)."""
        plan = plans.basic(tuple(frameworks), tuple(ops), tuple(imports))
        return self.start_plan(lambda: plan, device=device, source=source)

    def start_plan(self, make_plan, device: int | None = None, source: str = "", scheduled: bool = False) -> bool:
        """Start the thread on the plan `make_plan()` returns (called in the thread: reading a
        notebook never holds up the kernel). False when a warm-up is already running. A
        `scheduled` start (go()) keeps what the cells did since it was scheduled: a GPU cell of
        the user's, the first cell's wait."""
        with self._lock:
            if self._for_good or self.held() or (self._thread is not None and self._thread.is_alive()
                                                 and not self._exiting):
                return False
            self._stop_asked = False  # stopped for a suspend: a later plan (typed cells) may start
            self._pending, self._exiting = None, False
            overlap = self.status.first_cell_overlap if scheduled else None
            self.status = WarmState(state="running", source=source, device=device, phase="reading the plan",
                                    started=time.monotonic(), first_cell_overlap=overlap,
                                    after_cells=not scheduled and self._cells_started > 0)
            self._under_way.clear()
            if not scheduled:
                self._cell_started, self._user_gpu = None, False
            self._background, self._ordinals, self._holds_handles = [], None, False
            self._thread = threading.Thread(target=self._run, args=(make_plan, device), name="gpuctx-warmup",
                                            daemon=True)
            self._thread.start()
            return True

    def start_after(self, make_plan, source: str = "") -> None:
        """Start `make_plan`'s plan once the warm-up running or scheduled now has ended (a standby
        handed to another notebook: its own plan first, then that notebook's) — unless a cell of
        the user's has started by then: the user's cells do the rest, and no GPU work of ours
        (nor an emptied cache) comes after theirs."""
        cells = self._cells_started

        def later():
            while self.running:
                thread = self._thread
                thread.join(1.0) if thread is not None and thread.is_alive() else time.sleep(0.05)
            with self._cond:
                if self._cells_started != cells:
                    return
                self.start_plan(make_plan, source=source)

        threading.Thread(target=later, name="gpuctx-warmup-next", daemon=True).start()

    def replan(self, make_plan, source: str) -> bool:
        """Carry out `make_plan(previous plan)` next: at once when no warm-up runs (True), else once the
        running one has finished the batch of steps in hand (False); a later call replaces a plan not
        taken up yet. Its turns are the same: no step while a cell runs."""
        with self._lock:
            thread = self._thread
            alive = thread is not None and thread.is_alive()
            if self._pending is not None or (alive and not self._exiting):
                self._next = (make_plan, source)
                return False
        if alive:
            thread.join(2.0)  # it has taken its last plan and is ending: only its record is left to write
        return self.start_plan(lambda: make_plan(self.plan), source=source)

    def schedule(self, make_plan, device: int | None = None, source: str = "", within: float = 1.0,
                 on_start=None) -> None:
        """Start soon after `answered()` (the kernel's kernel_info replies) or after `within` s,
        whichever comes first; `on_start()` is called then."""
        with self._lock:
            self._pending, self._on_start = (make_plan, device, source), on_start
            self.status = WarmState(state="running", source=source, device=device, phase="starting")
            self._cell_started, self._user_gpu = None, False
        side.timer(within, self.go)

    def answered(self, grace: float = START_GRACE_S) -> None:
        """The kernel answered kernel_info: start once `grace` s pass without another answer."""
        with self._lock:
            if self._pending is None:
                return
            if self._grace is not None:
                self._grace.cancel()
            self._grace = side.timer(grace, self.go)

    def stop(self, why: str = "gpuctx was unloaded (%unload_ext)", for_good: bool = True, wait: float = 0.0) -> bool:
        """No further step (the one under way ends on its own) nor plan: for good when gpuctx is
        unloaded. Before a suspend the step under way and its imports get `wait` s to end; if they
        do not, the warm-up goes on as if not asked. Whether nothing of it runs now (an import left
        running past the import budget is not counted: it hangs, and would refuse every suspend)."""
        if for_good:
            self.cancel_scheduled()
        with self._cond:
            self._stop_asked, self._stopped, self._for_good = True, why, for_good or self._for_good
            self._cond.notify_all()
        end, thread = time.monotonic() + wait, self._thread
        if thread is not None:
            thread.join(wait)
        now = time.monotonic()
        flights = [d for d, began in list(self._flights.items()) if now - began < self.import_budget]
        for done in [*flights, self.cells_thread.idle]:
            done.wait(max(0.0, end - time.monotonic()))
        quiet = (not (thread is not None and thread.is_alive()) and all(d.is_set() for d in flights)
                 and self.cells_thread.idle.is_set())
        if not quiet and not for_good:
            with self._cond:
                self._stop_asked = self._for_good
        return quiet

    def cancel_scheduled(self) -> None:
        """Forget a scheduled start that has not begun (unloading)."""
        with self._lock:
            self._next = None
            if self._pending is not None:
                self._pending = None
                self.status = WarmState(detail="unloaded before it started")

    def go(self) -> bool:
        """Start a scheduled warm-up now; False when none was scheduled."""
        with self._lock:
            pending, self._pending = self._pending, None
            on_start, self._on_start = self._on_start, None
            if self._grace is not None:
                self._grace.cancel()
        if pending is None:
            return False
        if on_start is not None:
            on_start()
        return self.start_plan(*pending, scheduled=True)

    def wait(self, timeout: float | None = None) -> WarmState:
        """Until the warm-up has finished (or `timeout`). A scheduled warm-up starts now, and this
        returns no sooner than it is under way; it does not pause for the cell that waits."""
        with self._cond:
            self._waiters += 1
            self._cell_waits = self._cells > 0
            self._regate()
            self._cond.notify_all()
        try:
            if self.go():
                self._under_way.wait(0.5)
            thread = self._thread
            if thread is not None:
                thread.join(timeout)
        finally:
            with self._cond:
                self._waiters -= 1
                self._regate()
        return self.status

    def plan_lines(self) -> list[str]:
        """`%gpu status`'s plan: a header, a line per step (and the notebook line asking), notes."""
        return self.plan.lines() if self.plan is not None else []

    # -- cell events ------------------------------------------------------------------------------
    def cell_started(self, source: str = "") -> None:
        source = source or ""
        with self._cond:
            self._cells += 1
            self._cells_started += 1
            if not self.running:  # (work left to the cells' thread is given up for a GPU cell of the user's)
                self.cells_thread.user_gpu |= bool(self.cells_thread.pending and _GPU_CELL.search(source))
                return
            if self._cell_started is None and self.status.first_cell_overlap is None:
                self._cell_started = time.monotonic()
            if _GPU_CELL.search(source):
                self._user_gpu = True
                self._cond.notify_all()
            importing, deadline = self._importing, self._deadline
            thread = self._thread if self._stepping_aside else None
        if thread is not None:
            # Let the thread exit first, so the cell's thread gets its handles from torch's pools.
            thread.join(1.0)
        if importing is not None and not importing.is_set() and imports_packages(source):
            # The cell may need what is being imported: let it finish first (unheld), never a half-imported package.
            GATE.open()
            self.status.cell_waits = self.status.phase
            try:  # in slices: a signal another thread received (Interrupt) is seen between them
                while not importing.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
                    if time.monotonic() >= deadline:
                        break
            finally:  # (an Interrupt meanwhile stops the cell: state.py)
                self.status.cell_waits = ""
                with self._cond:
                    self._regate()
            return
        with self._cond:  # then the warm-up's imports stand still until no cell runs
            self._regate()

    def _regate(self) -> None:
        """Hold the warm-up's imports while a cell runs that does not wait on it (import_gate.py)."""
        (GATE.close if self._cells and not (self._waiters or self._cell_waits) else GATE.open)()

    @property
    def _deadline(self) -> float:
        """When the import budget is spent: time held for cells or stood still (stood_still.py) not counted."""
        return self._import_deadline + GATE.held() + STOOD.seconds - self._gate_base

    @property
    def _stepping_aside(self) -> bool:
        return self._user_gpu and self._holds_handles

    def cell_finished(self) -> None:
        with self._cond:
            self._cells, self._cell_waits = max(0, self._cells - 1), False
            self._last_cell_end = time.monotonic()
            self._regate()
            if self._cell_started is not None and self.running and self.status.first_cell_overlap is None:
                self.status.first_cell_overlap = 0.0  # it finished before the warm-up's step did
                self._cell_started = None
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------------------------
    def _run(self, make_plan, device) -> None:
        st, unniced = self.status, None
        if self.nice or os.environ.get(STANDBY):  # a standby of the warm pool yields the CPU to every other process
            # first: what the thread starts for good (unniced()) keeps the kernel's priority
            self._unniced = unniced = side.Unniced()
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread (and its helpers)
        reading = Step("plan", "reading the plan")
        try:
            self._turn(reading, heavy=False)  # (making a plan is Python work: not beside a cell)
            try:
                plan = self.plan = make_plan()
                self._carry_out(plan, device)
            except plans.NotWanted as exc:  # a notebook the policy does not warm: off, unless cells typed meanwhile
                st.state, st.detail = "off", str(exc)
            while True:  # plans asked for meanwhile (typed cells): the latest, until none is left
                with self._lock:
                    follow, self._next = self._next, None
                    if follow is None:
                        self._exiting = True
                        break
                make_next, st.source = follow
                st.state, st.detail = "running", ""  # %gpu status: under way again, not the last plan's "done"
                self._ordinals, self._user_gpu = None, False  # (a new plan: today's device; the user's GPU cells ended)
                self._turn(reading, heavy=False)
                plan = self.plan = make_next(self.plan)
                self._carry_out(plan, device)
        except _SteppedAside as exc:
            unloaded = isinstance(exc, _Unloaded)
            why = self._stopped if unloaded else "your own GPU cell started first"
            for s in self.plan.steps if self.plan is not None else ():
                if s.state in ("planned", "running"):
                    s.state, s.detail = "skipped", why
            st.state, st.detail = ("off", f"stopped: {why}") if unloaded else (
                "done", "stopped early: your first GPU cell started and does the rest itself")
        except BaseException as exc:  # noqa: BLE001 — a warm-up must never take the kernel down
            st.state, st.detail = "failed", f"{st.phase}: {type(exc).__name__}: {exc}"
            log.warning("gpuctx warm-up failed (the kernel works on, CUDA starts on first use): %s", st.detail)
        finally:  # (what is shared only while this thread is the warmer's: one may start once it took its last plan)
            if unniced is not None:
                unniced.close()
            with self._lock:
                current = self._thread is threading.current_thread()
                if current:  # (a plan asked for after a failure or a step aside waits for the next ask)
                    self._exiting, self._next, self._unniced = True, None, None
            st.phase, st.finished = "", time.monotonic()
            if current:
                self.cells_thread.hand_over(self, threading.current_thread())
                with self._cond:
                    if self._cell_started is not None and st.first_cell_overlap is None:
                        st.first_cell_overlap = st.finished - self._cell_started
                    self._cell_started = None
                self._under_way.set()

    def _carry_out(self, plan: Plan, device) -> None:
        st = self.status
        for step in plan.steps:  # set-up first: literal settings the plan applies itself
            if step.kind == "setup" and step.state == "planned":
                name, value = step.env or ("", None)
                if name and value is not None and name not in os.environ:
                    os.environ[name] = value
                    step.state = "done"
                else:
                    step.state, step.detail = "skipped", "the kernel's environment has it already"
        if self.on_plan is not None:
            try:
                self.on_plan(plan)
            except Exception as exc:  # noqa: BLE001 — what the plan names besides warming never fails it
                log.warning("gpuctx: after the warm plan: %s: %s", type(exc).__name__, exc)
        missing = sorted({s.framework for s in plan.steps if s.kind == "framework" and s.state == "planned"
                          and s.framework in fws.BY_NAME and not fws.BY_NAME[s.framework].installed()})
        if missing:  # a configured framework this kernel lacks: nothing of the frameworks' part is done
            for s in plan.steps:
                if s.framework and s.state == "planned":
                    s.state, s.detail = "skipped", f"{', '.join(missing)} is not installed in this kernel"
        self._import_deadline, self._gate_base = time.monotonic() + self.import_budget, GATE.held() + STOOD.seconds
        reason, decided, waits = None, False, False
        for kind, batch in plans.batches(plan.steps):  # in the plan's order: the order the notebook needs them
            if self._next is not None:
                return  # a newer plan (typed cells) takes over from here: _run carries it out
            if kind == "import":
                for step in batch:
                    if step.state == "planned":
                        self._import(step, wait=not step.overlap)
                continue
            todo = without_framework(batch)
            if not todo:
                continue
            if not decided:
                imported = [s.framework for s in plan.steps if s.framework and s.kind in ("import", "framework")
                            and s.state in ("done", "running")]
                (reason, waits), decided = why_no_gpu_work(plan, imported, self._turn), True
            if reason:
                cpu_batch(self, plan, todo)
                short = reason.split("; ", 1)[-1].split(":", 1)[0]  # "no GPU is visible", ...
                for s in todo:
                    s.waits = waits  # (for the notebook's line: typed cells warm the GPU once it has run)
                    if s.state == "planned":
                        s.state, s.detail = "skipped", short
            else:
                if self._ordinals is None:  # the first batch picks the devices (follows none once stopped)
                    self._ordinals = devices_of(plan, device, None if self._stop_asked else self.switcher)
                    self.status.device = self._ordinals[0]
                gpu_batch(self, plan, self._ordinals, todo)
        self.wait_background()
        self._unniced.run(self.on_end) if self._unniced else self.on_end()  # at the kernel's priority (settle.py)
        failed = [s for s in plan.steps if s.state == "failed"]
        if failed:
            st.state, st.detail = "failed", f"{failed[0].name}: {failed[0].detail}"
        elif missing:
            st.state, st.detail = "skipped", f"{', '.join(missing)} is not installed in this kernel"
        elif reason and plan.gpu:  # (a plan without GPU work, a standby's, did all it was for)
            st.state, st.detail = "skipped", reason
        elif not plan.gpu:
            st.state, st.detail = "done", f"imported only ({plan.reading})" if plan.reading else "imported only"
        else:
            st.state = "done"
            if self._user_gpu and any(s.state == "skipped" and s.detail.startswith("your") for s in plan.steps):
                st.detail = "stopped early: your first GPU cell started and does the rest itself"
        if plan.stopped or plan.gpu_blocked:
            st.detail = "; ".join(x for x in (st.detail, plan.gpu_blocked or plan.stopped) if x)

    # -- taking turns with the user ------------------------------------------------------------
    def _turn(self, step: Step, heavy: bool) -> int:
        """Until it is this step's turn: no cell running, and the user idle a moment after the
        last one (longer before a heavy step); a cell waiting on the warm-up lets it go on. Returns
        the cells started by then (read under the lock: a cell started later overlaps the step)."""
        with self._cond:
            while not (self._waiters or self._cell_waits or self._stepping_aside or self._stop_asked):
                if self._cells == 0:
                    need = HEAVY_IDLE_S if heavy else LIGHT_IDLE_S
                    idle = need if self._last_cell_end is None else time.monotonic() - self._last_cell_end
                    if idle >= need:
                        break
                    self._cond.wait(need - idle)
                else:
                    self.status.phase = f"starting {step.name} once your cells finish"
                    self._cond.wait(1.0)
            if self._stop_asked:
                raise _Unloaded
            self.status.phase = step.name
            if step.op == "cuda_init":  # a cell starting from now on waits for it (state.py)
                self.starting_cuda.set()
            return self._cells_started

    # -- what a recipe may ask (recipes.Run) ------------------------------------------------------
    cells_started = property(lambda self: self._cells_started)
    user_gpu = property(lambda self: self._user_gpu)

    def phase(self, step: Step, fn, heavy: bool = False, handles: bool = False) -> bool:
        """Run one step as a phase of the record when it is its turn; True when it ran. `handles`:
        this thread holds library handles of its own afterwards (it then steps aside for a GPU cell)."""
        ran = self._phase(step, fn, heavy)
        if ran and handles:
            self._holds_handles = True
        return ran

    def import_module(self, step: Step) -> None:
        self._import(step)

    def in_cells_thread(self, step: Step, fn, ready=None) -> None:
        self.cells_thread.add(step, fn, ready)  # (cells_thread.py: once this thread has exited, no cell running)

    def unless_cells_since(self, cells: int, fn) -> bool:
        """Run `fn` while no cell can start (a cell's start waits for it); False, without running
        it, when a cell has started since `cells` had, or one does GPU work."""
        with self._cond:
            if self._cells_started != cells or self._user_gpu:
                return False
            fn()
            return True

    def unniced(self, fn):
        """`fn()`, at the kernel's CPU priority: processes it starts (inductor's compile workers)
        outlive the warm-up, and a standby's low priority cannot be raised again once inherited.
        Between turns: never once stopped (unloaded, suspended), as a phase would not be."""
        if self._stop_asked:
            raise _Unloaded
        return self._unniced.run(fn) if self._unniced is not None else fn()

    def _phase(self, step: Step, fn, heavy: bool = False) -> bool:
        cells = self._turn(step, heavy)
        try:
            return self._run_step(step, fn, cells)
        finally:
            self.starting_cuda.clear()  # (set by _turn for torch's CUDA start, under the cells' lock)

    def _run_step(self, step: Step, fn, cells: int) -> bool:
        if self._stepping_aside:
            raise _SteppedAside
        if step.kind == "gpu" and self._user_gpu:
            step.state, step.detail = "skipped", "your own GPU cell started first"
            return False
        step.state, step.started = "running", time.monotonic()
        self._under_way.set()
        drawn = None if step.module else rng.save(step.kind == "gpu")  # given back after it (kernel/rng.py)
        t0 = time.perf_counter()
        try:
            fn()
        except _SteppedAside:
            raise
        except Exception as exc:  # noqa: BLE001 — recorded and logged; the kernel works on without this step
            step.state, step.detail = "failed", f"{type(exc).__name__}: {exc}"
            log.warning("gpuctx warm-up failed at %s (the kernel works on; your notebook does it itself): %s",
                        step.name, step.detail)
            return False
        finally:
            step.seconds = time.perf_counter() - t0
            self.status.phases[step.name] = step.seconds
            with self._cond:  # (a cell's start waits on this lock: none can seed meanwhile)
                if self._cell_started is not None and self.status.first_cell_overlap is None:
                    self.status.first_cell_overlap = time.monotonic() - self._cell_started
                    self._cell_started = None
                note = rng.give_back(drawn, overlapped=self._cells_started != cells)
            if note:
                step.detail = f"{step.detail}; {note}" if step.detail else note
        step.state = "done"
        return True

    # -- imports ------------------------------------------------------------------------------------
    def wait_background(self) -> None:
        """Until the imports running in the background have ended (or the import budget is spent)."""
        for done in list(self._background):
            done.wait(max(0.0, self._deadline - time.monotonic()))

    def _import(self, step: Step, wait: bool = True) -> None:
        """Import in a helper thread, bounded by what is left of the import budget: an import that
        hangs is left behind (recorded as such), not waited on. With wait=False the import runs in
        the background while the next steps go on (CUDA's C calls let go of the GIL meanwhile)."""
        if time.monotonic() >= self._deadline:
            step.state, step.detail = "skipped", f"the import budget ({self.import_budget:g} s) is spent"
            return
        if fws.imported(step.module) and not step.names:
            step.state, step.detail, step.seconds = "done", "already imported", 0.0
            return
        module_step = next((s for s in self.plan.steps if s.kind == "import" and s.module == step.module
                            and not s.names), None) if step.names and self.plan is not None else None
        if module_step is not None and module_step.state in ("failed", "skipped"):  # not tried again per name
            step.state, step.detail = "skipped", f"import {step.module} {module_step.state}"
            return
        done, box = threading.Event(), {}

        def work():
            try:
                with GATE.holding():  # (it stands still while a cell runs)
                    preload.libraries(step.module)  # the loader's share of the import, without the GIL
                    mod = importlib.import_module(step.module)
                    for name in step.names:  # `from x import y`: y may be a lazy attribute or a submodule
                        if not hasattr(mod, name):
                            importlib.import_module(f"{step.module}.{name}")
            except BaseException as exc:  # noqa: BLE001 — recorded, never raised
                box["exc"] = exc
            finally:
                self._flights.pop(done, None)
                done.set()

        def run():
            with self._cond:
                self._importing, self._flights[done] = done, time.monotonic()
            threading.Thread(target=work, name="gpuctx-warmup-import", daemon=True).start()
            while not STOOD.wait(done, 0.1):
                if self._for_good:  # (a suspend waits for the import: stop())
                    raise _Unloaded
                if self._stepping_aside:  # the import goes on in its own thread, which holds no handles
                    raise _SteppedAside
                if time.monotonic() >= self._deadline:
                    raise TimeoutError(f"still importing after the import budget ({self.import_budget:g} s); "
                                       "left to finish in the background")
            side.raise_from(box)

        if not wait:
            self._turn(step, heavy=True)
            self._background.append(done)
            self._flights[done] = time.monotonic()

            side.in_background(step, lambda: (work(), side.raise_from(box)), self.status.phases)
            return
        try:
            self._phase(step, run, heavy=True)
        finally:
            with self._cond:
                self._importing = None
            step.cuda = cuda_driver.touched()
            if step.cuda and self.plan is not None and not self.plan.gpu:
                step.detail = "; ".join(x for x in (step.detail, f"it started CUDA ({step.cuda})") if x)


class _SteppedAside(Exception):
    """A cell of the user's does GPU work while this thread holds cuBLAS/cuDNN handles: the thread
    exits now, so that its handles go back to torch's pools for the user's thread."""


class _Unloaded(_SteppedAside):
    """Stopped (gpuctx unloaded, the kernel suspended) while the warm-up ran: it ends at its next turn."""
