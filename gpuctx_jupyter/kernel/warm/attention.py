"""Attention at the notebook's own shapes: noted on one run, built ahead on the next.

Where torch runs attention through cuDNN (torch 2.11 on Hopper, bf16/fp16), cuDNN builds a graph
for every problem (sizes, strides, dtypes, causal, dropout, mask) on its first call, and compiles
kernels for a sequence length it has not met: first calls at a new shape on an H200 took 0.5 s
forward, 0.08 s backward (docs/benchmarks.md). The forward's graphs are kept per thread; the
backward's in autograd's device thread, which every thread shares. A warm-up at shapes of its own
pays none of that for the notebook. So:

- while the notebook's first attention cell runs, the problems its cells' thread passes to
  `F.scaled_dot_product_attention` are noted (sizes, strides, dtypes and flags; never a value)
  and kept per notebook in Jupyter's data folder (`gpuctx/attention/`); then the watch ends;
- the next warm-up of that notebook (a restart, another day, a standby it adopts) runs each
  problem forward and backward in the warm-up's thread, then, once that thread has exited, the
  forward once more in the cells' thread while no cell runs (scheduler's `in_cells_thread`).

The watch replaces F.scaled_dot_product_attention with a wrapper while it lasts. Calls made while
torch compiles, or with tensors that are not plain tensors (symbolic tracing, fake tensors), pass
straight through; TorchScript knows the wrapper as the op itself. It is put back afterwards unless
torch.compile compiled code meanwhile (a compiled frame's guards hold the wrapper: it stays, and
notes nothing more).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time

log = logging.getLogger("gpuctx")

MAX_PROBLEMS = 8  # noted per notebook, and built ahead
MAX_CELLS = 30  # a watch that has noted nothing in this many cells ends
MAX_BYTES = 1 << 30  # a problem whose tensors take more is not built ahead
FOLDER = os.path.join("gpuctx", "attention")  # under Jupyter's data folder
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


# -- what is kept -----------------------------------------------------------------------------------
def _file(notebook: str) -> str:
    from jupyter_core.paths import jupyter_data_dir

    key = hashlib.sha256(os.path.abspath(notebook).encode()).hexdigest()[:24]
    return os.path.join(jupyter_data_dir(), FOLDER, f"{key}.json")


def remembered(notebook: str | None) -> list[dict]:
    """The problems noted on the notebook's last run ([] when none, or unreadable)."""
    if not notebook:
        return []
    try:
        with open(_file(notebook), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("notebook") != os.path.abspath(notebook):
        return []
    problems = data.get("problems")
    return [p for p in problems if _valid(p)][:MAX_PROBLEMS] if isinstance(problems, list) else []


def remember(notebook: str, problems: list[dict]) -> None:
    path = _file(notebook)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"notebook": os.path.abspath(notebook), "saved": time.time(), "problems": problems}, fh)
    os.replace(tmp, path)


def _layout(t) -> dict:
    return {"size": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).rsplit(".", 1)[-1]}


def _valid_layout(x) -> bool:
    ints = lambda v: isinstance(v, list) and all(isinstance(i, int) and i >= 0 for i in v)  # noqa: E731
    return (isinstance(x, dict) and ints(x.get("size")) and ints(x.get("stride"))
            and len(x["size"]) == len(x["stride"]) <= 8 and isinstance(x.get("dtype"), str) and x["dtype"].isidentifier())


def _valid(p) -> bool:
    return (isinstance(p, dict) and all(_valid_layout(p.get(k)) for k in "qkv")
            and (p.get("mask") is None or _valid_layout(p["mask"])) and isinstance(p.get("dropout"), (int, float))
            and isinstance(p.get("causal"), bool) and isinstance(p.get("grad"), bool)
            and (p.get("scale") is None or isinstance(p["scale"], (int, float))) and isinstance(p.get("gqa", False), bool))


