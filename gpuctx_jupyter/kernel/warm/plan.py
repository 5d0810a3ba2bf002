"""The `notebook` warm recipe: the plan of what a notebook will ask of the kernel first.

The notebook is read by the contract's one reader (`contract.notebook`: imports, frameworks,
set-up, devices and what the cells run, each with its line; nothing runs); this module turns those
facts into the kernel's plan of steps, each with the line that asked for it:

  set-up     literal environment settings at the top of the notebook that must precede its imports
             (applied when they are on a known safe list and do not contradict the kernel's own
             environment; any other set-up makes the plan stop before the imports that follow it)
  imports    the notebook's top-level, unconditional imports in notebook order, of modules installed
             outside the notebook's folder (never local code, never an editable install, never a
             module on the deny list), capped in number and time
  frameworks the GPU frameworks it uses, and no other (JAX and Numba imported only)
  GPU work   on the device(s) the notebook names: the ops its cells will run first — precisions,
             convolutions, attention, autograd and optimizer steps when it trains

Imports are resolved with importlib.util.find_spec on the top-level package only, which imports
nothing, in this kernel's environment (which is why this half lives on the kernel side).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ...contract import DEFAULT_OPS, INDUCTOR_MODULE, NOTEBOOK_FRAMEWORKS
from . import attention

if TYPE_CHECKING:  # (the reader is imported by the warm-up thread, which reads the notebook: not at load)
    from ...contract.notebook import Event, Facts

MAX_IMPORTS = 30
IMPORT_BUDGET_S = 60.0
MAX_DEVICES = 8


class NotWanted(Exception):
    """The policy does not warm this notebook (why, as `%gpu status` says it): found by the thread
    that makes the plan, so that a kernel never reads its notebook before it answers."""

# Modules whose import does more than define things: starts CUDA or preallocates GPU memory
# (pycuda.autoinit, TensorFlow, cuDF/RMM), picks a GUI backend from a background thread
# (matplotlib.pyplot and what imports it), logs in, prompts, patches other libraries or opens
# windows. Matched on the module or any parent package.
DEFAULT_DENY = (
    "pycuda", "tensorflow", "tf_keras", "keras", "jax.experimental.jax2tf", "paddle", "mxnet", "torch_xla",
    "cudf", "cuml", "cugraph", "rmm", "dask_cuda",
    "matplotlib.pyplot", "pylab", "seaborn", "pyautogui", "turtle", "tkinter", "pygame",
    "wandb", "comet_ml", "neptune", "clearml", "google.colab", "getpass", "antigravity", "this",
)

# What a library imports only when first used, and what that costs: imported by the warm-up after
# the GPU work, where the notebook imports the library and the module is installed. Lightning's
# first Trainer() runs its MPI check, `from mpi4py import MPI`, which starts MPI: 0.6-0.7 s of the
# first Trainer.fit cell on an H200 host (scripts/probe-first-cell.py).
_LIGHTNING_MPI = ("mpi4py", ("MPI",), "what lightning's first Trainer() imports (its MPI check starts MPI)")
FIRST_USE = {name: (_LIGHTNING_MPI,) for name in ("lightning", "lightning.pytorch", "pytorch_lightning")}

# Set-up the warm-up may apply itself, when the notebook sets it with a literal before its first
# import and the kernel's environment does not already say otherwise.
SAFE_ENV = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING",
            "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK",
            "TORCH_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
            "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE",
            "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "NUMEXPR_MAX_THREADS", "CUPY_CACHE_DIR", "NUMBA_CACHE_DIR", "NUMBA_DISABLE_JIT"}
SAFE_ENV_PREFIXES = ("XLA_", "JAX_")
# Settings the GPU work itself reads (at CUDA start-up or first allocation): one the warm-up
# cannot apply means it must not start CUDA before the notebook does.
GPU_ENV_PREFIXES = ("CUDA_", "CUBLAS", "CUDNN", "NVIDIA_", "PYTORCH_", "TORCH_CUDA", "XLA_", "JAX_", "CUPY_",
                    "NUMBA_", "NCCL_", "TF_")

@dataclass
class Step:
    """One thing the warm-up does, and why (the notebook line that asked for it)."""

    kind: str  # setup | import | framework | gpu | cpu | cells (run by the cells' thread: cells_thread.py)
    name: str  # what it does, as shown: "import transformers", "matmul bf16 on cuda:1"
    where: str = ""  # "cell 3, line 2", "warm_imports", "basic recipe"
    code: str = ""  # the notebook's line
    state: str = "planned"  # planned | running | done | skipped | failed
    detail: str = ""
    seconds: float | None = None
    started: float | None = None  # time.monotonic() as it began (a benchmark places a cell beside it)
    cuda: str = ""  # after an import: "driver" or "context" when it touched CUDA (core/cuda_driver.py)
    overlap: bool = False  # an import that runs in the background while the next steps go on
    first_use: bool = False  # an import a library makes on its first use: after the GPU work
    waits: bool = False  # skipped until the notebook's set-up or device line has run (typed cells try again)
    ordinal: int | None = None  # another device's copy of the work (None: the plan's first device)
    # what to do, for the warm-up (not shown)
    module: str = ""
    names: tuple[str, ...] = ()
    op: str = ""
    framework: str = ""
    env: tuple[str, str] | None = None

    def line(self) -> str:
        text = f"{self.state:<8} {self.name}"
        if self.seconds is not None and self.state in ("done", "failed"):
            text += f" ({self.seconds:.2f} s)"
        if self.detail:
            text += f": {self.detail}"
        if self.where:
            text += f"  ← {self.where}" + (f": {self.code.strip()[:80]}" if self.code.strip() else "")
        return text


@dataclass
class Plan:
    """What a kernel warms, derived from its notebook (`notebook` recipe) or fixed (`basic`)."""

    recipe: str = "basic"  # notebook | basic | imports only (a new notebook)
    notebook: str = ""
    reading: str = ""  # what reading the notebook found, in one sentence
    notes: list[str] = field(default_factory=list)  # what was left out and why
    frameworks: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # device specs; empty: the kernel's own device
    device_where: str = ""  # the line that chose the first device
    gpu: bool = True  # False: import only (no CUDA, no GPU memory)
    gpu_blocked: str = ""  # why the GPU work is not done before the notebook's own set-up
    stopped: str = ""  # why the imports stop early
    workers: str | None = None  # the notebook's `%gpu workers start ARGS`: ARGS (None: it starts none)
    workers_where: str = ""  # its line
    steps: list[Step] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        for step in d["steps"]:
            for key in ("module", "names", "op", "framework", "env", "waits", "ordinal"):
                step.pop(key, None)
        return d

    def lines(self) -> list[str]:
        """The plan as `%gpu status` shows it: a header, then one line per step."""
        head = f"warm plan ({self.recipe})"
        if self.notebook:
            head += f" from {os.path.basename(self.notebook)}"
        if self.reading:
            head += f": {self.reading}"
        out = [head]
        out += [f"  {s.line()}" for s in self.steps]
        if self.workers is not None:
            out.append(f"  note: the notebook starts workers ({self.workers_where}): gpuctx prepares them ahead "
                       "(imports only, no GPU memory); `%gpu workers` says how far")
        for extra in (self.gpu_blocked, self.stopped, *self.notes):
            if extra:
                out.append(f"  note: {extra}")
        return out

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        return step


# -- resolving imports ----------------------------------------------------------------------------
def _site_dirs() -> list[str]:
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(os.path.realpath(sysconfig.get_path(key)))
        except (KeyError, TypeError):
            pass
    return sorted(dirs)


def _under(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:
        return False


def installed_outside(module: str, notebook_dir: str | None, cwd: str | None = None) -> tuple[bool, str]:
    """Whether `module`'s top-level package is installed (site-packages, dist-packages or the
    standard library) and not under the notebook's folder or the working directory, without
    importing it; (False, why) when not."""
    top = module.split(".")[0]
    loaded = sys.modules.get(top)
    try:
        spec = getattr(loaded, "__spec__", None) if loaded is not None else importlib.util.find_spec(top)
    except (ImportError, ValueError, AttributeError) as exc:
        return False, f"cannot be found ({type(exc).__name__})"
    if spec is None:
        return False, "not installed in this kernel"
    if spec.origin in ("built-in", "frozen"):
        return True, ""
    places = [spec.origin] if spec.origin and spec.has_location else []
    places += list(spec.submodule_search_locations or [])
    if not places:
        return False, "not a file-based module"
    homes = [os.path.realpath(p) for p in (notebook_dir, cwd or os.getcwd()) if p]
    for place in places:
        real = os.path.realpath(place)
        for home in homes:
            if _under(real, home) and not _in_site_packages(real):
                return False, f"local code ({real}): importing it would run your code"
        if not (_in_site_packages(real) or any(_under(real, d) for d in _site_dirs())):
            return False, f"not an installed package ({real}: an editable install or a path on sys.path)"
    return True, ""


def _in_site_packages(path: str) -> bool:
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


def denied(module: str, deny) -> str | None:
    """The deny-list entry that keeps `module` out, if any."""
    for entry in deny:
        if module == entry or module.startswith(entry + "."):
            return entry
    return None


# -- the plan --------------------------------------------------------------------------------------
def derive(path: str | None, *, frameworks_fallback=("torch",), extra_ops=(), extra_imports=(),
           deny=DEFAULT_DENY, max_imports: int = MAX_IMPORTS, environ=None, installed=None,
           cwd: str | None = None, facts: Facts | None = None, typed: bool = False, shapes: bool = True) -> Plan:
    """The `notebook` recipe's plan for the notebook at `path` (read now, from disk, unless its
    `facts` are given: cells a frontend holds that are not saved yet).

    `shapes`: plan the attention shapes its last run noted (c.GpuWarmup.attention_shapes).
    `typed`: the facts are cells as typed, which may never run as they stand: the plan applies none
    of their settings (nor imports past them, nor GPU work past a GPU setting); the devices they
    name are for the caller to weigh (warm/typed.py).

    `installed(name) -> bool` says whether a framework is installed (default: find_spec);
    `environ` is the kernel's environment (default os.environ), which the notebook's set-up never
    overrides. Unreadable, empty or odd notebooks give a plan that says so, never an exception."""
    environ = os.environ if environ is None else environ
    installed = installed or (lambda name: _find(name))
    plan = Plan(recipe="notebook", notebook=path or "")
    for module in extra_imports:
        plan.add(Step("import", f"import {module}", where="warm_imports", module=module))
    if facts is None:
        from ...contract import notebook as nbread

        facts = nbread.read(path)
    if facts.error:
        plan.reading = facts.error
        return _fallback(plan, frameworks_fallback, extra_ops)
    if facts.opts_out:
        plan.reading, plan.gpu, plan.steps = "the notebook opts out (metadata gpuctx.warm = false)", False, []
        return plan
    plan.notes += facts.notes
    if facts.new:
        plan.reading = "a new notebook (no code yet): importing only, no CUDA"
        plan.recipe, plan.gpu = "imports only", False
        torch = [f for f in frameworks_fallback if f == "torch" and installed(f)]
        for name in torch:
            plan.add(Step("framework", f"import {name}", where="new notebook", framework=name, module=name))
        plan.frameworks = torch
        return plan
    plan.reading = f"{facts.code_cells} code cells read"
    used = {fw: (str(w), w.code) for fw, w in facts.frameworks.items()}
    plan.frameworks = [f for f in NOTEBOOK_FRAMEWORKS if f in used]
    _setup_and_imports(plan, facts.events, path, deny, max_imports, environ, cwd, apply_setup=not typed)
    workers = next((ev for ev in facts.events if ev.kind == "workers"), None)
    if workers is not None and not typed:  # typed cells may never run as they stand: nothing starts for them
        plan.workers, plan.workers_where = workers.device, str(workers.where)
    if not plan.frameworks:
        if facts.magics is None:
            plan.reading += "; no GPU framework used"
            plan.gpu = False
            return plan
        plan.frameworks = [f for f in frameworks_fallback if installed(f)]
    signals = {name: (str(w), w.code) for name, w in facts.signals.items()}
    _devices(plan, facts)
    present = []
    for name in plan.frameworks:
        where, code = used.get(name) or ("notebook", "")
        mine = next((s for s in plan.steps if s.kind == "import" and s.module == name), None)
        if not installed(name):
            plan.add(Step("framework", f"import {name}", where=where, code=code, framework=name, state="skipped",
                          detail=f"{name} is not installed in this kernel"))
            if mine is not None and mine.state == "planned":
                mine.state, mine.detail = "skipped", f"{name} is not installed in this kernel"
            continue
        present.append(name)
        if mine is not None and mine.state == "planned":
            mine.framework = name  # the notebook's own `import torch` imports the framework
        else:
            plan.add(Step("framework", f"import {name}", where=where, code=code, framework=name, module=name))
    plan.frameworks = present
    if "torch" in present:
        _torch_steps(plan, signals, extra_ops, used.get("torch"), shapes)
    for name in ("cupy", "jax", "numba"):
        if name in present:
            _other_steps(plan, name, signals, used.get(name))
    order_by_need(plan, _first_gpu_cell(facts))
    return plan


# -- the order the notebook needs them in -----------------------------------------------------------
# Torch work by when the notebook's cells need it: CUDA and what a first GPU cell runs, then
# training (autograd, the optimizer's step: torch._dynamo's import runs in the background from the
# moment torch is imported, ~3 s of CPU that would otherwise stall the first training cell), then
# precisions and other kernels.
_FIRST_WORK = ("cuda_init", "alloc", "elementwise", "matmul_fp32")
_TRAINING = ("backward", "optimizer", "grad_scaler")


def _first_gpu_cell(facts: Facts) -> int | None:
    cells = [w.cell for _n, w in facts.cuda_literals]
    cells += [ev.where.cell for ev in facts.events if ev.kind == "device"]
    if "gpu_work" in facts.signals:
        cells.append(facts.signals["gpu_work"].cell)
    return min(cells) if cells else None


def _cell_of(step: Step) -> int | None:
    if step.where.startswith("cell "):
        try:
            return int(step.where.split()[1].rstrip(","))
        except (IndexError, ValueError):
            return None
    return None


def order_by_need(plan: Plan, first_gpu_cell: int | None) -> None:
    """The steps in the order the notebook's cells need them: set-up; the imports of the cells up to
    the first GPU cell; CUDA on the notebook's device and what a first GPU cell runs; training;
    precisions and other work; then the later cells' imports. torch._dynamo, where the notebook
    trains, is imported in the background right after torch; what a library imports on its first use
    comes after the training steps."""
    steps = plan.steps

    def late(s: Step) -> bool:
        cell = _cell_of(s)
        return first_gpu_cell is not None and cell is not None and cell > first_gpu_cell and not s.framework

    setup = [s for s in steps if s.kind == "setup"]
    first_use = [s for s in steps if s.first_use]
    imports = [s for s in steps if s.kind in ("import", "framework") and not s.first_use]
    early, later = [s for s in imports if not late(s)], [s for s in imports if late(s)]
    work = [s for s in steps if s.kind in ("gpu", "cpu")]
    first = [s for s in work if s.op in _FIRST_WORK]
    training = [s for s in work if s.op in _TRAINING]
    rest = [s for s in work if s not in first and s not in training]
    if any(s.op == "optimizer" and s.state == "planned" for s in training):
        torch_import = next((i for i, s in enumerate(early) if s.module == "torch" or
                             (s.framework == "torch" and s.module.split(".")[0] == "torch")), None)
        dynamo = Step("import", "import torch._dynamo", where=training[0].where, code=training[0].code,
                      module="torch._dynamo", framework="torch", overlap=True,
                      detail="what an optimizer's first use imports, in the background")
        early.insert(len(early) if torch_import is None else torch_import + 1, dynamo)
    plan.steps = setup + early + first + training + first_use + rest + later



def imports_only(modules, deny=DEFAULT_DENY, cwd: str | None = None) -> Plan:
    """A standby's plan: the server's import profile, imported ahead of any notebook, and nothing
    that touches CUDA (the notebook that adopts the standby warms its GPU part itself). As for a
    notebook's imports: installed packages only, never local code, never the deny list. Where the
    profile has torch.compile's import, inductor's compile workers are started too (recipes/torch.py).
    An item "module:name" is `from module import name`, one step each (what one cannot resolve
    is no judgement on the module), after its module's import."""
    plan = Plan(recipe="imports", reading="a standby of the server: its import profile, no CUDA", gpu=False)
    planned = set()
    for item in modules:
        module, _, name = item.partition(":")
        if name:
            if module in planned and name.isidentifier() and not denied(f"{module}.{name}", deny):
                plan.add(Step("import", f"from {module} import {name}", where="import profile: what notebooks take "
                              "from it", module=module, names=(name,)))
            continue
        step = plan.add(Step("import", f"import {module}", where="import profile", module=module))
        entry = denied(module, deny)
        ok, why = installed_outside(module, None, cwd)
        if entry:
            step.state, step.detail = "skipped", f"on the deny list ({entry}): importing it has side effects"
        elif not ok:
            step.state, step.detail = "skipped", why
        else:
            planned.add(module)
    if any(s.module == INDUCTOR_MODULE and s.state == "planned" for s in plan.steps):  # after the imports
        plan.add(Step("cpu", "start inductor's compile workers", where="import profile: torch.compile",
                      framework="torch", op="compile_pool", detail="no CUDA"))
    return plan


