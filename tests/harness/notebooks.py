"""Notebooks and kernel configurations that tests write into their temporary folders."""
from __future__ import annotations

import json

# Run in a kernel: wait for its warm-up (up to `wait` s) and print its record as JSON.
STATUS = ("import json; m = get_ipython()._gpuctx; m.warmer.wait({wait})\n"
          "print(json.dumps(dict(m.warmer.status.as_dict(), pid=__import__('os').getpid())))")


def warm_status(ks, wait: float = 60) -> dict:
    """The warm-up record of the kernel behind `ks` (a server.Channels)."""
    r = ks.execute(STATUS.format(wait=wait))
    assert r.reply["status"] == "ok", r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def notebook(path, code: str | list[str], metadata: dict | None = None) -> None:
    """Write a notebook with one code cell per string."""
    cells = [code] if isinstance(code, str) else code
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None}
                    for c in cells],
          "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def kernel_config_env(tmp_path, policy: str = "always") -> dict:
    """The environment of a kernel configured to warm by its own config (the VS Code / JupyterHub route)."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.py").write_text(
        f'c.IPKernelApp.extensions = ["gpuctx"]\nc.GpuWarmup.policy = "{policy}"\n')
    return {"IPYTHONDIR": str(tmp_path / "ipython")}
