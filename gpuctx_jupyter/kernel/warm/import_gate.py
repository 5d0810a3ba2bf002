"""The warm-up's imports and the user's cells: which cells wait for an import, and the gate that
holds the warm-up's imports while a cell runs.

An import the warm-up began before a cell is Python work that shares the GIL with that cell (a 1 s
cell ran beside 40 modules of 10 ms each of a package being imported: tests/test_import_gate.py).
The warm-up starts no step while a cell runs; the gate stops the step under way too, for the first
HOLD_MAX_S of each cell: its import threads stand still at their next module (a finder first on
`sys.meta_path` waits, letting go of Python's import lock). Standing still must never block the
cell, so an import is held only while it runs module code alone (import statements of modules
being imported: not a library's function nor C code, which may hold a lock the cell needs), and it
goes on for the rest of the cell as soon as another thread waits for a module's lock (a
half-imported package the cell needs) or the cell forks (the fork then waits as long as the
imports were held: the child finds them as far along as it would without the gate).
"""
from __future__ import annotations

import _imp
import ast
import dis
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
_IMPORT_OPS = {dis.opmap["IMPORT_NAME"], dis.opmap["IMPORT_FROM"]}
POLL_S = 0.01  # how often a held import looks whether it should go on
HOLD_MAX_S = 2.0  # the longest the warm-up's imports stand still for one cell


def imports_packages(source: str) -> bool:
    """Whether a cell imports a module beyond the standard library that is not fully imported yet
    (it may need what the warm-up is importing: it waits for that import instead)."""
    for name in _imported(source):
        if name.split(".")[0] in sys.stdlib_module_names and name in sys.modules:
            continue
        if not fws.imported(name):
            return True
    return False


def _imported(source: str) -> list[str]:
    """The modules a cell's import statements name (every one of `import a, b`; magics aside)."""
    try:
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    except (SyntaxError, ValueError):
        return _IMPORTS.findall(source)
    return [alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names] + [
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level]


def _module_code_only(frame, root) -> bool:
    """Whether the import that reached `frame` runs module code alone since the thread's `root`
    frame: import statements of modules being imported (and importlib.import_module) - not a
    library's function (which may hold a lock), nor C code (an extension's init, pickle)."""
    inner = None
    while frame is not None and frame is not root:
        code = frame.f_code
        if code.co_filename in _MACHINERY:
            if code.co_name == "_call_with_frames_removed" and (inner is None or inner.co_name != "<module>"):
                return False  # (C code between: an extension module's init imports)
        elif code.co_name == "<module>":
            if code.co_code[frame.f_lasti] not in _IMPORT_OPS and inner is not _IMPORT_MODULE:
                return False
        elif code is not _IMPORT_MODULE:
            return False
        inner, frame = code, frame.f_back
    return frame is root


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
        self._roots: dict[int, object] = {}  # registered thread -> the frame that registered it
        self._cell = 0  # which cell's closing this is (the hold ends per cell)
        self._closed_at = 0.0
        self._gone_on = False  # the hold is over for this cell
        self._held = 0  # threads standing still now
        self._held_since = 0.0

    def close(self) -> None:
        with self._lock:
            if self._open.is_set():
                self._cell += 1
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
        """Register the calling thread: its imports stand still while the gate is closed."""
        me = threading.get_ident()
        with self._lock:
            self._roots[me] = sys._getframe(2)  # (the caller's: past contextlib's __enter__)
            self._none_left.clear()
            if not self._installed:  # once, for good: a finder taken out races other threads' imports
                sys.meta_path.insert(0, self)
                self._installed = True
        try:
            yield
        finally:
            with self._lock:
                self._roots.pop(me, None)
                if not self._roots:
                    self._none_left.set()

    def _forking(self) -> None:
        """Before a fork: the held imports go on, and the fork waits as long as they were held, so
        that the child finds them as far along as without the gate (no longer: `!cmd` forks too)."""
        with self._lock:
            held_for = time.monotonic() - self._held_since if self._held else 0.0
            if held_for and threading.get_ident() not in self._roots:
                self._gone_on = True
            else:
                held_for = 0.0
        if held_for:
            self._none_left.wait(held_for)  # (at most HOLD_MAX_S)

    # -- the finder: it finds nothing, it only waits -----------------------------------------------
    def find_spec(self, name, path=None, target=None):
        root = self._roots.get(threading.get_ident())
        if self._open.is_set() or self._gone_on or root is None:
            return None
        cell = self._cell
        if not _module_code_only(sys._getframe(1), root) or self._must_go_on(cell):
            return None
        try:  # Python's import lock is held around a finder: let go of it meanwhile
            _imp.release_lock()
        except RuntimeError:
            return None  # (not held here: this is no import of Python's machinery)
        if _imp.lock_held():  # held more than once (or taken at once by another thread): go on
            _imp.acquire_lock()
            return None
        with self._lock:
            self._held += 1
            if self._held == 1:
                self._held_since = time.monotonic()
        try:
            while not self._open.wait(POLL_S) and not self._must_go_on(cell):
                pass
        finally:
            _imp.acquire_lock()
            with self._lock:
                self._held -= 1
                if not self._held:
                    self.held_s += time.monotonic() - self._held_since
        return None

    def invalidate_caches(self) -> None:
        pass

    def _must_go_on(self, cell: int) -> bool:
        """The hold is over for this cell: its time is up, or another thread waits for a module
        (or another cell has begun since: its own hold is decided at the next module)."""
        with self._lock:
            if cell != self._cell or self._gone_on:
                return True
            closed_at = self._closed_at
        if time.monotonic() - closed_at >= HOLD_MAX_S or self._another_waits():
            with self._lock:
                if cell == self._cell:
                    self._gone_on = True
            return True
        return False

    def _another_waits(self) -> bool:
        """Whether a thread not held takes a module's lock (one a held import may hold): an import
        of something else goes its way (IPython imports at a kernel's first cell, for one)."""
        for ident, frame in sys._current_frames().items():
            if ident in self._roots:
                continue
            while frame is not None:
                if frame.f_code.co_name == "acquire" and frame.f_code.co_filename == _MACHINERY[0]:
                    return True
                frame = frame.f_back
        return False


GATE = ImportGate()  # one per process: the kernel's warm-up holds its imports for the kernel's cells