def basic(frameworks=("torch",), ops=DEFAULT_OPS, imports=()) -> Plan:
    """The fixed recipe: the configured imports, frameworks and ops, whatever the notebook does."""
    plan = Plan(recipe="basic", reading="the fixed recipe (warm_frameworks, warm_ops, warm_imports)",
                frameworks=list(frameworks))
    for module in imports:
        plan.add(Step("import", f"import {module}", where="warm_imports", module=module))
    for name in frameworks:
        plan.add(Step("framework", f"import {name}", where="basic recipe", framework=name, module=name))
    for name in frameworks:
        if name == "torch":
            plan.add(Step("gpu", "cuda init", where="basic recipe", op="cuda_init", framework="torch"))
            for op in _ordered(ops):
                _torch_op(plan, op, "basic recipe" if op in DEFAULT_OPS else "warm_ops")
        elif name in ("cupy", "jax", "numba"):
            _other_steps(plan, name, {})
    return plan


def _fallback(plan: Plan, frameworks, extra_ops) -> Plan:
    """No readable notebook: the basic recipe's frameworks and ops, with the reason shown."""
    fixed = basic(frameworks, tuple(DEFAULT_OPS) + tuple(o for o in extra_ops if o not in DEFAULT_OPS))
    plan.frameworks = fixed.frameworks
    plan.steps += fixed.steps
    plan.recipe = "basic"
    return plan


