"""Server-side settings: `c.GpuctxServer.<trait>` in jupyter_server_config.py (or --GpuctxServer.<trait>=)."""
from __future__ import annotations

import os

from traitlets import Bool, Enum, Float, Int, List, Unicode, default
from traitlets.config import Configurable

from ..contract import DEFAULT_OPS, FRAMEWORKS, OPS


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

    min_interval = Float(
        0.5,
        help="""Fastest rate, in seconds between messages, that a client of the GPU stream
        (/gpuctx/api/stream?interval=…) may ask for; a faster request is clamped to this and the
        first message says so. Every client shares one NVML sampler, so this bounds its rate.""",
    ).tag(config=True)

    max_interval = Float(
        60.0,
        help="""Slowest rate, in seconds between messages, of the GPU stream; a slower request is
        clamped to this, so that a client always sees the stream is alive.""",
    ).tag(config=True)

    expose_gpus = List(
        Unicode(),
        help="""The GPUs that the server's GPU API, stream and /metrics show, as device specs
        (CUDA ordinals as the server's kernels see them, GPU-<uuid> prefixes or name fragments,
        as in `%gpu use`); empty (default): every GPU visible to the server's kernels. A spec
        that names no visible GPU is reported in the API's "notes".""",
    ).tag(config=True)

    allow_actions = Bool(
        True,
        help="""Allow interrupt, restart and shutdown of this server's kernels through
        POST /gpuctx/api/kernels/<id>/<action> (the GPU panel's buttons). False: those requests
        get 403; the read-only endpoints keep working. The caller needs the server's permission
        to write kernels either way.""",
    ).tag(config=True)

    kernel_query_timeout = Float(
        2.0,
        help="""Seconds GET /gpuctx/api/kernels/<id> waits for a kernel to answer the GPU
        question on its control channel before it answers {"status": "no-answer"} (a kernel
        busy in a C call that holds the GIL, or one without gpuctx loaded, never answers).""",
    ).tag(config=True)

    pool_size = Int(
        0,
        help="""Standby kernels to keep per pool kernelspec, started and warmed ahead of time
        (0, the default: no pool). A new notebook or a restart then gets a GPU-ready kernel at
        once. Standbys are hidden from /api/kernels and the culler; each warmed one holds ~630
        MiB of GPU memory (see pool_gpu_budget_mib).""",
    ).tag(config=True)

    pool_kernelspecs = List(
        Unicode(), default_value=["python3"],
        help="Kernelspecs the pool keeps standbys for (ipykernel kernelspecs).",
    ).tag(config=True)

    pool_gpu_budget_mib = Int(
        4096,
        help="""GPU memory, in MiB, that all standbys together may hold (a warmed kernel holds
        ~630 MiB): the pool keeps min(pool_size, budget / 630 / number of pool kernelspecs)
        standbys per kernelspec. 0: no cap.""",
    ).tag(config=True)

    pool_max_age = Float(
        3600.0,
        help="""Seconds after which an unused standby is replaced by a fresh one (so that it does
        not run on stale code or environment after upgrades). 0: never.""",
    ).tag(config=True)

    replay_trace = Unicode(
        "",
        help="""Serve a recorded NVML trace (python -m gpuctx_jupyter.trace record) instead of
        live NVML, for UI tests and demos on machines without a GPU. Every snapshot and the
        panel then say it is a replay; nothing replays unless this is set.""",
    ).tag(config=True)
