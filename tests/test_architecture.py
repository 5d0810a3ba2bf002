"""The layers are enforced, not remembered: import-linter's contracts (pyproject.toml) hold, and a
wrong import breaks them with the contract's name; jupyter_server still has every private name
the warm pool relies on; importing our modules changes nothing in the importing process."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from gpuctx_jupyter.server import jupyter_internals

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=120)


def test_the_layer_contracts_hold():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def lint_with(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess:
    """lint-imports on a copy of the package where `module` (a path under it) has `line` added."""
    shutil.copytree(ROOT / "gpuctx_jupyter", tmp_path / "gpuctx_jupyter",
                    ignore=shutil.ignore_patterns("labextension", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / "gpuctx_jupyter" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    return lint(tmp_path)


def test_a_server_module_importing_the_kernel_side_breaks_the_layers_contract(tmp_path):
    run = lint_with(tmp_path, "server/pool.py", "from ..kernel.warm import scheduler")
    assert run.returncode != 0
    assert "Layers: the kernel side and the server side" in run.stdout and "BROKEN" in run.stdout
    assert "gpuctx_jupyter.server.pool -> gpuctx_jupyter.kernel.warm.scheduler" in run.stdout


def test_jupyter_server_still_has_what_the_warm_pool_reaches_into():
    gone = jupyter_internals.missing()
    assert not gone, (f"jupyter_server changed: {', '.join(gone)} no longer exist(s); gpuctx was checked against "
                      f"{jupyter_internals.CHECKED_AGAINST} — update server/jupyter_internals.py")


def test_importing_the_server_side_loads_no_kernel_code_and_leaves_logging_alone():
    code = ("import logging, sys\n"
            "import gpuctx_jupyter.server.extension, gpuctx_jupyter.server.pool, gpuctx_jupyter.server.launch\n"
            "log = logging.getLogger('gpuctx')\n"
            "print(sorted(m for m in sys.modules if m.startswith(('gpuctx_jupyter.kernel', 'IPython', 'torch'))))\n"
            "print(log.handlers, log.propagate)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == ["[]", "[] True"]


def test_a_kernels_start_loads_what_it_needs_and_each_command_the_rest():
    """gpuctx is loaded into every kernel the server starts, before the kernel answers (readiness):
    what only a command, a request, an error or the workers need is imported when first needed — and
    works then. The GPU inventory (with NVML's bindings and the device records: a third of what
    loading took) waits for the first command or the warm-up's GPU check; `%%on_gpu` on one device
    needs nothing more."""
    later = ["kernel.doctor", "kernel.reports", "kernel.release", "kernel.workers", "kernel.hints", "kernel.oom",
             "kernel.adoption", "kernel.warm.typed", "core.checkpoint", "contract.holders"]
    first_use = ["core.inventory", "core.nvml", "core.devices", "kernel.render"]
    code = ("import json, sys\n"
            "from IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\n"
            "ip.run_line_magic('load_ext', 'gpuctx')\n"
            f"later = ['gpuctx_jupyter.' + m for m in {later!r}]\n"
            f"at_load = [m for m in {first_use!r} if 'gpuctx_jupyter.' + m in sys.modules]\n"
            "ip.run_cell('%%on_gpu 0\\nx = 1')  # one device (here none: the cell runs on the CPU, and says why)\n"
            "at_start = [m for m in later if m in sys.modules]\n"
            "for line in ('help', 'doctor', 'status', 'mem', 'free'):\n"
            "    ip.run_line_magic('gpu', line)\n"
            "failed = ip.run_cell('1 / 0').error_in_exec is not None\n"
            "print(json.dumps([at_load, at_start, [m for m in later if m in sys.modules], failed]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    at_load, at_start, after, failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert at_load == [] and at_start == [] and failed
    assert {m.removeprefix("gpuctx_jupyter.") for m in after} >= {
        "kernel.doctor", "kernel.reports", "kernel.release", "kernel.workers", "kernel.hints", "kernel.oom"}, after
    assert "warm-up:" in out.stdout and "gpuctx doctor" in out.stdout.lower(), out.stdout[-2000:]


def test_loading_the_kernel_extension_sends_its_log_to_the_kernels_stderr(shell):
    import logging

    handlers = [h for h in logging.getLogger("gpuctx").handlers if getattr(h, "_gpuctx", False)]
    assert len(handlers) == 1 and handlers[0].stream is sys.__stderr__


def test_test_modules_import_the_harness_never_each_other():
    import ast

    offenders = []
    for path in [*ROOT.glob("tests/test_*.py"), *ROOT.glob("benchmarks/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                name = ("." * node.level) + (node.module or "")
                if name.startswith((".test_", ".conftest", "tests.test_", "tests.conftest")):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_a_module_importing_pynvml_outside_core_nvml_breaks_the_nvml_contract(tmp_path):
    run = lint_with(tmp_path, "server/snapshot.py", "import pynvml")
    assert run.returncode != 0
    assert "Only core/nvml.py calls NVML BROKEN" in run.stdout.replace("\n", " ")
    assert "gpuctx_jupyter.server.snapshot -> pynvml" in run.stdout


def documented_modules() -> set[str]:
    """The module paths the tree in docs/architecture.md names (folders by their indentation)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Every module and its one job", 1)[1].split("```", 2)[1]
    stack: list[tuple[int, str]] = []
    found = set()
    for line in block.splitlines():
        if not line.strip() or line.startswith(" " * 20):  # a description's continuation
            continue
        indent, name = len(line) - len(line.lstrip()), line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([*(p for _, p in stack), name.rstrip("/")])
        if name.endswith("/"):
            stack.append((indent, name.rstrip("/")))
        elif name.endswith(".py"):
            found.add(path)
    return found


def _only_a_docstring(path: Path) -> bool:
    """A package marker that holds nothing but its docstring."""
    import ast

    body = ast.parse(path.read_text()).body
    return path.name == "__init__.py" and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                              for n in body)


def test_every_module_is_listed_in_docs_architecture():
    listed = documented_modules()
    package = ROOT / "gpuctx_jupyter"
    actual = {f"gpuctx_jupyter/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py")
              if "labextension" not in p.parts and not _only_a_docstring(p)}
    assert not actual - listed, f"docs/architecture.md does not list {sorted(actual - listed)}: say what each is for"
    assert not (listed - actual - {"gpuctx.py"}), f"docs/architecture.md lists modules that do not exist: " \
                                                 f"{sorted(listed - actual - {'gpuctx.py'})}"


def test_no_module_is_over_600_lines():
    """A module past 600 lines has grown a second job: split it where the jobs part."""
    package = ROOT / "gpuctx_jupyter"
    long = {p.relative_to(ROOT).as_posix(): n for p in package.rglob("*.py") if "labextension" not in p.parts
            and (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"over 600 lines: {long}"