def _find(name: str) -> bool:
    try:
        return name in sys.modules or importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _setup_and_imports(plan: Plan, events: list[Event], path, deny, max_imports, environ, cwd,
                       apply_setup: bool = True) -> None:
    nb_dir = os.path.dirname(os.path.abspath(path)) if path else None
    warm_imports = 0
    seen = {s.module for s in plan.steps}
    for ev in events:
        where, code = str(ev.where), ev.where.code
        if ev.kind == "env":
            _env_step(plan, ev, environ, before_imports=warm_imports == 0, apply=apply_setup)
        elif ev.kind == "barrier":
            plan.add(Step("setup", ev.why, where=where, code=code, state="skipped",
                          detail="not done by the warm-up: the imports after it are left to your notebook"))
            plan.stopped = plan.stopped or f"imports stop at {where} ({ev.why})"
        elif ev.kind == "import":
            if not ev.beyond_stdlib or ev.module in seen:
                continue
            seen.add(ev.module)
            step = Step("import", f"import {ev.module}" if not ev.names else f"from {ev.module} import "
                        f"{', '.join(ev.names)}", where=where, code=code, module=ev.module, names=ev.names)
            plan.add(step)  # (`from matplotlib import pyplot` imports what the deny list names)
            entry = denied(ev.module, deny) or next(filter(None, (denied(f"{ev.module}.{n}", deny) for n in ev.names)), None)
            if plan.stopped:
                step.state, step.detail = "skipped", "after set-up the warm-up leaves to your notebook"
            elif entry:
                step.state, step.detail = "skipped", f"on the deny list ({entry}): importing it has side effects"
            elif warm_imports >= max_imports:
                step.state, step.detail = "skipped", f"more than {max_imports} imports: the rest are left to your notebook"
            else:
                ok, why = installed_outside(ev.module, nb_dir, cwd)
                if ok:
                    warm_imports += 1
                    _first_use(plan, step, seen, deny)
                else:
                    step.state, step.detail = "skipped", why


