"""The random generators a notebook draws from, given back as gpuctx's own work found them.

`torch.manual_seed(0)` in a cell fixes what the next cells draw, and Restart & Run All of a seeded
notebook gives the same numbers every time. The warm-up's steps draw from the same generators (a
tiny model's initial weights, random inputs, dropout, inductor's pad_mm benchmark), and they run
between the user's cells: without this, a seeded notebook's model got other initial weights than
in a kernel without gpuctx. So what a step draws is taken back: `save()` before it, `restore()`
after it, while no cell can start (the caller's lock).

Only the generators of modules that have finished importing are read (nothing is imported here;
one half imported by a background import cannot be read safely). A generator that came into being
during the step is set back to its start: torch's CPU one to its own initial seed with nothing
drawn; CUDA's to the state torch's lazy start gave them, which a notebook may have queued before
CUDA started (`torch.cuda.set_rng_state`, read by a call queued behind the notebook's own;
`torch.manual_seed`, whose seeds torch runs last, replayed over it). NumPy's legacy global
generator and Python's `random` are given back too; JAX has no global generator; CuPy's recipe
draws from a generator of its own (recipes/cupy.py).
"""
from __future__ import annotations

import logging
import random
import sys

from ..core.frameworks import imported

log = logging.getLogger("gpuctx")
# A step's note where a cell started while it ran: the cell may have seeded the generators, so they
# are left as they are, the step's draws and the cell's interleaved as any two threads' would be.
OVERLAP = "a cell started during this step: random numbers drawn meanwhile may differ from a kernel without gpuctx"


def save(cuda_may_start: bool = False) -> dict:
    """The states of the global generators that exist now (`cuda_may_start`: a GPU step, which may
    start CUDA); never raises (what could not be read is said in "error", and nothing is put back)."""
    try:
        return _save(cuda_may_start)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


def give_back(saved: dict | None, overlapped: bool) -> str | None:
    """After a step (called under the lock a cell's start takes): `restore(saved)`, unless a cell
    started during the step (`overlapped`) or nothing was saved (an import); the step's note."""
    if saved is None:
        return None
    return OVERLAP if overlapped else restore(saved)


def restore(saved: dict) -> str | None:
    """Every global generator as `saved` found it, or at its start where it was not there yet;
    None, or a note saying why not (never raises: the warm-up's work is done all the same)."""
    if "error" in saved:
        return f"random generators not saved ({saved['error']})"
    try:
        _restore(saved)
    except Exception as exc:  # noqa: BLE001
        log.warning("gpuctx: the random generators could not be given back after a warm-up step: %s", exc)
        return f"random generators not given back ({type(exc).__name__}: {exc})"
    return None


def _save(cuda_may_start: bool) -> dict:
    saved: dict = {"random": random.getstate()}
    if imported("numpy.random"):
        saved["numpy"] = sys.modules["numpy.random"].get_state()
    if imported("torch"):
        torch = sys.modules["torch"]
        saved["torch"] = torch.default_generator.get_state()
        if torch.cuda.is_initialized():
            saved["cuda"] = [g.get_state() for g in torch.cuda.default_generators]
        elif cuda_may_start:  # its generators as CUDA's start leaves them, before the step draws
            at_start: list = []
            lazy_call = getattr(torch.cuda, "_lazy_call", None)
            if lazy_call is not None:
                def read():  # also the device current then: `torch.cuda.manual_seed` seeds that one
                    at_start.extend(g.get_state() for g in torch.cuda.default_generators)
                    saved["cuda_device_at_start"] = torch.cuda.current_device()
                lazy_call(read)
            saved["cuda_at_start"] = at_start
            # torch runs the queued seeds (`torch.manual_seed`) after every other queued call, so
            # after the one above too: they are replayed over what it read, on the device it saw
            tracker = getattr(torch.cuda, "_lazy_seed_tracker", None)
            saved["cuda_seeds"] = [call[0] for call in (tracker.get_calls() if tracker else []) if call]
    return saved


def _restore(saved: dict) -> None:
    random.setstate(saved["random"])
    if "numpy" in saved and imported("numpy.random"):  # (one made during the step was seeded afresh anyway)
        sys.modules["numpy.random"].set_state(saved["numpy"])
    if not imported("torch"):
        return
    torch = sys.modules["torch"]
    _put(torch.default_generator, saved.get("torch"))
    if torch.cuda.is_initialized():
        states = saved.get("cuda") or saved.get("cuda_at_start") or []
        for i, gen in enumerate(torch.cuda.default_generators):
            _put(gen, states[i] if i < len(states) else None)
        if "cuda" not in saved and saved.get("cuda_seeds"):
            with torch.cuda.device(saved.get("cuda_device_at_start", torch.cuda.current_device())):
                for seed in saved["cuda_seeds"]:
                    seed()


def _put(gen, state) -> None:
    if state is None:
        gen.manual_seed(gen.initial_seed())  # as it started: its seed, nothing drawn
    else:
        gen.set_state(state)
