"""Pre-warming CUDA in a background thread, so the first GPU cell runs at steady-state speed.

The thread imports the frameworks, starts CUDA on the kernel's device and runs what people run
first (an allocation, fp32 and bf16 matmuls, a cuDNN convolution), then exits: its cuBLAS and
cuDNN handles go back to torch's pools, so it leaves no extra GPU memory behind. It never holds
up kernel readiness or a cell; a cell that touches CUDA meanwhile waits on torch's own
lazy-init lock for the rest only. Failures are recorded and logged once, never raised.
"""
from __future__ import annotations

import importlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field

from traitlets import Enum, List, Unicode, default
from traitlets.config import Configurable

from ..contract import DEFAULT_OPS, FRAMEWORKS, OPS, WarmPlan
from ..core import frameworks as fws
from ..core import inventory

log = logging.getLogger("gpuctx")
# A first cell that names one of these will do its own first GPU work: the warm-up then stops
# after its current phase instead of competing with it (import and CUDA start-up are shared).
_GPU_CELL = re.compile(r"\b(?:torch|cuda|cupy|jax|jnp|numba|on_gpu)\b")  # not %gpu: `%gpu status` only looks


class GpuWarmup(Configurable):
    """Kernel-side warm-up settings (`c.GpuWarmup.<trait>` in ipython_kernel_config.py).

    The jupyter_server extension sets them per kernel through GPUCTX_* environment variables;
    a kernel that jupyter_server does not start (VS Code, a JupyterHub image) sets them in its
    own config together with `c.IPKernelApp.extensions = ["gpuctx"]`.
    """

    policy = Enum(
        ["never", "always", "auto"],
        help="""When the kernel warms CUDA at start-up. 'always': every kernel. 'auto': only
        kernels whose notebook uses a GPU framework (imports torch/cupy/jax/numba or uses %gpu /
        %%on_gpu): a warmed kernel holds ~630 MiB of GPU memory. 'never': only `%gpu warm`.
        GPUCTX_WARM=0 in the kernel's environment always wins (opt-out).""",
    ).tag(config=True)

    frameworks = List(
        Unicode(), help="Frameworks to import and warm, in order (torch, cupy, jax)."
    ).tag(config=True)

    ops = List(
        Unicode(), help=f"Operations to run once CUDA is up; any of {', '.join(OPS)}."
    ).tag(config=True)

    imports = List(
        Unicode(), help="Other slow-to-import modules to import first (e.g. transformers, lightning)."
    ).tag(config=True)

    device = Unicode(
        help="""Device this kernel starts on (a spec such as '1' or 'GPU-…'); empty: CUDA's
        default. Set by the server's device assignment through GPUCTX_DEVICE."""
    ).tag(config=True)

    device_source = Unicode(help="Who chose `device`, shown by %gpu status.").tag(config=True)

    @default("policy")
    def _policy_default(self):
        return WarmPlan.from_env().policy

    @default("frameworks")
    def _frameworks_default(self):
        return WarmPlan.from_env().frameworks

    @default("ops")
    def _ops_default(self):
        return WarmPlan.from_env().ops

    @default("imports")
    def _imports_default(self):
        return WarmPlan.from_env().imports

    @default("device")
    def _device_default(self):
        return WarmPlan.from_env().device

    @default("device_source")
    def _source_default(self):
        return WarmPlan.from_env().device_source or ("kernel config" if self.device else "")


