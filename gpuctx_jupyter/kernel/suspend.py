"""Suspend and resume, the kernel's side (issue #28).

The server moves an idle kernel's GPU memory into the kernel's own host memory with the CUDA
driver's process checkpoint API, from a helper process (core/checkpoint.py). While the process is
checkpointed its CUDA calls wait until the memory is back, and some calls the process makes itself
crashed it on the H200 (scripts/checkpoint_probe.py, calls_while_suspended). So the kernel:

- consents first (contract.SUSPEND_PREPARE_REQUEST, on the control channel, answered by
  kernel_view with `Gate.prepare`), or refuses: while a request that may run the user's code is in
  flight in any shell thread (the main shell's, or one of ipykernel 7's subshells': each thread
  counts on its own), while a warm-up step or import is under way (a warm-up waiting for its turn
  is given up, and goes on once the kernel runs again), while it has data-parallel workers
  (`%gpu workers`: processes of their own, joined by NCCL), when it uses GPU memory another process
  shared with it (CUDA IPC: the driver could not restore such a process); consenting, it gives its
  allocators' cache back to the GPU, so that only what it holds moves;
- from its consent on, restores itself before every shell request that may run the user's code —
  a cell from any frontend, a widget's comm message, a completion, an inspection — in ipykernel's
  `should_handle`, which every shell request passes (`Gate.before`); kernel_info, history,
  shutdown and interrupt requests pass untouched, so a restart does not restore first;
- touches no GPU library while suspended: the server's question is answered from what the kernel
  knew before (`Gate.answer`), the release request is refused (kernel_view asks `Gate.suspended`),
  and the process's sampler (the monitor) pauses;
- restores itself through the waiting helper (`checkpoint serve`) it starts when it consents,
  while CUDA still runs: the next cell pays the restore and little more, and its output says once
  that the kernel was resumed and how long it took. A restore that fails (no room on the GPU) leaves the kernel
  suspended, its variables safe, and the request is answered with the reason instead of run; so
  does one that has not ended within RESTORE_TIMEOUT_S (a driver call that hangs: its helper is
  killed, the next request tries again with a fresh one);
- never blocks its control thread behind a restore a request started: the server's Resume is then
  answered at once that the kernel is resuming, so interrupts, shutdowns and the server's
  questions still get through.

The consent is a token: a request that arrives before the server's helper has locked the process
cancels it (core.checkpoint.cancel), so that a suspend never begins after the kernel has started on
a request; one that arrives during or after waits for the helper to end, then restores.

The gate is the kernel state's `suspend` (kernel/state.py) while gpuctx is loaded in an ipykernel.
"""
from __future__ import annotations

import inspect
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

from ..contract import SUSPEND_STATES
from ..core.sampler import process_sampler
from . import kernel_view
from .state import of as state_of

if TYPE_CHECKING:
    from ..core.inventory import Inventory

# core.checkpoint, oom and release are imported when a suspend is asked for, the GPU inventory on
# the sampler's first read: this module is loaded with every kernel the server starts, before it
# answers (readiness).

RUNNING, SUSPENDING, SUSPENDED, RESUMING = SUSPEND_STATES
# Shell requests that never run the user's code: answered as they come, also while suspended.
NO_USER_CODE = frozenset({"kernel_info_request", "connect_request", "history_request", "comm_info_request",
                          "is_complete_request", "shutdown_request", "interrupt_request",
                          "create_subshell_request", "delete_subshell_request", "list_subshell_request"})
# How long a resume may take before the kernel gives up on it: the restore of a whole H200's memory
# is ~30 s (0.22 s/GiB, docs/benchmarks.md), after waiting for a suspend under way (~0.5 s/GiB).
RESTORE_TIMEOUT_S = 300.0
CELL_END_S = 0.5  # a consent waits this long for a cell that has just ended to be done with (after())
WARMUP_STOP_S = 1.0  # a suspend waits this long for a warm-up step under way (the server, 2 s in all)
STOPPING = "a suspend was asked for"  # why the warm-up's steps given up for a consent were skipped
WARMING = ("its warm-up is in the middle of a step or an import: try again once that has ended (`%gpu status` "
           "shows the warm-up)")
