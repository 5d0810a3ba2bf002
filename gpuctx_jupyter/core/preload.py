"""Load torch's shared libraries without holding the GIL, before the warm-up imports torch.

Why: Python loads an extension module with the GIL held, and torch's import loads its libraries
that way (its own ctypes call included): the dynamic loader's relocations and static initialisers
of a CUDA build take hundreds of ms, during which the kernel's own thread can neither answer
kernel_info nor start a cell sent at once (scripts/probe-gil.py measures it). A C function called
through ctypes lets go of the GIL, so the warm-up asks the loader for the same libraries that way
first; torch's import then finds them loaded. Only libraries without Python in them are loaded,
with the flags torch's import uses, and — for a CUDA build, whose import opens NVIDIA's libraries
by path — only where the loader would pick the very files torch's import picks; anything that does
not load is left to the import, which reports it as usual.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import sys

_done: set[str] = set()
# the CUDA libraries torch's import loads itself, by path, from the NVIDIA packages
_LIBRARY = (r"lib(cudart|cublas|cublasLt|cudnn\w*|cufft|curand|cusolver|cusparse\w*|nvJitLink|nvrtc[\w-]*|"
            r"nccl|cupti|nvshmem\w*|cufile|nvToolsExt)\.so")
_CUDA_LIBRARY, _CUDA_LIBRARY_BYTES = re.compile(_LIBRARY), re.compile(_LIBRARY.encode())
LD_CACHE = "/etc/ld.so.cache"
SYSTEM_FOLDERS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", f"/lib/{os.uname().machine}-linux-gnu",
                  f"/usr/lib/{os.uname().machine}-linux-gnu")


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


def _search_path() -> list[str]:
    """The folders the loader searches before a library's own RUNPATH: LD_LIBRARY_PATH as the
    process started with it (the loader read it then) and as it is now; an empty entry is the
    working directory."""
    values = [os.environ.get("LD_LIBRARY_PATH", "")]
    try:
        with open("/proc/self/environ", "rb") as f:
            values += [v[len(b"LD_LIBRARY_PATH="):].decode(errors="replace") for v in f.read().split(b"\0")
                       if v.startswith(b"LD_LIBRARY_PATH=")]
    except OSError:
        pass
    return [entry or os.getcwd() for value in values if value for entry in value.split(os.pathsep)]


def _system_has_cuda() -> bool:
    """The loader's own search finds CUDA libraries on the system (a toolkit registered in
    ld.so.cache or in the system's folders, as CUDA's container images have): a dependency that a
    wheel's library does not find by its RUNPATH would then come from there."""
    try:
        with open(LD_CACHE, "rb") as f:
            if _CUDA_LIBRARY_BYTES.search(f.read()):
                return True
    except OSError:
        pass
    return any(_holds_cuda(folder) for folder in SYSTEM_FOLDERS)


def _holds_cuda(folder: str) -> bool:
    try:
        return any(_CUDA_LIBRARY.match(name) for name in os.listdir(folder))
    except OSError:
        return False


def _same_files_as_import(site: str) -> bool:
    """The loader finds CUDA's libraries only where torch's import opens them: no folder of
    LD_LIBRARY_PATH holds one (a driver's folder, as containers set it, holds none), the system
    has none of its own, and the NVIDIA packages (if any) are installed beside torch, first on
    sys.path. Else a library torch's import opens by path could be mapped twice: the wheel's and
    another the loader found first for a dependency."""
    if any(_holds_cuda(folder) for folder in _search_path()) or _system_has_cuda():
        return False
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
        if os.environ.get("TORCH_USE_RTLD_GLOBAL") or not os.path.exists(os.path.join(lib, "libtorch_global_deps.so")):
            return []
        if os.path.exists(os.path.join(lib, "libtorch_cuda.so")) and not _same_files_as_import(site):
            return []  # (a CPU build links no CUDA library: the loader finds what the import finds)
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