def problem_of(torch, args: tuple, kwargs: dict) -> dict | None:
    """The problem of one call, or None where it is not one of plain tensors (a proxy of symbolic
    tracing, a fake or functional tensor) or not of the kind the wrapper knows."""
    call = dict(zip(_ARGS, args))
    call.update(kwargs)
    q, k, v, mask = call.get("query"), call.get("key"), call.get("value"), call.get("attn_mask")
    if not all(type(t) is torch.Tensor for t in (q, k, v)) or not (mask is None or type(mask) is torch.Tensor):
        return None
    dropout, scale = call.get("dropout_p", 0.0), call.get("scale")
    if not isinstance(dropout, (int, float)) or not (scale is None or isinstance(scale, (int, float))):
        return None
    return {"q": _layout(q), "k": _layout(k), "v": _layout(v), "mask": None if mask is None else _layout(mask),
            "dropout": float(dropout), "causal": bool(call.get("is_causal", False)), "scale": scale,
            "gqa": bool(call.get("enable_gqa", False)), "device": q.device.type,
            "grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))}


def describe(problem: dict) -> str:
    """`4×8×64×32 bfloat16, causal` as a step says it."""
    q = problem["q"]
    flags = [f for f, on in (("causal", problem["causal"]), ("masked", problem.get("mask") is not None),
                             (f"dropout {problem['dropout']:g}", problem["dropout"] > 0)) if on]
    return "×".join(map(str, q["size"])) + f" {q['dtype']}" + (", " + ", ".join(flags) if flags else "")


# -- watching a run -----------------------------------------------------------------------------------
class Watch:
    """Notes the attention problems of the notebook's first attention cell (see the module's doc)."""

    def __init__(self):
        self.notebook: str | None = None  # armed for this notebook
        self.noted: list[dict] = []
        self._torch = self._original = self._wrapper = None
        self._frames = 0  # torch.compile's frames when the wrapper went in
        self._cells = 0  # cells since then
        self._noted_in_cell = False
        self._lock = threading.Lock()
        self.quiet = False  # the warm-up's own calls in the cells' thread are not the notebook's

    @property
    def watching(self) -> bool:
        return self._wrapper is not None

    def arm(self, notebook: str | None) -> None:
        """Watch this notebook's run, from the next cell on once torch is imported."""
        if notebook and self.notebook is None:
            self.notebook = notebook
            self.install()

    def install(self) -> bool:
        """Put the wrapper in, if armed, torch imported and not done yet."""
        torch = sys.modules.get("torch")
        F = getattr(getattr(torch, "nn", None), "functional", None)
        with self._lock:
            if self.notebook is None or self._wrapper is not None or self._torch is not None or F is None:
                return False
            original = getattr(F, "scaled_dot_product_attention", None)
            if original is None:
                return False
            self._torch, self._original = torch, original
            compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
            main = threading.main_thread()

            def scaled_dot_product_attention(*args, **kwargs):
                if not compiling() and self._wrapper is not None and threading.current_thread() is main:
                    self._note(args, kwargs)
                return original(*args, **kwargs)

            scaled_dot_product_attention.__doc__ = original.__doc__
            scaled_dot_product_attention.__wrapped__ = original
            try:  # TorchScript: the wrapper is the op (a scripted function calling it compiles as before)
                from torch.jit import _builtins

                _builtins._register_builtin(scaled_dot_product_attention, "aten::scaled_dot_product_attention")
            except Exception:  # noqa: BLE001 — an older or newer torch: scripting such code fails as it says
                pass
            self._wrapper, self._frames, self._cells = scaled_dot_product_attention, _compiled_frames(), 0
            F.scaled_dot_product_attention = scaled_dot_product_attention
            return True

    def _note(self, args, kwargs) -> None:
        if self.quiet or len(self.noted) >= MAX_PROBLEMS:
            return
        try:
            problem = problem_of(self._torch, args, kwargs)
        except Exception:  # noqa: BLE001 — noting never fails the user's call
            return
        if problem is not None and problem not in self.noted:
            self.noted.append(problem)
            self._noted_in_cell = True

    def before_cell(self) -> None:
        if self.notebook is not None and self._torch is None and "torch" in sys.modules:
            self.install()

    def after_cell(self) -> None:
        """A cell ended: once it noted problems, keep them and end the watch."""
        if self._wrapper is None:
            return
        self._cells += 1
        noted, self._noted_in_cell = self._noted_in_cell, False
        if noted:
            try:
                remember(self.notebook, list(self.noted))
            except OSError as exc:
                log.info("gpuctx: attention shapes not kept (%s): the next start warms them as today", exc)
        if noted or self._cells >= MAX_CELLS:
            self.end()

    def end(self) -> None:
        """Put F.scaled_dot_product_attention back (unless a compiled frame may hold the wrapper)."""
        with self._lock:
            wrapper, self._wrapper = self._wrapper, None
            if wrapper is None:
                return
            F = self._torch.nn.functional
            if F.scaled_dot_product_attention is wrapper and _compiled_frames() == self._frames:
                F.scaled_dot_product_attention = self._original

    def original(self, torch):
        """The function that runs attention (never the wrapper)."""
        return self._original if self._original is not None else torch.nn.functional.scaled_dot_product_attention


def _compiled_frames() -> int:
    counters = getattr(sys.modules.get("torch._dynamo.utils"), "counters", None)
    try:
        return int(sum(counters["frames"].values())) if counters is not None else 0
    except Exception:  # noqa: BLE001
        return 0


WATCH = Watch()


# -- building ahead -------------------------------------------------------------------------------------
def nbytes(problem: dict) -> int:
    sizes = {"bool": 1, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
    total = 0
    for key in ("q", "k", "v", "mask"):
        lay = problem.get(key)
        if lay:
            span = 1 + sum((s - 1) * st for s, st in zip(lay["size"], lay["stride"]) if s)
            total += span * sizes.get(lay["dtype"], 4)
    return total * (3 if problem["grad"] else 2)  # the output, the gradients


def run(torch, dev, problem: dict, backward: bool) -> None:
    """One call at the problem's sizes, strides and flags on `dev` (zeros: values do not matter
    to which graph is built); its backward too where the notebook's needed one and `backward`."""
    def tensor(lay, grad=False):
        t = torch.empty_strided(lay["size"], lay["stride"], dtype=getattr(torch, lay["dtype"]), device=dev)
        t.zero_() if t.dtype != torch.bool else t.fill_(True)
        return t.requires_grad_(grad and t.is_floating_point())

    # (inputs that need a gradient: the forward then keeps what its backward reads, a graph of its own)
    q, k, v = (tensor(problem[key], problem["grad"]) for key in "qkv")
    mask = tensor(problem["mask"]) if problem.get("mask") else None
    extra = {"enable_gqa": True} if problem.get("gqa") else {}
    with torch.set_grad_enabled(problem["grad"]):
        out = WATCH.original(torch)(q, k, v, attn_mask=mask, dropout_p=problem["dropout"], is_causal=problem["causal"],
                                    scale=problem["scale"], **extra)
        if problem["grad"] and backward:
            out.backward(torch.zeros_like(out))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def fitting(torch, dev, problems: list[dict]) -> tuple[list[dict], str]:
    """The problems worth building on `dev` (its kind of device, within MAX_BYTES and a quarter of
    the free memory), and what was left out, said in words."""
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else MAX_BYTES
    keep = [p for p in problems if p.get("device", "cuda") == dev.type and nbytes(p) <= min(MAX_BYTES, free // 4)]
    left = len(problems) - len(keep)
    return keep, f"{left} too large or for another kind of device, not built" if left else ""


def in_cells_thread(torch, dev, problems: list[dict]):
    """What the cells' thread runs: each forward, not noted as the notebook's own; the allocator's
    cache given back after it unless the cells had cached blocks of their own."""
    def forwards():
        had = dev.type == "cuda" and torch.cuda.memory_reserved(dev) > 0
        WATCH.quiet = True
        try:
            for problem in problems:
                run(torch, dev, problem, backward=False)
        finally:
            WATCH.quiet = False
            if dev.type == "cuda" and not had:
                torch.cuda.empty_cache()
    return forwards
