"""`%gpu doctor`: every check that explains "why is my GPU not used / slow / wrong", with the fix."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..contract import XLA_SET_BY, jax_preallocation
from ..core import frameworks as fws
from ..core import nvml
from ..core.devices import device_order_problem
from ..core.inventory import Inventory
from .render import Section, gib
from .reports import WrappedReport

OK, INFO, WARN, ERROR = "ok", "info", "warn", "error"
_MARK = {OK: "✓", INFO: "·", WARN: "!", ERROR: "✗"}


@dataclass
class Finding:
    level: str
    topic: str
    detail: str
    advice: str = ""


def _version_tuple(v: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in str(v).split(".")[:2])
    except (TypeError, ValueError):
        return None


def _nvml_findings(inv: Inventory) -> list[Finding]:
    if inv.nvml_error:
        return [Finding(ERROR, "NVML", inv.nvml_error,
                        "run on a machine with an NVIDIA GPU and driver; in a container, start it with the GPU "
                        "passed through (docker --gpus all, or the NVIDIA container toolkit)")]
    driver, cuda = nvml.driver_version(), nvml.cuda_driver_version()
    out = [Finding(OK, "NVML", f"driver {driver}, supports CUDA up to {cuda}; {len(inv.records)} GPU record(s)")]
    for r in inv.records:
        if r.error:
            out.append(Finding(ERROR, f"GPU {r.nvml_index}", f"{r.name or r.uuid}: {r.error}",
                               "the GPU fell off the bus or the driver lost it: check `nvidia-smi` and the "
                               "kernel log; a reboot or a driver reload usually brings it back"))
        if r.persistence_mode is False and not r.mig_parent:
            out.append(Finding(WARN, f"GPU {r.nvml_index}", "persistence mode is off: every CUDA start-up pays "
                               "driver initialisation again", "enable it with `sudo nvidia-smi -pm 1`"))
        if r.mig_enabled and not r.mig_parent:
            out.append(Finding(INFO, f"GPU {r.nvml_index}", "MIG mode is on: CUDA sees MIG instances, not the "
                               "whole GPU", "pick an instance with CUDA_VISIBLE_DEVICES=MIG-<uuid> before start-up"))
    return out


def _torch_findings(inv: Inventory, warm=None) -> list[Finding]:
    torch = fws.TORCH
    if not torch.loaded():
        if not torch.installed():
            return [Finding(INFO, "torch", "not installed", "install a CUDA build of torch to use the GPU from PyTorch")]
        version, build = installed_torch_build()
        if build == "cpu" or (build or "").startswith("ROCm"):
            kind = "a CPU-only build" if build == "cpu" else f"a {build} build, for AMD GPUs"
            return [Finding(WARN if inv.devices else INFO, "torch", f"{version} is {kind} (read from its "
                            "installed package; not imported yet)",
                            "install a CUDA build of torch that matches your driver to use the GPU")]
        what = f"{version}, {build} build (read from its installed package)" if build else version or "installed"
        out = [Finding(INFO, "torch", f"{what}; not imported yet, so the checks below cover the frameworks "
                       "this kernel has imported")]
        return out + _driver_findings(build.removeprefix("CUDA ") if build and build.startswith("CUDA ") else None,
                                      inv)
    mod = torch.mod
    built = getattr(mod.version, "cuda", None)
    if not built:
        return [Finding(WARN if inv.devices else INFO, "torch", f"{mod.__version__} is a CPU-only build",
                        "install a CUDA build of torch that matches your driver to use the GPU")]
    out = [Finding(OK, "torch", f"{mod.__version__}, built for CUDA {built}")] + _driver_findings(built, inv)
    if torch.initialized():
        # Imported here, not with the extension: importing multiprocessing aliases the user's
        # namespace as sys.modules["__mp_main__"], and before torch's own import of it that made
        # pickle name torch.contiguous_format after the namespace — inductor's cache keys then
        # differed from a plain kernel's for the same graph (every compile missed its cache).
        import multiprocessing

        method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()
        if method == "fork":
            by_warmup = warm is not None and warm.state == "done"
            out.append(Finding(WARN, "multiprocessing", "CUDA is initialised" + (" (by gpuctx's warm-up)" if by_warmup
                               else "") + " and the start method is 'fork': a forked child cannot use CUDA "
                               "('Cannot re-initialize CUDA in forked subprocess')",
                               "use multiprocessing.set_start_method('spawn') or "
                               "DataLoader(..., multiprocessing_context='spawn'); workers that stay on the CPU are fine"
                               + ("; or opt this notebook out of warming: notebook metadata "
                                  '{"gpuctx": {"warm": false}}, or GPUCTX_WARM=0 in the kernel\'s environment'
                                  if by_warmup else "")))
    return out


def _driver_findings(built: str | None, inv: Inventory) -> list[Finding]:
    """A torch built for a newer CUDA than the driver supports cannot start CUDA at all."""
    supported = _version_tuple(nvml.cuda_driver_version()) if built and not inv.nvml_error else None
    if not supported or (_version_tuple(built) or (0,)) <= supported:
        return []
    most = ".".join(map(str, supported))
    return [Finding(ERROR, "torch", f"built for CUDA {built}, but the driver supports only up to {most}",
                    f"upgrade the NVIDIA driver, or install a torch build for CUDA {most} or older")]


def _visibility_findings(inv: Inventory) -> list[Finding]:
    if inv.visibility is None or device_order_problem(os.environ.get("CUDA_DEVICE_ORDER")):
        return []  # a bad CUDA_DEVICE_ORDER hides everything: _env_findings names it as the cause
    cvd = inv.visibility.cuda_visible_devices
    shown = ", ".join(f"cuda:{d.ordinal}=nvidia-smi {d.record.nvml_index}" for d in inv.devices) or "nothing"
    level = OK if inv.devices else WARN
    what = "unset" if cvd is None else repr(cvd)
    out = [Finding(level, "CUDA_VISIBLE_DEVICES", f"{what} → {shown}" + (" (read from torch)" if inv.exact else ""),
                   "" if inv.devices else (inv.visibility.empty_reason or "") + ": unset it or list a GPU, then restart the kernel")]
    for note in inv.notes:
        out.append(Finding(WARN, "CUDA_VISIBLE_DEVICES", note, "fix the variable, then restart the kernel"))
    remapped = [d for d in inv.devices if d.ordinal != d.record.nvml_index]
    if remapped and not inv.visibility.cuda_visible_devices:
        out.append(Finding(INFO, "numbering", "CUDA ordinals differ from nvidia-smi's indices here ("
                           + ", ".join(f"cuda:{d.ordinal} is nvidia-smi {d.record.nvml_index}" for d in remapped) + ")",
                           "set CUDA_DEVICE_ORDER=PCI_BUS_ID before the kernel starts to make them agree; "
                           "gpuctx always shows torch's number"))
    return out


def _count_findings(inv: Inventory) -> list[Finding]:
    out = []
    want = len(inv.devices)
    for fw in fws.loaded():
        if fw is fws.TORCH and not getattr(fw.mod.version, "cuda", None):
            continue  # a CPU-only build: one finding, above
        reason = fws.reason_without_starting(fw)
        if reason:
            if inv.devices:
                out.append(Finding(INFO if reason == fws.NOT_STARTED else WARN, fw.name, reason))
            continue
        n = fw.device_count()
        if n is not None and n != want:
            out.append(Finding(WARN, fw.name, f"sees {n} device(s) where NVML and CUDA_VISIBLE_DEVICES give {want}",
                               "CUDA_VISIBLE_DEVICES probably changed after this framework started: restart the kernel"))
        else:
            out.append(Finding(OK, fw.name, f"sees {n} device(s), current cuda:{fw.current()}"))
    return out


def diagnose(inv: Inventory, warm=None) -> list[Finding]:
    return (_nvml_findings(inv) + _visibility_findings(inv) + _torch_findings(inv, warm) + _count_findings(inv)
            + _env_findings() + _keeper_findings(inv))


def _keeper_findings(inv: Inventory, env=None) -> list[Finding]:
    """What the frameworks keep for themselves: JAX's preallocation (75% of every GPU it starts on
    unless told otherwise) and CuPy's memory pool — the first things to name when another notebook
    runs out of memory."""
    env = os.environ if env is None else env
    out = []
    if fws.JAX.loaded() or fws.JAX.installed():
        fraction = jax_preallocation(env)
        by_server = env.get(XLA_SET_BY) == "server"
        if fraction is None:
            how = ("XLA_PYTHON_CLIENT_PREALLOCATE=false, set by the gpuctx server for the kernels it starts "
                   "(c.GpuctxServer.jax_preallocate = True turns that off)" if by_server
                   else "set in this kernel's environment")
            out.append(Finding(OK, "JAX memory", f"preallocation is off ({how}): JAX takes GPU memory as it needs it"))
        else:
            total = max((d.record.memory_total or 0 for d in inv.devices), default=0)
            grab = f" (~{gib(int(fraction * total))} of each {gib(total)} GPU)" if total else ""
            loaded = fws.JAX.loaded()
            out.append(Finding(WARN if loaded else INFO, "JAX memory",
                               f"JAX {'preallocates' if loaded else 'will preallocate'} {fraction:.0%} of every GPU it "
                               f"starts on{grab}, whether it uses it or not; other notebooks then run out of memory",
                               "set XLA_PYTHON_CLIENT_PREALLOCATE=false (or XLA_PYTHON_CLIENT_MEM_FRACTION=0.3) in "
                               "the kernel's environment before jax starts, then restart the kernel; kernels that "
                               "a gpuctx server starts get it unless c.GpuctxServer.jax_preallocate = True"))
    if fws.CUPY.loaded() and fws.CUPY.gpu_reason() is None:
        cached = sum(f.reserved - f.allocated for f in fws.allocator_figures() if f.framework == "cupy")
        if cached >= 2**30:
            out.append(Finding(INFO, "CuPy memory", f"CuPy's memory pool keeps {gib(cached)} cached for reuse",
                               "`%gpu free` returns it to the GPU; cupy.cuda.set_allocator(None) turns pooling off"))
    return out


def _env_findings() -> list[Finding]:
    problem = device_order_problem(os.environ.get("CUDA_DEVICE_ORDER"))
    if problem:
        return [Finding(ERROR, "CUDA_DEVICE_ORDER", problem,
                        "use FASTEST_FIRST (the default) or PCI_BUS_ID, spelled so, then restart the kernel")]
    return []


def installed_torch_build() -> tuple[str | None, str | None]:
    """(version, "cpu" / "CUDA 12.8" / "ROCm 6.3" / "CUDA" / None) of the installed torch, read
    without importing it (seconds of start-up): a heuristic over the package's metadata.

    1. A local version label says it outright: `2.13.0+cpu`, `+cu128`, `+rocm6.3` (the builds
       from download.pytorch.org carry one).
    2. Without one (PyPI's builds): Linux CUDA wheels require NVIDIA's runtime packages
       (`nvidia-cuda-runtime-cu12`, `nvidia-cublas`, …), so such a requirement means CUDA.
    3. Else the package's own library folder decides: CUDA builds ship `libtorch_cuda.so`
       (`torch_cuda.dll`). No such file: CPU-only. A CUDA build that loads the runtime from
       elsewhere (a conda or a source build) still has that library, so it is not mistaken.
    (None, None) when torch has no package metadata (a source tree on sys.path, say); the build
    is None when no rule decides. Once torch is imported, doctor reads `torch.version.cuda` instead.
    """
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    version = dist.version
    local = version.partition("+")[2].lower()
    if local.startswith("cpu"):
        return version, "cpu"
    cuda = re.fullmatch(r"cu(\d+)(\d)", local)
    if cuda:
        return version, f"CUDA {cuda.group(1)}.{cuda.group(2)}"
    if local.startswith("rocm"):
        return version, f"ROCm {local[4:]}"
    if any(re.match(r"nvidia[-_]", req, flags=re.IGNORECASE) for req in dist.requires or ()):
        return version, "CUDA"
    spec = importlib.util.find_spec("torch")
    lib = Path(next(iter(spec.submodule_search_locations or ()), "")) / "lib" if spec else None
    if lib is None or not lib.is_dir():
        return version, None
    names = {p.name for p in lib.iterdir()}
    return version, "CUDA" if any(n.startswith(("libtorch_cuda", "torch_cuda")) for n in names) else "cpu"


def report(findings: list[Finding]) -> WrappedReport:
    """The findings as a table; in plain text the last column wraps to the terminal's width."""
    rows = [[_MARK[f.level], f.topic, f.detail + (f" → {f.advice}" if f.advice else "")] for f in findings]
    worst = [f for f in findings if f.level in (WARN, ERROR)]
    summary = "all checks passed" if not worst else f"{len(worst)} finding(s) need attention"
    section = Section(f"gpuctx doctor: {summary}", ["", "check", "finding → what to do"], rows,
                      marked={i for i, f in enumerate(findings) if f.level in (WARN, ERROR)})
    return WrappedReport([section], data={"findings": [f.__dict__ for f in findings]}, wrap={0: 2})
