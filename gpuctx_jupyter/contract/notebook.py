"""Reading a notebook without running it, once per change, for the server and the kernel alike.

One reader answers "does this notebook want the GPU, and what does it run?": what it imports (top
level, in notebook order), which GPU frameworks it uses, its set-up lines (environment settings,
sys.path and working-directory changes, package installs), the devices it names, and what its
cells will do first (training, precisions, convolutions, attention, compilation), each with the
cell and line that says so. The kernel turns these facts into its warm plan; the server uses them
to decide whether a kernel is a GPU notebook's and what a standby should have imported.

Reading is safe on any path: only regular files are read (a FIFO or /dev/zero named as a
notebook is refused at once), never more than MAX_NOTEBOOK_BYTES, and nothing in the notebook runs.
IPython syntax (magics, shell escapes, help requests) becomes Python that keeps every line where
it was, so cells parse with the standard library's `ast`. `Reader` keeps the facts per file
until the file changes on disk; `facts_from_sources` reads cells that exist only in a frontend
(typed, not yet saved). Standard library only.
"""
from __future__ import annotations

import ast
import functools
import json
import os
import re
import stat
import sys
import threading
from dataclasses import dataclass, field

from . import FRAMEWORK_OF, SESSION

MAX_NOTEBOOK_BYTES = 50 * 2**20  # outputs make notebooks big; code rarely is
MAX_CELL_CHARS = 1_000_000  # a cell larger than this is not parsed (it says so)

# What the notebook's code says it will run; the first line matching each names it.
SIGNALS = {
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
    "compile": re.compile(r"\btorch\.compile\(|\btorch\.jit\.(?:script|trace)\(|@torch\.compile\b"),
    "torch_compile": re.compile(r"\btorch\.compile\(|@torch\.compile\b"),  # inductor's (not TorchScript's)
    "jax_jit": re.compile(r"\bjax\.jit\b|@jit\b|\bjit\(|\bjax\.grad\b|\bgrad\("),
    # a line that puts work on a GPU: its cell is the notebook's first GPU cell
    "gpu_work": re.compile(r"\.cuda\(|\.to\(\s*(?:device|['\"]cuda)|\bdevice\s*=|['\"]cuda(?::\d+)?['\"]|"
                           r"\bcp\.\w+\(|\bcupy\.\w+\(|\bjnp\.\w+\(|\bjax\.device_put\b"),
    "numba_cuda": re.compile(r"\bnumba\.cuda\b|\bfrom numba import\b.*\bcuda\b|\bcuda\.jit\b"),
    "cupy_kernel": re.compile(r"\bcupy\.(?:RawKernel|ElementwiseKernel|ReductionKernel|fuse)\b|\bcp\.(?:RawKernel|"
                              r"ElementwiseKernel|ReductionKernel|fuse)\b"),
}
_CUDA_LITERAL = re.compile(r"""["']cuda:(\d+)["']|torch\.device\(\s*["']cuda["']\s*,\s*(\d+)\s*\)""")
_CELL_MAGIC = re.compile(r"^\s*%%(\w+)[ \t]*(.*)$")
_CODE_CELL_MAGICS = {"time", "timeit", "capture", "prun", "on_gpu"}  # their body is Python
_GPUCTX_MAGIC = re.compile(r"^\s*%%?(?:gpu|on_gpu)\b", re.MULTILINE)
_HELP = re.compile(r"^[\w.]+\?{1,2}$")  # os? or np.array??
_ASSIGNED_ESCAPE = re.compile(r"^(\s*[\w.,\s\[\]()*]+?=\s*)[!%].*$")  # files = !ls, t = %timeit -o f()
_FRAMEWORK_IMPORT = re.compile(r"^\s*(?:import|from)\s+(" + "|".join(sorted(FRAMEWORK_OF, key=len, reverse=True))
                               + r")\b", re.MULTILINE)


class NotReadable(Exception):
    """The path is not a notebook this reader may read (a sentence naming the file and why)."""


