"""The Binder demo, built the way repo2docker builds it as far as this machine allows: a virtual
environment with binder/requirements.txt, then binder/postBuild from a copy of the repository;
then the tour notebook runs top to bottom in it (no GPU here) and says so honestly.

What does not change between runs is kept (tests/harness/cache.py, under .cache/): the
environment with binder/requirements.txt (torch, JupyterLab) per hash of that file; postBuild
runs again in it whenever a file it builds from changes (the package, labextension/, pyproject,
binder/), and its production build of the JupyterLab extension is reused while labextension/ and
pyproject are unchanged. Every run checks both extensions in that environment and executes the
tour in it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import cache

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".venv", "node_modules", ".git", "__pycache__", ".devwheels", ".whl", ".cache",
                                ".hypothesis", ".pytest_cache", "build", "dist", "results", "*.egg-info", "lib",
                                "labextension_build")
# What binder/postBuild's `pip install .` is built from, and the part that its npm build reads.
POSTBUILD_INPUTS = ["pyproject.toml", "gpuctx.py", "install.json", "README.md", "binder", "jupyter-config",
                    "gpuctx_jupyter", "labextension"]
LABEXT_INPUTS = ["pyproject.toml", "labextension"]
LABEXT_BUILD = "gpuctx_jupyter/labextension"


def sh(cmd, env, cwd, timeout=900):
    proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


@pytest.mark.timeout(1500)  # a first run builds the environment: torch, JupyterLab, an npm build
def test_binder_environment_builds_and_runs_the_tour(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    shutil.rmtree(repo / LABEXT_BUILD, ignore_errors=True)  # built by postBuild
    name = f"binder-{cache.tree_hash(['binder/requirements.txt'])}"
    cache.prune("binder-", keep=name)  # environments for an older binder/requirements.txt
    with cache.locked(name) as cached:
        venv = cached / "env"
        env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
        env.pop("PYTHONPATH", None)
        if not (cached / "requirements.done").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            sh(["python", "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], env, repo)
            (cached / "requirements.done").touch()

        built = cached / f"postBuild-{cache.tree_hash(POSTBUILD_INPUTS, skip=[LABEXT_BUILD])}.done"
        if not built.exists():
            labext = cached / f"labextension-{cache.tree_hash(LABEXT_INPUTS)}"
            if labext.is_dir():  # the build hook skips npm when its output is there
                shutil.copytree(labext, repo / LABEXT_BUILD)
            out = sh(["bash", "binder/postBuild"], env, repo)
            assert "Traceback" not in out
            if not labext.is_dir():
                for old in cached.glob("labextension-*"):
                    shutil.rmtree(old)
                shutil.copytree(repo / LABEXT_BUILD, labext)
            for old in cached.glob("postBuild-*.done"):
                old.unlink()
            built.touch()

        listing = sh(["jupyter", "server", "extension", "list"], env, repo)
        assert "gpuctx_jupyter" in listing and "enabled" in listing
        labs = sh(["jupyter", "labextension", "list"], env, repo)
        assert "gpuctx-jupyterlab" in labs and "enabled" in labs, labs

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
