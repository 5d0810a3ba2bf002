"""Time from opening a notebook to a kernel that answers, warming off against on, through a real jupyter_server.

    python benchmarks/readiness.py [--notebook mlp_adamw] [--repeat 12] [--direct 16] [--json benchmarks/results/readiness.json]

Readiness is what JupyterLab waits for before it shows the kernel idle: POST /api/sessions (the
server starts the kernel and waits for its first kernel_info reply), then the frontend's own
kernel_info over the websocket. A kernel that warms up begins importing right after that first
reply, in a thread, and an import holds the GIL while it loads extension modules: the frontend's
kernel_info may wait behind it. Two servers on one root: warming off, and the defaults without the
imports standby (each kernel's own warm-up: the case where it matters; with a standby the kernel
has imported long before). Each repeat opens the notebook on both, in turn (the order alternates),
and closes it. Per open, on one clock (CLOCK_MONOTONIC is shared by all processes of a host): the
POST, the kernel process's start (/proc: what the server did before it launched the kernel), the
websocket's kernel_info asked and answered, and when the kernel's warm-up began.

A server's readiness varies by hundreds of ms from open to open (the server, the websocket, the
kernel's start), more than what gpuctx adds. `--direct N` also starts N pairs of kernels for the
notebook straight through jupyter_client, one plain and one as the server launches it (`--ext=gpuctx`
and the server's warm-up settings), and times start → first kernel_info reply: what loading gpuctx
adds to a kernel's start, with little else around it. Prints medians (and per-pair differences)
and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.harness.server import KernelSocket, Server, as_installed  # noqa: E402

NOTEBOOKS = os.path.join(ROOT, "benchmarks", "notebooks")
PID = "import os as _os\nprint(_os.getpid())\ndel _os"
LOADED_IN = "print(getattr(getattr(get_ipython(), '_gpuctx', None), 'loaded_in', None))"  # `%load_ext gpuctx`, s
WARM_BEGAN = ("_m = getattr(get_ipython(), '_gpuctx', None)\n"
              "print(getattr(getattr(_m, 'warmer', None) and _m.warmer.status, 'started', None))\ndel _m")


def spawned(pid: int) -> float | None:
    """When process `pid` started, on CLOCK_MONOTONIC (the kernel counts both from boot; 10 ms steps)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, field 22 of stat
    except (OSError, ValueError, IndexError):
        return None


def open_once(srv: Server, path: str) -> dict:
    t0 = time.monotonic()
    status, model = srv.api("POST", "/api/sessions", {"path": path, "type": "notebook", "name": os.path.basename(path),
                                                      "kernel": {"name": "python3"}})
    assert status == 201, (status, model)
    posted = time.monotonic()
    ks = KernelSocket(srv, model["kernel"]["id"])
    asked = time.monotonic()
    ks.wait_ready()
    ready = time.monotonic()
    started = spawned(int(ks.execute(PID, silent=True).stdout.strip()))
    deadline = time.monotonic() + 5  # (a warm-up still waiting to begin says None: asked again)
    while (began := ks.execute(WARM_BEGAN, silent=True).stdout.strip()) in ("", "None") and time.monotonic() < deadline:
        time.sleep(0.2)
    loaded = ks.execute(LOADED_IN, silent=True).stdout.strip()
    ks.close()
    srv.api("DELETE", f"/api/sessions/{model['id']}")
    rel = lambda t: None if t is None else round(t - t0, 4)  # noqa: E731
    return {"post": rel(posted), "spawned": rel(started), "ws_asked": rel(asked), "ready": rel(ready),
            "warm_began": rel(float(began)) if began not in ("", "None") else None,
            "gpuctx_loaded_in": float(loaded) if loaded not in ("", "None") else None}


