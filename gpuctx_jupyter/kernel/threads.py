"""Carrying the kernel's device into the threads a notebook starts.

CUDA keeps the current device per host thread, and torch keeps its default device per thread too,
so a device chosen with `%gpu use 1` in the cell thread does not reach a `threading.Thread`, a
`ThreadPoolExecutor` worker or a library's thread: without help they start on CUDA's device 0.

`ThreadFollower` wraps `threading.Thread.start` (every Python thread, pool workers and library
threads included, goes through it). In the starting thread it records that thread's choice: its
own carried choice if gpuctx started it, else the kernel's (the Switcher's stack, so `%%on_gpu`
counts). In the new thread it applies that choice to torch, CuPy and Numba before the thread's
`run`, so anything the thread's own code sets afterwards wins. JAX's default device is
process-wide already. It does not use `threading.setprofile` or `settrace`, which profilers and
debuggers need.

What it never does: import a framework, start CUDA (a framework whose CUDA has not started is left
to its queued switch, and the thread is named in the report), or raise in the user's thread (a
failed switch leaves that thread on its default device and records one warning).
Not covered: threads started with `_thread.start_new_thread` or from C; threads started before
gpuctx was loaded, or while no GPU framework was imported and no device chosen (not tracked); and a
device set by hand (`torch.cuda.set_device`) in a thread: that thread's own threads get the choice
it was started with, not the one it set.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

# The default device of these is process-wide: nothing to carry into a thread.
PROCESS_WIDE = frozenset({"jax"})
# gpuctx's own threads (warm-up, sampler) choose their device themselves.
OWN_PREFIX = "gpuctx-"
MAX_WARNINGS = 100
NAMES_SHOWN = 4


@dataclass(eq=False)
class Started:
    """One thread that the hook started, as the report needs it."""

    choice: object | None  # the carried switching.Choice; None: no device was chosen
    # "starting" until the thread runs; then "switched", "before CUDA" (left to CUDA's device 0
    # unless it starts CUDA itself), "unchosen" or "failed".
    state: str = "starting"


def describe(choice) -> str:
    """How the user made a choice, as they typed it."""
    if choice.source == "%gpu use":
        return f"`%gpu use {choice.ordinal}`"
    if choice.source == "%%on_gpu":
        return f"`%%on_gpu {choice.ordinal}`"
    return f"cuda:{choice.ordinal} ({choice.source})"


class ThreadFollower:
    """Makes a thread begin on the device of the thread that starts it (owned by a Switcher)."""

    def __init__(self, switcher):
        self.switcher = switcher
        self.follow = True
        self.warnings: list[str] = []
        self._dropped = 0
        self._live: dict[threading.Thread, Started] = {}  # started through the hook, not finished
        self._usable: dict[tuple[str, int], bool] = {}
        self._original = None
        self._patched = None

    # -- the hook -------------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._patched is not None

    def install(self) -> None:
        """Wrap `threading.Thread.start` (idempotent)."""
        if self._patched is not None:
            return
        original = threading.Thread.start
        follower = self

        def start(thread):
            if follower._patched is not start:  # removed while another wrapper sat on top of ours
                return original(thread)
            return follower._start(thread, original)

        functools.update_wrapper(start, original, assigned=("__name__", "__doc__"))
        self._original, self._patched = original, start
        threading.Thread.start = start

    def remove(self) -> None:
        """Put `threading.Thread.start` back exactly as it was; threads already started keep running."""
        if self._patched is None:
            return
        if threading.Thread.start is self._patched:
            threading.Thread.start = self._original
        # else another tool wrapped `start` after us: leave its wrapper in place; ours now only
        # passes through (see `start` above).
        self._original = self._patched = None

    # -- in the starting thread -----------------------------------------------------------------
    def _per_thread(self) -> list:
        """The loaded frameworks that keep a device per thread and can use a GPU here."""
        out = []
        for fw in self.switcher.frameworks:
            if fw.name in PROCESS_WIDE or not fw.loaded():
                continue
            key = (fw.name, id(fw.mod))
            usable = self._usable.get(key)
            if usable is None:  # a CPU-only build or no device stays so for the process's life
                try:
                    usable = fw.usable()
                except Exception:
                    usable = False
                if usable is None:  # CUDA not started: kept (a new thread waits, or says why); asked again
                    out.append(fw)
                    continue
                self._usable[key] = usable
            if usable:
                out.append(fw)
        return out

    def _start(self, thread: threading.Thread, original):
        try:
            wrapped, had_run = self._prepare(thread)
        except Exception as exc:  # a fault of ours must not stop the user's thread from starting
            wrapped, had_run = False, None
            self._warn(thread, f"gpuctx's thread hook failed: {type(exc).__name__}: {exc}")
        if not wrapped:
            return original(thread)
        try:
            return original(thread)
        except BaseException:  # e.g. "threads can only be started once": leave nothing behind
            self._forget(thread, had_run)
            raise

    def _prepare(self, thread: threading.Thread) -> tuple[bool, object]:
        """Record the starting thread's choice and wrap the new thread's `run` to apply it there."""
        if not self.follow:
            return False, None
        try:
            name = thread.name
        except Exception:  # Thread.__init__ was never called: `start` itself says so
            return False, None
        if name.startswith(OWN_PREFIX):
            return False, None
        mine = self._live.get(threading.current_thread())
        choice = mine.choice if mine is not None else self.switcher.choice
        if choice is None and not self._per_thread():
            return False, None  # nothing chosen, no GPU framework: nothing to carry or report
        record = Started(choice)
        had_run = thread.__dict__.get("run")
        run = thread.run

        def run_on_carried_device():
            try:
                self._enter(thread, record)
            except Exception as exc:  # never into the user's thread
                record.state = "failed"
                self._warn(thread, f"{type(exc).__name__}: {exc}")
            try:
                return run()
            finally:
                self._forget(thread, had_run)

        self._live[thread] = record
        thread.run = run_on_carried_device
        return True, had_run

    def _forget(self, thread, had_run) -> None:
        self._live.pop(thread, None)
        if had_run is None:
            thread.__dict__.pop("run", None)  # also breaks the thread -> wrapper -> thread cycle
        else:
            thread.__dict__["run"] = had_run

    # -- in the new thread, before its own code -------------------------------------------------
    def _enter(self, thread: threading.Thread, record: Started) -> None:
        choice = record.choice
        if choice is None:
            record.state = "unchosen"
            return
        switched = False
        failed = []
        frameworks = self._per_thread()
        for fw in frameworks:
            try:
                if fw.initialized() is False:
                    if fw.name == "torch" and self.switcher.cuda_starting():
                        # The warm-up is starting CUDA right now: wait for it (torch's lazy-init
                        # lock), then switch, as `Switcher.enforce` does for a cell.
                        fw.mod.cuda.set_device(choice.ordinal)
                        switched = True
                    continue  # no CUDA yet: switching would start it; the kernel's queued switch stays
                fw.set_current(choice.ordinal)
                switched = True
            except Exception as exc:
                failed.append(f"{fw.name}: {type(exc).__name__}: {exc}")
        if choice.default:
            torch = next((fw for fw in frameworks if fw.name == "torch"), None)
            if torch is not None:
                try:
                    torch.set_default(choice.ordinal)  # a Python-level setting: starts no CUDA
                except Exception as exc:
                    failed.append(f"torch default device: {type(exc).__name__}: {exc}")
        if failed:
            record.state = "failed"
            self._warn(thread, "; ".join(failed), choice.ordinal)
        else:  # nothing switched: CUDA had not started, or no GPU framework was imported yet
            record.state = "switched" if switched else "before CUDA"

    def _warn(self, thread, what: str, ordinal: int | None = None) -> None:
        if len(self.warnings) >= MAX_WARNINGS:
            self._dropped += 1
            return
        target = f" to cuda:{ordinal}" if ordinal is not None else ""
        self.warnings.append(f"thread {_thread_name(thread)!r} could not be switched{target} ({what}); "
                             "it runs on its default device")

    # -- for %gpu status ------------------------------------------------------------------------
    def report(self) -> list[str]:
        if not self.installed:
            return [("threads: not followed (gpuctx's thread hook is not installed); threads you start "
                     "begin on CUDA's device 0")]
        if not self.follow:
            return [("threads: do not follow the kernel's device (turned off); threads you start begin on "
                     "CUDA's device 0 unless they call torch.cuda.set_device")]
        lines = [("threads: follow the kernel's device (a thread starts on the device of the thread that "
                  "starts it: torch, CuPy, Numba; JAX's device is process-wide)")]
        now = self.switcher.choice
        now_ordinal = now.ordinal if now is not None else 0
        groups: dict[tuple[int, str], list[str]] = {}
        before_cuda = []
        for thread, rec in self._live.copy().items():
            if not thread.is_alive() or rec.state == "starting":
                continue
            if rec.state == "before CUDA":
                if now_ordinal != 0:
                    before_cuda.append(thread.name)
                continue
            if rec.state == "unchosen":
                on, why = 0, f"started before {describe(now)}" if now is not None else ""
            elif rec.state == "failed":
                on, why = 0, "switching it failed: see the thread warnings"
            else:
                on, why = rec.choice.ordinal, f"started under {describe(rec.choice)}"
            if on != now_ordinal:
                groups.setdefault((on, why), []).append(thread.name)
        for (on, why), names in groups.items():
            subject = f"thread {names[0]!r} runs" if len(names) == 1 else f"threads {_names(names)} run"
            lines.append(f"{subject} on cuda:{on}, not cuda:{now_ordinal}" + (f" ({why})" if why else ""))
        if before_cuda:
            lines.append(f"threads started before CUDA started keep CUDA's device 0 unless they started CUDA "
                         f"themselves: {_names(before_cuda)} (call torch.cuda.set_device({now_ordinal}) in them)")
        count = len(self.warnings) + self._dropped
        if count:
            lines.append(f"{count} thread{'s' if count > 1 else ''} could not be switched; latest: "
                         f"{self.warnings[-1]}")
        return lines


def _thread_name(thread: threading.Thread) -> str:
    try:
        return thread.name
    except Exception:  # a subclass that never called Thread.__init__
        return type(thread).__name__


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:NAMES_SHOWN])
    return shown if len(names) <= NAMES_SHOWN else f"{shown} and {len(names) - NAMES_SHOWN} more"