@dataclass
class WarmState:
    state: str = "off"  # off | running | done | skipped | failed
    detail: str = ""  # what it did, or why it skipped or failed
    source: str = ""  # server hook, kernel config, %gpu warm
    device: int | None = None
    phase: str = ""  # the phase running now
    phases: dict[str, float] = field(default_factory=dict)  # seconds each
    started: float | None = None  # time.monotonic()
    finished: float | None = None
    first_cell_overlap: float | None = None  # how long the first cell ran while warm-up was busy

    @property
    def total(self) -> float | None:
        return None if self.started is None or self.finished is None else self.finished - self.started

    def summary(self) -> str:
        phases = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in self.phases.items())
        where = f" on cuda:{self.device}" if self.device is not None else ""
        by = f", started by {self.source}" if self.source else ""
        if self.state == "running":
            return f"running{where} (now: {self.phase}; done: {phases or 'nothing yet'}){by}"
        if self.state == "off":
            return f"off ({self.detail})" if self.detail else "off"
        text = f"{self.state}{where}"
        if self.total is not None and self.state != "skipped":
            text += f" in {self.total:.2f} s"
        if phases:
            text += f" ({phases})"
        if self.detail:
            text += f": {self.detail}" if self.state in ("skipped", "failed") else f"; {self.detail}"
        text += by
        if self.first_cell_overlap is not None:
            text += f"; your first cell waited for it at most {self.first_cell_overlap:.2f} s"
        return text

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["total"] = self.total
        return d


