"""The `notebook` warm recipe: what a notebook will ask of the kernel first, read before it runs.

A kernel reads its notebook (JPY_SESSION_NAME) at its own start — so every restart reads the
notebook's current content — and derives a plan of steps, each with the line that asked for it:

  set-up     literal environment settings at the top of the notebook that must precede its imports
             (applied when they are on a known safe list and do not contradict the kernel's own
             environment; any other set-up makes the plan stop before the imports that follow it)
  imports    the notebook's top-level, unconditional imports in notebook order, of modules installed
             outside the notebook's folder (never local code, never an editable install, never a
             module on the deny list), capped in number and time
  frameworks the GPU frameworks it uses, and no other (JAX and Numba imported only)
  GPU work   on the device(s) the notebook names: the ops its cells will run first — precisions,
             convolutions, attention, autograd and optimizer steps when it trains

Reading never runs the notebook's code: cells are parsed (IPython syntax turned into Python by
IPython's own TransformerManager), imports are resolved with importlib.util.find_spec on the
top-level package only, which imports nothing.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import sys
import sysconfig
from dataclasses import asdict, dataclass, field

from ..contract import (
    DEFAULT_OPS,
    FRAMEWORK_OF,
    NOTEBOOK_FRAMEWORKS,
    code_cells,
    notebook_opts_out,
    read_notebook,
)

MAX_IMPORTS = 30
IMPORT_BUDGET_S = 60.0
MAX_DEVICES = 8

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

# What the notebook's code says it will run; the first line matching each names the step.
_SIGNALS = {
    "training": re.compile(r"\.backward\(|\btorch\.optim\b|\boptim\.\w+\(|\b(?:AdamW?|SGD|RMSprop|Adagrad|Adadelta|"
                           r"Adamax|NAdam|RAdam|LBFGS|Lion)\(|\bGradScaler\b|\bTrainer\(|\bLightningModule\b|"
                           r"\bloss\.backward\b|\baccelerator\.backward\b"),
    "adamw": re.compile(r"\bAdamW?\(|\boptim\.Adam|\bTrainer\(|\bLightningModule\b"),
    "sgd": re.compile(r"\bSGD\("),
    "grad_scaler": re.compile(r"\bGradScaler\b"),
    "autocast": re.compile(r"\bautocast\b"),
    "bf16": re.compile(r"\bbfloat16\b|\bbf16\b|\.bfloat16\(\)"),
    "fp16": re.compile(r"\bfloat16\b|\bfp16\b|\.half\(\)|\bGradScaler\b"),
    "tf32": re.compile(r"\ballow_tf32\b|\bset_float32_matmul_precision\b"),
    "conv": re.compile(r"\bConv[123]d\b|\bconv[123]d\(|\bConvTranspose[123]d\b|\bBatchNorm[123]d\b|"
                       r"\btorchvision\b|\btimm\b|\bresnet\w*\(|\bvgg\w*\(|\befficientnet\w*\("),
    "attention": re.compile(r"\bscaled_dot_product_attention\b|\bMultiheadAttention\b|\bTransformer(?:Encoder|"
                            r"Decoder)?(?:Layer)?\(|\btransformers\b"),
    "numba_cuda": re.compile(r"\bnumba\.cuda\b|\bfrom numba import\b.*\bcuda\b|\bcuda\.jit\b"),
}
_CUDA_LITERAL = re.compile(r"""["']cuda:(\d+)["']|torch\.device\(\s*["']cuda["']\s*,\s*(\d+)\s*\)""")
_CELL_MAGIC = re.compile(r"^\s*%%(\w+)[ \t]*(.*)$")
_CODE_CELL_MAGICS = {"time", "timeit", "capture", "prun", "on_gpu"}  # their body is Python


@dataclass
class Step:
    """One thing the warm-up does, and why (the notebook line that asked for it)."""

    kind: str  # setup | import | framework | gpu | cpu
    name: str  # what it does, as shown: "import transformers", "matmul bf16 on cuda:1"
    where: str = ""  # "cell 3, line 2", "warm_imports", "basic recipe"
    code: str = ""  # the notebook's line
    state: str = "planned"  # planned | running | done | skipped | failed
    detail: str = ""
    seconds: float | None = None
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
    steps: list[Step] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        for step in d["steps"]:
            for key in ("module", "names", "op", "framework", "env"):
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
        for extra in (self.gpu_blocked, self.stopped, *self.notes):
            if extra:
                out.append(f"  note: {extra}")
        return out

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        return step


