"""Load torch's shared libraries without holding the GIL, before the warm-up imports torch.

Why: Python loads an extension module with the GIL held, and torch's import loads its libraries
that way (its own ctypes calls included): the dynamic loader's relocations and static initialisers
of a CUDA build take hundreds of ms, during which the kernel's own thread can neither answer
kernel_info nor start a cell sent at once (scripts/probe-gil.py measures it). A C function called
through ctypes lets go of the GIL, so the warm-up makes the very calls torch's import makes to the
loader, in the same order and with the same flags, that way first; torch's import then finds every
library loaded. The calls are those of torch's `_load_global_deps` as the installed torch writes
it (read from its source, not imported): its global dependencies, then — where it preloads NVIDIA's
libraries by path, as a CUDA build from pip does — those files, then libtorch itself. Where its
source does not say so plainly, or a call fails, the rest is left to the import, which does it as
usual; nothing is loaded that the import would not load.
"""
from __future__ import annotations

import ast
import ctypes
import glob
import importlib.util
import os
import re
import sys

_done: set[str] = set()


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


def _function(source: str, name: str) -> ast.FunctionDef | None:
    """Top-level function `name` of `source`, parsed alone: parsing all of torch's __init__.py
    took 8-15 ms holding the GIL, the very thing this module is there to spare the kernel."""
    start = re.search(rf"^def {name}\(", source, re.MULTILINE)
    if start is None:
        return None
    end = re.compile(r"^[^\s#)]", re.MULTILINE).search(source, source.index("\n", start.start()) + 1)
    try:
        tree = ast.parse(source[start.start():end.start() if end else len(source)])
    except (SyntaxError, ValueError):
        return None
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def cuda_deps(source: str) -> list[tuple[str, str, bool]] | None:
    """What torch's `_load_global_deps` preloads by path once its global dependencies loaded,
    as (folder, file pattern, required), in its order: [] where it preloads nothing then, None
    where its source does not say plainly (the import is then left to do it)."""
    load, deps = _function(source, "_load_global_deps"), _function(source, "_preload_cuda_deps")
    if load is None:
        return None
    tries = [n for n in ast.walk(load) if isinstance(n, ast.Try)]
    if not any(_calls(ast.Module(body=t.body, type_ignores=[]), "_preload_cuda_deps") for t in tries):
        return []  # (it preloads only where its global dependencies fail to load: so do we not)
    if deps is None:
        return None
    out: list[tuple[str, str, bool]] = []
    for node in deps.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.List, ast.Tuple, ast.Dict)):
            try:
                libs = ast.literal_eval(node.value)
            except ValueError:
                return None
            out += [(folder, pattern, True) for folder, pattern in (libs.items() if isinstance(libs, dict) else libs)]
        for call in _calls(node, "_preload_cuda_lib"):
            if len(call.args) == 2 and all(isinstance(a, ast.Constant) for a in call.args):
                required = not any(k.arg == "required" and getattr(k.value, "value", True) is False
                                   for k in call.keywords)
                out.append((call.args[0].value, call.args[1].value, required))
    return out or None


def _dep_path(folder: str, pattern: str, cuda_major: str | None) -> str | None:
    """The file torch's `_preload_cuda_lib` picks: the first folder of sys.path that holds it."""
    for entry in sys.path:
        found = glob.glob(os.path.join(entry, "nvidia", folder, "lib", pattern))
        if cuda_major:
            found += glob.glob(os.path.join(entry, "nvidia", f"cu{cuda_major}", "lib", pattern))
        found += glob.glob(os.path.join(entry, folder, "lib", pattern))
        if found:
            return found[0]
    return None


def _maps() -> str:
    try:
        with open("/proc/self/maps") as f:
            return f.read()
    except OSError:
        return ""


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
        here = os.path.dirname(spec.origin)
        lib = os.path.join(here, "lib")
        if os.environ.get("TORCH_USE_RTLD_GLOBAL") or not os.path.exists(os.path.join(lib, "libtorch_global_deps.so")):
            return []
        with open(spec.origin, encoding="utf-8") as f:
            deps = cuda_deps(f.read())
        if deps is None:
            return []
        done = []
        if not dlopen(os.path.join(lib, "libtorch_global_deps.so").encode(), os.RTLD_GLOBAL | os.RTLD_NOW):
            return done  # (the import then preloads what it lacks and tries again, as usual)
        done.append("libtorch_global_deps.so")
        if deps and "libcudart.so" in _maps():  # a CUDA build: the import preloads these, by path
            major = _cuda_major(here)
            for folder, pattern, required in deps:
                path = _dep_path(folder, pattern, major)
                if path is None and not required:
                    continue
                if path is None or not dlopen(path.encode(), os.RTLD_NOW):
                    break  # where the import's preloading stops too (it goes on to libtorch)
                done.append(os.path.basename(path))
        if dlopen(os.path.join(lib, "libtorch.so").encode(), os.RTLD_NOW):
            done.append("libtorch.so")
        return done
    except (OSError, AttributeError, ValueError, TypeError):
        return []


def _cuda_major(torch_dir: str) -> str | None:
    """torch.version.cuda's major number, read from its file (importing it imports torch)."""
    try:
        with open(os.path.join(torch_dir, "version.py"), encoding="utf-8") as f:
            m = re.search(r"^cuda\b[^=\n]*=\s*['\"](\d+)", f.read(), re.MULTILINE)
        return m.group(1) if m else None
    except OSError:
        return None
