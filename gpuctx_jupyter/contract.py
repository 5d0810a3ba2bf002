"""What the server and a kernel say to each other, in one place both sides import.

The server hands a kernel its warm-up plan as `GPUCTX_*` environment variables (at launch, or
through a first request for kernels behind a gateway) — including the recipe, GPUCTX_WARM_PLAN:
`notebook` lets the kernel read its notebook at each start and warm what it runs (see
docs/warm-plan.md) — and it asks a running kernel what it does on the GPU with one
control-channel message. Both sides read the policy vocabulary from here, so a
name or a value is spelled once. Standard library only: this module is imported by the server,
by every kernel, and by nothing heavy.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# -- the environment variables of the warm plan ------------------------------------------------
WARM = "GPUCTX_WARM"  # policy: auto | always | never; 0/false/off is an explicit opt-out
WARM_SOURCE = "GPUCTX_WARM_SOURCE"  # who planned it, shown by %gpu status
WARM_FRAMEWORKS = "GPUCTX_WARM_FRAMEWORKS"  # comma-separated
WARM_OPS = "GPUCTX_WARM_OPS"  # comma-separated
WARM_IMPORTS = "GPUCTX_WARM_IMPORTS"  # comma-separated
WARM_PLAN = "GPUCTX_WARM_PLAN"  # the recipe: notebook (what the notebook runs) | basic (the fixed one)
DEVICE = "GPUCTX_DEVICE"  # a device spec the kernel starts on
DEVICE_SOURCE = "GPUCTX_DEVICE_SOURCE"  # who chose it
POOLED = "GPUCTX_POOLED"  # set in a kernel handed out by the warm pool: seconds it waited ready
SESSION = "JPY_SESSION_NAME"  # jupyter_server's: the notebook's path, read by the `auto` policy

# -- the control-channel question ---------------------------------------------------------------
REQUEST, REPLY = "gpuctx_request", "gpuctx_reply"
# The warm pool hands a standby to a notebook: {"cwd", "env", "pooled"} → {"status": "ok"}. On the
# control channel, so that it is no cell: no execution count, no cell hooks, no user activity.
ADOPT_REQUEST, ADOPT_REPLY = "gpuctx_adopt_request", "gpuctx_adopt_reply"
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
OPT_OUT_VALUES = ("0", "false", "off", "never")
_POLICY_ALIASES = {"1": "always", "true": "always", "on": "always", "0": "never", "false": "never",
                   "off": "never", "": "never"}
# A notebook uses a GPU framework when a code cell imports one or uses gpuctx's magics.
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
_GPU_CODE = re.compile(r"^\s*(?:import|from)\s+(?:" + "|".join(sorted(FRAMEWORK_OF, key=len, reverse=True))
                       + r")\b|^\s*%%?(?:gpu|on_gpu)\b", re.MULTILINE)


def parse_policy(value: str | None) -> str:
    """GPUCTX_WARM's value as a policy; anything unknown means never (warming is never a surprise)."""
    value = (value or "").strip().lower()
    value = _POLICY_ALIASES.get(value, value)
    return value if value in POLICIES else "never"


def parse_recipe(value: str | None) -> str:
    """GPUCTX_WARM_PLAN's value as a recipe; empty or unknown means the default (`notebook`)."""
    value = (value or "").strip().lower()
    return value if value in RECIPES else DEFAULT_RECIPE


def opted_out(env: Mapping[str, str] | None = None) -> bool:
    """GPUCTX_WARM=0 (or false/off/never) in the kernel's environment: no warm-up, whatever else says."""
    env = os.environ if env is None else env
    return env.get(WARM, "").strip().lower() in OPT_OUT_VALUES


def split_list(raw: str | None) -> list[str]:
    return [x.strip() for x in (raw or "").split(",") if x.strip()]


@dataclass
class WarmPlan:
    """What the server asks of a kernel it starts: whether and what to warm, and on which device."""

    policy: str = "never"
    source: str = ""
    frameworks: list[str] = field(default_factory=lambda: ["torch"])
    ops: list[str] = field(default_factory=lambda: list(DEFAULT_OPS))
    imports: list[str] = field(default_factory=list)
    device: str = ""
    device_source: str = ""
    opt_out: bool = False  # the user's own GPUCTX_WARM=0: reported as such, never overridden
    recipe: str = DEFAULT_RECIPE  # notebook | basic: see RECIPES

    def to_env(self) -> dict[str, str]:
        env = {
            WARM: "0" if self.opt_out else self.policy,
            WARM_SOURCE: self.source,
            WARM_FRAMEWORKS: ",".join(self.frameworks),
            WARM_OPS: ",".join(self.ops),
            WARM_PLAN: self.recipe,
        }
        if self.imports:
            env[WARM_IMPORTS] = ",".join(self.imports)
        if self.device:
            env[DEVICE], env[DEVICE_SOURCE] = self.device, self.device_source
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WarmPlan:
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
            recipe=parse_recipe(env.get(WARM_PLAN)),
        )

    @property
    def warms(self) -> bool:
        return not self.opt_out and self.policy != "never"