def _first_use(plan: Plan, step: Step, seen: set, deny) -> None:
    """The imports `step`'s library makes on its first use (FIRST_USE), where installed."""
    for module, names, why in FIRST_USE.get(step.module, ()):
        if module in seen or denied(module, deny) or not _find(module):
            continue
        seen.add(module)
        plan.add(Step("import", f"from {module} import {', '.join(names)}" if names else f"import {module}",
                      where=step.where, code=step.code, module=module, names=names, detail=why, first_use=True))


def _env_step(plan: Plan, ev: Event, environ, before_imports: bool, apply: bool = True) -> None:
    name, value = ev.env or ("", None)
    where, code = str(ev.where), ev.where.code
    label = f"set {name}={value}" if name and value is not None else f"set {name or 'environment variables'}"
    step = plan.add(Step("setup", label, where=where, code=code, env=(name, value) if name else None))
    safe = name in SAFE_ENV or name.startswith(SAFE_ENV_PREFIXES)
    current = environ.get(name) if name else None
    if name and value is not None and current == value:
        step.state, step.detail, step.env = "done", "the kernel's environment already has it", None
        return
    reason = ""
    if not name or value is None:
        reason = "not a literal the warm-up can apply"
    elif not apply:
        reason = "typed, not yet run: a setting takes effect when its cell runs"
    elif not before_imports:
        reason = "set after the notebook's first import: applying it earlier would change what those imports see"
    elif not safe:
        reason = "not on the list of settings the warm-up applies for you"
    elif current is not None:
        reason = f"the kernel's environment says {name}={current}: the warm-up never overrides either"
    if not reason:
        return  # planned: applied before anything else
    step.state, step.detail, step.env = "skipped", reason, None
    plan.stopped = plan.stopped or f"imports stop at {where} (set-up the warm-up leaves to your notebook)"
    if not name or name.startswith(GPU_ENV_PREFIXES):
        plan.gpu_blocked = plan.gpu_blocked or (f"no GPU work before your notebook's own set-up at {where} "
                                                f"({(code or '').strip()[:60]})")


