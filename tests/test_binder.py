"""The Binder demo, built the way repo2docker builds it as far as this machine allows: a fresh
virtual environment, binder/requirements.txt, then binder/postBuild from a copy of the
repository; then the tour notebook runs top to bottom in it (no GPU here) and says so honestly."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORE = shutil.ignore_patterns(".venv", "node_modules", ".git", "__pycache__", ".devwheels", ".whl",
                                "results", "*.egg-info", "lib", "labextension_build")


def sh(cmd, env, cwd, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def test_binder_environment_builds_and_runs_the_tour(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    shutil.rmtree(repo / "gpuctx_jupyter" / "labextension", ignore_errors=True)  # built by postBuild
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)
    sh(["python", "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], env, repo)
    out = sh(["bash", "binder/postBuild"], env, repo)
    assert "Traceback" not in out
    listing = sh(["jupyter", "server", "extension", "list"], env, repo)
    assert "gpuctx_jupyter" in listing and "enabled" in listing

    sh(["jupyter", "nbconvert", "--to", "notebook", "--execute", "--ExecutePreprocessor.timeout=300",
        "examples/tour.ipynb", "--output", str(tmp_path / "tour-run.ipynb")], env, repo)
    nb = json.loads((tmp_path / "tour-run.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    text = "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                     for o in outputs)
    assert "No GPU is visible to this kernel" in text and "NVML reports:" in text
    assert "gpuctx doctor" in text and "UsageError: no GPU is visible" in text
    assert "warm-up: skipped" in text
    # the live monitor (no GPU) and the labelled replay of the recorded H200 trace
    assert sum("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs) == 2
