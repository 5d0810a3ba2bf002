"""The warm pool: standby kernels started ahead of time, so that a notebook opened or restarted
finds its imports done, or its GPU ready (standby.py: the two kinds).

The automatic pool (the default, `pool_size` unset) keeps
- an *imports* standby per kernelspec that GPU notebooks use (the default kernelspec from the
  start, where a GPU framework is installed in its Python): it has imported the server's import
  profile (import_profile.py: torch and what recently used notebooks import) without touching
  CUDA, and is refilled as soon as it is taken;
- a *gpu* standby, the restart reserve, per kernelspec a running GPU notebook uses: warmed with the
  plan of the notebook used last, on that notebook's device, once that notebook's kernel has run
  `pool_reserve_after` s; never below `pool_min_free_fraction` of a GPU free nor within
  `pool_gpu_budget_mib` exceeded (reserve.py decides these).
`pool_size` = N keeps N gpu standbys per `pool_kernelspecs` entry instead (0: no pool).

All standbys together stay within `standby_memory_fraction` of the host memory available (the
container's limit where one applies; standby_memory.py); none starts while the host is short, and
they go first when memory gets short (the GPU floors keep out gpu standbys only). No standby's
start slows a running cell (giving_way.py): starting standbys are paused while cells run (on a
machine with more than `standby_pause_cores` cores, for their first `standby_yield_s` s, then they
go on at the lowest CPU priority).

A launch (provisioner.py) takes the standby whose imports cover the notebook best, unless the
notebook's set-up must run before those imports, its folder shadows one of them, or an environment
variable read when the process (or CUDA) started differs; then it starts fresh, and says why in
its environment (contract.POOL_NOTE, shown by `%gpu status`).

A kernelspec whose standbys cannot start is retried with exponential backoff up to RETRY_MAX_S,
logged once per change of state; `status()` says why a reserve is empty. Every process the pool
starts is stopped, its connection file removed, when the server exits.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import time
import weakref
from dataclasses import dataclass

from jupyter_core.utils import ensure_async

from ..contract import SESSION, STANDBY, STANDBY_RECIPE, WORKER_IMPORTS, WarmSettings, opted_out
from . import standby as sb
from .giving_way import GivingWay
from .import_profile import ImportProfile, recent_notebooks
from .launch import Launcher
from .reserve import RESERVE, WARMED_KERNEL_MIB, Reserve
from .standby import Standby, StandbyFailed
from .standby_memory import StandbyMemory
from .tasks import Background

EVICT_PAUSE_S = 300.0  # after a GPU ran short of memory, no gpu standby is started for this long
RETRY_FIRST_S, RETRY_MAX_S = 2.0, 300.0  # backoff after a standby failed to start: 2, 4, 8 … 300 s
HEALTHY_AFTER_S = 30.0  # a ready standby alive this long (or one adopted) clears its kind's failures

# The log of the standbys' own kernel managers: what they would say (a failed launch's traceback,
# each time it is retried) the pool says itself, in one line per change of state.
QUIET = logging.getLogger("gpuctx.pool.standby")
QUIET.propagate = False
QUIET.addHandler(logging.NullHandler())


@dataclass
class SpecHealth:
    """How starting one kernelspec's standbys of one kind goes: failures in a row, when to try next."""

    failures: int = 0
    error: str | None = None  # the last failure, while failing
    retry_at: float = 0.0  # time.monotonic()