def _devices(plan: Plan, facts: Facts) -> None:
    """The device(s) the notebook names: its first `%gpu use`, `%%on_gpu` or set_device first,
    then every other cuda:N literal."""
    specs: list[str] = []
    for ev in facts.events:
        if ev.kind == "device" and ev.device not in specs:
            if not specs:
                plan.device_where = f"{ev.where}: {ev.where.code.strip()}"
            specs.append(ev.device)
    for n, where in facts.cuda_literals:
        if n not in specs:
            if not specs:
                plan.device_where = f"{where}: {where.code.strip()}"
            specs.append(n)
    plan.devices = specs[:MAX_DEVICES]


_OP_ORDER = ("alloc", "elementwise", "matmul_fp32", "matmul_bf16", "matmul_fp16", "conv", "conv_bf16", "attention",
             "autocast", "backward", "optimizer", "grad_scaler", "compile")
CPU_OPS = ("optimizer", "compile")  # steps that still help without a GPU (on the CPU)


def _ordered(ops) -> list[str]:
    return [op for op in _OP_ORDER if op in ops]


# The optimizers a warmed optimizer step runs (recipes/torch.train_step), as the plan names them.
OPTIMIZERS = {"adamw": "AdamW", "sgd": "SGD with momentum"}


def optimizer_step_name(names=tuple(OPTIMIZERS)) -> str:
    """The optimizer step's name, whichever recipe planned it: "optimizer step (AdamW and SGD with
    momentum)", or only the optimizers the notebook uses."""
    return "optimizer step (" + " and ".join(OPTIMIZERS[n] for n in names) + ")"


