"""Framework adapters: what torch, CuPy, Numba and JAX think the current GPU is, and how to change it.

Each adapter only touches a framework that the user has already imported (``sys.modules``):
gpuctx never imports a GPU framework on its own, so loading the extension costs nothing
and never starts CUDA behind the user's back.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import asdict, dataclass

from . import cuda_driver


@dataclass
class Memory:
    """Allocator figures of one framework on one device, in bytes."""

    allocated: int
    reserved: int
    peak: int | None = None


def imported(name: str) -> bool:
    """Module `name` is imported and has finished importing (a warm-up thread may be importing it
    right now: it is in sys.modules, half initialised, until then)."""
    mod = sys.modules.get(name)
    return mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False)


class Framework:
    name = ""
    module = ""  # the sys.modules key that says "loaded"
    package = ""  # the importable top-level package

    @property
    def mod(self):
        return sys.modules.get(self.module)

    def loaded(self) -> bool:
        """Imported and finished importing (a warm-up thread may be importing it right now)."""
        return imported(self.module)

    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.package) is not None
        except (ImportError, ValueError):
            return False

    def gpu_reason(self) -> str | None:
        """None when this framework can use a GPU here, else why not (one line)."""
        return None

    def initialized(self) -> bool | None:
        """Whether this framework has started CUDA in this process (None: cannot tell)."""
        return None

    def usable(self) -> bool | None:
        """`gpu_reason() is None`, asked only once CUDA has started in this process; None before.
        Asking torch or CuPy starts CUDA's driver in the asking thread (0.1-0.3 s on a large GPU
        host, holding the GIL): what runs after every cell and at every thread's start must not
        make a kernel that has not used the GPU pay that (nor start CUDA in it)."""
        if not self.initialized() and not cuda_driver.touched():
            return None
        return self.gpu_reason() is None

    def device_count(self) -> int | None:
        return None

    def current(self) -> int | None:
        """The current CUDA ordinal, without starting CUDA where avoidable."""
        return None

    def set_current(self, ordinal: int) -> None:
        raise NotImplementedError

    def default_device(self) -> str | None:
        """Where tensors created without a device land, when that differs from the current GPU."""
        return None

    def set_default(self, ordinal: int | None, previous: object = None) -> object:
        """Make tensors created without a device land on ``ordinal``; return what to restore."""
        return None

    def memory(self, ordinal: int) -> Memory | None:
        return None

    def release_cached(self) -> int:
        """Return cached allocator memory to the GPU; the number of bytes released."""
        return 0


class Torch(Framework):
    name = module = package = "torch"

    def gpu_reason(self):
        torch = self.mod
        if torch is None:
            return "torch is not imported"
        if not getattr(torch.version, "cuda", None):
            return f"torch {torch.__version__} is a CPU-only build (install a CUDA build of torch)"
        if not torch.cuda.is_available():
            return "torch sees no CUDA device (torch.cuda.is_available() is False)"
        return None

    def initialized(self):
        torch = self.mod
        return bool(torch and torch.cuda.is_initialized())

    def usable(self):
        torch = self.mod
        if torch is not None and not getattr(torch.version, "cuda", None):
            return False  # a CPU-only build: known without asking CUDA
        return super().usable()

    def device_count(self):
        torch = self.mod
        return torch.cuda.device_count() if torch and torch.version.cuda else 0

    def current(self):
        torch = self.mod
        if torch is None or not torch.version.cuda:
            return None
        return torch.cuda.current_device() if torch.cuda.is_initialized() else _lazy_choice.get(id(torch), 0)

    def set_current(self, ordinal):
        torch = self.mod
        if torch.cuda.is_initialized():
            torch.cuda.set_device(ordinal)
            return
        # Not started yet: queue the switch for torch's own lazy initialisation, so that
        # `%gpu use` never starts CUDA (nor costs its ~600 MiB) in a kernel that may not use it.
        key = id(torch)
        queued = key in _lazy_choice
        _lazy_choice[key] = ordinal
        if not queued:  # one queued call reads the latest choice when CUDA starts
            torch.cuda._lazy_call(lambda: torch.cuda.set_device(_lazy_choice[key]))

    def default_device(self):
        torch = self.mod
        if torch is None or not hasattr(torch, "get_default_device"):
            return None
        dev = torch.get_default_device()
        return None if dev.type == "cpu" else str(dev)

    def set_default(self, ordinal, previous=None):
        torch = self.mod
        before = torch.get_default_device() if hasattr(torch, "get_default_device") else None
        if ordinal is None:
            torch.set_default_device(previous if previous is not None and str(previous) != "cpu" else None)
        else:
            torch.set_default_device(f"cuda:{ordinal}")
        return before

    def memory(self, ordinal):
        torch = self.mod
        if not self.initialized():
            return None
        return Memory(
            allocated=torch.cuda.memory_allocated(ordinal),
            reserved=torch.cuda.memory_reserved(ordinal),
            peak=torch.cuda.max_memory_allocated(ordinal),
        )

    def release_cached(self):
        torch = self.mod
        if not self.initialized():
            return 0
        before = sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))
        torch.cuda.empty_cache()
        after = sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))
        return max(0, before - after)

    def uuids(self) -> list[str] | None:
        """The UUIDs of torch's devices in ordinal order, once CUDA is up: the ground truth."""
        torch = self.mod
        if not self.initialized():
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            uuid = str(getattr(torch.cuda.get_device_properties(i), "uuid", "") or "")
            if uuid and not uuid.startswith(("GPU-", "MIG-")):
                uuid = "GPU-" + uuid
            out.append(uuid)
        return out