@dataclass(frozen=True)
class Where:
    """A line of the notebook: its cell (counted from 1 over all cells, as the notebook shows them),
    its line in the cell, and the line itself."""

    cell: int
    line: int
    code: str = ""

    def __str__(self) -> str:
        return f"cell {self.cell}, line {self.line}"


@dataclass(frozen=True)
class Event:
    """A top-level statement that matters before the notebook's imports run, in notebook order.

    kind: import (module, names) | env (a setting: name and literal value; name "" or value None
    when not a literal) | barrier (changes what later imports see: sys.path, the working directory,
    package installs; `why`) | device (a device the notebook selects: `%gpu use`, `%%on_gpu`,
    set_device) | workers (`%gpu workers start ARGS`: the ARGS, in `device`)."""

    kind: str
    where: Where
    module: str = ""
    names: tuple[str, ...] = ()
    env: tuple[str, str | None] | None = None
    why: str = ""
    device: str = ""

    @property
    def beyond_stdlib(self) -> bool:
        """An import of something outside the standard library (and not `__future__`): the
        imports worth doing ahead, by a warm-up or a standby, because they take time."""
        top = self.module.split(".")[0]
        return self.kind == "import" and top not in sys.stdlib_module_names and top != "__future__"


@dataclass
class Facts:
    """What one notebook says about itself; `error` says why there are none."""

    path: str = ""
    error: str = ""  # not read: why, as a sentence naming the file
    opts_out: bool = False  # metadata {"gpuctx": {"warm": false}}
    code_cells: int = 0
    new: bool = False  # read, but no code yet (a notebook just created)
    events: list[Event] = field(default_factory=list)
    frameworks: dict[str, Where] = field(default_factory=dict)  # GPU framework -> its first import anywhere
    magics: Where | None = None  # gpuctx's magics, first use
    signals: dict[str, Where] = field(default_factory=dict)
    cuda_literals: list[tuple[str, Where]] = field(default_factory=list)  # ("1", where) for 'cuda:1'
    notes: list[str] = field(default_factory=list)  # cells that could not be read, and why

    @property
    def readable(self) -> bool:
        return not self.error

    def imports(self) -> list[Event]:
        """The top-level, unconditional imports in notebook order (the standard library included)."""
        return [e for e in self.events if e.kind == "import"]

    def wants_gpu(self) -> tuple[bool, str]:
        """The `auto` policy: does this notebook use a GPU framework? (and why we think so)"""
        if self.error:
            return False, self.error
        if self.opts_out:
            return False, "the notebook opts out (metadata gpuctx.warm = false)"
        first = min([*self.frameworks.values(), *([self.magics] if self.magics else [])],
                    key=lambda w: (w.cell, w.line), default=None)
        if first is None:
            return False, "the notebook uses no GPU framework"
        return True, f"the notebook uses a GPU framework ({first.code.strip()})"

    def summary(self) -> dict:
        """JSON for logs and the API: counts and names, never the notebook's code."""
        return {"path": self.path, "error": self.error, "code_cells": self.code_cells, "new": self.new,
                "frameworks": sorted(self.frameworks), "imports": [e.module for e in self.imports()]}


