"""Becoming a notebook's kernel: the warm pool hands a standby to a notebook, on its control channel
(contract.ADOPT_REQUEST), and the standby takes what a kernel started for that notebook would have
had — its working directory (and sys.path's entry for it, IPython's directory history `_dh`), its
environment, its connection file (sys.argv, %connect_info), `__session__` and the device the server
assigned it — then warms what that notebook runs. That it came from the pool is kept in its
KernelState (for `%gpu status`), not in its environment, which is a fresh kernel's.

No cell runs, so neither the warm-up nor the user's first cell mistakes the hand-over for one,
and the notebook's first cell is In [1].
"""
from __future__ import annotations

import locale
import logging
import os
import sys
from pathlib import Path

from ..contract import SESSION
from . import state as kernel_state
from .warm import settle
from .warm.recipes import inductor

log = logging.getLogger("gpuctx")


def adopt(ip, content: dict, then=None) -> dict:
    """Apply the hand-over `content` ({"cwd", "env": {name: value or None}, "pooled",
    "connection_file"}); `then(previous)` (the notebook the standby was warmed for, or None)
    carries on with the new notebook's plan. Returns the reply's content."""
    previous = os.environ.get(SESSION)
    old_cwd = os.getcwd()
    cwd = str(content["cwd"])
    with settle.LOCK:  # not while the standby freezes its objects: the notebook's must never be frozen
        settle.handed_over()
        os.chdir(cwd)
        sys.path[:] = _rebased(sys.path, old_cwd, cwd)
        for name, value in (content.get("env") or {}).items():
            if value is None:  # the standby had it (its notebook, GPUCTX_STANDBY); the new kernel must not
                os.environ.pop(str(name), None)
            else:
                os.environ[str(name)] = str(value)
    _fresh_directory_history(ip)
    st = kernel_state.of(ip)
    if st is not None:
        st.pooled = str(content.get("pooled", ""))
        _take_assigned_device(ip, st)
    if SESSION in os.environ:
        ip.user_ns["__session__"] = os.environ[SESSION]
    else:
        ip.user_ns.pop("__session__", None)
    connection_file = content.get("connection_file")
    if connection_file:
        _use_connection_file(ip, str(connection_file))
    try:  # a standby kept inductor's compile workers while it waited: the notebook keeps them as long as any
        inductor.after_adoption()
    except Exception as exc:  # noqa: BLE001 — optional, like what follows
        log.warning("gpuctx: inductor's compile workers after the hand-over: %s: %s", type(exc).__name__, exc)
    if then is not None:
        try:  # optional: a failure here must not undo the hand-over
            then(previous)
        except Exception as exc:  # noqa: BLE001
            log.warning("gpuctx: warming the adopting notebook's plan failed to start: %s: %s",
                        type(exc).__name__, exc)
    return {"status": "ok", "cwd": os.getcwd()}


def _fresh_directory_history(ip) -> None:
    """IPython's directory history (`_dh`, `%dhist`, `cd -0`) as a kernel started here has it: its
    start directory only (the same list object `_dh` names)."""
    history = getattr(getattr(ip, "history_manager", None), "dir_hist", None)
    if isinstance(history, list):
        history[:] = [Path.cwd()]


def _take_assigned_device(ip, st) -> None:
    """The device the server assigned this kernel (GPUCTX_DEVICE, now in its environment), as a
    fresh kernel takes it at its start (warm/start.start_from_config): the choice, then each
    framework already imported switched as if it had just been imported — lazily, without asking
    it whether it can use a GPU, so the hand-over starts no CUDA (torch queues the switch for its
    own start-up)."""
    from .warm.settings import GpuWarmup
    from .warm.start import configured_device

    choice = configured_device(GpuWarmup(parent=ip))
    if choice is not None:
        st.switcher.assign(choice)


def _rebased(path: list[str], old_cwd: str, cwd: str, sitedirs: list[str] | None = None) -> list[str]:
    """sys.path as a kernel started in `cwd` would have had it: `python -m ipykernel_launcher` put
    its start directory first, and PYTHONPATH's relative entries (an empty one is the start
    directory itself) were made absolute against it; PYTHONPATH's absolute entries stay, even one
    that names the directory the standby started in. The .pth files' entries follow: site adds
    none that is on the path already, so one that a relative entry hid at the standby's start (an
    editable install of the code in the standby's start directory, with PYTHONPATH's empty entry)
    comes back after its site dir, and one that a relative entry now names goes."""
    moved = {os.path.normpath(os.path.join(old_cwd, e)): os.path.normpath(os.path.join(cwd, e))
             for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if not os.path.isabs(e)}
    out = [cwd if i == 0 and entry == old_cwd else moved.get(entry, entry) for i, entry in enumerate(path)]
    if not moved:
        return out
    for sitedir in _site_dirs() if sitedirs is None else sitedirs:
        if sitedir not in out:
            continue
        added = _pth_paths(sitedir)
        head = out[:out.index(sitedir) + 1]  # site adds what is not on the path yet (sys.path[0] comes later)
        out = head + [d for d in added if d not in head[1:]] + [e for e in out[len(head):] if e not in added]
    return out


def _site_dirs() -> list[str]:
    import site

    own = getattr(site, "getsitepackages", None)  # (absent from some embedded Pythons' site)
    return [*(own() if own else []), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]


def _pth_paths(sitedir: str) -> list[str]:
    """The directories `sitedir`'s .pth files add to sys.path, read as site reads them."""
    out: list[str] = []
    try:
        names = sorted(n for n in os.listdir(sitedir) if n.endswith(".pth"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(sitedir, name), "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        try:
            lines = raw.decode("utf-8-sig").splitlines()
        except UnicodeDecodeError:
            lines = raw.decode(locale.getpreferredencoding(False), errors="replace").splitlines()
        for line in lines:
            if not line.strip() or line.startswith(("#", "import ", "import\t")):
                continue
            entry = os.path.abspath(os.path.join(sitedir, line.rstrip()))
            if os.path.exists(entry) and entry not in out:
                out.append(entry)
    return out


def _use_connection_file(ip, path: str) -> None:
    """The kernel's connection file is now the server's for this kernel id: `%connect_info`,
    `jupyter console --existing` and sys.argv name it, as they would in a fresh kernel."""
    if "-f" in sys.argv[:-1]:
        sys.argv[sys.argv.index("-f") + 1] = path
    app = getattr(getattr(ip, "kernel", None), "parent", None)
    if app is not None and hasattr(app, "connection_file"):
        try:
            app.connection_file = path
        except Exception as exc:  # noqa: BLE001 — a trait that refuses it leaves the old name shown
            log.info("gpuctx: could not rename the connection file to %s: %s", path, exc)
