"""Has this process touched CUDA? Asked of the driver without touching it; and starting it
without holding the GIL (`start`, the warm-up's first GPU step).

An import-warm standby (a kernel that imported a notebook's modules ahead of time) must leave
CUDA alone: no context (nothing in nvidia-smi, no GPU memory) and, so that the environment a
notebook gives it at adoption still applies (CUDA_VISIBLE_DEVICES is read when the driver starts),
not even the driver started. Some imports start it (torch_geometric does; torch, transformers and
lightning do not — scripts/probe-imports.py). This module answers for the current process:

- `touched()`: "" (untouched), "driver" (cuInit ran, no context), or "context" (a primary
  context is active on some device: it holds GPU memory);
- libcuda is never loaded by asking: if the process has not loaded it (RTLD_NOLOAD), CUDA is
  untouched. Without an NVIDIA driver the answer is "" too.
"""
from __future__ import annotations

import ctypes
import os

NOT_INITIALIZED = 3  # CUDA_ERROR_NOT_INITIALIZED: cuInit has not run in this process
LIBCUDA = "libcuda.so.1"


def _loaded_libcuda():
    try:
        return ctypes.CDLL(LIBCUDA, mode=getattr(os, "RTLD_NOLOAD", 0x4) | ctypes.RTLD_GLOBAL)
    except OSError:
        return None


def touched() -> str:
    """"" | "driver" | "context" for this process (see the module's docstring); never raises."""
    try:
        cuda = _loaded_libcuda()
        if cuda is None:
            return ""
        count = ctypes.c_int(0)
        code = cuda.cuDeviceGetCount(ctypes.byref(count))
        if code == NOT_INITIALIZED:
            return ""
        if code != 0:
            return "driver"
        for ordinal in range(count.value):
            device, flags, active = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
            if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
                continue
            if cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value:
                return "context"
        return "driver"
    except Exception:  # noqa: BLE001 — an odd libcuda answers "driver": it was loaded, so assume started
        return "driver"


def _started():
    """libcuda with its driver started (cuInit), both without the GIL: loading it is the loader's
    C work, called through ctypes; None without a driver or where it does not start."""
    from . import preload

    if not preload.dlopen(LIBCUDA.encode(), os.RTLD_NOW):
        return None
    cuda = _loaded_libcuda()
    return cuda if cuda is not None and cuda.cuInit(0) == 0 else None


def init() -> bool:
    """Start CUDA's driver (cuInit) through ctypes, which lets go of the GIL: asking torch or CuPy
    whether a GPU is usable starts it while holding the GIL (0.1-0.3 s on a large GPU host). No
    context, no GPU memory. True when started; never raises."""
    try:
        return _started() is not None
    except (OSError, AttributeError, ValueError):
        return False


def start(ordinal: int) -> bool:
    """Start the driver and device `ordinal`'s primary context (the one torch's runtime uses)
    through ctypes, without the GIL: torch's own start does both while holding it, and a cell
    sent meanwhile waits. The context is retained, as torch's runtime keeps it for the process's
    life (`release` gives it back where torch's start then fails). True when done; never raises
    (torch's own start then does it, as without this)."""
    try:
        cuda = _started()
        device, context = ctypes.c_int(0), ctypes.c_void_p()
        return (cuda is not None and cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0)
    except (OSError, AttributeError, ValueError):
        return False


def release(ordinal: int) -> None:
    """Give back the primary context `start` retained (when torch did not start after all: no
    GPU memory is kept that torch alone would not have kept); never raises."""
    try:
        cuda = _loaded_libcuda()
        device = ctypes.c_int(0)
        if cuda is not None and cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0:
            cuda.cuDevicePrimaryCtxRelease_v2(device)
    except (OSError, AttributeError, ValueError):
        pass
