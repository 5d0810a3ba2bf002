"""The pre-warm hook in a real jupyter_server with real kernels (no GPU here: the warm-up
imports torch, then skips CUDA and says why)."""
from __future__ import annotations

import json
import os
import time

from .harness.kernels import run as kernel_run
from .harness.kernels import start as kernel_start
from .harness.kernels import stop as kernel_stop
from .harness.notebooks import STATUS, kernel_config_env, notebook
from .harness.notebooks import warm_status as status
from .harness.waiting import wait_for

HERE = os.path.dirname(__file__)


def test_hook_warms_on_start_and_on_restart(server_factory):
    srv = server_factory("--GpuctxServer.warm_policy=always")
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    first = status(ks)
    assert first["source"] == "server hook"
    assert first["state"] == "skipped" and "imported torch only; no GPU is visible" in first["detail"]
    assert "import torch" in first["phases"]
    ks.close()
    assert srv.api("POST", f"/api/kernels/{kid}/restart")[0] == 200
    ks = srv.channels(kid)
    second = status(ks)
    assert second["pid"] != first["pid"] and second["source"] == "server hook"
    r = ks.execute("import torch; torch.ones(3).sum().item()")
    assert "3.0" in r.text  # torch was imported by the warm-up: the cell just uses it
    ks.close()


def test_readiness_does_not_wait_for_the_warm_up(server_factory, tmp_path):
    release = tmp_path / "release"
    env = {"PYTHONPATH": os.pathsep.join([os.path.join(HERE, "data", "slowimport"), os.environ.get("PYTHONPATH", "")]),
           "GPUCTX_TEST_RELEASE": str(release)}
    srv = server_factory("--GpuctxServer.warm_policy=always", "--GpuctxServer.warm_imports=gpuctx_slow_import",
                         env=env)
    ks = srv.channels(srv.start_kernel())
    ks.wait_ready()
    # ready while warming: the warm-up reaches the import (held until release) with the kernel
    # answering all along
    def in_the_import():
        now = status(ks, wait=0)
        return now if now["phase"] == "import gpuctx_slow_import" else None

    assert wait_for(in_the_import, timeout=60, every=0.2)["state"] == "running"
    assert ks.execute("6 * 7").text == "42"  # and cells run meanwhile
    release.write_text("go")
    done = status(ks)
    assert done["state"] == "skipped" and "import gpuctx_slow_import" in done["phases"]
    ks.close()


def test_auto_warms_only_notebooks_that_use_a_gpu_framework(server_factory, tmp_path):
    notebook(tmp_path / "train.ipynb", "import torch\nmodel = torch.nn.Linear(2, 2)")
    notebook(tmp_path / "plain.ipynb", "print('hello')")
    notebook(tmp_path / "magic.ipynb", "%gpu use auto")
    notebook(tmp_path / "optout.ipynb", "import torch", metadata={"gpuctx": {"warm": False}})
    notebook(tmp_path / "library.ipynb", "from transformers import AutoModel")  # a library built on torch
    srv = server_factory()  # auto is the default policy
    states = {}
    for name in ("train", "plain", "magic", "optout", "library"):
        ks = srv.channels(srv.start_kernel(path=f"{name}.ipynb"))
        states[name] = status(ks)
        ks.close()
    assert states["train"]["state"] == "skipped" and states["train"]["source"] == "server hook", states
    assert states["magic"]["state"] == "skipped" and states["library"]["state"] == "skipped", states
    assert states["plain"]["state"] == "off" and "uses no GPU framework" in states["plain"]["detail"]
    assert states["optout"]["state"] == "off" and "opts out" in states["optout"]["detail"]


def test_gpuctx_warm_0_opts_out(server_factory):
    srv = server_factory("--GpuctxServer.warm_policy=always", env={"GPUCTX_WARM": "0"})
    ks = srv.channels(srv.start_kernel())
    st = status(ks)
    assert st["state"] == "off" and "opted out (GPUCTX_WARM=0)" in st["detail"]
    ks.close()


