"""What the server and a kernel say to each other, in one place both sides import.

The server hands a kernel its warm settings (`WarmSettings`) as `GPUCTX_*` environment variables
(at launch, or through a first request for kernels behind a gateway) — including the recipe,
GPUCTX_WARM_RECIPE: `notebook` lets the kernel make its plan from what its notebook runs (see
docs/warm-plan.md) — and it asks a running kernel what it does on the GPU with control-channel
messages. Both sides read the policy vocabulary from here, so a name or a value is spelled once.
Standard library only: this package is imported by the server, by every kernel, and by nothing
heavy. Its modules: `notebook` (one reader of notebooks for both sides), `holders` (the holders
file, the release request, how a suspended notebook is named), `cells` (the cells a frontend sends
as they are typed, and their check).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

# -- the environment variables of the warm settings ---------------------------------------------
WARM = "GPUCTX_WARM"  # policy: auto | always | never; 0/false/off is an explicit opt-out
WARM_SOURCE = "GPUCTX_WARM_SOURCE"  # who planned it, shown by %gpu status
SERVER_HOOK = "server hook"  # WARM_SOURCE of the kernels gpuctx's server starts
WARM_FRAMEWORKS = "GPUCTX_WARM_FRAMEWORKS"  # comma-separated
WARM_OPS = "GPUCTX_WARM_OPS"  # comma-separated
WARM_IMPORTS = "GPUCTX_WARM_IMPORTS"  # comma-separated
WARM_IMPORT_BUDGET = "GPUCTX_WARM_IMPORT_BUDGET"  # seconds the warm-up's imports may take in all
WARM_RECIPE = "GPUCTX_WARM_RECIPE"  # the recipe: notebook (what the notebook runs) | basic (the fixed one)
DEVICE = "GPUCTX_DEVICE"  # a device spec the kernel starts on
DEVICE_SOURCE = "GPUCTX_DEVICE_SOURCE"  # who chose it
STANDBY = "GPUCTX_STANDBY"  # set in a standby of the warm pool (its warm-up runs at the lowest CPU priority)
WORKER_IMPORTS = "GPUCTX_WORKER_IMPORTS"  # "1" in an imports standby: do the `%gpu workers` imports too
POOL_NOTE = "GPUCTX_POOL_NOTE"  # why this kernel was started fresh rather than from the warm pool
SESSION = "JPY_SESSION_NAME"  # jupyter_server's: the notebook's path, read by the `auto` policy

# -- the control-channel question ---------------------------------------------------------------
REQUEST, REPLY = "gpuctx_request", "gpuctx_reply"
# The warm pool hands a standby to a notebook: {"cwd", "env", "pooled"} → {"status": "ok"}. On the
# control channel, so that it is no cell: no execution count, no cell hooks, no user activity.
ADOPT_REQUEST, ADOPT_REPLY = "gpuctx_adopt_request", "gpuctx_adopt_reply"
# Release cached memory without losing work: the server's request and its reply. Content of the
# request: {} ; of the reply: {"status": "ok", "pid", "released": {framework: bytes},
# "released_total", "gc_collected", "cleared": [names of the references dropped], "before", "after"
# (NVML bytes of this process per CUDA ordinal), "seconds"} or {"status": "error", "message"}.
RELEASE_REQUEST, RELEASE_REPLY = "gpuctx_release_request", "gpuctx_release_reply"
# Suspend (issue #28): an idle kernel's GPU memory into host memory, back before its next request.
# The server suspends a kernel with the CUDA driver's process checkpoint API, from a helper process
# (core/checkpoint.py); the kernel consents first, so that from then on it restores itself before
# any shell request that may run the user's code (a cell from any frontend, a widget callback, a
# completion), on the control channel:
#   SUSPEND_PREPARE {"token"} → {"status": "ok", "pid", "report": <REQUEST's reply before>} or
#       {"status": "refused", "message"} (a cell running, the warm-up, CUDA memory shared in);
#   SUSPEND_DONE {"token", "ok", "since", "moved": {"<ordinal>": bytes}, "need": {UUID: bytes},
#       "message"} → {"status": "ok", "state"}: how the suspend ended (the kernel's waiting helper
#       starts when it succeeded);
#   RESUME {} → {"status": "ok", "resumed": bool, "seconds", "steps", "state"} or
#       {"status": "error", "message", "state"}: the Resume button's path; "state": "resuming" when
#       a restore one of its requests started is under way (answered at once, not waited for).
# REQUEST's reply carries "suspend": {"state": one of SUSPEND_STATES, "since", "moved", "error"};
# while suspended the kernel answers it from what it knew before, touching no GPU library.
SUSPEND_PREPARE_REQUEST, SUSPEND_PREPARE_REPLY = "gpuctx_suspend_prepare_request", "gpuctx_suspend_prepare_reply"
SUSPEND_DONE_REQUEST, SUSPEND_DONE_REPLY = "gpuctx_suspend_done_request", "gpuctx_suspend_done_reply"
RESUME_REQUEST, RESUME_REPLY = "gpuctx_resume_request", "gpuctx_resume_reply"
SUSPEND_MESSAGES = (SUSPEND_PREPARE_REQUEST, SUSPEND_PREPARE_REPLY, SUSPEND_DONE_REQUEST, SUSPEND_DONE_REPLY,
                    RESUME_REQUEST, RESUME_REPLY)
SUSPEND_STATES = ("running", "suspending", "suspended", "resuming")
# Typed cells (issue #25): the notebook's code cells as the frontend holds them, unsaved edits
# included, for the kernel to re-plan its warm-up from: {"cells": [...]} → {"status": "ok", …} or
# {"status": "refused", "message"}. Format and caps: contract/cells.py.
CELLS_REQUEST, CELLS_REPLY = "gpuctx_cells_request", "gpuctx_cells_reply"
# The function a kernel behind a gateway runs to load gpuctx and apply the plan it was sent
# (the server names it as text: it never imports the kernel side).
WARM_ENTRY_MODULE, WARM_ENTRY_FUNCTION = "gpuctx_jupyter.kernel.extension", "warm_from_env"

# -- the policy vocabulary ------------------------------------------------------------------------
POLICIES = ("auto", "always", "never")
FRAMEWORKS = ("torch", "cupy", "jax")  # what `%gpu warm --frameworks` and warm_frameworks accept
# What a notebook may use, and so what the `notebook` recipe may warm (Numba: imported only).
NOTEBOOK_FRAMEWORKS = ("torch", "cupy", "jax", "numba")
OPS = ("alloc", "elementwise", "matmul_fp32", "matmul_bf16", "matmul_fp16", "conv", "conv_bf16", "attention",
       "autocast", "backward", "optimizer", "grad_scaler")
# backward is opt-in: autograd's first backward starts a per-GPU worker thread that keeps its own
# cuBLAS/cuDNN handles (~100 MiB) for the kernel's life; only training notebooks pay that anyway.
# optimizer: one AdamW and one SGD-with-momentum step (the first imports torch._dynamo, ~3 s of CPU).
DEFAULT_OPS = ("alloc", "elementwise", "matmul_fp32", "matmul_bf16", "conv")
# How a kernel decides what to warm: `notebook` reads its notebook (JPY_SESSION_NAME) at every start
# and warms the frameworks, imports, precisions, training steps and devices it uses; `basic` is the
# fixed recipe (warm_frameworks, warm_ops, warm_imports) whatever the notebook does.
RECIPES = ("notebook", "basic")
DEFAULT_RECIPE = "notebook"
# A standby of the server's warm pool that imports the server's import profile and touches no CUDA
# (the notebook that adopts it warms its GPU part); not a setting of the user's.
STANDBY_RECIPE = "imports"
# What torch.compile imports on its first call (1-2 s): the import profile counts it as an import of
# every notebook that compiles, and an imports standby that imports it also starts inductor's
# compile workers (they take 5-10 s to be ready: longer than a user reads before compiling).
INDUCTOR_MODULE = "torch._inductor.compile_fx"
KERNEL_RECIPES = (*RECIPES, STANDBY_RECIPE)
OPT_OUT_VALUES = ("0", "false", "off", "never")
_POLICY_ALIASES = {"1": "always", "true": "always", "on": "always", "0": "never", "false": "never",
                   "off": "never", "": "never"}
# The GPU framework a notebook uses when it imports these (the libraries import it themselves):
# the `auto` policy warms a notebook that imports any of them, and the plan warms that framework.
FRAMEWORK_OF = {
    "torch": "torch", "torchvision": "torch", "torchaudio": "torch", "timm": "torch", "transformers": "torch",
    "lightning": "torch", "pytorch_lightning": "torch", "accelerate": "torch", "diffusers": "torch",
    "sentence_transformers": "torch", "peft": "torch", "torchmetrics": "torch", "torch_geometric": "torch",
    "cupy": "cupy", "cupyx": "cupy",
    "jax": "jax", "jaxlib": "jax", "flax": "jax", "optax": "jax", "equinox": "jax", "haiku": "jax",
    "numba": "numba",
}


def parse_policy(value: str | None) -> str:
    """GPUCTX_WARM's value as a policy; anything unknown means never (warming is never a surprise)."""
    value = (value or "").strip().lower()
    value = _POLICY_ALIASES.get(value, value)
    return value if value in POLICIES else "never"


