"""Warming what is being typed (issue #25): the cells a frontend holds, unsaved edits included, as
the kernel's plan.

A new notebook's file is empty until its first save, and cells added since the last save are not
in the file either, so a plan read from disk warms nothing of them. JupyterLab sends the code cells
as they stand (debounced, never while a cell runs) through the server, which forwards them on the
control channel (contract.CELLS_REQUEST). Here they are checked again (`contract.cells`), read by
the notebook reader exactly as a saved file would be (`facts_from_sources`), planned by the same
recipe, and merged with the plan in hand: a step that is done, running, failed, planned already or
left to the user's own GPU cell is kept as it is (never done twice; GPU work that waited for a
typed device or setting line is done once that line has run: _kept); what is new is carried out
next, in the order the cells need it, taking turns with the user's cells as every warm-up does.

Cells answered "ok" are kept until the warm-up has made their plan (_Kept): a plan waiting behind
a running warm-up is dropped with it when that warm-up is given up for a suspend's consent, steps
aside for the user's GPU cell or fails, and no plan starts while a suspend is under way — the
frontend never sends cells it was told were taken again, so the kernel hands them to its warm-up
again once it can (no warm-up running, none held; not after a warm-up they were handed to failed
before it made them), and the steps a consent gave up are planned again where the cells need them.

Refused, with one sentence, where warming is off (GPUCTX_WARM=0, policy never), fixed (the basic
recipe) or not for a notebook (a standby of the pool); put off where the kernel is suspended. Nothing of
the cells' text is logged or sent back: the reply carries counts.
"""
from __future__ import annotations

import os
import threading
import time
import weakref

from ...contract import SESSION, STANDBY_RECIPE, opted_out
from ...contract import notebook as nbread
from ...contract.cells import BadCells, check_cells
from .plan import Plan, Step
from .settings import GpuWarmup
from .start import planner

SOURCE = "typed cells"


def accept(state, shell, content) -> dict:
    """The reply to a typed-cells message: re-plan from the cells, or why not."""
    try:
        sources = check_cells(content)
    except BadCells as exc:
        return {"status": "refused", "message": str(exc)}
    gate = state.suspend
    if gate is not None and gate.suspended:  # not a refusal: once resumed, the cells are welcome again
        return {"status": "suspended", "message": "this kernel is suspended: nothing of ours touches the GPU "
                                                  "until it has resumed"}
    cfg = GpuWarmup(parent=shell)
    why = refusal(state, cfg)
    if why:
        return {"status": "refused", "message": why}
    path = os.environ.get(SESSION) or ""
    facts = nbread.facts_from_sources(sources, path)
    reply = {"status": "ok", "cells": len(sources), "planned": 0}
    if cfg.policy == "auto" and not facts.wants_gpu()[0]:
        return {**reply, "warmup": state.warmer.status.state,
                "detail": "policy auto: these cells use no GPU framework, so nothing is warmed for them"}
    choice = getattr(state.switcher, "base", None)  # the kernel's own choice, not a %%on_gpu block's
    derived = typed_plan(cfg, path, facts, choice)
    warmer = state.warmer
    new = [s for s in merge(derived, warmer.plan).steps if s.state == "planned" and s.kind != "cells"]
    if not new:
        return {**reply, "warmup": warmer.status.state, "detail": "nothing new to warm for these cells"}
    warmer.import_budget = cfg.import_budget
    keep(state, shell, lambda previous: merge(typed_plan(cfg, path, facts, getattr(state.switcher, "base", None)),
                                              previous))  # (the choice when it is made: a cell may have run)
    return {**reply, "planned": len(new), "warmup": warmer.status.state,
            "detail": f"{len(new)} step(s) to warm for these cells, when it is their turn"}


RETRY_S = 0.25  # how often cells not taken up yet look whether the warm-up can take them
HELD_RETRY_S = 1.0  # ... while a suspend holds every plan back (it may last hours)
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Warmer -> _Kept
_LOCK = threading.Lock()


class _Kept:
    """The newest typed cells of one kernel's warm-up until a warm-up has made their plan, and the
    thread that hands them over again until one has."""

    def __init__(self):
        self.newest = None  # make_plan(previous) of the newest cells answered "ok"
        self.pending = False  # ... not made yet
        self.watching: threading.Thread | None = None

    def made(self, previous):
        """Taken up by a warm-up: the newest cells' plan, whichever hand-over comes first (one
        still queued from older cells makes the newest; a later one finds it made). From here on
        its steps are the warm-up's plan: a suspend's consent gives them up, the resume takes
        them again."""
        with _LOCK:
            pending, newest, self.pending = self.pending, self.newest, False
        return newest(previous) if pending or previous is None else previous