# -- reading cells ---------------------------------------------------------------------------------
@dataclass
class _Cell:
    number: int
    lines: list[str]  # the cell's source lines (for quoting)
    tree: ast.Module | None
    offset: int  # lines before the parsed code (a leading cell magic)
    magic: tuple[str, str] | None  # a leading cell magic: (name, arguments)
    error: str = ""

    def where(self, lineno: int) -> tuple[str, str]:
        n = lineno + self.offset
        code = self.lines[n - 1] if 0 < n <= len(self.lines) else ""
        return f"cell {self.number}, line {n}", code


def _strip_magics(src: str) -> str:
    """IPython syntax as Python that keeps every line where it was: magics, shell escapes and help
    requests become `pass` (the fallback when IPython's transformer cannot read a cell)."""
    out = []
    for line in src.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("%", "!", "?")) or stripped.rstrip().endswith("?"):
            out.append(line[: len(line) - len(stripped)] + "pass")
        else:
            out.append(line)
    return "\n".join(out)


def _read_cell(number: int, src: str) -> _Cell:
    lines = src.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    offset, magic, body = 0, None, src
    if first is not None:
        m = _CELL_MAGIC.match(lines[first])
        if m:
            magic = (m.group(1), m.group(2).strip())
            if magic[0] not in _CODE_CELL_MAGICS:
                return _Cell(number, lines, None, first + 1, magic)
            offset, body = first + 1, "\n".join(lines[first + 1:])
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        code = TransformerManager().transform_cell(body)
    except Exception:  # noqa: BLE001 — IPython's transformer may raise anything on odd input: strip instead
        code = _strip_magics(body)
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        try:  # IPython's transformer may have moved lines; the plain strip keeps them
            tree = ast.parse(_strip_magics(body))
        except SyntaxError:
            line = (exc.lineno or 1) + offset
            return _Cell(number, lines, None, offset, magic, error=f"cell {number}: syntax error on line {line} "
                                                                    f"({exc.msg}): its imports are not warmed")
    except (ValueError, RecursionError) as exc:
        return _Cell(number, lines, None, offset, magic, error=f"cell {number}: cannot parse ({exc})")
    return _Cell(number, lines, tree, offset, magic)


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call) and _dotted(node.func) == "get_ipython":
        parts.append("get_ipython()")
    return ".".join(reversed(parts))


@dataclass
class _Event:
    """A top-level statement that matters to the plan, in notebook order."""

    kind: str  # import | env | barrier | device
    where: str
    code: str
    module: str = ""
    names: tuple[str, ...] = ()
    env: tuple[str, str | None] | None = None  # (name or "", literal value or None)
    why: str = ""  # barrier: what it changes
    device: str = ""