class Pool:
    def __init__(self, mkm, cfg, launcher: Launcher, reserve: Reserve, log, background: Background,
                 profile: ImportProfile | None = None, root_dir: str | None = None):
        self.mkm, self.cfg, self.launcher, self.reserve, self.log = mkm, cfg, launcher, reserve, log
        self.background = background  # standbys starting, the start-up scan of the root
        self.auto = cfg.pool_size is None
        self.profile = profile
        self.root_dir = root_dir
        self.standbys: list[Standby] = []
        self._all: list[Standby] = []  # every standby not yet taken or stopped
        self._starting: dict[tuple[str, str], int] = {}  # (kernelspec, kind) -> starting now
        self._kms: weakref.WeakSet = weakref.WeakSet()  # every kernel manager the pool launched
        self._closing = False
        self._tasks: list[asyncio.Task] = []
        self.refused: list[str] = []  # why the last refusals happened (for status and tests)
        self.health: dict[tuple[str, str], SpecHealth] = {}  # (kernelspec, kind) -> its standbys' starts
        self.unsupported: dict[str, str] = {}  # kernelspec -> why the pool keeps no standby for it
        self._paused: dict[int, float] = {}  # GPU ordinal -> no gpu refill there before (monotonic)
        self._short: str | None = None  # why no gpu standby may start now (memory), while that lasts
        self._short_host: str | None = None  # why no standby at all may (the host's memory)
        self._import_specs: set[str] = {getattr(mkm, "default_kernel_name", "python3") or "python3"}
        self._frameworkless: set[str] = set()  # kernelspecs without a GPU framework: no imports standby
        self.mem = StandbyMemory(cfg, profile)  # the standbys' share of host memory
        self.giving_way = GivingWay(mkm, cfg)
        self._taking = asyncio.Lock()

    # -- running -------------------------------------------------------------------------------
    def start(self) -> None:
        atexit.register(self._kill_all)
        self._tasks = [self.background.spawn(self._maintain(), "keeping the warm pool"),
                       self.background.spawn(self.giving_way.run(lambda: self.standbys, lambda: self._closing),
                                             "pausing standbys for running cells")]
        if self.imports_on:
            self.background.spawn(self._learn_from_root(), "reading the notebooks under the root for imports")

    @property
    def imports_on(self) -> bool:
        return self.auto and self.cfg.import_standbys and self.profile is not None and self.cfg.warm_policy != "never"

    def launched_by_pool(self, km) -> bool:
        """Whether `km` is one of the pool's own kernel managers (a standby's)."""
        return km in self._kms

    def launching(self, km, env: dict) -> None:
        """A standby's process is being launched with `env` (its kernelspec's variables merged in):
        what a launch's environment is compared with."""
        for s in self._all:
            if s.km is km:
                s.env = dict(env)

    def serves(self, kernel_name: str) -> bool:
        return not self._closing and (self.auto or kernel_name in self.cfg.pool_kernelspecs)

    # -- what to keep -------------------------------------------------------------------------------
    def wanted(self) -> list[tuple[str, str, int]]:
        """(kernelspec, kind, how many) the pool keeps now."""
        out = []
        if not self.auto:
            return [(name, "gpu", self.target(name)) for name in self.cfg.pool_kernelspecs]
        if self.imports_on:
            out += [(name, "imports", 1) for name in sorted(self._import_specs)]
        out += [(name, "gpu", self.target(name)) for name in sorted(self.reserve.notebooks)]
        return out

    def kernelspecs(self) -> list[str]:
        return sorted({name for name, _, _ in self.wanted()} | {s.kernel_name for s in self.standbys})

    def target(self, name: str | None = None) -> int:
        """GPU-warm standbys to keep for kernelspec `name` (None: per kernelspec in use), within the
        GPU-memory budget. The automatic reserve keeps RESERVE while a GPU notebook uses it."""
        if self.cfg.warm_policy == "never":  # standbys are warmed kernels
            return 0
        if self.auto:
            specs = max(1, len(self.reserve.notebooks))
            n = RESERVE if name is None or name in self.reserve.notebooks else 0
        else:
            specs = max(1, len(self.cfg.pool_kernelspecs))
            n = self.cfg.pool_size
        if self.cfg.pool_gpu_budget_mib:
            n = min(n, self.cfg.pool_gpu_budget_mib // WARMED_KERNEL_MIB // specs)
        return max(0, n)

    def memory(self) -> dict:
        """Host memory: what standbys hold, and the budget they share."""
        return self.mem.of(self.standbys)

    # -- the API's view -----------------------------------------------------------------------------
    def status(self) -> dict:
        now = time.monotonic()
        specs = {}
        for name in self.kernelspecs():
            health = self._spec_health(name)
            ready = sum(1 for s in self.standbys if s.kernel_name == name and s.ready)
            starting = sum(n for (k, _), n in self._starting.items() if k == name)
            specs[name] = {"ready": ready, "starting": starting, "failures": health.failures, "error": health.error,
                           "reason": None if ready else self._empty_reason(name, now)}
            if self.auto:
                specs[name]["wanted_for"] = [nb.path for nb in self.reserve.notebooks.get(name, []) if nb.path]
        standbys = []
        for s in self.standbys:
            on = self.reserve.held_by(s.pid)
            standbys.append({"kernel_name": s.kernel_name, "kind": s.kind, "pid": s.pid, "ready": s.ready,
                             "state": "paused" if s.paused else s.state, "age": round(now - s.started, 1),
                             "notebook": s.notebook, "imports": len(s.imported()), "cuda_driver": s.driver,
                             "rss": s.rss(),
                             "ordinal": (max(on, key=on.get) if on else
                                         (s.ordinal if self.reserve.gpus() and s.kind == "gpu" else None)),
                             "memory": sum(on.values()) if on else None})
        reason = None
        if self.auto and not self.standbys and not any(self._starting.values()):
            reason = self._auto_reason(now)
        out = {"mode": "auto" if self.auto else "fixed", "target": self.target(), "kernelspecs": specs,
               "standbys": standbys, "refused": self.refused[-10:], "reason": reason,
               "min_free_fraction": self.cfg.pool_min_free_fraction, "host_memory": self.memory()}
        if self.imports_on:
            out["import_profile"] = self.profile.as_dict()
        return out

    def _auto_reason(self, now: float) -> str | None:
        if self._closing:
            return "the server is shutting down"
        if self.cfg.warm_policy == "never":
            return "warm_policy is 'never': standbys are warmed kernels, so the reserve keeps none"
        if not self.reserve.notebooks and not self.imports_on:
            if self.reserve.waiting(now):
                return (f"a GPU notebook's kernel started: the reserve starts once it has run "
                        f"{self.cfg.pool_reserve_after:g} s")
            return "no GPU notebook is running: the reserve starts once one runs"
        if self._short:
            return self._short
        for name in self.kernelspecs():
            why = self._empty_reason(name, now)
            if why:
                return why
        return None

    def _spec_health(self, name: str) -> SpecHealth:
        """How a kernelspec's standbys start, for its status: its failing kind's, if any."""
        kinds = [h for (spec, _), h in self.health.items() if spec == name]
        return max(kinds, key=lambda h: (h.error is not None, h.failures), default=SpecHealth())

    def _empty_reason(self, name: str, now: float) -> str:
        health = self._spec_health(name)
        if self._closing:
            return "the server is shutting down"
        if self.auto and name not in self.reserve.notebooks and not (self.imports_on and name in self._import_specs):
            return "no GPU notebook of this kernelspec is running"
        if self.target(name) == 0 and not (self.imports_on and name in self._import_specs):
            if self.cfg.warm_policy == "never":
                return "warm_policy is 'never': standbys are warmed kernels, so the pool keeps none"
            return (f"pool_gpu_budget_mib={self.cfg.pool_gpu_budget_mib} leaves no room for a standby "
                    f"(~{WARMED_KERNEL_MIB} MiB each)")
        if name in self.unsupported:
            return self.unsupported[name]
        short = self._short_host if self.imports_on and name in self._import_specs else self._short
        if short:  # (an imports standby holds no GPU memory: only the host's memory keeps it out)
            return short
        if health.error:
            wait = max(0.0, health.retry_at - now)
            return (f"standbys fail to start ({health.failures} in a row): {health.error}; "
                    f"next try in {wait:.0f} s")
        if any(until > now for until in self._paused.values()):
            return "a GPU ran short of memory: standbys were stopped to free it, refilling later"
        if any(n for (k, _), n in self._starting.items() if k == name):
            return "a standby is starting"
        if not self.mem.fits(self.standbys, "imports"):
            return (f"standbys would hold more than standby_memory_fraction={self.cfg.standby_memory_fraction:g} "
                    "of the host memory available")
        if self.giving_way.holding_starts:
            return "waiting for the running cells to finish (a machine with few cores)"
        return "a standby will start shortly"

    # -- keeping the pool full --------------------------------------------------------------------
    async def _maintain(self) -> None:
        while not self._closing:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the pool must never take the server down
                self.log.warning("gpuctx pool: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(1.0)

    async def _tick(self) -> None:
        now = time.monotonic()
        if self.auto:
            await self.reserve.update(now)
            for notebooks in self.reserve.notebooks.values():  # a GPU notebook's kernelspec gets imports standbys
                for nb in notebooks:
                    record = self.launcher.launched.get(nb.kernel_id)
                    if record is not None and record.kernel_name not in self._frameworkless:
                        self._import_specs.add(record.kernel_name)
        self._short_host = self.reserve.short_host()
        self._short = self._short_host or self.reserve.short_gpu()
        for s in list(self.standbys):
            if s.state not in ("booting", "ready"):
                continue
            await self.mem.look(s)
            dead = s.ready and not s.alive()
            old = self.cfg.pool_max_age and now - s.started > self.cfg.pool_max_age
            unwanted = self.auto and s.kind == "gpu" and s.kernel_name not in self.reserve.notebooks
            stale = s.kind == "imports" and s.ready and self._replaced(s)
            if dead or old or unwanted or stale:
                if dead:
                    self._failed(s.kernel_name, s.kind, f"a standby kernel died ({sb.exit_status(s.km)})")
                elif unwanted:
                    self.log.info("gpuctx pool: no GPU notebook of %s runs any more: stopping its standby (pid %s)",
                                  s.kernel_name, s.pid)
                elif stale:
                    self.log.info("gpuctx pool: the import profile grew: standby %s replaced by one that has it", s.pid)
                else:
                    self.log.info("gpuctx pool: recycling standby %s", s.pid)
                await self._stop(s)
            elif s.ready and now - s.started > HEALTHY_AFTER_S:
                self._healthy(s.kernel_name, s.kind)
        await self._keep_the_floor()
        self.mem.regrow(self.standbys)  # an outdated ready standby is then replaced by one that has them
        gpu_paused = any(until > now for until in self._paused.values())
        for name, kind, target in self.wanted():
            have = sum(1 for s in self.standbys if s.kernel_name == name and s.kind == kind and s.ready
                       and not (kind == "imports" and self._outdated(s)))
            have += self._starting.get((name, kind), 0)  # (those still starting: counted here)
            health = self.health.setdefault((name, kind), SpecHealth())
            short = self._short_host if kind == "imports" else self._short  # imports: no GPU memory
            if (have < target and now >= health.retry_at and name not in self.unsupported and not short
                    and not (kind == "gpu" and gpu_paused) and self.mem.fits(self.standbys, kind)
                    and not self.giving_way.holding_starts):
                self._starting[(name, kind)] = self._starting.get((name, kind), 0) + 1
                self.background.spawn(self._spawn(name, kind), f"starting a standby {name} kernel")

    def _outdated(self, s: Standby) -> bool:
        """An imports standby that lacks imports (or names) the profile has since learnt."""
        return bool(set(self.profile.imports(s.kernel_name)) - set(s.profile)) if self.profile else False

    def _replaced(self, s: Standby) -> bool:
        """An outdated imports standby, once an up-to-date one of its kernelspec is ready."""
        return self._outdated(s) and any(o is not s and o.kind == "imports" and o.kernel_name == s.kernel_name
                                         and o.ready and not self._outdated(o) for o in self.standbys)

    async def _keep_the_floor(self) -> None:
        """Stop the standbys on a GPU whose free memory fell below the floor, every standby when the
        host runs short of memory, and the newest ones while they hold more than their budget (one
        still starting counts as a failure: backoff, and a profile trimmed to fit, standby_memory.py)."""
        for ordinal in sorted({o for s in self.standbys for o in self._gpus_of(s)}):
            if self.reserve.below_floor(ordinal):
                await self.evict(ordinal)
        if self._short_host and self.standbys:
            gone = list(self.standbys)
            self.log.info("gpuctx pool: %s: stopping %d standby(s)", self._short_host, len(gone))
            await asyncio.gather(*(self._stop(s) for s in gone))
        m = self.memory()
        while self.standbys and m["available"] is not None and m["standbys"] > m["budget"]:
            newest = max(self.standbys, key=lambda s: s.started)
            self.log.info("gpuctx pool: standbys hold %.1f GiB, more than their share of host memory (%.1f GiB): "
                          "stopping standby %s", m["standbys"] / 2**30, m["budget"] / 2**30, newest.pid)
            if newest.state == "booting":  # it outgrew the budget while starting: not again every tick
                self._failed(newest.kernel_name, newest.kind, self.mem.outgrew(newest, m))
            await self._stop(newest)
            m = self.memory()

    def _gpus_of(self, s: Standby) -> set[int]:
        """The GPUs a standby holds memory on (NVML), else the one it was planned on (gpu kind)."""
        held = set(self.reserve.held_by(s.pid))
        return held or ({s.ordinal} if s.kind == "gpu" else set())

    async def evict(self, ordinal: int) -> int:
        """GPU `ordinal` is short of memory: stop the standbys on it and start no gpu standby for
        EVICT_PAUSE_S. Returns how many stopped."""
        gone = [s for s in self.standbys if ordinal in self._gpus_of(s)]
        self._paused[ordinal] = time.monotonic() + EVICT_PAUSE_S
        await asyncio.gather(*(self._stop(s) for s in gone))
        if gone:
            self.log.info("gpuctx pool: cuda:%d is short of memory: stopped %d standby(s); no refill for %g s",
                          ordinal, len(gone), EVICT_PAUSE_S)
        return len(gone)

    def _failed(self, name: str, kind: str, error: str) -> None:
        health = self.health.setdefault((name, kind), SpecHealth())
        health.failures += 1
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (health.failures - 1))
        health.retry_at = time.monotonic() + delay
        if error != health.error:
            self.log.warning("gpuctx pool: no standby %s kernel: %s; retrying in %g s, backing off up to %g s "
                             "(the pool's status in GET /gpuctx/api/devices says so too)",
                             name, error, delay, RETRY_MAX_S)
        health.error = error

    def _recovered(self, name: str, kind: str) -> None:
        health = self.health.setdefault((name, kind), SpecHealth())
        if health.error:
            self.log.info("gpuctx pool: standby %s kernels start again (after %d failures)", name, health.failures)
            health.error = None

    def _healthy(self, name: str, kind: str) -> None:
        self.health[(name, kind)] = SpecHealth()

    # -- one standby ---------------------------------------------------------------------------------
    async def _spawn(self, name: str, kind: str) -> None:
        standby = None
        try:
            standby = await self._launch(name, kind)
            if standby is None:
                return
            await sb.until_ready(standby, lambda: self._closing)
            report = await sb.until_warmed(standby, lambda: self._closing)
            self._learn_outcomes(standby, report)
            if standby.state == "booting" and kind == "imports" and (
                    report.get("cuda_started") or "context" in self._cuda_of(report)):
                raise StandbyFailed("its imports created a CUDA context (dropped from the import profile)")
            if await standby.become_ready():  # (False: stopped or taken while its memory was read)
                self.mem.ready(standby)
                self._recovered(name, kind)
                self.log.info("gpuctx pool: standby %s kernel ready (pid %s, %s)", name, standby.pid,
                              f"{len(standby.imports)} imports" if kind == "imports" else "GPU-warm")
        except Exception as exc:  # StandbyFailed, or the kernel manager's own error
            if not self._closing and (standby is None or standby.state == "booting"):
                self._failed(name, kind, str(exc) if isinstance(exc, StandbyFailed) else f"{type(exc).__name__}: {exc}")
        finally:
            self._starting[(name, kind)] -= 1
            if standby is not None and standby.state == "booting":  # failed, or the server is closing
                await self._stop(standby)

    @staticmethod
    def _cuda_of(report: dict) -> set[str]:
        return {st.get("cuda") for st in (report.get("plan") or {}).get("steps") or [] if st.get("cuda")}

    def _learn_outcomes(self, s: Standby, report: dict) -> None:
        """What each of its imports did goes into the import profile (time, failures, CUDA)."""
        if s.kind != "imports" or self.profile is None:
            return
        for st in (report.get("plan") or {}).get("steps") or []:
            taken = sb.named_import(st) if st.get("kind") == "import" else None
            if taken is None:
                continue
            module, names = taken
            said = (st.get("state", ""), st.get("seconds"), st.get("cuda", ""), st.get("detail", ""))
            if not names:
                self.profile.outcome(module, *said, kernel_name=s.kernel_name, paused_s=sb.paused_during(s, st))
            for name in names:
                self.profile.name_outcome(module, name, *said, paused_s=sb.paused_during(s, st))
        self._save_profile()

    async def _launch(self, name: str, kind: str) -> Standby | None:
        """Launch one standby; None when the pool keeps none of this kernelspec."""
        notebook = self.reserve.for_kernelspec(name) if (self.auto and kind == "gpu") else None
        env = sb.with_session(os.environ, notebook.path if notebook else None)
        settings = WarmSettings.from_env(await self.launcher.settings(name, env) or {})
        missing = self.launcher.without_gpuctx(name)
        if missing:
            self.unsupported[name] = f"{missing}: the pool keeps warmed kernels only"
            self.log.info("gpuctx pool: no standbys for %s: %s", name, missing)
            return None
        broken = await self.launcher.unlaunchable(name)
        if broken:
            raise StandbyFailed(broken)
        profile: tuple[str, ...] = ()
        if kind == "imports":
            if not await self.launcher.has_gpu_framework(name):
                self._import_specs.discard(name)
                self._frameworkless.add(name)
                self.log.info("gpuctx pool: no imports standby for %s: no GPU framework is installed there", name)
                return None
            profile = tuple(self.profile.imports(name))  # modules, and "module:name" for names taken from them
            settings = WarmSettings(policy="always", recipe=STANDBY_RECIPE, source="the warm pool (imports standby)",
                                    imports=list(profile), opt_out=settings.opt_out,
                                    import_budget=self.cfg.import_profile_seconds)
            env.pop(SESSION, None)
            if self.cfg.standby_worker_imports:
                env[WORKER_IMPORTS] = "1"  # kernel/worker_zygote.py
        else:
            if not settings.opt_out:  # the server's own opt-out stands
                settings.policy = "always"  # a standby serves no notebook yet: warm it regardless
            if notebook is not None and notebook.device:
                settings.device, settings.device_source = notebook.device, "the notebook's kernel (warm reserve)"
        env.update(settings.to_env())
        env[STANDBY] = "1"
        try:
            km, _, _ = self.mkm.pre_start_kernel(name, {})
        except Exception as exc:
            raise StandbyFailed(f"kernelspec {name!r}: {type(exc).__name__}: {exc}") from None
        km.autorestart = False  # a standby that dies is replaced by the pool, never revived half-warm
        km.log = QUIET  # a failed launch is the pool's to report, once, in one line
        self._kms.add(km)
        standby = Standby(km, name, env, time.monotonic(), kind=kind, profile=profile,
                          notebook=env.get(SESSION) if notebook else None)
        self.standbys.append(standby)
        self._all.append(standby)
        try:
            await ensure_async(km.start_kernel(env=env))
        except Exception as exc:
            await self._stop(standby)
            raise StandbyFailed(f"could not launch it: {type(exc).__name__}: {exc}") from None
        return standby

    # -- handing a standby over --------------------------------------------------------------------
    async def fits(self, env: dict) -> bool:
        """A warmed standby fits this launch unless it opts out of warming, or the `auto` policy
        finds no GPU framework in its notebook (such kernels must not start CUDA, nor pay imports)."""
        if opted_out(env) or self.cfg.warm_policy == "never":
            return False
        if self.cfg.warm_policy == "always":
            return True
        return (await self.launcher.notebooks.facts(env.get(SESSION))).wants_gpu()[0]

    def has_standby_for(self, kernel_name: str) -> bool:
        return self.serves(kernel_name) and any(s.kernel_name == kernel_name and s.alive() for s in self.standbys)

    async def take(self, kernel_name: str, env: dict, cwd: str, restart: bool) -> tuple[Standby | None, str]:
        """The standby for this launch (no longer the pool's), or None and why none could serve.
        One launch chooses at a time: choosing awaits reads, and no two may take one standby."""
        if not self.serves(kernel_name):
            return None, ""
        async with self._taking:
            return await self._choose(kernel_name, env, cwd, restart)

    async def _choose(self, kernel_name: str, env: dict, cwd: str, restart: bool) -> tuple[Standby | None, str]:
        facts = await self.launcher.notebooks.facts(env.get(SESSION))
        if self.imports_on and not facts.error:
            self.opened(facts)
        wanted, notebook = sb.needed(facts), env.get(SESSION)

        def open_(s: Standby) -> bool:  # (asked again after the reads: the pool may stop one meanwhile)
            return s.kernel_name == kernel_name and s.state in ("booting", "ready") and s in self.standbys

        def key(s: Standby) -> tuple:
            same = s.kind == "gpu" and s.notebook is not None and s.notebook == notebook
            return restart and same, s.ready, sb.covered(s, wanted), same, s.kind == "gpu" and restart

        refusals, fit = [], []
        for s in list(self.standbys):
            if not (open_(s) and s.alive()):
                continue
            why = await self._refusal(s, env, facts, cwd)
            if why:
                refusals.append(why)
            else:
                fit.append(s)
        best = max((s for s in fit if open_(s)), key=key, default=None)
        if best is None:
            note = refusals[0] if refusals else ""
            if note:
                self.refused.append(note)
                self.log.info("gpuctx pool: not adopting a standby: %s", note)
            return None, note
        best.state = "taken"
        self.standbys.remove(best)
        self.mem.forget(best)  # (one taken while it imported: its looks end here)
        return best, ""

    async def _refusal(self, s: Standby, env: dict, facts, cwd: str) -> str | None:
        differ = sb.differing_environment(s, env)
        if env.get("GPUCTX_DEVICE") and s.kind == "gpu" and s.env.get("GPUCTX_DEVICE") != env.get("GPUCTX_DEVICE"):
            differ.append("GPUCTX_DEVICE")
        if differ:
            return f"{', '.join(differ)} differ from the standby's"
        if facts.error and facts.path and os.path.exists(facts.path):  # (none there: a console, no set-up lines)
            return f"{facts.error}: whether its set-up must run before the standby's imports cannot be told"
        why = None if facts.error else sb.unsafe_setup(s, facts)
        if why:
            return why
        if s.kind == "imports" or s.notebook != facts.path:
            return await asyncio.get_running_loop().run_in_executor(None, sb.shadowed, s, cwd)
        return None

    async def hand_over(self, s: Standby, kernel_id: str, cwd: str, env: dict, connection_file: str) -> None:
        try:
            await sb.hand_over(s, cwd, env, connection_file)
        except BaseException:
            await self._stop(s)
            raise
        self._all = [x for x in self._all if x is not s]
        self._healthy(s.kernel_name, s.kind)  # adopted: its kernelspec's standbys of its kind work

    # -- the import profile -----------------------------------------------------------------------
    def opened(self, facts) -> None:
        """A notebook was opened: what it imports, and when, go into the profile, kept across
        restarts even where the imports stay the same (which names give way goes by when)."""
        if self.profile is not None and not (facts.error or facts.opts_out):
            self.profile.learn(facts)
            self._save_profile()

    def _save_profile(self) -> None:
        """Keep the profile (its snapshot taken here, on the event loop; written off it)."""
        payload = self.profile.snapshot()
        self.background.spawn(asyncio.get_running_loop().run_in_executor(None, self.profile.write, payload),
                              "saving the import profile")

    async def _learn_from_root(self) -> None:
        """At start-up: the profile as last kept, and what the recently used notebooks import."""
        loop = asyncio.get_running_loop()
        self.profile.merge(await loop.run_in_executor(None, self.profile.read))  # (file work off the loop only)
        if not self.root_dir:
            return
        found = await loop.run_in_executor(None, recent_notebooks, self.root_dir)
        for mtime, path in found:
            facts = await self.launcher.notebooks.facts(path)
            if facts.wants_gpu()[0]:
                self.profile.learn(facts, when=mtime)
        await loop.run_in_executor(None, self.profile.write, self.profile.snapshot())

    # -- stopping --------------------------------------------------------------------------------------
    async def _stop(self, s: Standby) -> None:
        self.mem.forget(s)
        if s in self.standbys:
            self.standbys.remove(s)
        try:
            await sb.stop(s, self.log)
        finally:
            self._all = [x for x in self._all if x is not s]

    async def close(self) -> None:
        """Stop every process the pool started (standbys, ones still starting)."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*(self._stop(s) for s in list(self._all)), return_exceptions=True)

    def _kill_all(self) -> None:
        """Last resort at interpreter exit: no process the pool started outlives the server."""
        for s in list(self._all):
            pid = s.pid
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            sb.remove_connection_file(s.km)