# -- reading files -------------------------------------------------------------------------------------
def read_bytes(path: str, limit: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The content of a regular file, at most `limit` bytes; NotReadable otherwise. Opened without
    blocking, so that a FIFO, a device or a socket is refused at once rather than read forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise NotReadable(f"cannot read the notebook {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable(f"cannot read the notebook {path}: not a regular file")
        if st.st_size > limit:
            raise NotReadable(f"cannot read the notebook {path}: larger than {limit // 2**20} MiB")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while being read
                raise NotReadable(f"cannot read the notebook {path}: larger than {limit // 2**20} MiB")
        return b"".join(chunks)
    except OSError as exc:
        raise NotReadable(f"cannot read the notebook {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def stamp(path: str) -> tuple | None:
    """What changes when the file changes (None: no such file)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)


def load(path: str | None) -> dict:
    """The notebook at `path` as a dict; NotReadable (with the reason) when it is not one."""
    if not path:
        raise NotReadable(f"no notebook ({SESSION} unset)")
    raw = read_bytes(path)
    try:
        nb = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise NotReadable(f"cannot read the notebook {path}: {exc}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells", []), list):
        raise NotReadable(f"cannot read the notebook {path}: not a notebook")
    return nb


def cell_sources(nb: dict) -> list[tuple[int, str]]:
    """(cell number counted from 1 over all cells; source) of each code cell."""
    out = []
    for number, cell in enumerate(nb.get("cells", []), start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        out.append((number, "".join(map(str, src)) if isinstance(src, list) else str(src)))
    return out


def opts_out(nb: dict) -> bool:
    meta = nb.get("metadata", {})
    meta = meta.get("gpuctx", {}) if isinstance(meta, dict) else {}
    return isinstance(meta, dict) and meta.get("warm") is False


def read(path: str | None) -> Facts:
    """The facts of the notebook at `path`, read now; never an exception."""
    try:
        nb = load(path)
    except NotReadable as exc:
        return Facts(path=path or "", error=str(exc))
    if opts_out(nb):
        return Facts(path=path or "", opts_out=True)
    return facts_from_cells(cell_sources(nb), path or "")


def facts_from_sources(sources: list[str], path: str = "") -> Facts:
    """The facts of cells as a frontend holds them (numbered 1, 2, … in order)."""
    return facts_from_cells(list(enumerate(sources, start=1)), path)


def facts_from_cells(cells: list[tuple[int, str]], path: str = "") -> Facts:
    facts = Facts(path=path, code_cells=len(cells))
    facts.new = not any(src.strip() for _n, src in cells)
    for number, src in cells:
        cell = _cell_facts(number, src) if len(src) <= _CACHED_CELL_CHARS else _read_cell(number, src)
        if cell.error:
            facts.notes.append(cell.error)
        facts.events += cell.events
        for name, where in cell.frameworks:
            facts.frameworks.setdefault(name, where)
        if facts.magics is None:
            facts.magics = cell.magics
        for name, where in cell.signals:
            facts.signals.setdefault(name, where)
        facts.cuda_literals += cell.cuda_literals
    return facts


@dataclass(frozen=True)
class _CellFacts:
    """What one cell says, in the order it says it (each first occurrence where that matters)."""

    error: str
    events: tuple[Event, ...]
    frameworks: tuple[tuple[str, Where], ...]
    magics: Where | None
    signals: tuple[tuple[str, Where], ...]
    cuda_literals: tuple[tuple[str, Where], ...]


def _read_cell(number: int, src: str) -> _CellFacts:
    cell = _parse(number, src)
    used: dict[str, Where] = {}
    _frameworks(cell, used)
    magics = None
    m = _GPUCTX_MAGIC.search("\n".join(cell.lines))
    if m:
        line = "\n".join(cell.lines)[:m.start()].count("\n") + 1
        magics = Where(cell.number, line, cell.lines[line - 1] if line <= len(cell.lines) else "")
    signals: dict[str, Where] = {}
    literals = []
    for i, line in enumerate(cell.lines, start=1):
        code = line.split("#", 1)[0]
        for name, rx in SIGNALS.items():
            if name not in signals and rx.search(code):
                signals[name] = Where(cell.number, i, line)
        for lit in _CUDA_LITERAL.finditer(code):
            literals.append((lit.group(1) or lit.group(2), Where(cell.number, i, line)))
    return _CellFacts(cell.error, tuple(_events(cell)), tuple(used.items()), magics, tuple(signals.items()),
                      tuple(literals))


# A frontend sends every cell again a second after each pause in typing, and a notebook is read
# again when saved: each cell is parsed once (per number and text), up to this many, this large
# (at most 32 MiB of cells kept; a larger cell is read each time).
_CACHED_CELL_CHARS = 16 * 1024
_cell_facts = functools.lru_cache(maxsize=2048)(_read_cell)


class Reader:
    """Facts per notebook, read again only when the file changed on disk (its inode, mtime, size).
    Thread-safe: the server reads in worker threads, never on its event loop."""

    def __init__(self, limit: int = 1000):
        self.limit = limit
        self._cache: dict[str, tuple[tuple | None, Facts]] = {}
        self._lock = threading.Lock()

    def facts(self, path: str | None) -> Facts:
        if not path:
            return read(path)
        now = stamp(path)
        with self._lock:
            seen = self._cache.get(path)
        if seen is not None and seen[0] == now and now is not None:
            return seen[1]
        facts = read(path)
        with self._lock:
            if len(self._cache) >= self.limit:
                self._cache.clear()
            self._cache[path] = (now, facts)
        return facts


# -- reading cells -------------------------------------------------------------------------------------
@dataclass
class _Cell:
    number: int
    lines: list[str]  # the cell's source lines (for quoting)
    tree: ast.Module | None
    offset: int  # lines before the parsed code (a leading cell magic)
    magic: tuple[str, str] | None  # a leading cell magic: (name, arguments)
    error: str = ""

    def where(self, lineno: int) -> Where:
        n = lineno + self.offset
        return Where(self.number, n, self.lines[n - 1] if 0 < n <= len(self.lines) else "")


def as_python(src: str) -> str:
    """IPython syntax as Python that keeps every line where it was: magics, shell escapes and help
    requests become `pass`, an assigned escape (`files = !ls`) assigns None."""
    out = []
    for line in src.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(("%", "!", "?")) or _HELP.match(stripped):
            out.append(indent + "pass")
            continue
        m = _ASSIGNED_ESCAPE.match(line)
        out.append(m.group(1) + "None" if m else line)
    return "\n".join(out)


def _parse(number: int, src: str) -> _Cell:
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
    if len(body) > MAX_CELL_CHARS:
        return _Cell(number, lines, None, offset, magic, error=f"cell {number}: too large to read "
                                                                f"(over {MAX_CELL_CHARS:,} characters)")
    try:
        tree = ast.parse(as_python(body))
    except SyntaxError as exc:
        line = (exc.lineno or 1) + offset
        return _Cell(number, lines, None, offset, magic, error=f"cell {number}: syntax error on line {line} "
                                                                f"({exc.msg}): its imports are not warmed")
    except (ValueError, RecursionError, MemoryError) as exc:
        return _Cell(number, lines, None, offset, magic, error=f"cell {number}: cannot parse ({type(exc).__name__})")
    return _Cell(number, lines, tree, offset, magic)


def _frameworks(cell: _Cell, used: dict[str, Where]) -> None:
    """Framework -> where it is first imported, anywhere in the cell (in functions too); a cell that
    does not parse is searched line by line."""
    if cell.tree is None:
        if cell.magic and cell.magic[0] not in _CODE_CELL_MAGICS:
            return  # another language's cell
        text = "\n".join(cell.lines)
        for m in _FRAMEWORK_IMPORT.finditer(text):
            fw = FRAMEWORK_OF[m.group(1)]
            line = text[:m.start()].count("\n") + 1
            used.setdefault(fw, Where(cell.number, line, cell.lines[line - 1]))
        return
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


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _magic_line(cell: _Cell, node) -> str | None:
    """The magic or shell line a `pass` stands for, if it does."""
    if not isinstance(node, ast.Pass):
        return None
    code = cell.where(node.lineno).code.strip()
    return code if code.startswith(("%", "!")) else None


def _events(cell: _Cell) -> list[Event]:
    out: list[Event] = []
    spec = cell.magic[1].split()[0] if cell.magic and cell.magic[0] == "on_gpu" and cell.magic[1] else ""
    if spec and spec.lower() != "all" and "," not in spec:  # `all`, `0,1`: the workers' GPUs, not the kernel's
        where = Where(cell.number, cell.offset, cell.lines[cell.offset - 1])
        out.append(Event("device", where, device=spec))
    if cell.tree is None:
        return out
    for node in cell.tree.body:
        where = cell.where(node.lineno)
        line = _magic_line(cell, node)
        if line is not None:
            out += _magic_events(line, where)
        elif isinstance(node, ast.Import):
            out += [Event("import", where, module=alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append(Event("import", where, module=node.module,
                                 names=tuple(a.name for a in node.names if a.name != "*")))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and _dotted(target.value) in ("os.environ", "environ"):
                    key = _const_str(target.slice)
                    value = _const_str(node.value) if isinstance(node, ast.Assign) else None
                    out.append(Event("env", where, env=(key or "", value)))
                elif _dotted(target) in ("sys.path", "os.environ", "environ"):
                    out.append(Event("barrier", where, why="replaces sys.path" if _dotted(target) == "sys.path"
                                     else "replaces os.environ"))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            out += _call_events(node.value, where)
    return out


def _magic_events(line: str, where: Where) -> list[Event]:
    if line.startswith("!"):
        if re.match(r"!\s*(pip|conda|mamba|uv)\b", line):
            return [Event("barrier", where, why="a shell command may install or upgrade packages")]
        return []
    words = line[1:].split(None, 1)
    magic, rest = (words[0], words[1].strip() if len(words) > 1 else "") if words else ("", "")
    if magic == "gpu" and rest.split()[:1] == ["use"] and len(rest.split()) > 1:
        return [Event("device", where, device=rest.split()[1])]
    if magic == "gpu" and rest.split()[:2] == ["workers", "start"]:
        return [Event("workers", where, device=rest.split(None, 2)[2] if len(rest.split()) > 2 else "")]
    if magic == "env":
        m = re.match(r"^(\w+)\s*[= ]\s*(.*)$", rest)
        if m:
            return [Event("env", where, env=(m.group(1), m.group(2)))]
        if rest and not re.match(r"^\w+$", rest):
            return [Event("env", where, env=("", None))]
        return []
    if magic in ("pip", "conda", "mamba", "uv"):
        return [Event("barrier", where, why=f"%{magic} may install or upgrade packages")]
    if magic == "cd":
        return [Event("barrier", where, why="%cd changes the working directory")]
    if magic in ("run", "dotenv"):
        return [Event("env", where, env=("", None))]  # may set anything
    return []


def _call_events(call: ast.Call, where: Where) -> list[Event]:
    name = _dotted(call.func)
    args = [_const_str(a) for a in call.args]
    if name in ("os.environ.setdefault", "environ.setdefault") and len(args) >= 2:
        return [Event("env", where, env=(args[0] or "", args[1]))]
    if name in ("os.environ.update", "environ.update"):
        pairs = call.args[0] if call.args else None
        if isinstance(pairs, ast.Dict) and all(_const_str(k) for k in pairs.keys):
            return [Event("env", where, env=(_const_str(k), _const_str(v))) for k, v in zip(pairs.keys, pairs.values)]
        return [Event("env", where, env=("", None))]
    if name == "os.putenv":
        return [Event("env", where, env=(args[0] or "" if args else "", args[1] if len(args) > 1 else None))]
    if name in ("sys.path.append", "sys.path.insert", "sys.path.extend", "sys.path.remove", "site.addsitedir"):
        return [Event("barrier", where, why="changes sys.path")]
    if name == "os.chdir":
        return [Event("barrier", where, why="changes the working directory")]
    if name.rsplit(".", 1)[-1] == "load_dotenv":
        return [Event("env", where, env=("", None))]  # sets whatever the .env file holds
    if name in ("torch.cuda.set_device", "cuda.set_device") and call.args:
        arg = call.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, int) and not isinstance(arg.value, bool):
            return [Event("device", where, device=str(arg.value))]
        if _const_str(arg):
            return [Event("device", where, device=_const_str(arg).removeprefix("cuda:"))]
    return []
