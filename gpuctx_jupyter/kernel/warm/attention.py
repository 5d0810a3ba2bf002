"""Attention at the notebook's own shapes: noted on one run, built ahead on the next.

Where torch runs attention through cuDNN (torch 2.11 on Hopper, bf16/fp16), cuDNN builds a graph
for every problem (sizes, strides, dtypes, causal, dropout, mask) on its first call, and compiles
kernels for a sequence length it has not met: first calls at a new shape on an H200 took 0.5 s
forward, 0.08 s backward (docs/benchmarks.md). The forward's graphs are kept per thread; the
backward's in autograd's device thread, which every thread shares. A warm-up at shapes of its own
pays none of that for the notebook. So:

- while the notebook's first attention cell runs, the problems its cells' thread passes to
  `F.scaled_dot_product_attention` are noted — sizes, strides and dtypes of q, k, v and the mask,
  the flags, autocast's dtype, the backend torch picks, and the layout of the output's gradient
  (the backward's graph is built for it); never a value — and kept per notebook in Jupyter's data
  folder (`gpuctx/attention/`); then the watch ends;
- the next warm-up of that notebook (a restart, another day, a standby it adopts) runs each
  problem that cuDNN serves forward and backward in the warm-up's thread, then, once that thread
  has exited, the forward once more in the cells' thread while no cell runs (cells_thread.py).

The watch replaces F.scaled_dot_product_attention with a callable while it lasts. Calls made while
torch compiles, or with tensors that are not plain tensors (symbolic tracing, fake tensors), pass
straight through; torch's own mask objects (causal_lower_right, ...) are handed the function they
ask for; TorchScript knows the callable as the op itself, and it pickles as torch's function. It
is put back afterwards unless torch.compile compiled code meanwhile (a compiled frame's guards
hold it: it stays, and notes nothing more).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pkgutil
import sys
import tempfile
import threading
import time

log = logging.getLogger("gpuctx")

MAX_PROBLEMS = 8  # noted per notebook, and built ahead
MAX_CELLS = 30  # a watch that has noted nothing in this many cells ends
MAX_BYTES = 1 << 30  # a problem whose tensors take more is not built ahead
FOLDER = os.path.join("gpuctx", "attention")  # under Jupyter's data folder
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_BYTES = {"bool": 1, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}  # the dtypes a record may name


# -- what is kept -----------------------------------------------------------------------------------
def _file(notebook: str) -> str:
    from jupyter_core.paths import jupyter_data_dir

    key = hashlib.sha256(absolute(notebook).encode()).hexdigest()[:24]
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
    if not isinstance(data, dict) or data.get("notebook") != absolute(notebook):
        return []
    problems = data.get("problems")
    return [p for p in problems if _valid(p)][:MAX_PROBLEMS] if isinstance(problems, list) else []


def remember(notebook: str, problems: list[dict]) -> None:
    path = _file(notebook)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".attention-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"notebook": absolute(notebook), "saved": time.time(), "problems": problems}, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _layout(t) -> dict:
    return {"size": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).rsplit(".", 1)[-1]}


def _valid_layout(x) -> bool:
    ints = lambda v: isinstance(v, list) and all(isinstance(i, int) and i >= 0 for i in v)  # noqa: E731
    return (isinstance(x, dict) and ints(x.get("size")) and ints(x.get("stride"))
            and len(x["size"]) == len(x["stride"]) <= 8 and x.get("dtype") in _BYTES)


def _valid(p) -> bool:
    return (isinstance(p, dict) and all(_valid_layout(p.get(k)) for k in "qkv")
            and all(p.get(k) is None or _valid_layout(p[k]) for k in ("mask", "grad_out"))
            and isinstance(p.get("dropout"), (int, float)) and isinstance(p.get("causal"), bool)
            and isinstance(p.get("grad"), bool) and (p.get("scale") is None or isinstance(p["scale"], (int, float)))
            and isinstance(p.get("gqa", False), bool)
            and p.get("autocast") in (None, *_BYTES) and (p.get("backend") is None or isinstance(p["backend"], str)))


def problem_of(torch, args: tuple, kwargs: dict) -> dict | None:
    """The problem of one call, or None where it is not one of plain tensors (a proxy of symbolic
    tracing, a fake or functional tensor, a mask object) or has an argument the wrapper does not know."""
    if len(args) > len(_ARGS) or any(k not in _ARGS for k in kwargs):
        return None
    call = dict(zip(_ARGS, args))
    call.update(kwargs)
    q, k, v, mask = call.get("query"), call.get("key"), call.get("value"), call.get("attn_mask")
    if not all(type(t) is torch.Tensor for t in (q, k, v)) or not (mask is None or type(mask) is torch.Tensor):
        return None
    dropout, scale = call.get("dropout_p", 0.0), call.get("scale")
    if not isinstance(dropout, (int, float)) or not (scale is None or isinstance(scale, (int, float))):
        return None
    causal, gqa, autocast = bool(call.get("is_causal", False)), bool(call.get("enable_gqa", False)), _autocast(torch, q)
    return {"q": _layout(q), "k": _layout(k), "v": _layout(v), "mask": None if mask is None else _layout(mask),
            "dropout": float(dropout), "causal": causal, "scale": scale, "gqa": gqa, "device": q.device.type,
            "autocast": autocast, "grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
            "backend": None if autocast else _backend(torch, q, k, v, mask, float(dropout), causal, scale, gqa)}


def _backend(torch, q, k, v, mask, dropout: float, causal: bool, scale, gqa: bool) -> str | None:
    """The backend torch picks for this call (cuDNN's is the one that builds per problem); None
    where it cannot be asked."""
    try:
        from torch.nn.attention import SDPBackend

        extra = {"enable_gqa": True} if gqa else {}
        return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, dropout, causal, scale=scale, **extra)).name
    except Exception:  # noqa: BLE001 — a private call of torch's: unknown is no reason not to warm
        return None


def _autocast(torch, q) -> str | None:
    """The dtype autocast casts attention's inputs to, where it is on for q's device (else None)."""
    try:
        on = torch.is_autocast_enabled(q.device.type)
        return str(torch.get_autocast_dtype(q.device.type)).rsplit(".", 1)[-1] if on else None
    except (TypeError, AttributeError, RuntimeError):  # an older torch: autocast's CUDA calls only
        return None


def describe(problem: dict) -> str:
    """`4×8×64×32 bfloat16, causal` as a step says it."""
    q = problem["q"]
    flags = [f for f, on in (("causal", problem["causal"]), ("masked", problem.get("mask") is not None),
                             (f"dropout {problem['dropout']:g}", problem["dropout"] > 0),
                             (f"autocast {problem.get('autocast')}", problem.get("autocast"))) if on]
    return "×".join(map(str, q["size"])) + f" {q['dtype']}" + (", " + ", ".join(flags) if flags else "")


def _bias_class():
    """torch's own attention-mask objects (causal_upper_left/lower_right), where torch has them."""
    return getattr(sys.modules.get("torch.nn.attention.bias"), "CausalBias", None)


class _Noting:
    """F.scaled_dot_product_attention while a watch lasts: notes, then calls torch's function.
    A callable object rather than a function: it pickles as torch's function (a model that kept a
    reference to it still pickles), and tracebacks in IPython skip it."""

    def __init__(self, watch, torch, original):
        self.watch, self.torch, self.__wrapped__ = watch, torch, original
        self.__name__ = self.__qualname__ = "scaled_dot_product_attention"
        self.__doc__ = original.__doc__
        self._compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        self._main = threading.main_thread()

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # noqa: F841 — IPython shows the user's call, not this frame
        original = self.__wrapped__
        if self._compiling():
            return original(*args, **kwargs)
        mask = kwargs["attn_mask"] if "attn_mask" in kwargs else args[3] if len(args) > 3 else None
        bias = _bias_class()
        if bias is not None and isinstance(mask, bias):  # it asks which function called it: the one in F now
            return self.torch.overrides.handle_torch_function(
                self.torch.nn.functional.scaled_dot_product_attention, (mask,), *args, **kwargs)
        noted = self.watch.note(args, kwargs) if threading.current_thread() is self._main else None
        out = original(*args, **kwargs)
        if noted is not None and noted.get("grad") and getattr(out, "requires_grad", False):
            out.register_hook(lambda grad: noted.setdefault("grad_out", _layout(grad)) and None)
        return out

    def __reduce__(self):
        return pkgutil.resolve_name, ("torch.nn.functional:scaled_dot_product_attention",)

    def __repr__(self):
        return f"<gpuctx noting {self.__wrapped__!r}>"


# -- watching a run -----------------------------------------------------------------------------------
class Watch:
    """Notes the attention problems of the notebook's first attention cell (see the module's doc)."""

    def __init__(self):
        self.notebook: str | None = None  # armed for this notebook (its absolute path)
        self.noted: list[dict] = []
        self._keys: set[str] = set()
        self._seen: set = set()  # calls seen, by a key that is cheap to make (the same call again costs ~1 µs)
        self._torch = self._original = self._wrapper = None
        self._gpu: bool | None = None  # a GPU is visible (NVML, never CUDA: asked once, when a CPU problem is noted)
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
            self.notebook = absolute(notebook)
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
            wrapper = _Noting(self, torch, original)
            _EVER.append(wrapper)  # (TorchScript's table keys on its id: never reused by another object)
            try:  # TorchScript: the wrapper is the op (a scripted function calling it compiles as before)
                from torch.jit import _builtins

                _builtins._register_builtin(wrapper, "aten::scaled_dot_product_attention")
            except Exception:  # noqa: BLE001 — an older or newer torch: scripting such code fails as it says
                pass
            self._wrapper, self._frames, self._cells = wrapper, _compiled_frames(), 0
            F.scaled_dot_product_attention = wrapper
            return True

    def note(self, args, kwargs) -> dict | None:
        """Note a call of the cells' thread; the problem as noted (None: not noted)."""
        if self.quiet or self._wrapper is None or len(self.noted) >= MAX_PROBLEMS:
            return None
        try:
            seen = _seen_key(self._torch, args, kwargs)
            if seen in self._seen:
                return None
            self._seen.add(seen)
        except TypeError:  # (something unhashable among the arguments: the full key decides)
            pass
        try:
            problem = problem_of(self._torch, args, kwargs)
        except Exception:  # noqa: BLE001 — noting never fails the user's call
            return None
        if problem is None:
            return None
        key = json.dumps(problem, sort_keys=True)
        if key in self._keys:
            return None
        self._keys.add(key)
        self.noted.append(problem)
        # the watch ends after a cell with a problem of the GPU's (the CPU's where none is visible):
        # a first cell that tries a model on the CPU is not what the GPU's first step will build
        self._noted_in_cell |= problem["device"] == "cuda" or not self._gpu_visible()
        return problem

    def _gpu_visible(self) -> bool:
        """Whether NVML sees a GPU. Never torch.cuda.is_available(): it would start CUDA's driver
        with the environment of now, and a notebook may set CUDA_VISIBLE_DEVICES after `import torch`."""
        if self._gpu is None:
            try:
                from ...core import inventory

                self._gpu = bool(inventory.take().devices)
            except Exception:  # noqa: BLE001
                self._gpu = False
        return self._gpu

    def before_cell(self) -> None:
        if self.notebook is not None and self._torch is None and "torch" in sys.modules:
            self.install()

    def after_cell(self) -> None:
        """A cell ended: once it noted problems, keep them (in a thread of its own: a slow home
        folder never holds up the kernel) and end the watch."""
        if self._wrapper is None:
            return
        self._cells += 1
        noted, self._noted_in_cell = self._noted_in_cell, False
        if noted:
            notebook, problems = self.notebook, [dict(p) for p in self.noted]
            threading.Thread(target=_keep, args=(notebook, problems), name="gpuctx-attention", daemon=True).start()
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


def _seen_key(torch, args: tuple, kwargs: dict) -> tuple:
    def part(x):
        return (x.shape, x.stride(), x.dtype, x.device, x.requires_grad, type(x)) if isinstance(x, torch.Tensor) else x
    return (tuple(map(part, args)), tuple((k, part(v)) for k, v in kwargs.items()), torch.is_grad_enabled(),
            torch.is_autocast_enabled())


def _keep(notebook: str, problems: list[dict]) -> None:
    try:
        remember(notebook, problems)
    except (OSError, ValueError, TypeError) as exc:
        log.info("gpuctx: attention shapes not kept (%s): the next start warms attention as before", exc)


def _compiled_frames() -> int:
    counters = getattr(sys.modules.get("torch._dynamo.utils"), "counters", None)
    try:
        return int(sum(counters["frames"].values())) if counters is not None else 0
    except Exception:  # noqa: BLE001
        return 0


_EVER: list = []
_START_DIR = os.getcwd()  # the kernel's: a notebook's relative path is read against it, whatever %cd did since


def absolute(notebook: str) -> str:
    return os.path.normpath(os.path.join(_START_DIR, os.path.expanduser(notebook)))


WATCH = Watch()


# -- building ahead -------------------------------------------------------------------------------------
PER_PROBLEM = "CUDNN_ATTENTION"  # the backend that builds per problem: the others have nothing to build ahead


def nbytes(problem: dict) -> int:
    total = 0
    for key in ("q", "k", "v", "mask", "grad_out"):
        lay = problem.get(key)
        if lay:
            span = 1 + sum((s - 1) * st for s, st in zip(lay["size"], lay["stride"]) if s)
            total += span * _BYTES[lay["dtype"]]
    return total * (3 if problem["grad"] else 2)  # the output, the gradients


def run(torch, dev, problem: dict, backward: bool) -> None:
    """One call at the problem's sizes, strides and flags on `dev` (zeros: values do not matter to
    which graph is built), under autocast where the notebook's was; its backward too where the
    notebook ran one (with the gradient laid out as the notebook's was) and `backward`."""
    def tensor(lay, grad=False):
        t = torch.empty_strided(lay["size"], lay["stride"], dtype=getattr(torch, lay["dtype"]), device=dev)
        t.zero_() if t.dtype != torch.bool else t.fill_(True)
        return t.requires_grad_(grad and t.is_floating_point())

    # (inputs that need a gradient: the forward then keeps what its backward reads, a graph of its own)
    q, k, v = (tensor(problem[key], problem["grad"]) for key in "qkv")
    mask = tensor(problem["mask"]) if problem.get("mask") else None
    extra = {"enable_gqa": True} if problem.get("gqa") else {}
    cast = problem.get("autocast")
    autocast = torch.autocast(dev.type, dtype=getattr(torch, cast)) if cast else contextlib.nullcontext()
    with torch.set_grad_enabled(problem["grad"]), autocast:
        out = WATCH.original(torch)(q, k, v, attn_mask=mask, dropout_p=problem["dropout"], is_causal=problem["causal"],
                                    scale=problem["scale"], **extra)
    if problem["grad"] and backward and problem.get("grad_out"):
        out.backward(tensor(problem["grad_out"]))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def fitting(torch, dev, problems: list[dict]) -> tuple[list[dict], str]:
    """The problems worth building on `dev` (its kind of device, a backend that builds per problem,
    within MAX_BYTES and a quarter of the free memory), and what was left out, said in words."""
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else MAX_BYTES
    keep, left = [], []
    for p in problems:
        why = ("for another kind of device" if p.get("device", "cuda") != dev.type
               else f"{p['backend'].lower()} builds nothing per shape" if p.get("backend") not in (None, PER_PROBLEM)
               else "too large" if nbytes(p) > min(MAX_BYTES, free // 4) else "")
        (left if why else keep).append(why or p)
    return keep, f"not built: {'; '.join(sorted(set(left)))} ({len(left)} of {len(problems)})" if left else ""


def in_cells_thread(torch, dev, problem: dict):
    """What the cells' thread runs: the problem's forward, not noted as the notebook's own; the
    allocator's cache given back after it unless the cells had cached blocks of their own."""
    def forward():
        had = dev.type == "cuda" and torch.cuda.memory_reserved(dev) > 0
        WATCH.quiet = True
        try:
            run(torch, dev, problem, backward=False)
        finally:
            WATCH.quiet = False
            if dev.type == "cuda" and not had:
                torch.cuda.empty_cache()
    return forward