def plan_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The gpuctx variables in an environment (kept when a kernel's environment is rebuilt)."""
    return {k: v for k, v in env.items() if k.startswith("GPUCTX_")}


# A notebook larger than this is not read for a plan (outputs make notebooks big; code rarely is).
MAX_NOTEBOOK_BYTES = 50 * 2**20


def read_notebook(path: str | None) -> tuple[dict | None, str]:
    """The notebook at `path` as a dict, or None and why not (a sentence naming the file)."""
    if not path:
        return None, f"no notebook ({SESSION} unset)"
    try:
        if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
            return None, f"cannot read the notebook {path}: larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
        with open(path, encoding="utf-8") as fh:
            nb = json.load(fh)
    except (OSError, ValueError) as exc:
        return None, f"cannot read the notebook {path}: {exc}"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells", []), list):
        return None, f"cannot read the notebook {path}: not a notebook"
    return nb, ""


def notebook_opts_out(nb: dict) -> bool:
    """The notebook's own opt-out: metadata {"gpuctx": {"warm": false}}."""
    meta = nb.get("metadata", {})
    meta = meta.get("gpuctx", {}) if isinstance(meta, dict) else {}
    return isinstance(meta, dict) and meta.get("warm") is False


def code_cells(nb: dict) -> list[tuple[int, str]]:
    """(cell number counted from 1 over all cells, as the notebook shows them; source) of each code cell."""
    out = []
    for number, cell in enumerate(nb.get("cells", []), start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        out.append((number, "".join(map(str, src)) if isinstance(src, list) else str(src)))
    return out


def notebook_wants_gpu(path: str | None) -> tuple[bool, str]:
    """The `auto` policy: does this notebook use a GPU framework? (and why we think so)"""
    nb, why = read_notebook(path)
    if nb is None:
        return False, why
    if notebook_opts_out(nb):
        return False, "the notebook opts out (metadata gpuctx.warm = false)"
    for _number, src in code_cells(nb):
        match = _GPU_CODE.search(src)
        if match:
            return True, f"the notebook uses a GPU framework ({match.group(0).strip()})"
    return False, "the notebook uses no GPU framework"


# == Who holds the GPU (issue #18): the holders file and the release request ========================
# The server writes, in its Jupyter runtime dir, one JSON file naming its kernels and the PIDs NVML
# may list them under, so that a kernel that runs out of memory can name the notebooks holding the
# GPU without asking the server anything. Every kernel the server starts gets the file's path in
# HOLDERS; the kernel reads it only when an out-of-memory error happens. Format (version 1):
#   {"version": 1, "server_pid": 123, "time": <epoch s of the write>,
#    "release_url": "/<base_url>/gpuctx/api/kernels/{id}/release",
#    "kernels": [{"id": "…", "name": "python3", "paths": ["a.ipynb"], "pids": [4242, 17],
#                 "execution_state": "idle", "last_activity": <epoch s>, "idle_s": <at "time">,
#                 "standby": false,
#                 "memory": [{"framework": "torch", "ordinal": 0, "allocated": …, "reserved": …,
#                             "peak": …}],  # the kernel's last reported allocator figures
#                 "memory_time": <epoch s of that report, or null>}, …]}
# Standbys of the warm pool are entries with "standby": true, an id of "standby-<pid>" and no paths.
def standby_holder_id(pid: int) -> str:
    """A warm-pool standby's id in the holders file and the server's holder tables."""
    return f"standby-{pid}"


HOLDERS = "GPUCTX_HOLDERS"
HOLDERS_PREFIX = "gpuctx-holders-"  # + "<server pid>.json"
HOLDERS_VERSION = 1
MAX_HOLDERS_BYTES = 4 * 2**20
# Release cached memory without losing work: the server's control-channel request and its reply.
# Content of the request: {} ; of the reply: {"status": "ok", "pid", "released": {framework: bytes},
# "released_total", "gc_collected", "cleared": [names of the references dropped], "before", "after"
# (NVML bytes of this process per CUDA ordinal), "seconds"} or {"status": "error", "message"}.
RELEASE_REQUEST, RELEASE_REPLY = "gpuctx_release_request", "gpuctx_release_reply"


@dataclass(frozen=True)
class Holder:
    """One kernel (or warm-pool standby) of the server, as the holders file lists it."""

    id: str
    name: str = ""
    paths: tuple[str, ...] = ()
    pids: frozenset[int] = frozenset()
    execution_state: str | None = None
    last_activity: float | None = None  # epoch seconds
    idle_s: float | None = None  # at the file's time
    standby: bool = False
    memory: tuple[dict, ...] = ()  # allocator figures as the kernel last reported them
    memory_time: float | None = None

    def idle_at(self, now: float, written: float) -> float | None:
        """Seconds without user activity at `now` (None when unknown; 0 while busy)."""
        if self.execution_state == "busy":
            return 0.0
        if self.last_activity is not None:
            return max(0.0, now - self.last_activity)
        return None if self.idle_s is None else self.idle_s + max(0.0, now - written)

    def label(self) -> str:
        """How a person knows it: the notebook, else what it is."""
        if self.standby:
            return "a warm-pool standby kernel"
        return ", ".join(os.path.basename(p) or p for p in self.paths) or f"kernel {self.id[:8]}"

    def cached(self, ordinal: int) -> int | None:
        """Reserved but unallocated bytes on `ordinal` at the last report (None: no report)."""
        rows = [m for m in self.memory if m.get("ordinal") == ordinal]
        if not rows:
            return None
        return sum(max(0, int(m.get("reserved") or 0) - int(m.get("allocated") or 0)) for m in rows)

    def as_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "paths": list(self.paths), "pids": sorted(self.pids),
                "execution_state": self.execution_state, "last_activity": self.last_activity,
                "idle_s": self.idle_s, "standby": self.standby, "memory": [dict(m) for m in self.memory],
                "memory_time": self.memory_time}


@dataclass(frozen=True)
class HoldersFile:
    server_pid: int | None
    time: float
    kernels: tuple[Holder, ...]
    release_url: str = ""  # the release route with "{id}" for the kernel id, e.g. /gpuctx/api/kernels/{id}/release

    def to_json(self) -> str:
        return json.dumps({"version": HOLDERS_VERSION, "server_pid": self.server_pid, "time": self.time,
                           "release_url": self.release_url, "kernels": [k.as_dict() for k in self.kernels]},
                          separators=(",", ":"))

    def by_pid(self) -> dict[int, Holder]:
        table: dict[int, Holder] = {}
        for k in self.kernels:
            for pid in k.pids:
                table.setdefault(pid, k)
        return table


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _holder(raw) -> Holder | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        return None
    paths = raw.get("paths") if isinstance(raw.get("paths"), list) else []
    pids = raw.get("pids") if isinstance(raw.get("pids"), list) else []
    memory = raw.get("memory") if isinstance(raw.get("memory"), list) else []
    state = raw.get("execution_state")
    return Holder(
        id=raw["id"], name=raw["name"] if isinstance(raw.get("name"), str) else "",
        paths=tuple(p for p in paths if isinstance(p, str)),
        pids=frozenset(p for p in pids if isinstance(p, int) and not isinstance(p, bool) and p > 0),
        execution_state=state if isinstance(state, str) else None,
        last_activity=_num(raw.get("last_activity")), idle_s=_num(raw.get("idle_s")),
        standby=raw.get("standby") is True,
        memory=tuple(m for m in memory if isinstance(m, dict) and isinstance(m.get("ordinal"), int)),
        memory_time=_num(raw.get("memory_time")),
    )


def parse_holders(text: str | bytes | None) -> HoldersFile | None:
    """The holders file's content, or None when it is not one; entries that are junk are skipped."""
    try:
        raw = json.loads(text) if text else None
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("version") != HOLDERS_VERSION:
        return None
    kernels = raw.get("kernels") if isinstance(raw.get("kernels"), list) else []
    pid, url = raw.get("server_pid"), raw.get("release_url")
    return HoldersFile(server_pid=pid if isinstance(pid, int) else None, time=_num(raw.get("time")) or 0.0,
                       kernels=tuple(h for h in map(_holder, kernels) if h is not None),
                       release_url=url if isinstance(url, str) else "")


def read_holders(env: Mapping[str, str] | None = None) -> tuple[HoldersFile | None, str]:
    """The holders file named by HOLDERS in `env`, or None and why not (a sentence)."""
    env = os.environ if env is None else env
    path = env.get(HOLDERS, "")
    if not path:
        return None, f"this kernel was not started by a gpuctx server ({HOLDERS} unset)"
    try:
        if os.path.getsize(path) > MAX_HOLDERS_BYTES:
            return None, f"the holders file {path} is too large"
        with open(path, "rb") as fh:
            text = fh.read()
    except OSError as exc:
        return None, f"cannot read the holders file {path}: {exc.strerror or exc}"
    parsed = parse_holders(text)
    return (parsed, "") if parsed else (None, f"the holders file {path} is not one gpuctx wrote")


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
