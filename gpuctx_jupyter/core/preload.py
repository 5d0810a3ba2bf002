"""Load torch's shared libraries without holding the GIL, before the warm-up imports torch.

Why: Python loads an extension module with the GIL held, and torch's import loads its libraries
that way (its own ctypes call included): the dynamic loader's relocations and static initialisers
of a CUDA build take hundreds of ms, during which the kernel's own thread can neither answer
kernel_info nor start a cell sent at once (scripts/probe-gil.py measures it). A C function called
through ctypes lets go of the GIL, so the warm-up asks the loader for the same libraries that way
first; torch's import then finds them loaded. Only libraries without Python in them are loaded,
with the flags torch's import uses, and only where the loader would pick the very files torch's
import picks; anything that does not load is left to the import, which reports it as usual.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import sys

_done: set[str] = set()
# the CUDA libraries torch's import loads itself, by path, from the NVIDIA packages
_CUDA_LIBRARY = re.compile(r"lib(cudart|cublas|cublasLt|cudnn\w*|cufft|curand|cusolver|cusparse\w*|nvJitLink|nvrtc\S*|"
                           r"nccl|cupti|nvshmem\w*|cufile|nvToolsExt)\.so")


def _dlopen():
    libc = ctypes.CDLL(None)
    fn = libc.dlopen
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    return fn


def dlopen(path: bytes, mode: int) -> bool:
    """The C library's dlopen, called through ctypes (without the GIL, unlike ctypes.CDLL)."""
    try:
        return bool(_dlopen()(path, mode))
    except (OSError, AttributeError):
        return False


def _loaded(part: str) -> bool:
    try:
        with open("/proc/self/maps") as f:
            return part in f.read()
    except OSError:
        return False


def _same_files_as_import(site: str) -> bool:
    """The loader finds CUDA's libraries where torch's import looks for them: no folder on
    LD_LIBRARY_PATH holds one of them (a driver's folder, as containers set it, holds none), and
    the NVIDIA packages (if any) are installed beside torch, first on sys.path."""
    for folder in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        try:
            if any(_CUDA_LIBRARY.match(name) for name in os.listdir(folder)):
                return False
        except OSError:
            continue
    for entry in sys.path:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            return os.path.realpath(entry) == os.path.realpath(site)
    return True


def libraries(module: str) -> list[str]:
    """Load `module`'s libraries without the GIL (only torch's are known; Linux only). Returns the
    libraries loaded; never raises. Call it from the thread that is about to import `module`."""
    if module.split(".")[0] != "torch" or "torch" in sys.modules or "torch" in _done:
        return []
    if not sys.platform.startswith("linux"):
        return []
    _done.add("torch")
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return []
        lib = os.path.join(os.path.dirname(spec.origin), "lib")
        site = os.path.dirname(os.path.dirname(spec.origin))
        if (os.environ.get("TORCH_USE_RTLD_GLOBAL") or not os.path.exists(os.path.join(lib, "libtorch_global_deps.so"))
                or not _same_files_as_import(site)):
            return []
        done = []
        # first what torch's import loads first, as it does (global); then torch itself, local
        for name, mode in (("libtorch_global_deps.so", os.RTLD_GLOBAL | os.RTLD_NOW), ("libtorch.so", os.RTLD_NOW)):
            path = os.path.join(lib, name)
            if not os.path.exists(path) or not dlopen(path.encode(), mode):
                break
            done.append(name)
        return done
    except (OSError, AttributeError, ValueError):
        return []
