"""The random generators a notebook draws from, given back as gpuctx's own work found them.

`torch.manual_seed(0)` in a cell fixes what the next cells draw, and Restart & Run All of a seeded
notebook gives the same numbers every time. The warm-up's steps draw from the same generators (a
tiny model's initial weights, random inputs, dropout, inductor's pad_mm benchmark), and they run
between the user's cells: without this, a seeded notebook's model got other initial weights than
in a kernel without gpuctx. So what a step draws is taken back: `save()` before it, `restore()`
after it, while no cell can start (the caller's lock).

Only the generators of modules already imported are read; nothing is imported here. A generator
that came into being during the step (torch imported, CUDA started) is set back to its start: its
own initial seed, nothing drawn. NumPy's legacy global generator and Python's `random` are given
back too; JAX has no global generator; CuPy's is kept apart by its recipe (recipes/cupy.py).
"""
from __future__ import annotations

import logging
import random
import sys

log = logging.getLogger("gpuctx")
# A step's note where a cell started while it ran: the cell may have seeded the generators, so they
# are left as they are, the step's draws and the cell's interleaved as any two threads' would be.
OVERLAP = "a cell started during this step: random numbers drawn meanwhile may differ from a kernel without gpuctx"


def save() -> dict:
    """The states of the global generators that exist now."""
    saved: dict = {"random": random.getstate()}
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        saved["numpy"] = np_random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):  # (not while torch is half imported)
        saved["torch"] = torch.default_generator.get_state()
        if torch.cuda.is_initialized():
            saved["cuda"] = [g.get_state() for g in torch.cuda.default_generators]
    return saved


def restore(saved: dict) -> str | None:
    """Every global generator as `saved` found it, or at its start where it was not there yet;
    None, or a note saying why not (never raises: the warm-up's work is done all the same)."""
    try:
        _restore(saved)
    except Exception as exc:  # noqa: BLE001
        log.warning("gpuctx: the random generators could not be given back after a warm-up step: %s", exc)
        return f"random generators not given back ({type(exc).__name__}: {exc})"
    return None


def _restore(saved: dict) -> None:
    random.setstate(saved["random"])
    np_random = sys.modules.get("numpy.random")
    if np_random is not None and "numpy" in saved:  # (one made during the step was seeded afresh anyway)
        np_random.set_state(saved["numpy"])
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "default_generator"):
        return
    _put(torch.default_generator, saved.get("torch"))
    if torch.cuda.is_initialized():
        states = saved.get("cuda") or []
        for i, gen in enumerate(torch.cuda.default_generators):
            _put(gen, states[i] if i < len(states) else None)


def _put(gen, state) -> None:
    if state is None:
        gen.manual_seed(gen.initial_seed())  # as it started: its seed, nothing drawn
    else:
        gen.set_state(state)
