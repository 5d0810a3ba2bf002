"""Other hosts on this machine, for ipyparallel's SSH launcher: `python hosts.py ssh [OPTIONS] HOST
COMMAND...` does what ssh does with a remote command — runs it through the login shell (bash -c),
in the home folder, with a login's environment rather than the caller's — but here, in a UTS
namespace of its own whose host name is HOST (`unshare --uts`, which needs root). `python
hosts.py scp [OPTIONS] SRC DST` copies, reading `host:path` as `path`. So the launcher's real code
(its commands, its `engines` per host, starting and stopping remote processes) runs unchanged and
only the network between the hosts is missing. Standard library only: the launcher runs it as a
plain script.

`profile(folder, hosts)` writes an ipyparallel profile whose engines start on those hosts.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

HERE = os.path.abspath(__file__)
# What a login on the "host" has: no PYTHONPATH, no Jupyter or gpuctx variables of the caller.
KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


def can_run() -> str | None:
    """Why UTS namespaces cannot be made here (None: they can)."""
    if shutil.which("unshare") is None:
        return "no unshare (util-linux) on this machine"
    done = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"unshare --uts fails here: {done.stderr.strip() or done.returncode}"


def profile(folder: str, hosts: dict[str, int]) -> str:
    """An ipyparallel profile in `folder` whose SSH launcher starts `hosts[name]` engines on each host."""
    os.makedirs(folder, exist_ok=True)
    ssh, scp = [sys.executable, HERE, "ssh"], [sys.executable, HERE, "scp"]
    with open(os.path.join(folder, "ipcluster_config.py"), "w") as fh:
        fh.write(f"c.Cluster.engine_launcher_class = 'ssh'\n"
                 f"c.SSHEngineSetLauncher.engines = {hosts!r}\n"
                 f"c.SSHLauncher.ssh_cmd = {ssh!r}\n"
                 f"c.SSHLauncher.scp_cmd = {scp!r}\n"
                 f"c.SSHLauncher.remote_python = {sys.executable!r}\n")
    return folder


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """ssh's and scp's options (with their values) apart from the rest."""
    options, rest, i = [], [], 0
    while i < len(argv):
        if argv[i].startswith("-") and not rest:
            options.append(argv[i])
            if argv[i] in ("-p", "-P", "-i", "-o", "-l", "-F") and i + 1 < len(argv):
                options.append(argv[i + 1])
                i += 1
        else:
            rest.append(argv[i])
        i += 1
    return options, rest


def ssh(argv: list[str]) -> int:
    _options, rest = _split(argv)
    host, command = rest[0].rsplit("@", 1)[-1], " ".join(rest[1:])
    env = {k: os.environ[k] for k in KEEP if k in os.environ}
    env.update(HOME=os.path.expanduser("~"), SHELL="/bin/bash", USER=os.environ.get("USER", "root"))
    script = 'hostname "$0" && cd && exec bash -c "$1"'
    return subprocess.call(["unshare", "--uts", "bash", "-c", script, host, command], env=env)


def scp(argv: list[str]) -> int:
    _options, (src, dst) = _split(argv)
    src, dst = (p.split(":", 1)[1] if ":" in p else p for p in (src, dst))
    if os.path.abspath(src) != os.path.abspath(dst):
        shutil.copyfile(src, dst)
    return 0


if __name__ == "__main__":
    sys.exit({"ssh": ssh, "scp": scp}[sys.argv[1]](sys.argv[2:]))
