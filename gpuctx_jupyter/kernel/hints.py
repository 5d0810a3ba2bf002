"""What gpuctx prints under a traceback: a one-line fix for PyTorch's mixed-devices error, and the
out-of-memory explanation (kernel/oom.py: the device, this kernel, the other holders, the fixes)."""
from __future__ import annotations

import re

from . import oom

_MIXED = re.compile(r"Expected all tensors to be on the same device|is on (?:cpu|cuda:\d+), different from other tensors")
_DEVICE = re.compile(r"\b(cpu|cuda:\d+)\b")


def mixed_devices_hint(exc: BaseException | None) -> str | None:
    """The hint for `exc`, or None when it is not PyTorch's mixed-devices error."""
    if not isinstance(exc, RuntimeError):
        return None
    msg = str(exc)
    if not _MIXED.search(msg):
        return None
    devices = list(dict.fromkeys(_DEVICE.findall(msg)))
    gpus = sorted(d for d in devices if d.startswith("cuda"))
    if len(gpus) >= 2:
        a, b = gpus[:2]
        return (
            f"gpuctx: this operation mixes tensors on {a} and {b}. Move one to the other's device "
            f"(x.to(y.device)), or create both under `%%on_gpu {b.split(':')[1]} --default`."
        )
    if gpus and "cpu" in devices:
        g = gpus[0]
        return (
            f"gpuctx: this operation mixes a CPU tensor with one on {g}. Move the CPU one with "
            f".to('{g}'), or make new tensors land there with `%gpu use {g.split(':')[1]} --default`."
        )
    return "gpuctx: tensors on different devices were combined: move them to one device with .to(device)."


def hint_for(exc: BaseException | None) -> str | None:
    """The text to print under the traceback of `exc`, or None. Costs nothing without an error;
    the out-of-memory explanation reads NVML and the holders file only for an out-of-memory error."""
    if exc is None:
        return None
    return mixed_devices_hint(exc) or oom.explain(exc)
