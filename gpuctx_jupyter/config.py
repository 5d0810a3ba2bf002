"""Server-side settings: `c.GpuctxServer.<trait>` in jupyter_server_config.py (or --GpuctxServer.<trait>=)."""
from __future__ import annotations

import os

from traitlets import Bool, Enum, Float, List, Unicode, default
from traitlets.config import Configurable

from .warmup import DEFAULT_OPS, FRAMEWORKS, OPS


class GpuctxServer(Configurable):
    """gpuctx's jupyter_server extension."""

    warm_policy = Enum(
        ["auto", "always", "never"],
        help="""Which kernels that this server starts or restarts pre-warm CUDA.
        'auto' (default): only kernels whose notebook uses a GPU framework (imports torch, cupy,
        jax or numba, or uses %gpu / %%on_gpu), decided again at every restart — a warmed kernel
        holds ~630 MiB of GPU memory, which 'auto' spares kernels that never touch the GPU.
        'always': every Python kernel. 'never': none (`%gpu warm` still works by hand).
        Environment default: GPUCTX_SERVER_WARM.""",
    ).tag(config=True)

    warm_kernelspecs = List(
        Unicode(),
        help="""Kernelspec names to warm; empty (default): every ipykernel-based kernelspec.""",
    ).tag(config=True)

    warm_frameworks = List(
        Unicode(), default_value=["torch"],
        help=f"Frameworks each kernel imports and warms, in order; any of {', '.join(FRAMEWORKS)}.",
    ).tag(config=True)

    warm_imports = List(
        Unicode(),
        help="""Other slow-to-import modules each warmed kernel imports first, in the background
        (e.g. transformers, lightning), so the notebook's first import cell is instant too.""",
    ).tag(config=True)

    warm_ops = List(
        Unicode(), default_value=list(DEFAULT_OPS),
        help=f"""Operations the warm-up runs once CUDA is up; any of {', '.join(OPS)}. 'backward'
        is off by default: autograd's worker thread keeps ~100 MiB of library handles.""",
    ).tag(config=True)

    load_magics = Bool(
        True,
        help="""Load gpuctx's magics (%gpu, %%on_gpu) into every kernel the hook touches, so a
        notebook needs no `%load_ext gpuctx`. The warm-up needs the extension loaded either way.""",
    ).tag(config=True)

    assign_devices = Enum(
        ["off", "least-used", "round-robin"], default_value="off",
        help="""Give each new kernel a current GPU, so notebooks on a shared machine spread over
        the GPUs instead of all landing on cuda:0. 'least-used': the visible GPU with the most
        free memory when the kernel starts; 'round-robin': the next GPU in turn. The kernel keeps
        its GPU across restarts; `%gpu status` says where the choice came from; `%gpu use`
        overrides it.""",
    ).tag(config=True)

    gateway_timeout = Float(
        30.0,
        help="""Seconds to wait for a kernel behind a gateway to answer the request that loads
        gpuctx and starts its warm-up (such kernels cannot be given extra start-up arguments).""",
    ).tag(config=True)

    @default("warm_policy")
    def _warm_policy_default(self):
        value = os.environ.get("GPUCTX_SERVER_WARM", "auto").strip().lower()
        return value if value in ("auto", "always", "never") else "auto"
