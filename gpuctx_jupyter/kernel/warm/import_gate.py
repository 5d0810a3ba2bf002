"""The warm-up's imports and the user's cells: which cells wait for an import, and the gate that
holds the warm-up's imports while a cell runs.

An import the warm-up began before a cell is Python work that shares the GIL with that cell (a 1 s
cell ran beside 40 modules of 10 ms each of a package being imported: tests/test_import_gate.py).
The warm-up starts no step while a cell runs; the gate stops the step under way too, for the first
HOLD_MAX_S of each cell: its import threads stand still at their next module (a finder first on
`sys.meta_path` waits, letting go of Python's import lock). Standing still must never block the
cell, so an import is held only where it runs module code alone (import statements of modules
being imported: a library's function may hold a lock the cell needs), and it goes on, for the
rest of the cell, as soon as another thread waits for a module's lock (one the held import may
hold: a half-imported package) or the cell forks (the first fork waits, up to FORK_WAIT_S, for the held
imports to finish: a child must not inherit a half-imported package)."""
from __future__ import annotations

import _imp
import importlib
import os
import re
import sys
import threading
import time
from contextlib import contextmanager

from ...core import frameworks as fws

_IMPORTS = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][\w.]*)", re.MULTILINE)
_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_IMPORT_MODULE = importlib.import_module.__code__
POLL_S = 0.01  # how often a held import looks whether it should go on
HOLD_MAX_S = 2.0  # the longest the warm-up's imports stand still for one cell
FORK_WAIT_S = 5.0  # the longest a fork waits for the imports it let go on


def imports_packages(source: str) -> bool:
    """Whether a cell imports a module beyond the standard library that is not fully imported yet
    (it may need what the warm-up is importing: it waits for that import instead)."""
    for name in _IMPORTS.findall(source):
        if name.split(".")[0] in sys.stdlib_module_names and name in sys.modules:
            continue
        if not fws.imported(name):
            return True
    return False


def _module_code_only(frame) -> bool:
    """Whether the import that reached `frame` runs module code alone, from where it began."""
    chain = []
    while frame is not None:
        chain.append(frame.f_code)
        frame = frame.f_back
    outermost = max((i for i, code in enumerate(chain) if code.co_filename in _MACHINERY), default=0)
    return all(code.co_filename in _MACHINERY or code.co_name == "<module>" or code is _IMPORT_MODULE
               for code in chain[:outermost])


class ImportGate:
    """Closed while a cell runs; the threads registered with `holding()` stand still at their next
    import for the first HOLD_MAX_S of it (see the module's docstring for when they go on)."""

    def __init__(self):
        self._reset()
        self._installed = False
        self.held_s = 0.0  # time with an import standing still, in all (ongoing holds not yet)
        os.register_at_fork(before=self._forking, after_in_child=self._reset)

    def _reset(self) -> None:
        """A fresh state (and, in a forked child, no thread of the parent's and a gate open)."""
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._none_left = threading.Event()
        self._none_left.set()
        self._threads: set[int] = set()
        self._closed_at = 0.0
        self._gone_on = False  # this cell's hold is over
        self._held = 0  # threads standing still now
        self._held_since = 0.0

    def close(self) -> None:
        with self._lock:
            if self._open.is_set():
                self._closed_at, self._gone_on = time.monotonic(), False
                self._open.clear()

    def open(self) -> None:
        self._open.set()

    def held(self) -> float:
        """Seconds with an import standing still, until now (not counted in an import's budget)."""
        with self._lock:
            return self.held_s + (time.monotonic() - self._held_since if self._held else 0.0)

    @contextmanager
    def holding(self):
        """Register this thread: its imports stand still while the gate is closed."""
        me = threading.get_ident()
        with self._lock:
            self._threads.add(me)
            self._none_left.clear()
            if not self._installed:  # once, for good: a finder taken out races other threads' imports
                sys.meta_path.insert(0, self)
                self._installed = True
        try:
            yield
        finally:
            with self._lock:
                self._threads.discard(me)
                if not self._threads:
                    self._none_left.set()

    def _forking(self) -> None:
        with self._lock:
            held = self._held > 0 and threading.get_ident() not in self._threads
            if held:
                self._gone_on = True
        if held:
            self._none_left.wait(FORK_WAIT_S)

    # -- the finder: it finds nothing, it only waits -----------------------------------------------
    def find_spec(self, name, path=None, target=None):
        if self._open.is_set() or self._gone_on or threading.get_ident() not in self._threads:
            return None
        if not _module_code_only(sys._getframe(1)) or self._must_go_on():
            return None
        with self._lock:
            self._held += 1
            if self._held == 1:
                self._held_since = time.monotonic()
        try:  # Python's import lock is held around a finder: let go of it meanwhile
            _imp.release_lock()
            released = True
        except RuntimeError:
            released = False
        try:
            while not self._open.wait(POLL_S) and not self._must_go_on():
                pass
        finally:
            if released:
                _imp.acquire_lock()
            with self._lock:
                self._held -= 1
                if not self._held:
                    self.held_s += time.monotonic() - self._held_since
        return None

    def invalidate_caches(self) -> None:
        pass

    def _must_go_on(self) -> bool:
        """The hold is over for this cell: its time is up, or another thread waits for a module."""
        if not self._gone_on and (time.monotonic() - self._closed_at >= HOLD_MAX_S or self._another_waits()):
            self._gone_on = True
        return self._gone_on

    def _another_waits(self) -> bool:
        """Whether a thread not held takes a module's lock (one a held import may hold): an import
        of something else goes its way (IPython imports at a kernel's first cell, for one)."""
        for ident, frame in sys._current_frames().items():
            if ident in self._threads:
                continue
            while frame is not None:
                if frame.f_code.co_name == "acquire" and frame.f_code.co_filename == _MACHINERY[0]:
                    return True
                frame = frame.f_back
        return False


GATE = ImportGate()  # one per process: the kernel's warm-up holds its imports for the kernel's cells
