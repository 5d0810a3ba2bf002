"""The kernel-side warm-up settings: `c.GpuWarmup.<trait>` in ipython_kernel_config.py.

Their defaults come from the GPUCTX_* variables the server's launch puts into the kernel's
environment (`contract.WarmSettings`); a kernel started elsewhere (VS Code, a JupyterHub image)
sets them in its own config.
"""
from __future__ import annotations

from traitlets import Bool, Enum, Float, Int, List, Unicode, default
from traitlets.config import Configurable

from ...contract import KERNEL_RECIPES, OPS, WarmSettings
from . import plan as plans


class GpuWarmup(Configurable):
    """Kernel-side warm-up settings (`c.GpuWarmup.<trait>` in ipython_kernel_config.py).

    The jupyter_server extension sets them per kernel through GPUCTX_* environment variables;
    a kernel that jupyter_server does not start (VS Code, a JupyterHub image) sets them in its
    own config together with `c.IPKernelApp.extensions = ["gpuctx"]`.
    """

    policy = Enum(
        ["never", "always", "auto"],
        help="""When the kernel warms at start-up. 'always': every kernel. 'auto': only kernels
        whose notebook uses a GPU framework (imports torch/cupy/jax/numba or a library built on one, e.g.
        transformers, or uses %gpu / %%on_gpu), and a new, empty notebook's imports (no CUDA): a warmed kernel holds ~630 MiB
        of GPU memory. 'never': only `%gpu warm`. GPUCTX_WARM=0 in the kernel's environment always
        wins (opt-out).""",
    ).tag(config=True)

    recipe = Enum(
        list(KERNEL_RECIPES),
        help="""What the kernel warms. 'notebook': what its notebook runs, read at every kernel
        start from the notebook's current content — its top-level imports of installed packages,
        the GPU frameworks it uses and no other, its precisions, a backward and an optimizer step
        when it trains, on the device it names (`%gpu use`, `%%on_gpu`, `cuda:N`). 'basic': the
        fixed recipe (`frameworks`, `ops`, `imports`). `ops` and `imports` add to either.""",
    ).tag(config=True)

    frameworks = List(
        Unicode(), help="""Frameworks to import and warm, in order (torch, cupy, jax): the basic recipe's,
        and the notebook recipe's when a notebook uses gpuctx's magics but imports no framework."""
    ).tag(config=True)

    ops = List(
        Unicode(), help=f"Operations to run once CUDA is up; any of {', '.join(OPS)}."
    ).tag(config=True)

    imports = List(
        Unicode(), help="Other slow-to-import modules to import first (e.g. transformers, lightning)."
    ).tag(config=True)

    import_deny = List(
        Unicode(), default_value=list(plans.DEFAULT_DENY),
        help="""Modules (and their submodules) the notebook recipe never imports in the background,
        because importing them does more than define things: starts CUDA or preallocates GPU memory
        (pycuda.autoinit, tensorflow), picks a GUI backend (matplotlib.pyplot), logs in or prompts
        (wandb, google.colab). Set the full list to change it.""",
    ).tag(config=True)

    max_imports = Int(
        plans.MAX_IMPORTS, help="At most this many of the notebook's imports are warmed."
    ).tag(config=True)

    import_budget = Float(
        plans.IMPORT_BUDGET_S,
        help="""Seconds the warm-up spends on imports in all; an import still running then is left
        to finish in the background, and the rest are left to the notebook.""",
    ).tag(config=True)

    start_within = Float(
        1.0, help="""Seconds after loading by which the warm-up starts at the latest; it starts
        earlier, right after the kernel's first kernel_info reply, so readiness is never delayed."""
    ).tag(config=True)

    attention_shapes = Bool(
        True, help="""Note the attention problems (sizes, strides, dtypes, flags; never values) of
        the notebook's first attention cell, kept per notebook in Jupyter's data folder
        (gpuctx/attention/), and build them ahead on its next start: cuDNN's attention builds a graph
        per problem on its first call. Off: F.scaled_dot_product_attention is never wrapped."""
    ).tag(config=True)

    device = Unicode(
        help="""Device this kernel starts on (a spec such as '1' or 'GPU-…'); empty: CUDA's
        default. Set by the server's device assignment through GPUCTX_DEVICE; a device the
        notebook names wins."""
    ).tag(config=True)

    device_source = Unicode(help="Who chose `device`, shown by %gpu status.").tag(config=True)

    @default("policy")
    def _policy_default(self):
        return WarmSettings.from_env().policy

    @default("recipe")
    def _recipe_default(self):
        return WarmSettings.from_env().recipe

    @default("frameworks")
    def _frameworks_default(self):
        return WarmSettings.from_env().frameworks

    @default("ops")
    def _ops_default(self):
        return WarmSettings.from_env().ops

    @default("imports")
    def _imports_default(self):
        return WarmSettings.from_env().imports

    @default("import_budget")
    def _import_budget_default(self):
        budget = WarmSettings.from_env().import_budget
        return plans.IMPORT_BUDGET_S if budget is None else budget

    @default("device")
    def _device_default(self):
        return WarmSettings.from_env().device

    @default("device_source")
    def _source_default(self):
        return WarmSettings.from_env().device_source or ("kernel config" if self.device else "")
