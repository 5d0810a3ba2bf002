"""The JupyterLab extension's own unit tests (vitest: formatting, history, back-off, the
stream's reconnects, snapshot → view model, the panel's DOM), run as part of `make test`."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LABEXT = Path(__file__).resolve().parent.parent / "labextension"


def jlpm() -> list[str]:
    """JupyterLab's pinned yarn (the jupyter_builder package ships it beside this Python)."""
    local = Path(sys.executable).parent / "jlpm"
    return [str(local)] if local.exists() else [sys.executable, "-m", "jupyter_builder.jlpm"]


@pytest.mark.timeout(600)
def test_labextension_unit_tests():
    if shutil.which("node") is None:
        pytest.fail("Node.js is needed to run the labextension's unit tests (and to build it)")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if not (LABEXT / "node_modules" / "vitest").exists():
        # exactly what yarn.lock says: a test never rewrites a tracked file
        subprocess.run([*jlpm(), "install", "--immutable"], cwd=LABEXT, env=env, check=True, timeout=540)
    run = subprocess.run([*jlpm(), "test"], check=False, cwd=LABEXT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "failed" not in run.stdout.split("Test Files")[-1], run.stdout
