"""The warm-up's torch.compile and a cell that sets what it keeps.

Dynamo saves process-wide settings as it starts compiling and puts them back as it ends
(`preserve_global_state`): the default dtype, deterministic-algorithms mode, the fp32 matmul
precision, the random generators' states. A cell that set one of them while the warm-up's compile
ran lost it when the compile ended: a `torch.manual_seed(0)` gone for every later cell, float64
back to float32, deterministic mode off. Such a cell (read from its source, as the import gate
reads imports) waits for the compile's end first; any other cell runs beside it as before.
"""
from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager

# What a cell may set that dynamo puts back: the seeds and generator states (`manual_seed`, a
# library's `set_seed`, `seed_everything`), the default dtype and tensor type, deterministic mode,
# the matmul precision (TF32) switches. While it waits, the compile's own imports are held no longer
# than the import gate holds any for a cell (HOLD_MAX_S).
SETS = re.compile(r"\w*seed\w*\s*\(|set_rng_state|random\.setstate|set_default_dtype|set_default_tensor_type"
                  r"|use_deterministic_algorithms|set_float32_matmul_precision|allow_tf32|fp32_precision")
WAIT_S = 120.0  # at most (the warm-up's tiny compile takes seconds; a hung one is not waited for longer)

_idle = threading.Event()
_idle.set()


@contextmanager
def compiling():
    """Around the warm-up's own torch.compile."""
    _idle.clear()
    try:
        yield
    finally:
        _idle.set()


def wait_for(source: str) -> bool:
    """Before a cell: when it sets what dynamo puts back and the warm-up compiles, wait for the
    compile's end (in slices: an Interrupt is seen between them). Whether it waited."""
    if _idle.is_set() or not SETS.search(source or ""):
        return False
    deadline = time.monotonic() + WAIT_S
    while not _idle.wait(0.1) and time.monotonic() < deadline:
        pass
    return True