def parse_recipe(value: str | None) -> str:
    """GPUCTX_WARM_RECIPE's value as a recipe; empty or unknown means the default (`notebook`)."""
    value = (value or "").strip().lower()
    return value if value in KERNEL_RECIPES else DEFAULT_RECIPE


def opted_out(env: Mapping[str, str] | None = None) -> bool:
    """GPUCTX_WARM=0 (or false/off/never) in the kernel's environment: no warm-up, whatever else says."""
    env = os.environ if env is None else env
    return env.get(WARM, "").strip().lower() in OPT_OUT_VALUES


def _seconds(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < 86400 else None


def split_list(raw: str | None) -> list[str]:
    return [x.strip() for x in (raw or "").split(",") if x.strip()]


@dataclass
class WarmSettings:
    """What the server asks of a kernel it starts: whether and how to warm (the kernel makes its plan
    from these), and on which device."""

    policy: str = "never"
    source: str = ""
    frameworks: list[str] = field(default_factory=lambda: ["torch"])
    ops: list[str] = field(default_factory=lambda: list(DEFAULT_OPS))
    imports: list[str] = field(default_factory=list)
    device: str = ""
    device_source: str = ""
    opt_out: bool = False  # the user's own GPUCTX_WARM=0: reported as such, never overridden
    recipe: str = DEFAULT_RECIPE  # notebook | basic: see RECIPES
    import_budget: float | None = None  # seconds for all imports (None: the kernel's own setting)

    def to_env(self) -> dict[str, str]:
        env = {
            WARM: "0" if self.opt_out else self.policy,
            WARM_SOURCE: self.source,
            WARM_FRAMEWORKS: ",".join(self.frameworks),
            WARM_OPS: ",".join(self.ops),
            WARM_RECIPE: self.recipe,
        }
        if self.imports:
            env[WARM_IMPORTS] = ",".join(self.imports)
        if self.import_budget is not None:
            env[WARM_IMPORT_BUDGET] = f"{self.import_budget:g}"
        if self.device:
            env[DEVICE], env[DEVICE_SOURCE] = self.device, self.device_source
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WarmSettings:
        env = os.environ if env is None else env
        device = env.get(DEVICE, "").strip()
        return cls(
            policy=parse_policy(env.get(WARM)),
            source=env.get(WARM_SOURCE, ""),
            frameworks=split_list(env.get(WARM_FRAMEWORKS)) or ["torch"],
            ops=split_list(env.get(WARM_OPS)) or list(DEFAULT_OPS),
            imports=split_list(env.get(WARM_IMPORTS)),
            device=device,
            device_source=env.get(DEVICE_SOURCE, ""),
            opt_out=opted_out(env),
            recipe=parse_recipe(env.get(WARM_RECIPE)),
            import_budget=_seconds(env.get(WARM_IMPORT_BUDGET)),
        )

    @property
    def warms(self) -> bool:
        return not self.opt_out and self.policy != "never"


def gpuctx_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The gpuctx variables in an environment (kept when a kernel's environment is rebuilt)."""
    return {k: v for k, v in env.items() if k.startswith("GPUCTX_")}


# JAX preallocates a fraction of every GPU it initialises (75% unless told otherwise). Kernels the
# server starts get XLA_PYTHON_CLIENT_PREALLOCATE=false unless the user's environment sets it
# (c.GpuctxServer.jax_preallocate = True leaves it alone); XLA_SET_BY records that gpuctx set it.
XLA_PREALLOCATE, XLA_MEM_FRACTION, XLA_ALLOCATOR = (
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")
XLA_SET_BY = "GPUCTX_XLA_PREALLOCATE_SET_BY"
JAX_DEFAULT_FRACTION = 0.75


def jax_preallocation(env: Mapping[str, str] | None = None) -> float | None:
    """The fraction of each GPU that JAX will grab when it starts with this environment, or None
    when it does not preallocate (XLA_PYTHON_CLIENT_PREALLOCATE=false/0, or the platform allocator)."""
    env = os.environ if env is None else env
    if env.get(XLA_PREALLOCATE, "").strip().lower() in ("false", "0") or \
            env.get(XLA_ALLOCATOR, "").strip().lower() == "platform":
        return None
    try:
        fraction = float(env.get(XLA_MEM_FRACTION, "") or JAX_DEFAULT_FRACTION)
    except ValueError:
        fraction = JAX_DEFAULT_FRACTION
    return fraction if 0 < fraction <= 1 else JAX_DEFAULT_FRACTION