class Warmer:
    """Owns the one warm-up thread of this kernel and its record."""

    def __init__(self, switcher=None):
        self.switcher = switcher
        self.status = WarmState()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._cell_started: float | None = None
        self._yield = threading.Event()  # a GPU cell started: stop after the current phase
        self._logged = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, frameworks=("torch",), ops=DEFAULT_OPS, device: int | None = None, source: str = "%gpu warm",
              imports=()) -> bool:
        """Start the thread (False when one is already running)."""
        with self._lock:
            if self.running:
                return False
            self.status = WarmState(state="running", source=source, device=device, phase="starting",
                                    started=time.monotonic())
            self._cell_started = None
            self._yield.clear()
            self._thread = threading.Thread(target=self._run, args=(tuple(imports), tuple(frameworks), tuple(ops),
                                                                    device),
                                            name="gpuctx-warmup", daemon=True)
            self._thread.start()
            return True

    def wait(self, timeout: float | None = None) -> WarmState:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.status

    # -- cell events: how long did the first cell overlap the warm-up? --------------------------
    def cell_started(self, source: str = "") -> None:
        if self.running and self._cell_started is None and self.status.first_cell_overlap is None:
            self._cell_started = time.monotonic()
        if self.running and _GPU_CELL.search(source or ""):
            self._yield.set()

    def cell_finished(self) -> None:
        if self._cell_started is not None and self.running:
            # The first cell finished before the warm-up did: it did not wait for it.
            self.status.first_cell_overlap = 0.0
            self._cell_started = None

    # -- the thread -----------------------------------------------------------------------------
    def _run(self, imports, frameworks, ops, device) -> None:
        st = self.status
        try:
            for name in imports:
                self._phase(f"import {name}", lambda: importlib.import_module(name))
            for name in frameworks:
                if name not in FRAMEWORKS:
                    raise ValueError(f"cannot warm {name!r}: choose from {', '.join(FRAMEWORKS)}")
            missing = [name for name in frameworks if not fws.BY_NAME[name].installed()]
            if missing:
                st.state, st.detail = "skipped", f"{', '.join(missing)} is not installed in this kernel"
                return
            for name in frameworks:
                self._phase(f"import {name}", lambda: importlib.import_module(name))
            reason = self._cuda_reason(frameworks)
            if reason:
                st.state, st.detail = "skipped", reason
                return
            if device is None:
                device = self.switcher.choice.ordinal if self.switcher and self.switcher.choice else 0
            st.device = device
            for name in frameworks:
                getattr(self, f"_warm_{name}")(device, ops)
            st.state = "done"
        except _CutShort:
            st.state = "done"
            st.detail = "stopped early: your first GPU cell started and does the rest itself"
        except BaseException as exc:  # noqa: BLE001 — a warm-up must never take the kernel down
            st.state, st.detail = "failed", f"{st.phase}: {type(exc).__name__}: {exc}"
            if not self._logged:
                self._logged = True
                log.warning("gpuctx warm-up failed (the kernel works on, CUDA starts on first use): %s", st.detail)
        finally:
            st.phase = ""
            st.finished = time.monotonic()
            if self._cell_started is not None:
                st.first_cell_overlap = st.finished - self._cell_started
                self._cell_started = None

    def _phase(self, name: str, fn) -> None:
        if self._yield.is_set() and not name.startswith(("import", "cuda init")):
            raise _CutShort
        self.status.phase = name
        t0 = time.perf_counter()
        fn()
        self.status.phases[name] = time.perf_counter() - t0

    def _cuda_reason(self, frameworks) -> str | None:
        """Why CUDA is not to be warmed here (None: go ahead)."""
        inv = inventory.take()
        why = inv.no_gpu_reason()
        if why:
            return f"imported {', '.join(frameworks)} only; no GPU is visible: {why}"
        if "torch" in frameworks:
            reason = fws.TORCH.gpu_reason()
            if reason:
                return f"imported torch only; {reason}"
            if fws.TORCH.initialized():
                return "CUDA was already initialised in this kernel: nothing left to warm"
        return None

    def _warm_torch(self, device: int, ops) -> None:
        """What first cells run: each op loads its kernels (CUDA loads them lazily, process-wide)
        and creates the library handles that the user's thread then takes from torch's pools."""
        import torch
        import torch.nn.functional as F

        dev = torch.device("cuda", device)
        self._phase("cuda init", lambda: (torch.cuda.init(), torch.cuda.set_device(dev)))
        t = {}

        def alloc():
            t["x"] = torch.randn(1024, 1024, device=dev)
            t["y"] = torch.rand(1024, 1024, device=dev)
            torch.zeros(16, device=dev), torch.ones(16, device=dev), torch.arange(16, device=dev)
            torch.tensor([1.0, 2.0]).to(dev)

        def elementwise():
            x, y = t["x"], t["y"]
            z = torch.relu((x + y) * 2 - 1)
            z.sum().item(), z.mean().item(), z.max().item(), z.argmax().item()
            torch.softmax(z, dim=-1), torch.exp(z).cpu()

        def conv():
            img, weight = torch.randn(8, 3, 64, 64, device=dev), torch.randn(16, 3, 3, 3, device=dev)
            F.conv2d(img, weight, padding=1).sum().item()
            F.conv2d(img.half(), weight.half(), padding=1).sum().item()

        def backward():
            # Autograd only: an optimizer's first step imports torch._dynamo, seconds of holding
            # the GIL that would slow the user's cells instead of speeding them up.
            net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                      torch.nn.Linear(8 * 16 * 16, 10)).to(dev)
            loss = F.cross_entropy(net(torch.randn(4, 3, 16, 16, device=dev)), torch.zeros(4, dtype=torch.long,
                                                                                         device=dev))
            loss.backward()

        steps = {"alloc": alloc, "elementwise": elementwise, "matmul fp32": lambda: (t["x"] @ t["y"]).sum().item(),
                 "matmul bf16": lambda: (t["x"].bfloat16() @ t["y"].bfloat16()).float().sum().item(),
                 "conv": conv, "backward": backward}
        alloc_needed = any(op in ops for op in ("elementwise", "matmul_fp32", "matmul_bf16"))
        try:
            for name, fn in steps.items():
                if name.replace(" ", "_") in ops or (name == "alloc" and alloc_needed):
                    self._phase(name, fn)
            self._phase("sync", lambda: torch.cuda.synchronize(dev))
        finally:  # also when cut short: leave the allocator as a cold kernel would have it
            t.clear()
            torch.cuda.empty_cache()

    def _warm_cupy(self, device: int, ops) -> None:
        import cupy

        def run():
            with cupy.cuda.Device(device):
                a = cupy.ones((1024, 1024), dtype=cupy.float32)
                (a @ a).sum()
                cupy.cuda.Device(device).synchronize()
        self._phase("cupy ops", run)

    def _warm_jax(self, device: int, ops) -> None:
        import jax
        import jax.numpy as jnp

        def run():
            gpu = jax.devices("gpu")[device]
            a = jax.device_put(jnp.ones((1024, 1024), dtype=jnp.float32), gpu)
            (a @ a).block_until_ready()
        self._phase("jax ops", run)


class _CutShort(Exception):
    """The user's first GPU cell started: the rest of the warm-up would only compete with it."""