def _events(cell: _Cell) -> list[_Event]:
    out: list[_Event] = []
    spec = cell.magic[1].split()[0] if cell.magic and cell.magic[0] == "on_gpu" and cell.magic[1] else ""
    if spec and spec.lower() != "all" and "," not in spec:  # `all`, `0,1`: the workers' GPUs, not the kernel's
        where = f"cell {cell.number}, line {cell.offset}"
        out.append(_Event("device", where, cell.lines[cell.offset - 1], device=spec))
    if cell.tree is None:
        return out
    for node in cell.tree.body:
        ev = functools.partial(_emit, out, *cell.where(node.lineno))
        if isinstance(node, ast.Import):
            for alias in node.names:
                ev("import", module=alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                ev("import", module=node.module, names=tuple(a.name for a in node.names if a.name != "*"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and _dotted(target.value) in ("os.environ", "environ"):
                    key = _const_str(target.slice)
                    value = _const_str(node.value) if isinstance(node, ast.Assign) else None
                    ev("env", env=(key or "", value))
                elif _dotted(target) in ("sys.path", "os.environ", "environ"):
                    ev("barrier", why="replaces sys.path" if _dotted(target) == "sys.path" else "replaces os.environ")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            _call_event(node.value, ev)
    return out


def _emit(out: list, where: str, code: str, kind: str, **kw) -> None:
    out.append(_Event(kind, where, code, **kw))


def _call_event(call: ast.Call, ev) -> None:
    name = _dotted(call.func)
    args = [_const_str(a) for a in call.args]
    if name == "get_ipython().run_line_magic" and len(args) >= 2 and args[0]:
        magic, rest = args[0], (args[1] or "").strip()
        if magic == "gpu" and rest.split()[:1] == ["use"] and len(rest.split()) > 1:
            ev("device", device=rest.split()[1])
        elif magic == "env":
            m = re.match(r"^(\w+)\s*[= ]\s*(.*)$", rest)
            if m:
                ev("env", env=(m.group(1), m.group(2)))
            elif rest and not re.match(r"^\w+$", rest):
                ev("env", env=("", None))
        elif magic in ("pip", "conda", "mamba", "uv"):
            ev("barrier", why=f"%{magic} may install or upgrade packages")
        elif magic == "cd":
            ev("barrier", why="%cd changes the working directory")
        elif magic in ("run", "dotenv"):
            ev("env", env=("", None))  # may set anything
    elif name == "get_ipython().system" and args and args[0] and re.match(r"\s*(pip|conda|mamba|uv)\b", args[0]):
        ev("barrier", why="a shell command may install or upgrade packages")
    elif name in ("os.environ.setdefault", "environ.setdefault") and len(args) >= 2:
        ev("env", env=(args[0] or "", args[1]))
    elif name in ("os.environ.update", "environ.update"):
        pairs = call.args[0] if call.args else None
        if isinstance(pairs, ast.Dict) and all(_const_str(k) for k in pairs.keys):
            for k, v in zip(pairs.keys, pairs.values):
                ev("env", env=(_const_str(k), _const_str(v)))
        else:
            ev("env", env=("", None))
    elif name in ("os.putenv",):
        ev("env", env=(args[0] or "", args[1] if len(args) > 1 else None))
    elif name in ("sys.path.append", "sys.path.insert", "sys.path.extend", "sys.path.remove", "site.addsitedir"):
        ev("barrier", why="changes sys.path")
    elif name in ("os.chdir",):
        ev("barrier", why="changes the working directory")
    elif name.rsplit(".", 1)[-1] == "load_dotenv":
        ev("env", env=("", None))  # sets whatever the .env file holds
    elif name in ("torch.cuda.set_device", "cuda.set_device") and call.args:
        arg = call.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, int) and not isinstance(arg.value, bool):
            ev("device", device=str(arg.value))
        elif _const_str(arg):
            ev("device", device=_const_str(arg).removeprefix("cuda:"))


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
           cwd: str | None = None) -> Plan:
    """The `notebook` recipe's plan for the notebook at `path` (read now, from disk).

    `installed(name) -> bool` says whether a framework is installed (default: find_spec);
    `environ` is the kernel's environment (default os.environ), which the notebook's set-up never
    overrides. Unreadable, empty or odd notebooks give a plan that says so, never an exception."""
    environ = os.environ if environ is None else environ
    installed = installed or (lambda name: _find(name))
    plan = Plan(recipe="notebook", notebook=path or "")
    for module in extra_imports:
        plan.add(Step("import", f"import {module}", where="warm_imports", module=module))
    nb, why = read_notebook(path)
    if nb is None:
        plan.reading = why
        return _fallback(plan, frameworks_fallback, extra_ops)
    if notebook_opts_out(nb):
        plan.reading, plan.gpu, plan.steps = "the notebook opts out (metadata gpuctx.warm = false)", False, []
        return plan
    cells = [_read_cell(number, src) for number, src in code_cells(nb)]
    plan.notes += [c.error for c in cells if c.error]
    if not any(src.strip() for _n, src in code_cells(nb)):
        plan.reading = "a new notebook (no code yet): importing only, no CUDA"
        plan.recipe, plan.gpu = "imports only", False
        torch = [f for f in frameworks_fallback if f == "torch" and installed(f)]
        for name in torch:
            plan.add(Step("framework", f"import {name}", where="new notebook", framework=name, module=name))
        plan.frameworks = torch
        return plan
    plan.reading = f"{len(cells)} code cells read"
    sources = {c.number: c.lines for c in cells}
    events = [ev for c in cells for ev in _events(c)]
    used = _frameworks_used(cells)
    plan.frameworks = [f for f in NOTEBOOK_FRAMEWORKS if f in used]
    _setup_and_imports(plan, events, path, deny, max_imports, environ, cwd)
    if not plan.frameworks:
        if not _uses_gpuctx(cells):
            plan.reading += "; no GPU framework used"
            plan.gpu = False
            return plan
        plan.frameworks = [f for f in frameworks_fallback if installed(f)]
    signals = _signals(sources)
    _devices(plan, events, sources)
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
        _torch_steps(plan, signals, extra_ops, used.get("torch"))
    for name in ("cupy", "jax", "numba"):
        if name in present:
            _other_steps(plan, name, signals, used.get(name))
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


def _frameworks_used(cells: list[_Cell]) -> dict[str, tuple[str, str]]:
    """Framework -> (where, line) of its first import anywhere in the notebook (in functions too)."""
    used: dict[str, tuple[str, str]] = {}
    for cell in cells:
        if cell.tree is None:
            continue
        for node in ast.walk(cell.tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            for mod in mods:
                fw = FRAMEWORK_OF.get(mod.split(".")[0])
                if fw and fw not in used:
                    used[fw] = cell.where(node.lineno)
    return used


def _uses_gpuctx(cells: list[_Cell]) -> bool:
    return any(re.search(r"^\s*%%?(?:gpu|on_gpu)\b", "\n".join(c.lines), re.MULTILINE) for c in cells)


def _signals(sources: dict[int, list[str]]) -> dict[str, tuple[str, str]]:
    """Signal -> (where, line) of the first line that shows it."""
    found: dict[str, tuple[str, str]] = {}
    for number, lines in sources.items():
        for i, line in enumerate(lines, start=1):
            code = line.split("#", 1)[0]
            for name, rx in _SIGNALS.items():
                if name not in found and rx.search(code):
                    found[name] = (f"cell {number}, line {i}", line)
    return found


def _setup_and_imports(plan: Plan, events: list[_Event], path, deny, max_imports, environ, cwd) -> None:
    nb_dir = os.path.dirname(os.path.abspath(path)) if path else None
    warm_imports = 0
    seen = {s.module for s in plan.steps}
    for ev in events:
        if ev.kind == "env":
            _env_step(plan, ev, environ, before_imports=warm_imports == 0)
        elif ev.kind == "barrier":
            plan.add(Step("setup", ev.why, where=ev.where, code=ev.code, state="skipped",
                          detail="not done by the warm-up: the imports after it are left to your notebook"))
            plan.stopped = plan.stopped or f"imports stop at {ev.where} ({ev.why})"
        elif ev.kind == "import":
            top = ev.module.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__" or ev.module in seen:
                continue
            seen.add(ev.module)
            step = Step("import", f"import {ev.module}" if not ev.names else f"from {ev.module} import "
                        f"{', '.join(ev.names)}", where=ev.where, code=ev.code, module=ev.module, names=ev.names)
            plan.add(step)
            entry = denied(ev.module, deny)
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
                else:
                    step.state, step.detail = "skipped", why


def _env_step(plan: Plan, ev: _Event, environ, before_imports: bool) -> None:
    name, value = ev.env or ("", None)
    label = f"set {name}={value}" if name and value is not None else f"set {name or 'environment variables'}"
    step = plan.add(Step("setup", label, where=ev.where, code=ev.code, env=(name, value) if name else None))
    safe = name in SAFE_ENV or name.startswith(SAFE_ENV_PREFIXES)
    current = environ.get(name) if name else None
    if name and value is not None and current == value:
        step.state, step.detail, step.env = "done", "the kernel's environment already has it", None
        return
    reason = ""
    if not name or value is None:
        reason = "not a literal the warm-up can apply"
    elif not before_imports:
        reason = "set after the notebook's first import: applying it earlier would change what those imports see"
    elif not safe:
        reason = "not on the list of settings the warm-up applies for you"
    elif current is not None:
        reason = f"the kernel's environment says {name}={current}: the warm-up never overrides either"
    if not reason:
        return  # planned: applied before anything else
    step.state, step.detail, step.env = "skipped", reason, None
    plan.stopped = plan.stopped or f"imports stop at {ev.where} (set-up the warm-up leaves to your notebook)"
    if not name or name.startswith(GPU_ENV_PREFIXES):
        plan.gpu_blocked = plan.gpu_blocked or (f"no GPU work before your notebook's own set-up at {ev.where} "
                                                f"({(ev.code or '').strip()[:60]})")


def _devices(plan: Plan, events: list[_Event], sources: dict[int, list[str]]) -> None:
    """The device(s) the notebook names: its first `%gpu use`, `%%on_gpu` or set_device first,
    then every other cuda:N literal."""
    specs: list[str] = []
    for ev in events:
        if ev.kind == "device" and ev.device not in specs:
            if not specs:
                plan.device_where = f"{ev.where}: {ev.code.strip()}"
            specs.append(ev.device)
    for number, lines in sources.items():
        for i, line in enumerate(lines, start=1):
            for m in _CUDA_LITERAL.finditer(line.split("#", 1)[0]):
                n = m.group(1) or m.group(2)
                if n not in specs:
                    if not specs:
                        plan.device_where = f"cell {number}, line {i}: {line.strip()}"
                    specs.append(n)
    plan.devices = specs[:MAX_DEVICES]


_OP_ORDER = ("alloc", "elementwise", "matmul_fp32", "matmul_bf16", "matmul_fp16", "conv", "conv_bf16", "attention",
             "autocast", "backward", "optimizer", "grad_scaler")


def _ordered(ops) -> list[str]:
    return [op for op in _OP_ORDER if op in ops]


def _torch_op(plan: Plan, op: str, where: str, code: str = "") -> None:
    plan.add(Step("gpu" if op != "optimizer" else "cpu", op.replace("_", " "), where=where, code=code, op=op,
                  framework="torch"))


def _torch_steps(plan: Plan, signals: dict, extra_ops, used=None) -> None:
    """torch on the GPU: what the notebook's cells will run first; CPU-only steps (the optimizer's
    torch._dynamo import, one training step on the CPU) also where no GPU is."""
    base = used or ("notebook", "")
    wanted: dict[str, tuple[str, str]] = {op: base for op in ("alloc", "elementwise", "matmul_fp32")}
    by_signal = {"bf16": ["matmul_bf16", "conv_bf16"], "fp16": ["matmul_fp16"], "autocast": ["autocast"],
                 "conv": ["conv"], "attention": ["attention"], "training": ["backward", "optimizer"],
                 "grad_scaler": ["grad_scaler"], "tf32": ["matmul_fp32"]}
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
    if "training" in signals:
        step = next(s for s in plan.steps if s.op == "optimizer")
        opts = [name for name in ("adamw", "sgd") if name in signals] or ["adamw", "sgd"]
        step.names = tuple(opts)
        step.name = "optimizer step (" + " and ".join({"adamw": "AdamW", "sgd": "SGD with momentum"}[o]
                                                      for o in opts) + ")"


def _other_steps(plan: Plan, name: str, signals: dict, used=None) -> None:
    where, code = used or ("notebook", "")
    if name == "cupy":
        plan.add(Step("gpu", "cupy ops", where=where, code=code, op="cupy_ops", framework="cupy"))
    elif name == "jax":
        plan.add(Step("framework", "import jax.numpy", where=where, code=code, framework="jax", module="jax.numpy",
                      detail="imported only: JAX preallocates 75% of every GPU it starts on, so starting it is "
                             "left to your notebook"))
    elif name == "numba" and "numba_cuda" in signals:
        where, code = signals["numba_cuda"]
        plan.add(Step("framework", "import numba.cuda", where=where, code=code, framework="numba",
                      module="numba.cuda", detail="imported only: no CUDA context until your first kernel"))
