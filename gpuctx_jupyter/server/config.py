"""Server-side settings: `c.GpuctxServer.<trait>` in jupyter_server_config.py (or --GpuctxServer.<trait>=)."""
from __future__ import annotations

import math
import os

from traitlets import (
    Bool,
    Enum,
    Float,
    Int,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)
from traitlets.config import Configurable

from ..contract import DEFAULT_OPS, DEFAULT_RECIPE, FRAMEWORKS, OPS, RECIPES


class GpuctxServer(Configurable):
    """gpuctx's jupyter_server extension."""

    warm_policy = Enum(
        ["auto", "always", "never"],
        help="""Which kernels that this server starts or restarts pre-warm CUDA.
        'auto' (default): only kernels whose notebook uses a GPU framework (imports torch, cupy,
        jax or numba, or a library built on one such as transformers or flax, or uses %gpu /
        %%on_gpu), decided again at every restart — a warmed kernel
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

    history_seconds = Float(
        3600.0,
        help="""Seconds of GPU history the server keeps for the GPU panel and dashboard (utilisation,
        memory and each notebook's share, temperature, power, link throughput, host CPU and
        memory), sent to a page when it connects so that a reload shows the last minutes at once.
        Full resolution for the last ten minutes, 10 s steps beyond; about 80 KiB of arrays per
        GPU for an hour. It keeps what the server samples for its viewers: time when no page watched is a
        gap. 0: no history.""",
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
        busy in a C call that holds the GIL, or one without gpuctx loaded, never answers). A
        resume asks the same question first: a kernel that does not answer within this time is
        restored by the checkpoint helper instead of being asked to restore itself.""",
    ).tag(config=True)

    pool_size = Int(
        None, allow_none=True,
        help="""Standby kernels: started and warmed ahead of time, so that a restart (or a new GPU
        notebook) gets a GPU-ready kernel at once. Unset (default): the automatic warm reserve —
        one standby for each kernelspec that a running GPU notebook uses, none otherwise, warmed
        with the plan of the notebook used last, on its device. N: N standbys per kernelspec in
        pool_kernelspecs, always. 0: no pool. Standbys are hidden from /api/kernels and the
        culler; each warmed one holds ~630 MiB of GPU memory (see pool_gpu_budget_mib and
        pool_min_free_fraction). Environment default: GPUCTX_SERVER_POOL (auto, or a number).""",
    ).tag(config=True)

    @default("pool_size")
    def _pool_size_default(self):
        value = os.environ.get("GPUCTX_SERVER_POOL", "auto").strip().lower()
        if value.isdigit():
            return int(value)
        if value in ("off", "false", "no", "never", "none"):
            return 0
        if value not in ("", "auto", "on", "true", "yes"):
            self.log.warning("gpuctx: GPUCTX_SERVER_POOL=%r is neither 'auto', 'off' nor a number: using 'auto'",
                             value)
        return None

    pool_min_free_fraction = Float(
        0.10,
        help="""Keep at least this fraction of each GPU free of standbys: no standby starts where it
        would leave less, and standbys on a GPU whose free memory falls below it are stopped at
        once (then no standby starts for 5 min). 0: no floor.""",
    ).tag(config=True)

    pool_reserve_after = Float(
        10.0,
        help="""Seconds a GPU notebook's kernel runs before the automatic reserve starts a standby
        for it, so that the standby never competes with the notebook's own start and warm-up.""",
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

    import_standbys = Bool(
        True,
        help="""Keep an import-warm standby: one kernel per kernelspec that GPU notebooks use (the
        default kernelspec from the start), started with the server, that has imported the server's
        import profile — torch, torch._dynamo and torch.optim where torch is installed, and the
        top-level imports of the notebooks opened or modified most recently under the server's
        root — without touching CUDA (no context, no GPU memory). A notebook opened or restarted
        then takes it and finds its imports done. Only with the automatic reserve (pool_size
        unset), and only where a GPU framework is installed in the kernelspec's Python. Environment
        default: GPUCTX_SERVER_IMPORT_STANDBYS (0/false/off turns it off).""",
    ).tag(config=True)

    @default("import_standbys")
    def _import_standbys_default(self):
        return os.environ.get("GPUCTX_SERVER_IMPORT_STANDBYS", "1").strip().lower() not in ("0", "false", "off", "no")

    standby_worker_imports = Bool(
        True,
        help="""An imports standby also does the imports of `%gpu workers` (torch, torch._dynamo,
        torch.distributed, ipyparallel's engine and the import profile) in a process of its own,
        without CUDA, from which a notebook that starts workers forks them with their imports
        done; the hand-over ends it for any other notebook. About 1 GiB of host memory, counted
        with the standby's. Only where ipyparallel and torch are installed in the kernelspec's
        Python. Environment default: GPUCTX_SERVER_STANDBY_WORKER_IMPORTS (0/false/off: off).""",
    ).tag(config=True)

    @default("standby_worker_imports")
    def _standby_worker_imports_default(self):
        return os.environ.get("GPUCTX_SERVER_STANDBY_WORKER_IMPORTS", "1").strip().lower() not in (
            "0", "false", "off", "no")

    standby_memory_fraction = Float(
        0.20,
        help="""Host memory all standbys together may hold (resident memory), as a fraction of the
        memory available to the server — the container's memory limit where one applies, as under
        JupyterHub. A standby that would not fit is not started, and standbys are stopped first
        when memory gets short. Each standby's resident memory is in GET /gpuctx/api/devices.""",
    ).tag(config=True)

    import_profile_modules = Int(
        30, help="""At most this many modules in the import profile (see import_standbys).""",
    ).tag(config=True)

    import_profile_seconds = Float(
        60.0,
        help="""Seconds of imports, as standbys measured them, the import profile holds at most; a
        module whose own import fails, runs a third of this time without finishing (time its
        standby stood paused not counted) or creates a CUDA context is dropped from it (logged
        once) and tried again a week later.""",
    ).tag(config=True)

    standby_pause_cores = Int(
        2,
        help="""On a machine with at most this many CPU cores, standbys that are starting are paused
        (SIGSTOP) while any kernel of this server runs a cell, and none is started meanwhile, so that
        a standby never slows a running cell; with more cores see standby_yield_s. 0: never pause
        for as long as the cell runs.""",
    ).tag(config=True)

    standby_yield_s = Float(
        20.0,
        help="""On a machine with more cores than standby_pause_cores, standbys that are starting are
        paused (SIGSTOP) for the first this many seconds that any kernel of this server runs cells,
        then go on at the lowest CPU priority: a notebook's first cells (imports, the first compile)
        get the machine to themselves, and a cell that trains for hours does not keep the pool
        empty. 0: never pause there.""",
    ).tag(config=True)

    kernel_websocket_nodelay = Bool(
        True,
        help="""Send each message on a kernel's websocket at once (TCP_NODELAY): a cell run right
        after another answers ~40 ms sooner (Nagle's algorithm held its reply until the browser
        had acknowledged the cell's first messages, which Linux delays by 40 ms). False: the
        websockets as jupyter_server leaves them.""",
    ).tag(config=True)

    metrics_kernel_labels = Bool(
        False,
        help="""Label the per-kernel GPU memory series on /metrics with kernel ids and notebook
        paths even when /metrics is served without authentication
        (ServerApp.authenticate_prometheus = False). Off by default: anyone who can reach an
        unauthenticated /metrics would read what people work on; the series is then summed per
        kernelspec and GPU. With authentication on (jupyter_server's default) the labels are
        always there.""",
    ).tag(config=True)

    replay_trace = Unicode(
        "",
        help="""Serve a recorded NVML trace (python -m gpuctx_jupyter.trace record) instead of
        live NVML, for UI tests and demos on machines without a GPU. Every snapshot and the
        panel then say it is a replay; nothing replays unless this is set.""",
    ).tag(config=True)

    warm_recipe = Enum(
        list(RECIPES), default_value=DEFAULT_RECIPE,
        help="""What a warmed kernel warms (warm_policy says whether). 'notebook' (default): what
        its notebook runs, read by the kernel from the notebook at every start and restart — the
        GPU frameworks it uses and no other, its top-level imports, training (backward, an
        optimizer step), the dtypes it uses, the device it names; a new empty notebook gets
        `import torch` only. 'basic': the fixed recipe of warm_frameworks and warm_ops.
        warm_imports and warm_ops add to either. `%gpu status` shows the plan.""",
    ).tag(config=True)

    # -- who holds the GPU: idle holders, releasing cached memory, culling -------------------------
    idle_holder_seconds = Float(
        600.0,
        help="""Seconds without user activity after which a kernel that holds GPU memory is marked
        an idle holder in GET /gpuctx/api/devices (idle_holder: true; the GPU panel highlights it
        with its idle time and allocator figures). gpuctx's own requests are not activity. 0: never.""",
    ).tag(config=True)

    release_below_free_fraction = Float(
        0.05,
        help="""When a GPU's free memory falls below this fraction of its total (or one of this
        server's kernels has just run out of memory on it), the server gives memory back there: the
        warm pool's standbys on that GPU go first, then the cached allocator memory (reserved but
        unallocated: torch's cache, CuPy's pool) of this server's kernels on it that have been idle
        release_idle_seconds, as the panel's "Release cached memory" does. Tensors and variables
        are never touched. 0: off.""",
    ).tag(config=True)

    release_idle_seconds = Float(
        300.0,
        help="""Seconds a kernel must have been idle before automatic release under memory pressure
        may return its cached GPU memory; each idle stretch is released once.""",
    ).tag(config=True)

    release_idle_after = Float(
        0.0,
        help="""Release the cached GPU memory of any kernel idle this many seconds, whether or not
        the GPU is short (once per idle stretch). 0 (default): only under memory pressure.""",
    ).tag(config=True)

    release_timeout = Float(
        10.0,
        help="""Seconds to wait for a kernel's reply to a release request (the release route and
        automatic release) before answering {"status": "no-answer"}.""",
    ).tag(config=True)

    jax_preallocate = Bool(
        False,
        help="""Let JAX preallocate GPU memory in kernels this server starts. JAX takes 75% of every
        GPU it initialises (~105 GiB of an H200, used or not), so other notebooks run out of memory.
        False (default): kernels get XLA_PYTHON_CLIENT_PREALLOCATE=false unless their environment
        sets XLA_PYTHON_CLIENT_PREALLOCATE, XLA_PYTHON_CLIENT_MEM_FRACTION or
        XLA_PYTHON_CLIENT_ALLOCATOR; `%gpu doctor` says which applies. True: JAX's default.""",
    ).tag(config=True)

    jax_compilation_cache = Unicode(
        "",
        help="""JAX's persistent compilation cache for kernels this server starts: XLA keeps what it
        compiled on disk, so a notebook's jit cells compile in a fraction of the time when it runs
        again (after a restart, another day). Empty (default): a folder of the user's cache
        ($XDG_CACHE_HOME or ~/.cache)/gpuctx/jax; a path: that folder; "off": no cache. A kernel
        whose environment sets JAX_COMPILATION_CACHE_DIR keeps it.""",
    ).tag(config=True)

    jax_compilation_cache_max_gib = Float(
        4.0,
        help="""The largest the JAX compilation cache may grow, in GiB (JAX evicts the least recently
        used entries beyond it). 0: no bound.""",
    ).tag(config=True)

    cull_idle_gpu_kernels_after = Float(
        0.0,
        help="""Shut down kernels that hold GPU memory and have had no user activity for this many
        seconds (0, the default: never) — like MappingKernelManager.cull_idle_timeout, but only for
        GPU holders. A kernel running a cell is never culled; the log names the notebook and the
        memory freed; from cull_warning_seconds before, GET /gpuctx/api/devices marks the kernel
        (cull_at, cull_warning) and JupyterLab's GPU panel notifies its user.""",
    ).tag(config=True)

    cull_warning_seconds = Float(
        600.0,
        help="""How long before culling the GPU API marks a kernel (cull_warning), so that the GPU
        panel can warn its user.""",
    ).tag(config=True)

    # -- suspending idle notebooks (issue #28; server/suspend.py) ------------------------------------
    suspend_enabled = Bool(
        True,
        help="""Offer Suspend where the CUDA driver has its process checkpoint API (driver ≥ 570; the
        server asks the driver once at start, and GET /gpuctx/api/devices says what it found under
        "suspend"): POST /gpuctx/api/kernels/<id>/suspend moves an idle kernel's GPU memory into its
        host memory, and the kernel brings it back before its next cell. False: the button is
        absent and the route answers 409.""",
    ).tag(config=True)

    suspend_lock_timeout = Float(
        5.0,
        help="""Seconds the driver's lock may wait for a CUDA call the kernel is inside (a thread
        of the user's computing on the GPU) before the suspend is refused.""",
    ).tag(config=True)

    suspend_timeout = Float(
        900.0,
        help="""Seconds a whole suspend or resume may take (the checkpoint of a full H200 takes
        about a minute) before the server gives up waiting for it. A restart or shutdown of the
        kernel does not wait for it: it stops the suspend or resume in flight.""",
    ).tag(config=True)

    suspend_host_reserve_gib = Float(
        2.0,
        help="""GiB of host memory (of the machine, or of the kernel's container where it has a
        limit) that must stay free after a suspend: a suspend that would leave less is refused.""",
    ).tag(config=True)

    cull_idle_gpu_kernels_action = Enum(
        ["shutdown", "suspend"], "shutdown",
        help="""What culling does to an idle GPU holder (cull_idle_gpu_kernels_after): 'shutdown'
        (its variables are lost) or 'suspend' (its GPU memory moves to host memory; it resumes on
        its next cell). Where suspend is unavailable, 'suspend' culls nothing and says why in the log.""",
    ).tag(config=True)

    pressure_action = Enum(
        ["release", "suspend"], "release",
        help="""What automatic release does to this server's kernels that have been idle
        release_idle_seconds on a GPU that runs short (release_below_free_fraction): 'release' their
        cached allocator memory (tensors stay on the GPU), or 'suspend' them (all their GPU memory
        moves to host memory, variables intact; they resume on their next cell).""",
    ).tag(config=True)

    @validate("idle_holder_seconds", "release_idle_seconds", "release_idle_after", "cull_idle_gpu_kernels_after",
              "cull_warning_seconds", "release_timeout", "pool_reserve_after", "history_seconds")
    def _seconds(self, proposal):
        value = proposal.value
        if not math.isfinite(value) or value < 0 or (proposal.trait.name == "release_timeout" and value == 0):
            raise TraitError(f"c.GpuctxServer.{proposal.trait.name} = {value!r}: give 0 (off) or a positive "
                             "number of seconds")
        return value

    @validate("suspend_host_reserve_gib")
    def _gib(self, proposal):
        if not math.isfinite(proposal.value) or proposal.value < 0:
            raise TraitError(f"c.GpuctxServer.suspend_host_reserve_gib = {proposal.value!r}: give 0 or a positive "
                             "number of GiB")
        return proposal.value

    @validate("suspend_lock_timeout", "suspend_timeout")
    def _positive_seconds(self, proposal):
        if not math.isfinite(proposal.value) or proposal.value <= 0:
            raise TraitError(f"c.GpuctxServer.{proposal.trait.name} = {proposal.value!r}: give a positive number "
                             "of seconds")
        return proposal.value

    @validate("release_below_free_fraction", "pool_min_free_fraction", "standby_memory_fraction")
    def _fraction(self, proposal):
        if not 0 <= proposal.value < 1:
            raise TraitError(f"c.GpuctxServer.{proposal.trait.name} = {proposal.value!r}: give a fraction "
                             "of the GPU's memory, 0 ≤ f < 1")
        return proposal.value

    @validate("pool_size")
    def _pool_size(self, proposal):
        if proposal.value is not None and proposal.value < 0:
            raise TraitError(f"c.GpuctxServer.pool_size = {proposal.value!r}: give 0 (no pool), a number of "
                             "standbys, or leave it unset for the automatic warm reserve")
        return proposal.value
