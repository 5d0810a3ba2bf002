"""The kernel's device choice, and keeping every framework on it.

`cudaSetDevice` is per host thread and torch's default device is thread-local, so a choice made
in one cell must be re-applied in whatever thread runs the next one; frameworks imported after
the choice must pick it up before their first GPU use. This module owns both mechanisms:
a cheap per-cell check and a post-import hook. Threads the notebook starts get the starting
thread's choice through `threads.ThreadFollower`, which the Switcher owns.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from dataclasses import dataclass, field

from ..core import frameworks as fws
from .threads import ThreadFollower

WATCHED = {fw.module: fw for fw in fws.ALL}
# JAX's and Numba's start-up touch every GPU and leave the thread on the last one they touched:
# switch them first, so torch and CuPy (which share the thread's CUDA device) are set last.
APPLY_ORDER = (fws.JAX, fws.NUMBA, fws.CUPY, fws.TORCH)


@dataclass
class Choice:
    ordinal: int
    default: bool = False  # tensors created without a device land there too
    source: str = "%gpu use"

    @property
    def assigned(self) -> bool:
        """Given to the kernel (by the server or its config), not chosen by the user or the
        notebook: what the notebook names may take its place."""
        return "server" in self.source or "config" in self.source


@dataclass
class Applied:
    """What one switch did, per framework: 'cuda:1', 'cuda:1 (when CUDA starts)', or why not."""

    results: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class Switcher:
    """Holds the kernel's choice (`base`: `%gpu use`, the server's, the notebook's) and the
    `%%on_gpu` blocks running on top of it; the innermost block's choice is in force.

    A `use` or `assign` while a block runs (`%gpu use` in a `%%on_gpu` cell, the warm-up following
    the notebook meanwhile) changes the base only: the block keeps its device until it ends, and
    then every framework goes to the new base, as if `%gpu use` had run after the cell.

    `frameworks` are the adapters it keeps on the choice, in the order they are switched (tests
    pass recording fakes); torch's default device is handled by the one named "torch".
    """

    def __init__(self, cuda_starting=lambda: False, frameworks=APPLY_ORDER):
        # True while another thread (the warm-up) is starting CUDA: a cell must then wait
        # for it and set its own thread's device, rather than skip torch.
        self.cuda_starting = cuda_starting
        self.frameworks: tuple[fws.Framework, ...] = tuple(frameworks)
        self._base: Choice | None = None
        self._blocks: list[Choice] = []  # the %%on_gpu blocks running, innermost last
        self._lock = threading.RLock()
        self._on_first_cell: set[str] = set()  # frameworks `assign` switches before the first cell
        self._saved_torch_default: object = None
        self._torch_default_owned = False
        self.threads = ThreadFollower(self)

    def framework(self, name: str) -> fws.Framework | None:
        return next((fw for fw in self.frameworks if fw.name == name), None)

    def _loaded(self) -> list[fws.Framework]:
        return [fw for fw in self.frameworks if fw.loaded()]

    # -- threads the notebook starts (see threads.py) --------------------------------------------
    @property
    def follow_threads(self) -> bool:
        """Whether threads started from Python begin on the starting thread's device (default True)."""
        return self.threads.follow

    @follow_threads.setter
    def follow_threads(self, value: bool) -> None:
        self.threads.follow = bool(value)

    @property
    def thread_warnings(self) -> list[str]:
        """One line per thread whose switch failed (that thread runs on its default device)."""
        return self.threads.warnings

    def threads_report(self) -> list[str]:
        """Sentences for `%gpu status`: whether threads follow, and live threads on another device."""
        return self.threads.report()

    @property
    def choice(self) -> Choice | None:
        """The choice in force: the innermost `%%on_gpu` block's, else the kernel's."""
        return self._blocks[-1] if self._blocks else self._base

    @property
    def base(self) -> Choice | None:
        """The kernel's choice, which applies outside (and after) any `%%on_gpu` block."""
        return self._base

    @property
    def block(self) -> Choice | None:
        """The innermost `%%on_gpu` block running, if any."""
        return self._blocks[-1] if self._blocks else None

    def use(self, choice: Choice | None) -> Applied:
        """Make `choice` the kernel's device from now on (None forgets it); inside a `%%on_gpu`
        block, from the block's end on (nothing is switched now: the Applied is empty)."""
        with self._lock:
            base, self._base = self._base, choice
            if self._blocks:
                return Applied()
            if choice is None:
                return self._apply_default(None) if base is not None and base.default else Applied()
            return self.apply_all()

    def assign(self, choice: Choice) -> None:
        """Make `choice` the kernel's device as a kernel starting on it gets it (the server's
        assignment, taken at the warm pool's hand-over): each framework imported already is
        switched as if it had just been imported — not asked whether it can use a GPU, which would
        start CUDA's driver; torch queues the switch for its own start-up."""
        with self._lock:
            self._base = choice
            if self._blocks:
                return  # applied when the block ends
        for fw in self._loaded():
            if fw.name == "torch":
                self.on_import(fw.module)
            else:  # switching them starts their GPU backend: the user's first cell does it (enforce)
                self._on_first_cell.add(fw.name)

    def apply_all(self) -> Applied:
        applied = Applied()
        for fw in self._loaded():
            self._apply_one(fw, applied)
        if "torch" not in applied.errors:  # (torch cannot use the GPU: its default stays put)
            self._merge(self._apply_default(self.choice), applied)
        return applied

    def _apply_one(self, fw: fws.Framework, applied: Applied, ask: bool = True) -> None:
        """`ask`: ask the framework whether it can use a GPU even before CUDA has started (which
        starts CUDA's driver here, holding the GIL: for `%gpu use`, not for an import cell)."""
        choice = self.choice
        if choice is None:
            return
        reason = fw.gpu_reason() if ask or fw.usable() is False else None
        if reason:
            applied.errors[fw.name] = reason
            return
        try:
            fw.set_current(choice.ordinal)
        except Exception as exc:  # a framework's own error must not break the switch of the others
            applied.errors[fw.name] = f"{type(exc).__name__}: {exc}"
            return
        lazy = fw.name == "torch" and not fw.initialized()
        applied.results[fw.name] = f"cuda:{choice.ordinal}" + (" (from CUDA start-up)" if lazy else "")

    def _apply_default(self, choice: Choice | None) -> Applied:
        """torch's default device follows `--default`; CuPy, Numba and JAX always allocate on
        the current device, so for them the switch itself is the default."""
        applied = Applied()
        torch = self.framework("torch")
        if torch is None or not torch.loaded() or torch.usable() is False:  # (a Python-level setting)
            return applied
        if choice is not None and choice.default:
            before = torch.set_default(choice.ordinal)
            if not self._torch_default_owned:
                self._saved_torch_default, self._torch_default_owned = before, True
            applied.results["torch default"] = f"cuda:{choice.ordinal}"
        elif self._torch_default_owned:
            torch.set_default(None, previous=self._saved_torch_default)
            self._saved_torch_default, self._torch_default_owned = None, False
            applied.results["torch default"] = str(torch.default_device() or "cpu")
        return applied

    @staticmethod
    def _merge(src: Applied, dst: Applied) -> None:
        dst.results.update(src.results)
        dst.errors.update(src.errors)

    @contextlib.contextmanager
    def scoped(self, choice: Choice):
        """Run a block on `choice` and restore every framework afterwards, whatever happens."""
        saved = {fw.name: fw.current() for fw in self._loaded() if not fw.gpu_reason()}
        torch = self.framework("torch")
        saved_default = torch.default_device() if torch is not None and torch.loaded() else None
        with self._lock:
            base = self._base
            self._blocks.append(choice)
            saved_owned = (self._saved_torch_default, self._torch_default_owned)
            self._torch_default_owned = False
        try:
            applied = self.apply_all()
            yield applied
        finally:
            with self._lock:
                self._blocks.pop()
                self._restore(saved, saved_default, saved_owned)
                if self._base is not base and not self._blocks:
                    self._base_changed(base)

    def _base_changed(self, before: Choice | None) -> None:
        """A block has ended after a `use` inside it: the new base in force, as `use` puts it."""
        try:
            if self._base is not None:
                self.apply_all()
            elif before is not None and before.default:
                self._apply_default(None)
        except Exception:
            pass  # never mask the cell's own exception (the next cell's enforce() tries again)

    def _restore(self, saved, saved_default, saved_owned) -> None:
        for fw in self._loaded():
            if fw.gpu_reason():
                continue
            # A framework imported inside the block goes back to the kernel's choice (or 0, its own
            # default: without a choice the block's device would stay the notebook's from then on).
            target = saved.get(fw.name)
            if target is None:
                target = self.choice.ordinal if self.choice else 0
            if fw.current() == target:
                continue
            try:
                fw.set_current(target)
            except Exception:
                pass  # restoring must never mask the cell's own exception
        torch = self.framework("torch")
        if torch is not None and torch.loaded() and not torch.gpu_reason() and self._torch_default_owned:
            torch.set_default(None, previous=saved_default)
        self._saved_torch_default, self._torch_default_owned = saved_owned

    def enforce(self) -> None:
        """Before each cell: put the choice back in force in the thread that runs the cell."""
        choice = self.choice
        if choice is None:
            return
        if self._on_first_cell:
            waiting, self._on_first_cell = self._on_first_cell, set()
            for fw in self._loaded():
                if fw.name in waiting:
                    self._apply_one(fw, Applied(), ask=False)
        for fw in self._loaded():
            if fw.name not in ("torch", "cupy"):
                continue
            try:
                if fw.name == "torch" and not fw.initialized():
                    if self.cuda_starting():
                        fw.mod.cuda.set_device(choice.ordinal)  # waits on torch's lazy-init lock
                    continue  # otherwise the queued lazy call takes care of it
                if fw.usable() and fw.current() != choice.ordinal:  # (not asked before CUDA starts)
                    fw.set_current(choice.ordinal)
            except Exception:
                pass
        torch = self.framework("torch")
        if (choice.default and torch is not None and torch.loaded() and torch.usable() is not False
                and torch.default_device() != f"cuda:{choice.ordinal}"):
            torch.set_default(choice.ordinal)

    def on_import(self, module: str) -> None:
        """A watched framework finished importing: give it the kernel's device. JAX and Numba
        imported by another thread than the cells' (the warm-up's) get it before the next cell, in
        the cells' thread: their device is per thread, and switching starts their GPU backend."""
        fw = next((fw for fw in self.frameworks if fw.module == module), None)
        if fw is None or self.choice is None:
            return
        if fw.name in ("jax", "numba") and threading.current_thread() is not threading.main_thread():
            self._on_first_cell.add(fw.name)
            return
        applied = Applied()
        self._apply_one(fw, applied, ask=False)
        if fw.name == "torch":
            self._merge(self._apply_default(self.choice), applied)
        elif fw.name in ("jax", "numba"):
            self.enforce()  # their start-up may have moved this thread off the chosen device


class _Loader(importlib.abc.Loader):
    """Wraps a framework's loader to call back once the module has executed."""

    def __init__(self, loader, callback):
        self._loader, self._callback = loader, callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # From here on the module is the loader-of-record; restore the original for tools
        # that inspect __loader__ (pkgutil, importlib.resources).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
            # The module has run in full: let the callback see it as loaded (importlib clears
            # the flag itself only after this returns, and `Framework.loaded()` reads it).
            module.__spec__._initializing = False
        try:
            self._callback(module.__name__)
        except Exception:
            pass  # never break the user's import

    def __getattr__(self, name):
        return getattr(self._loader, name)


class PostImportHook(importlib.abc.MetaPathFinder):
    """Calls `callback(name)` after any watched module is imported."""

    def __init__(self, names, callback):
        self.names, self.callback = set(names), callback
        self._busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self.callback)
        return spec

    def install(self):
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self):
        while self in sys.meta_path:
            sys.meta_path.remove(self)