log = logging.getLogger("gpuctx")


def shares_cuda_memory() -> bool:
    """The kernel holds GPU memory another process shared with it through torch.multiprocessing
    (CUDA IPC): its shared_cache keys CUDA storages by the IPC handle's bytes."""
    reductions = sys.modules.get("torch.multiprocessing.reductions")
    cache = getattr(reductions, "shared_cache", None)
    try:
        items = list(cache.items()) if cache is not None else []
    except Exception:  # noqa: BLE001 — torch's private table changed: nothing to say
        return False
    for key, ref in items:
        if isinstance(key, tuple) and key and isinstance(key[0], bytes):
            expired = getattr(ref, "expired", None)
            if not (callable(expired) and expired()):
                return True
    return False


class Gate:
    """The kernel's suspend state and the one way through it: see the module's docstring."""

    def __init__(self, kernel, kernel_state, pid: int | None = None):
        self.kernel, self.kernel_state = kernel, kernel_state  # kernel/state.py's KernelState
        self.pid = pid or os.getpid()
        self._cond = threading.Condition()
        self.state = RUNNING
        self.token: str | None = None
        self.since: float | None = None
        self.moved: dict[str, int] = {}  # "<ordinal>" -> bytes, as the server measured them
        self.need: dict[str, int] = {}  # GPU UUID -> bytes a restore puts back there
        self.error: str | None = None  # why the last resume failed (the kernel is still suspended)
        self.before_report: dict | None = None  # the answer to REQUEST from before the suspend
        self.last: dict | None = None  # the last resume: {"seconds", "steps", "by"}
        # The threads (idents) inside a shell request that may run the user's code: the main shell's,
        # and with ipykernel 7 each subshell's (every one calls before/after for its own requests).
        self._busy: set[int] = set()
        self._resuming: tuple[str, float] | None = None  # who asked for the resume under way, and when
        self._reads = 0  # sampler reads in flight
        self._waiting: subprocess.Popen | None = None
        self._preparing = False
        # no warm-up plan starts from a consent's first check until the kernel runs again
        kernel_state.warmer.held = lambda: self._preparing or self.state != RUNNING
        self._note: str | None = None  # for the output of the cell that resumed the kernel

    @property
    def busy(self) -> bool:
        """Whether a shell thread is inside a request that may run the user's code (a thread that
        ended inside one, a subshell deleted meanwhile, no longer counts)."""
        with self._cond:
            if self._busy:
                self._busy &= {t.ident for t in threading.enumerate()}
            return bool(self._busy)

    @property
    def suspended(self) -> bool:
        """Not running: suspending, suspended or resuming (nothing of ours may touch the GPU)."""
        return self.state != RUNNING

    def as_dict(self) -> dict:
        with self._cond:
            return {"state": self.state, "since": self.since, "moved": dict(self.moved), "error": self.error,
                    "last_resume": self.last}

    # -- the server's requests ---------------------------------------------------------------------
    def prepare(self, token: str) -> dict:
        self._preparing = True
        try:
            result = self._prepare(token)
        finally:
            self._preparing = False
        if result["status"] != "ok":
            self._warm_on()  # (a warm-up given up for a consent then refused)
        return result

    def _prepare(self, token: str) -> dict:
        with self._cond:  # a cell just ended: ipykernel says idle before its post-handler hook ends it here
            self._cond.wait_for(lambda: not self.busy, timeout=CELL_END_S)
        why = ("no token given" if not token else "it is running a cell: suspend it once it is idle" if self.busy
               else self._refusal())
        if why:
            return {"status": "refused", "message": why, **({"retry": True} if why == WARMING else {})}  # asked again
        # Cache is free memory to the user: moving it to host memory and back would cost host RAM and
        # seconds for nothing, so it goes back to the GPU first, as Release does (a running cell is
        # refused below).
        from .release import return_cached

        released = 0 if self.busy else sum(return_cached().values())
        report = kernel_view.report(self.kernel_state)  # still running: the figures are read as usual
        with self._cond:
            if self.busy:
                return {"status": "refused", "message": "it is running a cell: suspend it once it is idle"}
            if self.state != RUNNING:
                return {"status": "refused", "message": f"it is {self.state} already"}
            self.state, self.token, self.before_report, self.error = SUSPENDING, token, report, None
            deadline = time.monotonic() + 2.0  # a sampler read under way ends within µs
            while self._reads and time.monotonic() < deadline:
                self._cond.wait(0.05)
        # Started now, while CUDA still runs: a resume then needs no new process, and the kernel
        # never starts one from a checkpointed process unless this one died meanwhile.
        self._start_waiting_helper()
        from ..core import checkpoint

        return {"status": "ok", "pid": self.pid, "report": report, "released_cache": released,
                "locks": checkpoint.folder_id()}

    def _refusal(self) -> str | None:
        workers = self.kernel_state.workers
        if workers is not None and workers.running:
            return ("it has data-parallel workers (%gpu workers), processes of their own that the driver would "
                    "leave on the GPU (and NCCL across processes cannot be checkpointed): `%gpu workers stop` first")
        if shares_cuda_memory():
            return ("it uses GPU memory another process shared with it (CUDA IPC, e.g. a DataLoader worker's CUDA "
                    "tensors): the driver could not restore it")
        # Last: a warm-up waiting for its turn is given up (what it did is in the checkpoint); one
        # with a step or an import under way past WARMUP_STOP_S goes on, and the suspend waits.
        if not self.kernel_state.warmer.stop(STOPPING, for_good=False, wait=WARMUP_STOP_S):
            return WARMING
        return None

    def done(self, content: dict) -> dict:
        with self._cond:
            if self.state != SUSPENDING or content.get("token") != self.token:
                return {"status": "ok", "state": self.state, "stale": True}
            if content.get("ok"):
                self.state = SUSPENDED
                self.since = float(content.get("since") or time.time())
                self.moved = {str(k): int(v) for k, v in (content.get("moved") or {}).items()}
                self.need = {str(k): int(v) for k, v in (content.get("need") or {}).items()}
            elif content.get("running") is False:  # failed, and could not be undone: restored before any request
                self.state, self.since, self.moved, self.need = SUSPENDED, time.time(), {}, {}
                self.error = str(content.get("message") or "the suspend failed and could not be undone")
            else:
                self.state, self.token = RUNNING, None
            self._cond.notify_all()
            state = self.state
        if state == RUNNING:
            self.close()  # not suspended after all: its waiting helper has nothing to do
            self._warm_on()
        return {"status": "ok", "state": state}

    def answer(self) -> dict | None:
        """The reply to the server's question while not running (None: running, ask as usual)."""
        with self._cond:
            if self.state == RUNNING:
                return None
            content = dict(self.before_report or {"status": "ok", "pid": self.pid})
        content["suspend"] = self.as_dict()
        return content

    # -- every shell request ---------------------------------------------------------------------------
    def before(self, stream, msg: dict, idents) -> bool:
        """Called for each shell request before its handler: restore first when suspended. False
        (the request is answered here, not handled) when the restore failed."""
        header = msg.get("header") or {}
        msg_type = header.get("msg_type", "")
        if msg_type in NO_USER_CODE:
            return True
        me = threading.get_ident()
        with self._cond:
            # (already there: a comm message ipykernel 7 dispatches beside the async cell it runs)
            mine = me not in self._busy
            self._busy.add(me)
            if self.state == RUNNING:
                return True
            since = self.since
        result = self.resume(by=msg_type)
        if result["status"] == "ok":
            content = msg.get("content") or {}
            if msg_type == "execute_request" and not content.get("silent") and result.get("resumed"):
                self._note = self._note_text(result, since)
            return True
        if mine:
            self.after()
        self._answer_instead(stream, msg, idents, result["message"])
        return False

    def after(self) -> None:
        """This shell thread is done with its request (ipykernel's post_handler_hook, which
        ipykernel 7 calls in the subshell's thread for a subshell's request)."""
        with self._cond:
            self._busy.discard(threading.get_ident())
            self._cond.notify_all()

    def resume(self, by: str, wait: bool = True) -> dict:
        """Back to running from wherever the suspend got to, within RESTORE_TIMEOUT_S; one at a
        time: a shell request waits for the resume under way (it ends by its deadline), the control
        thread (`wait` False) is answered at once that the kernel is resuming — it must stay free
        for interrupts, shutdowns and the server's questions."""
        with self._cond:
            while self.state == RESUMING:
                if not wait:
                    asked, since = self._resuming or ("a request", time.monotonic())
                    return {"status": "error", "state": RESUMING,
                            "message": f"it is resuming already (for {asked}, {time.monotonic() - since:.0f} s so "
                                       "far): ask again once that has ended"}
                self._cond.wait()
            if self.state == RUNNING:
                return {"status": "ok", "resumed": False, "state": RUNNING, "seconds": 0.0, "steps": {}}
            previous, token = self.state, self.token
            self.state, self._resuming = RESUMING, (by, time.monotonic())
        t0 = time.perf_counter()
        deadline = time.monotonic() + RESTORE_TIMEOUT_S
        try:
            from ..core import checkpoint

            if previous == SUSPENDING and token:
                # waits for a suspend under way (not past the deadline); stops one not begun
                checkpoint.cancel(self.pid, token, timeout=RESTORE_TIMEOUT_S)
            outcome = self._restore(deadline)
        except TimeoutError as exc:
            outcome = {"ok": False, "state": "unknown", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 — the kernel must go on, suspended, and say why
            outcome = {"ok": False, "state": "unknown", "error": f"{type(exc).__name__}: {exc}"}
        seconds = time.perf_counter() - t0
        steps = outcome.get("steps") or {}
        with self._cond:
            if outcome.get("ok"):
                self.state, self.token, self.error = RUNNING, None, None
                self.last = {"seconds": round(seconds, 4), "steps": steps, "by": by, "time": time.time()}
                moved, self.moved, self.need, self.since = self.moved, {}, {}, None
            else:
                self.state = SUSPENDED if previous == SUSPENDED or outcome.get("state") != "running" else RUNNING
                self.error = outcome.get("error") or "the helper gave no answer"
            self._resuming = None
            self._cond.notify_all()
        if not outcome.get("ok"):
            log.warning("gpuctx: could not resume this kernel (asked by %s): %s", by, self.error)
            if self.state == RUNNING:
                self._warm_on()
            return {"status": "error", "message": self.error, "error_name": outcome.get("error_name"),
                    "state": self.state}
        self._warm_on()
        return {"status": "ok", "resumed": bool(steps), "state": RUNNING, "seconds": round(seconds, 4),
                "steps": steps, "moved": moved}

    def _warm_on(self) -> None:
        """Running again (the suspend did not happen, or the kernel resumed): the warm-up goes on
        with the steps its consent gave up, which the next cells may still need."""
        warmer = self.kernel_state.warmer
        plan = warmer.plan
        if warmer.running or plan is None or not any(_given_up(s) for s in plan.steps):
            return

        def again(previous):
            for step in previous.steps:
                if _given_up(step):
                    step.state, step.detail = "planned", ""
            return previous

        warmer.replan(again, warmer.status.source)

    # -- the helper that restores ---------------------------------------------------------------------
    def _start_waiting_helper(self) -> None:
        if self._waiting is not None and self._waiting.poll() is None:
            return
        from ..core import checkpoint

        try:
            self._waiting = subprocess.Popen(
                checkpoint.helper_command("serve", self.pid), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, start_new_session=True)  # an interrupt is the kernel's
        except OSError as exc:  # a fresh helper restores instead
            log.warning("gpuctx: could not start the resume helper: %s", exc)
            self._waiting = None

    def _restore(self, deadline: float) -> dict:
        """The helper's outcome, by `deadline` (TimeoutError after it: the helper is killed, and
        the process left wherever the driver got; the next request tries again)."""
        need = [word for uuid, n in self.need.items() for word in ("--need", f"{uuid}={n}")]
        waiting, self._waiting = self._waiting, None
        if waiting is not None and waiting.poll() is None:
            answer = None
            try:
                waiting.stdin.write(" ".join(["resume", *need]) + "\n")
                waiting.stdin.flush()
                answer = _outcome_of(waiting, deadline)
            except (OSError, ValueError):
                pass  # it died: a fresh one
            finally:
                _end(waiting, deadline if answer is not None else 0.0)
            if answer is not None:
                return answer
        from ..core import checkpoint

        fresh = subprocess.Popen(checkpoint.helper_command("resume", self.pid, *need), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            answer = _outcome_of(fresh, deadline)
            if answer is None:
                try:
                    why = fresh.communicate(timeout=max(0.1, deadline - time.monotonic()))[1]
                except subprocess.TimeoutExpired:
                    raise TimeoutError(_too_long()) from None
                answer = {"ok": False, "state": "unknown",
                          "error": f"the resume helper failed: {why.decode(errors='replace').strip()[-300:]}"}
            return answer
        finally:
            _end(fresh, deadline)

    def close(self) -> None:
        if self._waiting is not None and self._waiting.poll() is None:
            self._waiting.kill()
        self._waiting = None

    # -- what the user sees ----------------------------------------------------------------------------
    @staticmethod
    def _note_text(result: dict, since: float | None) -> str:
        from .oom import duration
        from .render import gib

        moved = sum((result.get("moved") or {}).values())
        back = f" — {gib(moved)} back on the GPU" if moved else ""
        restore = (result.get("steps") or {}).get("restore")
        of = f" (restore {restore:.2f} s)" if restore is not None else ""
        held = f", suspended {duration(time.time() - since)} ago" if since else ""
        return f"gpuctx: resumed this kernel{back} in {result['seconds']:.2f} s{of}{held}"

    def print_note(self, *_args) -> None:
        """pre_run_cell: the note goes into the output of the cell that resumed the kernel, once."""
        note, self._note = self._note, None
        if note:
            print(note, flush=True)

    def _answer_instead(self, stream, msg: dict, idents, why: str) -> None:
        """The request cannot run (its code would wait for the GPU for ever): answer it with why."""
        text = (f"gpuctx: this kernel is suspended and its GPU memory could not be brought back: {why}. Its "
                "variables are safe in host memory meanwhile; run the cell again once that is fixed, or restart "
                "the kernel (its variables are then lost).")
        msg_type = (msg.get("header") or {}).get("msg_type", "")
        kernel = self.kernel
        try:
            if msg_type == "execute_request":
                error = {"ename": "GpuctxResumeError", "evalue": text, "traceback": [text]}
                kernel.session.send(kernel.iopub_socket, "error", error, msg, ident=kernel._topic("error"))
                kernel.session.send(stream, "execute_reply",
                                    {"status": "error", "execution_count": kernel.execution_count, **error},
                                    msg, ident=idents)
            elif msg_type.endswith("_request"):
                kernel.session.send(stream, msg_type.replace("_request", "_reply"),
                                    {"status": "error", "ename": "GpuctxResumeError", "evalue": text, "traceback": []},
                                    msg, ident=idents)
        except Exception as exc:  # noqa: BLE001 — the log line below says it all the same
            log.warning("gpuctx: could not answer a %s: %s", msg_type, exc)
        log.warning("gpuctx: a %s was not run: %s", msg_type or "request", text)

    # -- the process's sampler ---------------------------------------------------------------------------
    def read_inventory(self) -> Inventory:
        """The sampler's source: NVML and torch as usual while running; while suspended the sampler
        thread waits here, so that a monitor keeps its last sample (its time stops) and nothing of
        it calls a GPU library until the kernel is back."""
        with self._cond:
            while self.state != RUNNING:
                self._cond.wait()
            self._reads += 1
        from ..core import inventory

        try:
            return inventory.take()
        finally:
            with self._cond:
                self._reads -= 1
                self._cond.notify_all()


def _given_up(step) -> bool:
    return step.state == "skipped" and step.detail == STOPPING and step.kind != "cells"  # (no batch runs those)


def _too_long() -> str:
    return (f"the restore had not ended after {RESTORE_TIMEOUT_S:g} s (a driver call that hangs?): its helper was "
            "stopped")


def _end(helper: subprocess.Popen, deadline: float) -> None:
    """A helper that answered ends by itself (given until `deadline`, 10 s at most); any other is
    killed, and not waited for: a process inside a driver call may not die at once."""
    try:
        helper.wait(max(0.0, min(10.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        helper.kill()


def _outcome_of(helper: subprocess.Popen, deadline: float) -> dict | None:
    """A helper's outcome line (the waiting helper's comes after its "ready" line), read until
    `deadline` (TimeoutError after it); None when it ended without one. Read from its pipe's
    descriptor, so that a helper stuck in a driver call cannot hold the kernel past the deadline."""
    fd, pending = helper.stdout.fileno(), b""
    poller = select.poll()  # (not select(): a busy kernel's descriptors go past 1024)
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            answer = _json(line.decode(errors="replace"))
            if "ok" in answer:
                return answer
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(_too_long())
        if poller.poll(max(1, int(left * 1000))):
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            pending += chunk


def _json(line: str) -> dict:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# -- wiring into ipykernel -------------------------------------------------------------------------------
def install(ip, state) -> Gate | None:
    """Put the gate into the ipykernel running `ip`, as `state.suspend` (`state`: its
    KernelState; None in a plain IPython: nothing to suspend)."""
    kernel = getattr(ip, "kernel", None)
    if getattr(kernel, "control_handlers", None) is None or not callable(getattr(kernel, "should_handle", None)):
        return None
    if state.suspend is not None:
        return state.suspend
    gate = Gate(kernel, state)
    should_handle, post_handler_hook = kernel.should_handle, getattr(kernel, "post_handler_hook", None)
    own = {name: vars(kernel)[name] for name in ("should_handle", "post_handler_hook") if name in vars(kernel)}

    def gated_should_handle(stream, msg, idents):
        # ipykernel 7 allows an async should_handle; 6 calls it plainly
        result = should_handle(stream, msg, idents)
        if inspect.isawaitable(result):
            async def later():
                return await result and gate.before(stream, msg, idents)
            return later()
        return result and gate.before(stream, msg, idents)

    def gated_post_handler_hook(*args, **kwargs):
        gate.after()
        if post_handler_hook is not None:
            return post_handler_hook(*args, **kwargs)
        return None

    kernel.should_handle = gated_should_handle
    kernel.post_handler_hook = gated_post_handler_hook
    ip.events.register("pre_run_cell", gate.print_note)
    process_sampler().set_source(gate.read_inventory)

    def uninstall():
        for name, gated in (("should_handle", gated_should_handle), ("post_handler_hook", gated_post_handler_hook)):
            if vars(kernel).get(name) is gated:
                if name in own:
                    setattr(kernel, name, own[name])  # what was set on the instance before ours
                else:
                    delattr(kernel, name)  # back to the class's method
        ip.events.unregister("pre_run_cell", gate.print_note)
        process_sampler().set_source(None)
        gate.close()

    gate.uninstall = uninstall
    state.suspend = gate
    return gate


def uninstall(ip) -> None:
    st = state_of(ip)
    gate = st.suspend if st is not None else None
    if gate is not None:
        gate.uninstall()
        st.suspend = None