def test_a_failing_warm_up_is_recorded_logged_once_and_the_kernel_works_on(server_factory):
    srv = server_factory("--GpuctxServer.warm_policy=always", "--GpuctxServer.warm_imports=gpuctx_no_such_module")
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    st = status(ks)
    assert st["state"] == "failed" and "import gpuctx_no_such_module: ModuleNotFoundError" in st["detail"]
    r = ks.execute("%gpu status")
    assert "warm-up: failed" in r.text
    assert ks.execute("1 + 1").text == "2"
    ks.close()
    wait_for(lambda: "gpuctx warm-up failed" in srv.log())  # the kernel's stderr reaches the server's log
    assert srv.api("DELETE", f"/api/kernels/{kid}")[0] == 204
    wait_for(lambda: f"Kernel shutdown: {kid}" in srv.log())  # nothing more can come from it
    assert srv.log().count("gpuctx warm-up failed") == 1


def test_never_leaves_kernels_alone(server_factory):
    srv = server_factory("--GpuctxServer.warm_policy=never")
    ks = srv.channels(srv.start_kernel())
    r = ks.execute("print('_gpuctx' in dir(get_ipython()))")
    assert r.stdout.strip() == "False"
    ks.close()


def test_kernel_config_alone_turns_warming_on(tmp_path):
    """The route for kernels jupyter_server does not start (VS Code, JupyterHub images)."""
    km, kc = kernel_start(env=kernel_config_env(tmp_path))
    try:
        r = kernel_run(kc, STATUS.format(wait=60))
        st = json.loads(r.stdout.strip().splitlines()[-1])
        assert st["source"] == "kernel config" and st["state"] == "skipped"
        assert "import torch" in st["phases"]
    finally:
        kernel_stop(km, kc)


def test_kernels_behind_a_gateway_are_warmed_on_start_and_restart(server_factory, kernel_gateway):
    srv = server_factory("--GpuctxServer.warm_policy=always", f"--GatewayClient.url={kernel_gateway}")
    kid = srv.start_kernel()
    ks = srv.channels(kid)
    loaded = lambda: ks.execute("print('_gpuctx' in dir(get_ipython()))").stdout.strip() == "True"  # noqa: E731
    wait_for(loaded, timeout=30)  # the server's warm request is the kernel's first; wait until it has run
    st = status(ks)
    assert st["source"] == "server hook" and st["state"] == "skipped"
    ks.close()
    assert srv.api("POST", f"/api/kernels/{kid}/restart")[0] == 200
    ks = srv.channels(kid)
    wait_for(loaded, timeout=30)
    assert status(ks)["pid"] != st["pid"]
    ks.close()


def test_device_assignment_policies():
    from dataclasses import replace

    from gpuctx_jupyter.core.devices import VisibleDevice
    from gpuctx_jupyter.server.launch import pick_device

    from .harness.gpus import h200

    devs = [VisibleDevice(0, h200(0, used_gib=50)), VisibleDevice(1, h200(1, used_gib=5)),
            VisibleDevice(2, h200(2, used_gib=5))]
    assert pick_device(devs, "least-used", 0) == 1  # most free; the lower ordinal on a tie
    assert [pick_device(devs, "round-robin", turn) for turn in range(4)] == [0, 1, 2, 0]
    lost = [devs[0], VisibleDevice(1, replace(devs[1].record, error="GPU is lost")), devs[2]]
    assert pick_device(lost, "least-used", 0) == 2
    assert pick_device([], "least-used", 0) is None
    assert pick_device(devs, "off", 0) is None


