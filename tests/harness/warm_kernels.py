"""Kernels started as the server's hook starts them (`--ext=gpuctx`, GPUCTX_* in the environment,
JPY_SESSION_NAME naming the notebook), and their warm-up's record and plan."""
from __future__ import annotations

import json
import os

from .kernels import reply_to, run, start

PLAN = ("import json; m = get_ipython()._gpuctx; m.warmer.wait({wait})\n"
        "print(json.dumps({{'status': m.warmer.status.as_dict(), 'plan': m.warmer.plan.as_dict() if m.warmer.plan "
        "else None, 'lines': m.warmer.plan_lines()}}))")


def plan_of(kc, wait: float = 240) -> dict:  # (a warm-up importing torch on a loaded machine)
    r = run(kc, PLAN.format(wait=wait), timeout=wait + 30)
    assert r.reply["status"] == "ok", r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def warmup_now(kc) -> dict:
    """The warm-up record, asked on the control channel: no cell runs, so the warm-up does not pause."""
    request = kc.session.msg("gpuctx_request", {})
    kc.control_channel.send(request)
    # (the control thread answers late while an import holds the GIL on a loaded machine)
    return reply_to(kc, request["header"]["msg_id"], timeout=60, channel="control")["content"]["warmup"]


def kernel(tmp_path, nb_path, site_path=None, policy="auto", config: str = "", **env):
    full = {"JPY_SESSION_NAME": str(nb_path), "GPUCTX_WARM": policy, "GPUCTX_WARM_SOURCE": "server hook", **env}
    if site_path:
        full["PYTHONPATH"] = os.pathsep.join([site_path, os.environ.get("PYTHONPATH", "")])
    if config:
        profile = tmp_path / "ipython" / "profile_default"
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "ipython_kernel_config.py").write_text(config)
        full["IPYTHONDIR"] = str(tmp_path / "ipython")
    return start(env=full, extra_arguments=["--ext=gpuctx"], cwd=str(nb_path.parent))
