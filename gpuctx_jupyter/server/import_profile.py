"""The import profile: what an import-warm standby imports before any notebook asks for it.

Imports are the longest wait a notebook's first cells meet (10–17 s for notebooks built on
transformers, lightning or torch_geometric on an H200 host, longer than anyone reads before the
first Run): a standby that has imported them before the notebook is opened makes the import cell
instant. The profile holds:

- the base: torch, torch._dynamo and torch.optim where torch is installed (an optimizer's first
  use imports torch._dynamo, ~3 s);
- the top-level imports of installed modules of the notebooks opened or modified most recently
  under the server's root: read at start-up (off the event loop) and again at every open, kept
  across server restarts in Jupyter's data folder;
- the names those notebooks take from a module (`from transformers import BertModel`): a package
  that loads its parts lazily (transformers, diffusers) loads them only as a name is asked for, so
  a standby that imported the package alone left the notebook's import cell 1.5–2 s on an H200.
  A standby resolves each one (`module:name` in its list, `imports()`). At most MAX_NAMES per
  module: a new name takes a free place, or the place of one no notebook has taken for
  NAME_STALE_S — never of one taken lately, since every change to the list starts a new standby
  (two notebooks that take ten names between them would otherwise swap them at every open). A
  name it cannot resolve is not taken again for DROP_EXPIRES_S (no judgement on the module);
- `torch._inductor.compile_fx` for a notebook that calls torch.compile (the import its first
  compile pays; a standby that imports it starts inductor's compile workers too);
- what each import costs and what it did, as the standbys report it: a module whose own import
  failed, ran past HANG_FRACTION of the import budget without finishing (time its standby stood
  paused for a running cell not counted) or created a CUDA context is dropped (logged once), for
  DROP_EXPIRES_S: then it is tried once more (the package may have been fixed or upgraded; a week
  keeps a bad one to one standby's import a week, and needs no look into each kernelspec's
  environment, which the server cannot see). An import the budget left no time for is no judgement
  on the module: it stays. One that started the CUDA driver (torch_geometric does) stays, marked,
  and a standby holding it serves only notebooks whose CUDA start-up environment is the standby's;
- what is true of one kernelspec only (a module not installed in its environment, a module left
  out so that its standby fits the standbys' share of host memory) is left out for that kernelspec
  alone (`left_out`), in memory, and lapses as drops do (one left out to fit comes back sooner,
  once the host has memory for it: standby_memory.py). A profile file kept under older rules
  keeps only the drops today's make too (`DROP_REASON`): its drops for a spent budget ("did not
  finish in time") and for what one environment lacked are forgotten on load.

Capped by count and by import time: `modules(kernel_name)` are the modules a standby imports, in
that order, and `imports(kernel_name)` that list with the names taken from each. The file is
written whole (a temporary file renamed over it), one snapshot at a time, never an older over a
newer one.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from jupyter_core.paths import jupyter_data_dir

from ..contract import INDUCTOR_MODULE
from ..contract.notebook import Facts

BASE_TORCH = ("torch", "torch._dynamo", "torch.optim")
MAX_MODULES = 30
MAX_NAMES = 8  # names taken from one module that a standby resolves, at most
NAME_STALE_S = 24 * 3600.0  # a name no notebook has taken for this long gives its place to a new one
IMPORT_BUDGET_S = 60.0
RECENT_NOTEBOOKS = 20  # notebooks read at start-up: the most recently modified ones under the root
SCAN_ENTRIES = 5000  # folder entries looked at by the start-up scan at most
HANG_FRACTION = 1 / 3  # an import still running after this share of the import budget hangs (20 s of 60)
DROP_EXPIRES_S = 7 * 24 * 3600.0  # a dropped or left-out module is tried again after a week
# the reasons `outcome` drops a module for: a profile file's drops for any other are forgotten on load
DROP_REASON = re.compile(r"its import (failed|created a CUDA context|did not finish in \d+ s)")
MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a profile file's module names: dotted identifiers
SKIP_DIRS = {"node_modules", "site-packages", "__pycache__", ".ipynb_checkpoints", ".git", ".venv", "venv"}


@dataclass
class Entry:
    module: str
    seen: int = 0  # times a notebook importing it was opened, restarted or found at start-up
    last: float = 0.0  # when a notebook importing it was last opened or modified (epoch)
    seconds: float | None = None  # its import, as a standby last measured it
    dropped: str = ""  # why it is no longer imported ahead (a sentence)
    dropped_at: float = 0.0  # when (epoch): tried again DROP_EXPIRES_S later
    driver: bool = False  # its import starts the CUDA driver
    memory: int | None = None  # bytes of host memory its import added to a standby, as last seen
    names: list[str] = field(default_factory=list)  # taken from it by `from module import name`
    name_seconds: dict[str, float] = field(default_factory=dict)  # resolving each, as a standby last measured it
    name_last: dict[str, float] = field(default_factory=dict)  # when a notebook last took each (epoch)
    names_dropped: dict[str, float] = field(default_factory=dict)  # could not be resolved: when (epoch)

    def take(self, names, when: float) -> None:
        """A notebook takes `names` from this module (see the module's docstring)."""
        for name in names:
            dropped = self.names_dropped.get(name)
            if not name.isidentifier() or (dropped is not None and when - dropped < DROP_EXPIRES_S):
                continue
            if name not in self.names and len(self.names) >= MAX_NAMES:
                stale = min((n for n in self.names if when - self.name_last.get(n, 0.0) > NAME_STALE_S),
                            key=lambda n: self.name_last.get(n, 0.0), default=None)
                if stale is None:
                    continue  # (the adopted kernel's warm-up resolves it after the hand-over)
                self.names.remove(stale)
                self.name_seconds.pop(stale, None)
                self.name_last.pop(stale, None)
            if name not in self.names:
                self.names.append(name)
            self.name_last[name] = max(self.name_last.get(name, 0.0), when)


def profile_path(root_dir: str) -> str:
    """Where the import profile of the server serving `root_dir` is kept across restarts."""
    key = hashlib.sha1(os.path.abspath(root_dir).encode()).hexdigest()[:12]
    return os.path.join(jupyter_data_dir(), "gpuctx", f"import-profile-{key}.json")


class ImportProfile:
    def __init__(self, path: str | None, log, torch_installed: bool, max_modules: int = MAX_MODULES,
                 budget_s: float = IMPORT_BUDGET_S):
        self.path, self.log = path, log
        self.max_modules, self.budget_s = max_modules, budget_s
        self.base = list(BASE_TORCH) if torch_installed else []
        self.entries: dict[str, Entry] = {}
        self.left_out: dict[str, dict[str, tuple[str, float]]] = {}  # kernelspec -> module -> (why, when)
        self._logged: set[str] = set()
        self._writing = threading.Lock()  # one write at a time, and never an older snapshot over a newer
        self._snapshots = self._written = 0

    # -- learning --------------------------------------------------------------------------------
    def learn(self, facts: Facts, when: float | None = None) -> bool:
        """A notebook was opened (or found at start-up): its top-level imports count. True when the
        profile's list of imports changed."""
        if facts.error or facts.opts_out:
            return False
        before = self.imports()
        when = time.time() if when is None else when
        seen = set()
        imports = [(ev.module, ev.names) for ev in facts.imports() if ev.beyond_stdlib]
        for module, names in imports + ([(INDUCTOR_MODULE, ())] if "torch_compile" in facts.signals else []):
            entry = self.entries.setdefault(module, Entry(module))
            entry.take(names, when)
            if module not in seen:
                seen.add(module)
                entry.seen += 1
                entry.last = max(entry.last, when)
        return self.imports() != before

    def outcome(self, module: str, state: str, seconds: float | None, cuda: str, detail: str = "",
                kernel_name: str = "", paused_s: float = 0.0) -> None:
        """What importing `module` did in a standby of `kernel_name` (its plan step): keep its time,
        drop what broke. `paused_s`: how long that standby stood stopped for running cells during
        this import (its clock ran on meanwhile; standby.paused_during)."""
        entry = self.entries.get(module)
        if entry is None and module in self.base and cuda == "context":  # (torch patched to start CUDA)
            entry = self.entries[module] = Entry(module)  # dropped as any other: else every standby fails on it
        if entry is None:
            return
        if seconds is not None and state == "done":
            entry.seconds = seconds
        entry.driver = entry.driver or cuda == "driver"
        broke = self._broke(state, seconds, detail, paused_s)
        if cuda == "context":
            self._drop(entry, "its import created a CUDA context (GPU memory in a standby)")
        elif broke:
            self._drop(entry, broke)
        elif state == "skipped" and detail and "import budget" not in detail:
            self.leave_out(kernel_name, module, detail)  # not installed there, local code, the deny list

    def name_outcome(self, module: str, name: str, state: str, seconds: float | None, cuda: str, detail: str = "",
                     paused_s: float = 0.0) -> None:
        """What resolving `from module import name` did in a standby: its time counts with the
        module's; one that failed or hung is not taken again for DROP_EXPIRES_S; one that created a
        CUDA context drops the module, as its import would."""
        entry = self.entries.get(module)
        if entry is None or name not in entry.names:
            return
        if seconds is not None and state == "done":
            entry.name_seconds[name] = seconds
        if cuda == "context":
            self._drop(entry, f"its import created a CUDA context (GPU memory in a standby), with {name}")
        elif self._broke(state, seconds, detail, paused_s):
            entry.names.remove(name)
            entry.name_seconds.pop(name, None)
            entry.name_last.pop(name, None)
            entry.names_dropped[name] = time.time()

    def _broke(self, state: str, seconds: float | None, detail: str, paused_s: float) -> str:
        """Why what a standby tried (an import, a name) is held against it: it failed, or ran past
        HANG_FRACTION of the import budget (its paused time not counted); "" when not — a budget
        that left no time, or cut it short sooner, is no judgement on it."""
        if state != "failed":
            return ""
        if "import budget" not in detail:
            return f"its import failed ({detail})" if detail else "its import failed"
        own = (seconds or 0.0) - paused_s
        return f"its import did not finish in {own:.0f} s ({detail})" if own >= HANG_FRACTION * self.budget_s else ""

    def leave_out(self, kernel_name: str, module: str, why: str) -> None:
        """`module` is not imported ahead by standbys of `kernel_name` (the others still do)."""
        if module not in self.left_out.setdefault(kernel_name, {}):
            self.left_out[kernel_name][module] = (why, time.time())
            key = f"{kernel_name}:{module}"
            if key not in self._logged:
                self._logged.add(key)
                self.log.info("gpuctx pool: %s is no longer imported ahead by %s standbys: %s", module,
                              kernel_name, why)

    def trim(self, kernel_name: str, modules, excess: int) -> list[str]:
        """A standby of `kernel_name` importing `modules` outgrew the standbys' share of host memory
        by `excess` bytes: leave its heaviest learnt modules (as measured) out for that kernelspec
        until that much is gone. [] when what was measured cannot make it fit."""
        known = sorted(((self.entries[m].memory, m) for m in modules
                        if m in self.entries and m not in self.base and self.entries[m].memory), reverse=True)
        out, freed = [], 0
        for cost, module in known:
            if freed >= excess:
                break
            out.append((module, cost))
            freed += cost
        if freed < excess:
            return []
        for module, cost in out:
            self.leave_out(kernel_name, module, f"its import adds {cost / 2**20:.0f} MiB: a standby importing it "
                                                "holds more than standby_memory_fraction of the host memory")
        return [m for m, _ in out]

    def _drop(self, entry: Entry, why: str) -> None:
        if not entry.dropped:
            entry.dropped, entry.dropped_at = why, time.time()
            self._drop_once(entry.module, why)

    def _drop_once(self, module: str, why: str) -> None:
        if module not in self._logged:
            self._logged.add(module)
            self.log.info("gpuctx pool: %s is no longer imported ahead by standbys: %s", module, why)

    def take_back(self, kernel_name: str, module: str, why: str) -> bool:
        """`module`, left out for `kernel_name`, is imported ahead by its standbys again (False: it
        was not left out, or has lapsed meanwhile)."""
        if self.left_out.get(kernel_name, {}).pop(module, None) is None:
            return False
        self._logged.discard(f"{kernel_name}:{module}")
        self.log.info("gpuctx pool: %s is imported ahead by %s standbys again: %s", module, kernel_name, why)
        return True

    def _lapse(self, now: float) -> None:
        """Drops and left-outs older than DROP_EXPIRES_S are tried again."""
        for entry in self.entries.values():
            if entry.dropped and now - entry.dropped_at > DROP_EXPIRES_S:
                entry.dropped, entry.dropped_at = "", 0.0
                self._logged.discard(entry.module)
            entry.names_dropped = {n: t for n, t in entry.names_dropped.items() if now - t <= DROP_EXPIRES_S}
        for kernel_name, modules in self.left_out.items():
            for module, (_, when) in list(modules.items()):
                if now - when > DROP_EXPIRES_S:
                    del modules[module]
                    self._logged.discard(f"{kernel_name}:{module}")

    # -- what a standby imports ---------------------------------------------------------------------
    def modules(self, kernel_name: str = "") -> list[str]:
        """The base, then the learned modules most recently used first, capped by count and time;
        for a standby of `kernel_name`, without what is left out for it."""
        self._lapse(time.time())
        # a dropped base module (torch) takes what is under it along: torch.optim, a learnt torch.nn
        gone = tuple(f"{m}." for m in self.base if m in self.entries and self.entries[m].dropped)
        out = [m for m in self.base if not f"{m}.".startswith(gone)]
        skip = self.left_out.get(kernel_name, {})
        spent = 0.0
        for entry in sorted(self.entries.values(), key=lambda e: (-e.last, -e.seen, e.module)):
            if entry.dropped or entry.module in out or entry.module in skip or f"{entry.module}.".startswith(gone):
                continue
            if len(out) >= self.max_modules:
                break
            cost = (entry.seconds or 0.0) + sum(entry.name_seconds.values())
            if spent + cost > self.budget_s:
                continue
            spent += cost
            out.append(entry.module)
        return out

    def imports(self, kernel_name: str = "") -> list[str]:
        """What a standby of `kernel_name` is asked to import: modules(), each followed by the names
        notebooks take from it, as "module:name"."""
        out = []
        for module in self.modules(kernel_name):
            entry = self.entries.get(module)
            out += [module] + [f"{module}:{n}" for n in (entry.names if entry else ())]
        return out

    def starts_driver(self, modules) -> bool:
        return any(self.entries.get(m, Entry(m)).driver for m in modules)

    # -- kept across server restarts --------------------------------------------------------------
    def load(self) -> None:
        self.merge(self.read())

    def read(self) -> list[Entry]:
        """The entries of the profile file (none when there is none, or it is not ours): file work
        only, for a thread of its own — merge() then takes them in where the profile changes."""
        if not self.path:
            return []
        out = []
        try:
            with open(self.path) as fh:
                raw = json.load(fh)
            for item in raw.get("entries", []):
                entry = _entry(item)
                if entry is not None:
                    if entry.dropped and not DROP_REASON.match(entry.dropped):
                        entry.dropped, entry.dropped_at = "", 0.0  # under older rules, which no longer hold
                    elif entry.dropped and not entry.dropped_at:  # kept before drops lapsed: from now
                        entry.dropped_at = time.time()
                    out.append(entry)
        except (OSError, ValueError, TypeError, AttributeError, OverflowError):
            return []  # learnt again from the notebooks
        return out

    def merge(self, entries: list[Entry]) -> None:
        """Entries read from the file, under what was learnt since the server started."""
        for entry in entries:
            self.entries.setdefault(entry.module, entry)

    def snapshot(self) -> dict:
        """What write() keeps, taken where the profile changes (the server's event loop): write()
        may then run in another thread while notebooks opened meanwhile change it."""
        self._snapshots += 1
        return {"version": 1, "snapshot": self._snapshots, "entries": [asdict(e) for e in self.entries.values()]}

    def write(self, payload: dict) -> None:
        """Keep `payload` in the profile file (replaced whole: a reader never sees half a file),
        unless a newer snapshot was written already (writes run in the executor's threads)."""
        if not self.path:
            return
        with self._writing:
            if payload.get("snapshot", 0) <= self._written:
                return
            tmp = None
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".import-profile-", suffix=".tmp")
                with os.fdopen(fd, "w") as fh:
                    json.dump(payload, fh)
                os.replace(tmp, self.path)
                self._written = payload.get("snapshot", 0)
            except OSError as exc:
                if tmp is not None and os.path.exists(tmp):
                    os.unlink(tmp)
                if "(the profile file)" not in self._logged:
                    self._logged.add("(the profile file)")
                    self.log.warning("gpuctx pool: cannot keep the import profile in %s (learnt again from the "
                                     "notebooks after a server restart): %s", self.path, exc)

    def as_dict(self) -> dict:
        modules = self.modules()
        return {"modules": modules, "names": {m: self.entries[m].names for m in modules
                                              if m in self.entries and self.entries[m].names},
                "dropped": {m: e.dropped for m, e in self.entries.items() if e.dropped},
                "left_out": {k: {m: why for m, (why, _) in v.items()} for k, v in self.left_out.items() if v},
                "learned": len(self.entries)}