def _torch_op(plan: Plan, op: str, where: str, code: str = "") -> None:
    names = {"compile": "compile a tiny model (inductor)", "optimizer": optimizer_step_name()}
    plan.add(Step("cpu" if op in CPU_OPS else "gpu", names.get(op, op.replace("_", " ")), where=where, code=code,
                  op=op, framework="torch"))


def _torch_steps(plan: Plan, signals: dict, extra_ops, used=None, shapes: bool = True) -> None:
    """torch on the GPU: what the notebook's cells will run first; CPU-only steps (the optimizer's
    torch._dynamo import, one training step on the CPU) also where no GPU is."""
    base = used or ("notebook", "")
    wanted: dict[str, tuple[str, str]] = {op: base for op in ("alloc", "elementwise", "matmul_fp32")}
    by_signal = {"bf16": ["matmul_bf16", "conv_bf16"], "fp16": ["matmul_fp16"], "autocast": ["autocast"],
                 "conv": ["conv"], "attention": ["attention"], "training": ["backward", "optimizer"],
                 "grad_scaler": ["grad_scaler"], "tf32": ["matmul_fp32"], "compile": ["compile"]}
    for signal, ops in by_signal.items():
        if signal in signals:
            for op in ops:
                wanted.setdefault(op, signals[signal])
    if "conv_bf16" in wanted and "conv" not in wanted:
        del wanted["conv_bf16"]
    for op in extra_ops:
        wanted.setdefault(op, ("warm_ops", ""))
    where, code = plan.device_where.split(": ", 1) if ": " in plan.device_where else base
    plan.add(Step("gpu", "cuda init", where=where, code=code, op="cuda_init", framework="torch"))
    for op in _ordered(wanted):
        where, code = wanted[op]
        _torch_op(plan, op, where, code)
    # what the notebook's last run noted (warm/attention.py; recipes/torch.py builds it): not where it
    # compiles, nor once this kernel noted its own (its cells have built them)
    watched = shapes and "attention" in wanted and "compile" not in wanted and not attention.WATCH.noted
    noted = attention.remembered(plan.notebook) if watched else []
    if noted:
        plan.add(Step("gpu", f"attention at the notebook's own shapes ({'; '.join(map(attention.describe, noted))})",
                      where="the notebook's last run", op="attention_shapes", framework="torch"))
    if "training" in signals:
        step = next(s for s in plan.steps if s.op == "optimizer")
        step.names = tuple(name for name in OPTIMIZERS if name in signals) or tuple(OPTIMIZERS)
        step.name = optimizer_step_name(step.names)


