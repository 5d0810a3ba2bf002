"""A plain `pip install` of the built wheel, on a machine without Node.js, gives JupyterLab the
prebuilt extension and jupyter_server the enabled server extension: `jupyter labextension list`
and `jupyter server extension list` both say gpuctx is enabled and OK.

The wheel is built from this checkout (the labextension already built by `make`, so the
build hook only packages it) and kept under .cache/ per hash of the files it is made from
(tests/harness/cache.py): an unchanged tree reuses it, any change builds it anew. It is installed with --no-deps into a new venv whose only other
packages are this test environment's, reached through a .pth path entry (not a site dir, so
the checkout's editable-install hook is not loaded): the wheel's own files are what is found.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from .harness import cache

REPO = Path(__file__).resolve().parent.parent
# What goes into the wheel (the labextension's build output included).
WHEEL_INPUTS = ["pyproject.toml", "gpuctx.py", "install.json", "README.md", "jupyter-config", "gpuctx_jupyter"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    name = f"wheel-{cache.tree_hash(WHEEL_INPUTS)}"
    cache.prune("wheel-", keep=name)
    with cache.locked(name) as dist:
        if not list(dist.glob("gpuctx_jupyter-*.whl")):
            build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"),
                                    str(REPO)], check=False, capture_output=True, text=True, timeout=600)
            assert build.returncode == 0, build.stdout + build.stderr
            for built in (tmp / "dist").glob("gpuctx_jupyter-*.whl"):
                shutil.copy(built, dist)
        wheel, = dist.glob("gpuctx_jupyter-*.whl")
        wheel = shutil.copy(wheel, tmp)

    env_dir = tmp / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "zz_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                              str(wheel)], check=False, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr

    home = tmp / "home"
    home.mkdir()
    env = {
        "PATH": str(env_dir / "bin"),  # no node, no npm, no jlpm
        "HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "LANG": "C.UTF-8",
    }
    assert shutil.which("node", path=env["PATH"]) is None
    return py, env, env_dir


def run(py, env, *args) -> str:
    done = subprocess.run([str(py), "-m", *args], check=False, env=env, capture_output=True, text=True, timeout=120)
    out = ANSI.sub("", done.stdout + done.stderr)
    assert done.returncode == 0, out
    return out


def test_the_wheel_ships_the_labextension_enabled_and_ok(installed):
    py, env, env_dir = installed
    out = run(py, env, "jupyterlab.labextensions", "list")  # what `jupyter labextension list` runs
    line = next((l for l in out.splitlines() if "gpuctx-jupyterlab" in l), None)
    assert line is not None, out
    assert re.search(r"gpuctx-jupyterlab v\S+ enabled OK \(python, gpuctx-jupyter\)", line), out
    assert (env_dir / "share" / "jupyter" / "labextensions" / "gpuctx-jupyterlab" / "static" / "style.js").is_file()
    assert str(env_dir / "share" / "jupyter" / "labextensions") in out, out


def test_the_wheel_enables_the_server_extension(installed):
    py, env, env_dir = installed
    out = run(py, env, "jupyter_server.extension.serverextension", "list")  # `jupyter server extension list`
    assert re.search(r"gpuctx_jupyter enabled", out), out
    assert re.search(r"gpuctx_jupyter \S+ OK", out), out
    assert str(env_dir / "etc" / "jupyter") in out, out
