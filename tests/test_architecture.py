"""The layers are enforced, not remembered: import-linter's contracts (pyproject.toml) hold, and a
wrong import breaks them with the contract's name; jupyter_server still has every private name
the warm pool relies on; importing our modules changes nothing in the importing process."""
from __future__ import annotations

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


def test_a_server_module_importing_the_kernel_side_breaks_the_layers_contract(tmp_path):
    shutil.copytree(ROOT / "gpuctx_jupyter", tmp_path / "gpuctx_jupyter",
                    ignore=shutil.ignore_patterns("labextension", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    pool = tmp_path / "gpuctx_jupyter" / "server" / "pool.py"
    pool.write_text(pool.read_text() + "\nfrom ..kernel import warmup  # noqa\n")
    run = lint(tmp_path)
    assert run.returncode != 0
    assert "Layers: the kernel side and the server side" in run.stdout and "BROKEN" in run.stdout
    assert "gpuctx_jupyter.server.pool -> gpuctx_jupyter.kernel.warmup" in run.stdout


def test_jupyter_server_still_has_what_the_warm_pool_reaches_into():
    gone = jupyter_internals.missing()
    assert not gone, (f"jupyter_server changed: {', '.join(gone)} no longer exist(s); gpuctx was checked against "
                      f"{jupyter_internals.CHECKED_AGAINST} — update server/jupyter_internals.py")


def test_importing_the_server_side_loads_no_kernel_code_and_leaves_logging_alone():
    code = ("import logging, sys\n"
            "import gpuctx_jupyter.server.extension, gpuctx_jupyter.server.pool, gpuctx_jupyter.server.kernel_hook\n"
            "log = logging.getLogger('gpuctx')\n"
            "print(sorted(m for m in sys.modules if m.startswith(('gpuctx_jupyter.kernel', 'IPython', 'torch'))))\n"
            "print(log.handlers, log.propagate)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == ["[]", "[] True"]


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