def _other_steps(plan: Plan, name: str, signals: dict, used=None) -> None:
    where, code = used or ("notebook", "")
    if name == "cupy":
        plan.add(Step("gpu", "cupy ops", where=where, code=code, op="cupy_ops", framework="cupy"))
    elif name == "jax":
        plan.add(Step("framework", "import jax.numpy", where=where, code=code, framework="jax", module="jax.numpy"))
        where, code = signals.get("jax_jit", (where, code))
        plan.add(Step("cpu", "JAX backend and a tiny jit(grad)", where=where, code=code, op="jax_jit", framework="jax",
                      detail="only while JAX does not preallocate (the server turns preallocation off)"))
    elif name == "numba" and "numba_cuda" in signals:
        where, code = signals["numba_cuda"]
        plan.add(Step("framework", "import numba.cuda", where=where, code=code, framework="numba",
                      module="numba.cuda"))
        plan.add(Step("gpu", "Numba's context and a tiny @cuda.jit kernel", where=where, code=code, op="numba_jit",
                      framework="numba", detail="NVVM and libdevice loaded; your kernels compile on their first launch"))


def batches(steps: list[Step]):
    """Runs of consecutive steps of one sort: ("import", imports) or ("work", GPU/CPU work)."""
    out: list[tuple[str, list[Step]]] = []
    for step in steps:
        if step.kind in ("setup", "cells"):
            continue
        kind = "import" if step.kind in ("import", "framework") else "work"
        if out and out[-1][0] == kind:
            out[-1][1].append(step)
        else:
            out.append((kind, [step]))
    return out