def _entry(item) -> Entry | None:
    """One entry of a profile file, every field checked: a field of the wrong type or out of range
    is taken as unknown (its default), never trusted (a NaN would turn off the import budget, a
    string break the list's sort); None for an entry without a valid module name."""
    if not isinstance(item, dict) or not isinstance(item.get("module"), str) or not MODULE.fullmatch(item["module"]):
        return None

    now = time.time()

    def number(v, default=None):  # a finite, non-negative number
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return default
        try:
            return v if math.isfinite(float(v)) and v >= 0 else default
        except OverflowError:  # an int past any float
            return default

    def when(v) -> float:  # a time (epoch), never later than now: a future one would pin a name or a drop
        return min(float(number(v, 0.0)), now)

    def times(v, keep) -> dict[str, float]:
        return {n: when(t) for n, t in v.items() if keep(n) and number(t) is not None} if isinstance(v, dict) else {}

    names = item.get("names")
    names = list(dict.fromkeys(n for n in names if isinstance(n, str) and n.isidentifier()))[:MAX_NAMES] \
        if isinstance(names, list) else []
    seen, memory = number(item.get("seen"), 0), number(item.get("memory"))
    return Entry(item["module"], seen=int(seen), last=when(item.get("last")), seconds=number(item.get("seconds")),
                 dropped=item["dropped"] if isinstance(item.get("dropped"), str) else "",
                 dropped_at=when(item.get("dropped_at")), driver=item.get("driver") is True,
                 memory=int(memory) if memory is not None else None, names=names,
                 name_seconds=times(item.get("name_seconds"), lambda n: n in names),
                 name_last=times(item.get("name_last"), lambda n: n in names),
                 names_dropped=times(item.get("names_dropped"), lambda n: isinstance(n, str) and n.isidentifier()))


def recent_notebooks(root: str, limit: int = RECENT_NOTEBOOKS, budget: int = SCAN_ENTRIES) -> list[tuple[float, str]]:
    """(mtime, path) of the most recently modified notebooks under `root`, newest first; hidden
    and environment folders skipped, at most `budget` entries looked at (run off the event loop)."""
    found: list[tuple[float, str]] = []
    looked = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
        for name in files:
            looked += 1
            if name.endswith(".ipynb"):
                path = os.path.join(folder, name)
                try:
                    found.append((os.stat(path).st_mtime, path))
                except OSError:
                    continue
        looked += len(dirs)
        if looked > budget:
            break
    found.sort(reverse=True)
    return found[:limit]