# torch ordinal chosen before CUDA started, keyed by module identity (survives re-imports in tests)
_lazy_choice: dict[int, int] = {}


class CuPy(Framework):
    name = module = package = "cupy"

    def gpu_reason(self):
        cupy = self.mod
        if cupy is None:
            return "cupy is not imported"
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDARuntimeError without a driver
            return f"CuPy cannot reach CUDA: {exc}"
        return None if n else "CuPy sees no CUDA device"

    def device_count(self):
        try:
            return self.mod.cuda.runtime.getDeviceCount()
        except Exception:
            return 0

    def current(self):
        try:
            return self.mod.cuda.runtime.getDevice()
        except Exception:
            return None

    def set_current(self, ordinal):
        self.mod.cuda.runtime.setDevice(ordinal)

    def memory(self, ordinal):
        # Only the current device: entering another device would create a context there.
        if ordinal != self.current():
            return None
        pool = self.mod.get_default_memory_pool()
        return Memory(allocated=pool.used_bytes(), reserved=pool.total_bytes())

    def release_cached(self):
        cupy = self.mod
        pool = cupy.get_default_memory_pool()
        before = pool.total_bytes()
        pool.free_all_blocks()  # frees every device's cached blocks
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        return max(0, before - pool.total_bytes())


class Numba(Framework):
    name = "numba"
    module = "numba.cuda"
    package = "numba"

    def gpu_reason(self):
        cuda = self.mod
        if cuda is None:
            return "numba.cuda is not imported"
        try:
            return None if cuda.is_available() else "numba.cuda sees no usable CUDA device"
        except Exception as exc:
            return f"numba.cuda cannot reach CUDA: {exc}"

    def device_count(self):
        try:
            return len(self.mod.gpus)
        except Exception:
            return 0

    def current(self):
        return _numba_choice.get("ordinal")

    def set_current(self, ordinal):
        cuda = self.mod
        # select_device makes that device's primary context current in this thread.
        cuda.select_device(ordinal)
        _numba_choice["ordinal"] = ordinal


_numba_choice: dict[str, int] = {}


class Jax(Framework):
    name = module = package = "jax"

    def _gpus(self):
        try:
            return self.mod.devices("gpu")
        except Exception:
            return []

    def gpu_reason(self):
        if self.mod is None:
            return "jax is not imported"
        return None if self._gpus() else "JAX has no GPU backend (install jax[cuda13])"

    def initialized(self):
        """Whether JAX has started a GPU backend, asked without starting one (jax.devices() would,
        and by JAX's defaults preallocate 75% of every visible GPU)."""
        backends = getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None)
        return isinstance(backends, dict) and any(k in ("cuda", "gpu", "rocm") for k in backends)

    def device_count(self):
        return len(self._gpus())

    def current(self):
        dev = self.mod.config.jax_default_device if self.mod else None
        if dev is None or isinstance(dev, str):
            return None
        return dev.id if getattr(dev, "platform", "") == "gpu" else None

    def set_current(self, ordinal):
        gpus = self._gpus()
        self.mod.config.update("jax_default_device", gpus[ordinal])

    def default_device(self):
        dev = self.mod.config.jax_default_device if self.mod else None
        return None if dev is None else str(dev)


NOT_STARTED = "imported; its GPU backend starts at its first use"


def reason_without_starting(fw: Framework) -> str | None:
    """gpu_reason() for what only reports or gives back (%gpu status, %gpu doctor, %gpu free, the
    server's release request on the control thread): JAX's backend is not started to be asked."""
    if fw is JAX and fw.loaded() and not fw.initialized():
        return NOT_STARTED
    return fw.gpu_reason()


TORCH, CUPY, NUMBA, JAX = Torch(), CuPy(), Numba(), Jax()
ALL: tuple[Framework, ...] = (TORCH, CUPY, NUMBA, JAX)
BY_NAME = {fw.name: fw for fw in ALL}


def loaded() -> list[Framework]:
    return [fw for fw in ALL if fw.loaded()]


@dataclass(frozen=True)
class AllocatorFigures:
    """One framework's allocator on one device, in bytes; `peak` is None where it keeps none."""

    framework: str
    ordinal: int
    allocated: int
    reserved: int
    peak: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def allocator_figures(ordinal: int | None = None) -> list[AllocatorFigures]:
    """This process's allocator memory, per framework and device: torch on every device once it
    has started CUDA, CuPy on its current device (another device would need a context there).
    `ordinal` limits the answer to one device. Never imports a framework nor starts CUDA, so
    the magics, the control-channel answer and the monitor's sampler thread can all ask; a
    framework that fails to answer (a lost GPU) is left out rather than raising. CuPy's current
    device is per thread: asked from another thread, it answers for that thread's device (and
    labels the figures with it)."""
    out: list[AllocatorFigures] = []
    if TORCH.loaded() and TORCH.initialized():
        try:
            count = TORCH.device_count() or 0
            wanted = range(count) if ordinal is None else [o for o in (ordinal,) if 0 <= o < count]
            for i in wanted:
                m = TORCH.memory(i)
                if m is not None:
                    out.append(AllocatorFigures("torch", i, m.allocated, m.reserved, m.peak))
        except Exception:  # noqa: BLE001 — a figure we cannot read is one we do not show
            pass
    if CUPY.loaded() and cuda_driver.touched() and CUPY.gpu_reason() is None:  # asking CuPy would start it
        try:
            current = CUPY.current()
            m = CUPY.memory(current) if current is not None and ordinal in (None, current) else None
            if m is not None:
                out.append(AllocatorFigures("cupy", current, m.allocated, m.reserved, m.peak))
        except Exception:  # noqa: BLE001
            pass
    return out
