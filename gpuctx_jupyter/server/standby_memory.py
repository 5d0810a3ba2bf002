"""The standbys' share of host memory (pool.py): the budget they share, what the next standby is
counted at, what each import of an imports standby added, and what is left out of the import
profile when a starting standby outgrows the budget.

An imports standby's size is known only once one has run: the first is counted at
IMPORT_STANDBY_GUESS, later ones at what the last one reached — ready, or stopped while starting
because it outgrew the budget. In that case the import profile is trimmed for its kernelspec (its
heaviest learnt modules, as measured, left out) so that the next one fits; where what was measured
cannot make it fit, it is counted at what it reached, and none starts again until memory is freed
(without this the pool started the same standby, and stopped it, every second). What an import
added is read while the standby imports: the growth of its resident memory between two looks (the
pool's tick, every second) split over the imports it finished meanwhile, kept in the profile (a
name resolved from a module, `from transformers import BertModel`, adds to its module's).

What was left out to fit comes back once the budget has room for it again (memory another program
held was freed), rather than after the week other left-outs wait: with REGROW_MARGIN times its size
free, so that a budget that wavers does not trade an import in and out with every standby.
"""
from __future__ import annotations

import asyncio

from ..core import host_memory
from .import_profile import ImportProfile

IMPORT_STANDBY_GUESS = 1 << 30  # host memory an imports standby is counted at before one has run
REGROW_MARGIN = 2  # an import left out to fit is taken back once this many times its size is free


class StandbyMemory:
    def __init__(self, cfg, profile: ImportProfile | None):
        self.cfg, self.profile = cfg, profile
        self.seen = IMPORT_STANDBY_GUESS  # what the next imports standby is counted at
        # id(standby) -> (rss, its imports done, the modules whose memory it measured)
        self._looks: dict[int, tuple[int, frozenset[str], frozenset[str]]] = {}
        self.trimmed: dict[tuple[str, str], int] = {}  # (kernelspec, module) left out to fit -> what it adds

    def of(self, standbys) -> dict:
        """Host memory: what `standbys` hold, and the budget they share."""
        used = sum(s.rss() or 0 for s in standbys)
        mem = host_memory.available()
        budget = int(self.cfg.standby_memory_fraction * ((mem.available if mem else 0) + used))
        return {"standbys": used, "budget": budget, "available": mem.available if mem else None,
                "limit": mem.limit if mem else None}

    def fits(self, standbys, kind: str) -> bool:
        """Whether one more standby of `kind` fits beside `standbys`."""
        m = self.of(standbys)
        guess = self.seen if kind == "imports" else IMPORT_STANDBY_GUESS
        return m["available"] is None or m["standbys"] + guess <= m["budget"]

    async def look(self, s) -> None:
        """Read standby `s`'s memory (off the event loop: every tick while an imports standby
        imports, else when its reading is stale); while it imports, what the imports it finished
        since the last look added (with the processes an import started: inductor's compile
        workers are its memory too)."""
        if not s.pid:
            return
        own = await s.read_memory() if s.memory_stale() else None
        if s.kind != "imports" or s.state != "booting" or s.paused:
            return
        if own is None:  # (not read just now: read for this look alone)
            own = await asyncio.get_running_loop().run_in_executor(None, s.memory_now)
        if own is None:
            return
        done = frozenset(s.imports) | frozenset(s.resolved)
        last = self._looks.get(id(s))
        if last is None or self.profile is None:
            self._looks[id(s)] = (own, done, frozenset())
            return
        new, grew, measured = done - last[1], own - last[0], set(last[2])
        if not new:  # what grew meanwhile belongs to the import under way: counted once it ends
            return
        for item in sorted(new, key=lambda i: ":" in i) if grew > 0 else ():  # a module before its names
            module, _, name = item.partition(":")
            entry = self.profile.entries.get(module)
            if entry is None:
                continue
            if not name:
                entry.memory = grew // len(new)
                measured.add(module)
            elif module in measured:  # (not onto what an earlier standby measured)
                entry.memory = (entry.memory or 0) + grew // len(new)
        self._looks[id(s)] = (own, done, frozenset(measured))

    def ready(self, s) -> None:
        """A standby is ready: an imports one is what the next is counted at."""
        self._looks.pop(id(s), None)
        rss = s.rss()
        if s.kind == "imports" and rss:
            self.seen = rss

    def outgrew(self, s, m: dict) -> str:
        """Starting standby `s` is stopped: the standbys held `m` (of()), more than their budget.
        Remember what it reached and trim the profile for its kernelspec where that makes the next
        one fit. Returns why, in a sentence (the pool's backoff and status say it)."""
        self._looks.pop(id(s), None)
        reached = s.rss() or 0
        why = (f"a starting standby reached {reached / 2**30:.2f} GiB, more than the standbys' share of host memory "
               f"({m['budget'] / 2**30:.2f} GiB, standby_memory_fraction={self.cfg.standby_memory_fraction:g})")
        if s.kind != "imports":
            return why
        trimmed = self.profile.trim(s.kernel_name, s.profile, m["standbys"] - m["budget"]) if self.profile else []
        freed = sum(self.profile.entries[x].memory or 0 for x in trimmed)
        self.trimmed.update({(s.kernel_name, x): self.profile.entries[x].memory or 0 for x in trimmed})
        self.seen = reached - freed if trimmed else max(self.seen, reached)
        if trimmed:
            return f"{why}: its next standby leaves out {', '.join(trimmed)}"
        return f"{why}: none starts again until memory is freed"

    def regrow(self, standbys) -> list[str]:
        """Take back the imports left out to fit that the budget now has room for beside `standbys`
        and the next standby (smallest first). Returns them, as "module (kernelspec)"."""
        if not self.trimmed or self.profile is None:
            return []
        m = self.of(standbys)
        if m["available"] is None:
            return []
        room = m["budget"] - m["standbys"] - self.seen
        back, counted = [], set()
        for (kernel_name, module), cost in sorted(self.trimmed.items(), key=lambda kv: kv[1]):
            if REGROW_MARGIN * cost > room:
                break
            del self.trimmed[(kernel_name, module)]
            if not self.profile.take_back(kernel_name, module, "the standbys' share of host memory has room for it again"):
                continue  # its week out has lapsed meanwhile: already back, already counted
            if module not in counted:  # (the next standby of each kernelspec is counted at `seen`)
                counted.add(module)
                room -= cost
                self.seen += cost
            back.append(f"{module} ({kernel_name})")
        return back

    def forget(self, s) -> None:
        self._looks.pop(id(s), None)