def test_round_robin_turns_go_to_notebooks_not_to_the_pools_standbys(monkeypatch, nvml_records):
    """Every notebook opened is followed by a refill of the warm pool: a standby's launch taking
    a turn put every notebook on cuda:0 of two GPUs."""
    import asyncio
    import logging

    from gpuctx_jupyter.server.config import GpuctxServer
    from gpuctx_jupyter.server.launch import Launcher
    from gpuctx_jupyter.server.notebooks import Notebooks
    from gpuctx_jupyter.server.tasks import Background

    from .harness.gpus import h200

    nvml_records([h200(0), h200(1)])
    log = logging.getLogger("test")
    launcher = Launcher(GpuctxServer(assign_devices="round-robin"), log, None, Notebooks(), Background(log))

    async def opens():
        got = []
        for n in range(4):
            got.append(await launcher._device(f"kernel-{n}"))
            await launcher._device(None)  # the refill after it
        return got + [await launcher._device("kernel-1")]  # a restart keeps its device

    assert asyncio.run(opens()) == ["0", "1", "0", "1", "1"]


def test_a_framework_that_is_not_installed_is_skipped_not_failed(server_factory):
    srv = server_factory("--GpuctxServer.warm_policy=always", "--GpuctxServer.warm_frameworks=jax")
    ks = srv.channels(srv.start_kernel())
    st = status(ks)
    assert st["state"] == "skipped" and st["detail"] == "jax is not installed in this kernel"
    ks.close()


def test_a_gateway_warm_request_that_fails_is_logged_with_its_exception_type(caplog):
    """The warm request to a gateway kernel waits at most gateway_timeout, and says what failed."""
    import asyncio
    import logging
    import queue
    from types import SimpleNamespace

    from jupyter_client.session import Session

    from gpuctx_jupyter.server.config import GpuctxServer
    from gpuctx_jupyter.server.launch import Launcher
    from gpuctx_jupyter.server.notebooks import Notebooks
    from gpuctx_jupyter.server.tasks import Background

    class SilentClient:  # a kernel that takes the request and never answers
        session = Session()
        shell_channel = SimpleNamespace(send=lambda msg: None)

        async def start_channels(self, **kwargs):
            pass

        async def get_shell_msg(self, timeout):
            await asyncio.sleep(min(timeout, 0.05))
            raise queue.Empty

        def stop_channels(self):
            pass

    def unreachable():
        raise ConnectionRefusedError("gateway gone")

    kernels = {"silent": SimpleNamespace(client=SilentClient), "gone": SimpleNamespace(client=unreachable)}
    log = logging.getLogger("test-gateway-hook")
    mkm = SimpleNamespace(get_kernel=kernels.__getitem__)
    hook = Launcher(GpuctxServer(gateway_timeout=0.3), log, None, Notebooks(), Background(log), gateway=True,
                    kernel_manager=mkm)
    with caplog.at_level(logging.WARNING, logger="test-gateway-hook"):
        t0 = time.monotonic()
        asyncio.run(hook._send_warm_request("silent", {}))
        assert time.monotonic() - t0 < 5
        asyncio.run(hook._send_warm_request("gone", {}))
    assert [r.getMessage() for r in caplog.records] == [
        "gpuctx: could not ask kernel silent to warm up: NoReply: no reply within 0.3 s",
        "gpuctx: could not ask kernel gone to warm up: ConnectionRefusedError: gateway gone"]


def test_kernels_get_a_bounded_jax_compilation_cache_unless_they_name_one(server_factory, tmp_path):
    jax_env = "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('JAX_')}))"
    srv = server_factory(env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"})
    ks = srv.channels(srv.start_kernel())
    env = json.loads(ks.execute(jax_env).stdout)
    ks.close()
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache" / "gpuctx" / "jax")
    assert int(env["JAX_COMPILATION_CACHE_MAX_SIZE"]) == 4 * 2**30
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "2"  # the user's own setting is kept
    own = server_factory(env={"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")})
    ks = own.channels(own.start_kernel())
    assert json.loads(ks.execute(jax_env).stdout)["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "mine")
    ks.close()
    off = server_factory("--GpuctxServer.jax_compilation_cache=off")
    ks = off.channels(off.start_kernel())
    assert "JAX_COMPILATION_CACHE_DIR" not in json.loads(ks.execute(jax_env).stdout)
    ks.close()