def start_direct(path: str, gpuctx: bool, loaded: list) -> float:
    """Seconds from launching a kernel to its first kernel_info reply (jupyter_client's wait);
    with gpuctx, how long loading it took is added to `loaded`."""
    from jupyter_client import KernelManager

    from gpuctx_jupyter.contract import SESSION, WarmSettings

    env = {**os.environ, SESSION: path}
    if gpuctx:
        env.update(WarmSettings(policy="auto", recipe="notebook", source="the server").to_env())
    km = KernelManager(kernel_name="python3")
    t0 = time.monotonic()
    km.start_kernel(extra_arguments=["--ext=gpuctx"] if gpuctx else [], env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        seconds = time.monotonic() - t0
        if gpuctx:
            out = []  # (stdout only: a warning of the kernel's may come as stderr meanwhile)
            kc.execute_interactive(LOADED_IN, timeout=30, output_hook=lambda m: out.append(
                m["content"].get("text", "") if m["content"].get("name") == "stdout" else ""))
            last = ("".join(out).strip().splitlines() or ["None"])[-1]
            loaded.append(float(last) if last != "None" else float("nan"))
        return seconds
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def through_servers(root: str, path: str, repeat: int) -> dict[str, list[dict]]:
    common = ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True", "--MappingKernelManager.default_kernel_name=python3"]
    env = {"GPUCTX_SERVER_IMPORT_STANDBYS": "0", "GPUCTX_SERVER_POOL": "off",
           "JUPYTER_DATA_DIR": os.path.join(root, ".jupyter-data")}
    servers = {"warming off": Server(root, [*common, "--GpuctxServer.warm_policy=never"], env=env).start(),
               "warming on, no standby": Server(root, common, env=env).start()}
    runs: dict[str, list[dict]] = {name: [] for name in servers}
    try:
        for rep in range(repeat):
            for name in (list(servers) if rep % 2 == 0 else list(servers)[::-1]):
                runs[name].append(open_once(servers[name], path))
                time.sleep(0.5)  # the closed kernel's process is gone before the next open
    finally:
        for srv in servers.values():
            srv.stop()
    ms = lambda v: f"{v * 1000:.0f}" if v is not None else "–"  # noqa: E731
    print(f"readiness of {path}, {repeat} opens each; medians in ms from the POST")
    print(f"{'server':<26}{'POST':>8}{'kernel spawned':>16}{'ws connected':>14}{'ready':>8}{'warm-up began':>15}"
          f"{'gpuctx loaded in':>18}")
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) if all(r[k] is not None for r in rs) else None
               for k in ("post", "spawned", "ws_asked", "ready", "warm_began", "gpuctx_loaded_in")}
        print(f"{name:<26}{ms(med['post']):>8}{ms(med['spawned']):>16}{ms(med['ws_asked']):>14}{ms(med['ready']):>8}"
              f"{ms(med['warm_began']):>15}{ms(med['gpuctx_loaded_in']):>18}")
    off, on = runs["warming off"], runs["warming on, no standby"]
    diffs = [b["ready"] - a["ready"] for a, b in zip(off, on)]
    print(f"on − off, per pair (ms): {', '.join(f'{d * 1000:+.0f}' for d in diffs)}; median {statistics.median(diffs) * 1000:+.0f}")
    before = [r for r in on if r["warm_began"] is not None and r["warm_began"] < r["ready"]]
    print(f"warm-up began before the websocket's kernel_info was answered in {len(before)} of {len(on)} opens")
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebook", default="mlp_adamw")
    ap.add_argument("--repeat", type=int, default=12)
    ap.add_argument("--direct", type=int, default=0, help="also N pairs of kernels started without a server")
    ap.add_argument("--json", default="benchmarks/results/readiness.json")
    args = ap.parse_args()
    bytecode = as_installed()
    root = tempfile.mkdtemp(prefix="gpuctx-readiness-")
    shutil.copy(os.path.join(NOTEBOOKS, f"{args.notebook}.ipynb"), root)
    path = f"{args.notebook}.ipynb"
    direct: dict[str, list[float]] = {"plain": [], "gpuctx": [], "gpuctx_loaded_in": []}
    for rep in range(args.direct):
        for name in (("plain", "gpuctx") if rep % 2 == 0 else ("gpuctx", "plain")):
            direct[name].append(start_direct(os.path.join(root, path), name == "gpuctx", direct["gpuctx_loaded_in"]))
    runs = through_servers(root, path, args.repeat) if args.repeat else {}
    if args.direct:
        diffs = [b - a for a, b in zip(direct["plain"], direct["gpuctx"])]
        print(f"kernels started without a server, {args.direct} pairs: start → kernel_info, median "
              f"{statistics.median(direct['plain']) * 1000:.0f} ms plain, {statistics.median(direct['gpuctx']) * 1000:.0f} ms "
              f"with gpuctx; per pair {statistics.median(diffs) * 1000:+.0f} ms at the median "
              f"({min(diffs) * 1000:+.0f} to {max(diffs) * 1000:+.0f}); loading gpuctx took "
              f"{statistics.median(direct['gpuctx_loaded_in']) * 1000:.0f} ms at the median, in the kernel")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"python": platform.python_version(), "cpus": os.cpu_count(), **bytecode, "notebook": path, "runs": runs,
                   "direct": direct,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, fh, indent=1)


if __name__ == "__main__":
    main()