def keep(state, shell, make_plan) -> None:
    """Hand `make_plan` to the warm-up (next, or now when none runs), and again until it is made."""
    warmer = state.warmer
    with _LOCK:
        kept = _KEPT.setdefault(warmer, _Kept())
        kept.newest, kept.pending = make_plan, True  # (newer cells replace those not taken up yet)
        if kept.watching is None:
            kept.watching = threading.Thread(target=_watch, args=(state, shell, kept), name="gpuctx-typed-cells",
                                             daemon=True)
            kept.watching.start()
    warmer.replan(kept.made, SOURCE)


def _watch(state, shell, kept: _Kept) -> None:
    from ..state import of as state_of

    warmer, handed = state.warmer, False
    while True:
        time.sleep(HELD_RETRY_S if warmer.held() else RETRY_S)
        with _LOCK:
            # made; gpuctx unloaded; or the warm-up it was handed to failed before it made it (not again)
            if not kept.pending or state_of(shell) is not state or (handed and not warmer.running
                                                                    and warmer.status.state == "failed"):
                kept.pending, kept.watching = False, None
                return
        if not warmer.running and not warmer.held():  # dropped, or refused while a suspend was under way
            warmer.replan(kept.made, SOURCE)
            handed = True


def refusal(state, cfg: GpuWarmup) -> str | None:
    """Why this kernel does not warm typed cells (None: it does)."""
    if opted_out():
        return "the warm-up is off in this kernel (GPUCTX_WARM=0): typed cells are not warmed"
    if cfg.policy == "never":
        return ("the warm-up is off in this kernel (policy never): typed cells are not warmed "
                "(c.GpuctxServer.warm_policy or c.GpuWarmup.policy turns it on)")
    if cfg.recipe == STANDBY_RECIPE:
        return "a standby of the warm pool: it warms a notebook once it is handed one"
    if cfg.recipe != "notebook":
        return (f"this kernel warms the fixed {cfg.recipe} recipe whatever its cells do "
                "(c.GpuctxServer.warm_recipe = 'notebook' warms what they run)")
    return None


def typed_plan(cfg: GpuWarmup, path: str, facts: nbread.Facts, choice=None) -> Plan:
    """The notebook recipe's plan for the typed cells, said to come from them. It applies none of
    their settings (plan.derive, typed) and moves the kernel to no device they name: a typed line
    has not run and may never run as it stands. Where they name one and the user has chosen none
    yet (`choice`: the kernel's current device and who chose it), no GPU work is done until that
    cell has run; where the user has chosen, the chosen device is warmed."""
    plan = planner(cfg, path or None, facts=facts, typed=True)()
    if facts.readable and not facts.new:
        plan.reading = f"{facts.code_cells} code cells as typed (unsaved edits included)"
    if plan.devices:
        if choice is None or choice.assigned:
            where = plan.device_where.split(": ", 1)[0]  # the cell and line, not the line's text
            plan.gpu_blocked = plan.gpu_blocked or (f"the typed cells choose a device ({where}): its GPU is "
                                                    "warmed once that cell has run")
        plan.devices = []
    return plan


def key(step: Step) -> tuple:
    """What makes two steps the same work: an import of the same module, the same op of the same
    framework (on the same device), the same setting."""
    if step.kind == "setup":
        return ("setup", step.env or step.name)
    if step.module and not step.op:
        return ("import", step.module, tuple(step.names))
    return ("work", step.framework, step.op, tuple(step.names), step.ordinal)


def _kept(step: Step, derived: Plan) -> bool:
    """A step of the plan in hand that the new plan takes as it is: done, running, failed, still to
    do, or skipped when it ran — no GPU here, left to the user's own GPU cell (warming it again would
    only cost a second set of library handles). Tried again: an import the budget left out, GPU
    work that waited for a set-up or device line the new plan no longer waits for (its cell has
    run; done on the CPU meanwhile, or skipped), a setting (what the environment says now
    decides), and a step given up for a suspend's consent (the kernel runs again: typed cells
    taken up before its resume took them again still need it)."""
    from ..suspend import STOPPING

    if step.waits and not derived.gpu_blocked and step.state in ("done", "skipped"):
        return False
    if step.state != "skipped":
        return True
    return not ("import budget" in step.detail or step.kind == "setup" or step.detail == STOPPING)


def merge(derived: Plan, previous: Plan | None) -> Plan:
    """`derived` with each of its steps that `previous` has (and keeps) replaced by that step
    itself, so its state and time carry over; `previous`'s steps that `derived` lacks and that
    ran come first, as the record of what was done."""
    if previous is None:
        return derived
    old: dict[tuple, Step] = {}
    for step in list(previous.steps):
        old.setdefault(key(step), step)
    taken: set[int] = set()
    steps = []
    for step in derived.steps:
        mine = old.get(key(step))
        if mine is not None and _kept(mine, derived):
            taken.add(id(mine))
            steps.append(mine)
        else:
            steps.append(step)
    wanted = {key(s) for s in derived.steps}
    done = [s for s in previous.steps if id(s) not in taken and key(s) not in wanted
            and (s.state != "planned" or s.kind == "cells")]  # (the cells' thread still runs those)
    derived.steps = done + steps
    return derived
