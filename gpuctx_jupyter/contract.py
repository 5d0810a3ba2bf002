"""What the server and a kernel say to each other, in one place both sides import.

The server hands a kernel its warm-up plan as `GPUCTX_*` environment variables (at launch, or
through a first request for kernels behind a gateway); it asks a running kernel what it does on
the GPU with one control-channel message. Both sides read the policy vocabulary from here, so a
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
DEVICE = "GPUCTX_DEVICE"  # a device spec the kernel starts on
DEVICE_SOURCE = "GPUCTX_DEVICE_SOURCE"  # who chose it
POOLED = "GPUCTX_POOLED"  # set in a kernel handed out by the warm pool: seconds it waited ready
SESSION = "JPY_SESSION_NAME"  # jupyter_server's: the notebook's path, read by the `auto` policy

# -- the control-channel question ---------------------------------------------------------------
REQUEST, REPLY = "gpuctx_request", "gpuctx_reply"
# The function a kernel behind a gateway runs to load gpuctx and apply the plan it was sent
# (the server names it as text: it never imports the kernel side).
WARM_ENTRY_MODULE, WARM_ENTRY_FUNCTION = "gpuctx_jupyter.kernel.extension", "warm_from_env"

# -- the policy vocabulary ------------------------------------------------------------------------
POLICIES = ("auto", "always", "never")
FRAMEWORKS = ("torch", "cupy", "jax")
OPS = ("alloc", "elementwise", "matmul_fp32", "matmul_bf16", "conv", "backward")
# backward is opt-in: autograd's first backward starts a per-GPU worker thread that keeps its own
# cuBLAS/cuDNN handles (~100 MiB) for the kernel's life; only training notebooks pay that anyway.
DEFAULT_OPS = ("alloc", "elementwise", "matmul_fp32", "matmul_bf16", "conv")
OPT_OUT_VALUES = ("0", "false", "off", "never")
_POLICY_ALIASES = {"1": "always", "true": "always", "on": "always", "0": "never", "false": "never",
                   "off": "never", "": "never"}
# A notebook uses a GPU framework when a code cell imports one or uses gpuctx's magics.
_GPU_CODE = re.compile(r"^\s*(?:import|from)\s+(?:torch|cupy|jax|numba)\b|^\s*%%?(?:gpu|on_gpu)\b", re.M)


def parse_policy(value: str | None) -> str:
    """GPUCTX_WARM's value as a policy; anything unknown means never (warming is never a surprise)."""
    value = (value or "").strip().lower()
    value = _POLICY_ALIASES.get(value, value)
    return value if value in POLICIES else "never"


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

    def to_env(self) -> dict[str, str]:
        env = {
            WARM: "0" if self.opt_out else self.policy,
            WARM_SOURCE: self.source,
            WARM_FRAMEWORKS: ",".join(self.frameworks),
            WARM_OPS: ",".join(self.ops),
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
        )

    @property
    def warms(self) -> bool:
        return not self.opt_out and self.policy != "never"


def plan_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The gpuctx variables in an environment (kept when a kernel's environment is rebuilt)."""
    return {k: v for k, v in env.items() if k.startswith("GPUCTX_")}


def notebook_wants_gpu(path: str | None) -> tuple[bool, str]:
    """The `auto` policy: does this notebook use a GPU framework? (and why we think so)"""
    if not path:
        return False, f"no notebook ({SESSION} unset)"
    try:
        with open(path, encoding="utf-8") as fh:
            nb = json.load(fh)
    except (OSError, ValueError) as exc:
        return False, f"cannot read the notebook {path}: {exc}"
    if not isinstance(nb, dict):
        return False, f"cannot read the notebook {path}: not a notebook"
    meta = nb.get("metadata", {}).get("gpuctx", {})
    if isinstance(meta, dict) and meta.get("warm") is False:
        return False, "the notebook opts out (metadata gpuctx.warm = false)"
    for cell in nb.get("cells", []):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        match = _GPU_CODE.search(src)
        if match:
            return True, f"the notebook uses a GPU framework ({match.group(0).strip()})"
    return False, "the notebook uses no GPU framework"
