"""The warm-up's imports and the user's cells: which cells wait for an import, and the gate that
holds the warm-up's imports while a cell runs.

An import the warm-up began before a cell is Python work that shares the GIL with that cell (a 1 s
cell ran beside 40 modules of 10 ms each of a package being imported: tests/test_import_gate.py).
The warm-up starts no step while a cell runs; the gate stops the step under way too: its import
threads stand still at their next module (a finder first on `sys.meta_path` asks the gate,
letting go of Python's import lock while it waits) until no cell runs. The modules they are
importing stay locked meanwhile, so the gate lets them go on as soon as any other thread is
inside an import (it may be waiting for one of those), and before a fork (a child must not
inherit a half-imported module: the fork waits for those imports, bounded, as a cell importing
them waits)."""
from __future__ import annotations

import _imp
import os
import re
import sys
import threading
import time
from contextlib import contextmanager

from ...core import frameworks as fws

_IMPORTS = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][\w.]*)", re.MULTILINE)
_BOOTSTRAP = "<frozen importlib._bootstrap>"
POLL_S = 0.01  # how often a held import looks whether another thread now imports
FORK_WAIT_S = 5.0  # the longest a fork waits for the held imports to finish


def imports_packages(source: str) -> bool:
    """Whether a cell imports a module beyond the standard library that is not fully imported yet
    (it may need what the warm-up is importing: it waits for that import instead)."""
    for name in _IMPORTS.findall(source):
        if name.split(".")[0] in sys.stdlib_module_names and name in sys.modules:
            continue
        if not fws.imported(name):
            return True
    return False


class ImportGate:
    """Closed while a cell runs; the threads registered with `holding()` stop at their next import
    until it opens. On `sys.meta_path` only while such a thread runs."""

    def __init__(self):
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._threads: set[int] = set()
        self._none_left = threading.Event()
        self._none_left.set()
        self._closed_at: float | None = None
        self._closed_s = 0.0
        self.held_s = 0.0  # how long imports stood still for cells, in all (%gpu status)
        os.register_at_fork(before=self._forking)

    def close(self) -> None:
        with self._lock:
            if self._closed_at is None:
                self._closed_at = time.monotonic()
            self._open.clear()

    def open(self) -> None:
        with self._lock:
            if self._closed_at is not None:
                self._closed_s += time.monotonic() - self._closed_at
                self._closed_at = None
            self._open.set()

    def closed_s(self) -> float:
        """Seconds the gate has been closed until now (an import's time budget does not count them)."""
        with self._lock:
            return self._closed_s + (time.monotonic() - self._closed_at if self._closed_at is not None else 0.0)

    @contextmanager
    def holding(self):
        """Register this thread: its imports wait while the gate is closed."""
        me = threading.get_ident()
        with self._lock:
            self._threads.add(me)
            self._none_left.clear()
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)
        try:
            yield
        finally:
            with self._lock:
                self._threads.discard(me)
                if not self._threads:
                    self._none_left.set()
                    if self in sys.meta_path:
                        sys.meta_path.remove(self)

    def _forking(self) -> None:
        if self._threads and threading.get_ident() not in self._threads:
            self.open()
            self._none_left.wait(FORK_WAIT_S)

    # -- the finder: it finds nothing, it only waits -----------------------------------------------
    def find_spec(self, name, path=None, target=None):
        if self._open.is_set() or threading.get_ident() not in self._threads:
            return None
        t0 = time.monotonic()
        try:  # Python's import lock is held around a finder: let go of it meanwhile
            _imp.release_lock()
            released = True
        except RuntimeError:
            released = False
        try:
            while not self._open.wait(POLL_S) and not self._others_import():
                pass
        finally:
            if released:
                _imp.acquire_lock()
            with self._lock:
                self.held_s += time.monotonic() - t0
        return None

    def invalidate_caches(self) -> None:
        pass

    def _others_import(self) -> bool:
        """Whether a thread other than the held ones is inside Python's import machinery."""
        for ident, frame in sys._current_frames().items():
            if ident in self._threads:
                continue
            while frame is not None:
                if frame.f_code.co_filename == _BOOTSTRAP:
                    return True
                frame = frame.f_back
        return False


GATE = ImportGate()  # one per process: the kernel's warm-up holds its imports for the kernel's cells
