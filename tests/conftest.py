"""Fixtures over the real components of tests/harness/: an IPython shell with gpuctx loaded,
jupyter_server subprocesses (plain, with the warm pool, behind a Kernel Gateway), one Chromium per
browser-test module, NVML records for machines without a GPU, and the `gpu` marker's skip rule."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict

import pytest

from gpuctx_jupyter.core import nvml

from .harness import cache, kernels
from .harness.gpus import NO_GPU
from .harness.server import Server, free_port
from .harness.waiting import wait_for

# The automatic warm reserve (a standby kernel per kernelspec a GPU notebook uses) is the servers'
# default; every server the suite starts inherits this and keeps none, so that a test sees only
# the kernels it starts. Tests about the pool say so (--GpuctxServer.pool_size, or this variable).
os.environ.setdefault("GPUCTX_SERVER_POOL", "0")

# What Jupyter and IPython keep in the home folder (JupyterLab's settings and workspaces, IPython's
# history database, the servers' runtime files, gpuctx's import profile in Jupyter's data folder)
# is kept per test process: two xdist workers never see one another's theme switch, half-written
# settings file or locked history, and no test writes into the home folder.
_STATE = tempfile.mkdtemp(prefix="gpuctx-tests-home-")
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)
for _var, _name in (("JUPYTERLAB_SETTINGS_DIR", "lab-settings"), ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"),
                    ("IPYTHONDIR", "ipython"), ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
                    ("JUPYTER_DATA_DIR", "jupyter-data")):
    os.environ[_var] = os.path.join(_STATE, _name)


def pytest_collection_modifyitems(config, items):
    slowest_files_first(config, items)
    if NO_GPU is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test, no GPU here: {NO_GPU} (run scripts/gpu-check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- the slowest test files first, so that parallel workers finish together ------------------------
# `make test` hands whole files to xdist workers in collection order (--no-loadscope-reorder): the
# files that took longest in the last run go first. A file never timed yet is guessed from the
# longest timeout its tests declare (the Binder test's first build). Timings: .cache/tests/.
FILE_SECONDS = cache.ROOT / "file-seconds.json"
_seconds: dict[str, float] = defaultdict(float)


def known_file_seconds() -> dict[str, float]:
    try:
        return json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker orders the files alike, from the timings the controller read once."""
    node.workerinput["gpuctx_file_seconds"] = known_file_seconds()


def slowest_files_first(config, items) -> None:
    workerinput = getattr(config, "workerinput", None)
    known = workerinput["gpuctx_file_seconds"] if workerinput else known_file_seconds()
    guess: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        declared = max((m.args[0] for m in item.iter_markers("timeout") if m.args), default=0)
        guess[path] = max(guess.get(path, 1.0), declared / 5)
    items.sort(key=lambda item: (-known.get(path := item.nodeid.split("::")[0], guess[path]), path))


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput") or not _seconds:
        return  # a worker: the controller writes
    known = known_file_seconds()
    known.update({path: round(seconds, 1) for path, seconds in _seconds.items()})
    FILE_SECONDS.parent.mkdir(parents=True, exist_ok=True)
    tmp = FILE_SECONDS.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    os.replace(tmp, FILE_SECONDS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test with servers shows their logs (a CI failure is read from its output alone).
    Browser tests skipped for want of a browser share one location, so `-ra` sums them up in
    one line (`SKIPPED [7] ...: no Chromium ...: make browser ...`), not one line per test."""
    report = yield
    if report.failed and call.when == "call" and "server_factory" in item.fixturenames:
        for n, srv in enumerate(item.funcargs["server_factory"].servers):  # what the pool and the server said
            lines = [ln for ln in srv.log().splitlines() if "running over TCP without encryption" not in ln]
            report.sections.append((f"server {n} log (last 60 lines)", "\n".join(lines[-60:])))
    if report.skipped and "browser" in item.fixturenames and isinstance(report.longrepr, tuple):
        from .harness.browser import missing_browser

        code = missing_browser.__code__
        report.longrepr = (code.co_filename, code.co_firstlineno, report.longrepr[2])
    return report


@pytest.fixture
def shell():
    """The real IPython shell with gpuctx loaded; unloaded again afterwards."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "gpuctx")
    yield ip
    ip.run_line_magic("unload_ext", "gpuctx")
    ip.run_cell("pass")  # leave a clean last result


@pytest.fixture
def nvml_records(monkeypatch):
    """Make NVML report the given records (NVML is the driver's library, not ours)."""

    def install(records):
        monkeypatch.setattr(nvml, "read_records", lambda: list(records))
        monkeypatch.setattr(nvml, "driver_version", lambda: "580.159.03")
        monkeypatch.setattr(nvml, "cuda_driver_version", lambda: "13.0")

    return install


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(var, raising=False)
    return os.environ


@pytest.fixture(scope="module")
def loaded_kernel():
    """A real ipykernel with gpuctx loaded by `%load_ext gpuctx`, shared by a module's tests:
    (KernelManager, client)."""
    km, kc = kernels.start()
    r = kernels.run(kc, "%load_ext gpuctx")
    assert r.reply["status"] == "ok", r.error
    yield km, kc
    kernels.stop(km, kc)


@pytest.fixture
def server_factory(tmp_path):
    """Start real jupyter_servers with gpuctx enabled (python3 as the default kernel); all are
    stopped, and their kernels with them, when the test ends."""
    servers = []

    def make(*args, env=None):
        srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                     "--MappingKernelManager.default_kernel_name=python3", *args], env=env)
        servers.append(srv.start())
        return srv

    make.servers = servers
    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def pool_server(server_factory):
    """A server with a warm pool of one standby per kernelspec."""
    return lambda *args, env=None: server_factory("--GpuctxServer.pool_size=1", *args, env=env)


@pytest.fixture
def kernel_gateway(tmp_path, request):
    """A real Jupyter Kernel Gateway on a free port; its URL."""
    for _attempt in range(3):  # a port taken meanwhile by a parallel worker: try another
        proc, port = start_gateway(tmp_path)
        if proc:
            break
    else:
        pytest.fail("the kernel gateway found its port taken three times")
    yield f"http://127.0.0.1:{port}"
    # The test's servers first, while the gateway still answers their kernel shutdowns (else each
    # server retries a gateway that is gone for ~20 s before it exits).
    if "server_factory" in request.fixturenames:
        for srv in request.getfixturevalue("server_factory").servers:
            srv.stop()
    proc.terminate()
    proc.wait(20)


def start_gateway(tmp_path):
    """(process, port) of a gateway answering on its port, or (None, port) if the port was taken."""
    port = free_port()
    log_path = tmp_path / f"gateway-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
                                 f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
                                 "--JupyterWebsocketPersonality.list_kernels=True"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    gw = Server(str(tmp_path))  # only for its api() helper
    gw.port, gw.token = port, None

    def answers() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return gw.api("GET", "/api", token=None)[0] == 200
        except OSError:
            return False

    wait_for(answers, timeout=60)
    if proc.poll() is None:
        return proc, port
    assert "already in use" in log_path.read_text(), f"the kernel gateway exited: {log_path.read_text()}"
    return None, port


@pytest.fixture(scope="module")
def browser():
    """One headless Debian Chromium per browser-test module. Where none can run, its tests are
    skipped with one reason that names the fix — or fail, where GPUCTX_REQUIRE_BROWSER=1 (CI)."""
    from .harness.browser import Browser, browser_required, missing_browser

    why_not = missing_browser()
    if why_not and browser_required():
        pytest.fail(f"the browser tests are required here (GPUCTX_REQUIRE_BROWSER=1) but cannot run: {why_not}")
    if why_not:
        pytest.skip(why_not)
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def faulty(server_factory, tmp_path):
    """Real servers whose kernels' connection files go to a runtime folder of their own."""
    runtime = tmp_path / "runtime"

    def make(*args, env=None):
        srv = server_factory(*args, env={"JUPYTER_RUNTIME_DIR": str(runtime), **(env or {})})
        srv.runtime = str(runtime)
        return srv

    return make


@pytest.fixture(scope="module")
def lab_factory(browser, tmp_path_factory):  # the browser first: skipped without one, no lab started
    """Start real `jupyter lab`s for a browser-test module: `make(files, *args, env=None)` writes
    `files` ({name: text}) into a new folder and serves it (harness.browser.Lab); all are stopped
    when the module ends."""
    from .harness.browser import Lab

    labs = []

    def make(files: dict, *args, env=None, name: str = "lab"):
        root = tmp_path_factory.mktemp(name)
        for filename, text in files.items():
            (root / filename).write_text(text)
        lab = Lab(root, args, env=env)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.stop()


@pytest.fixture(scope="module")
def notebook_page(browser):
    """`open(lab, name)`: a new page with the notebook open and its kernel idle, closed when the
    module ends."""
    from .harness.browser import open_notebook

    pages = []

    def open_(lab, name: str):
        page = open_notebook(browser, lab, name)
        pages.append(page)
        return page

    yield open_
    for page in pages:
        if not page.is_closed():
            page.close()


@pytest.fixture
def site(tmp_path):
    """A site-packages folder the kernels get on PYTHONPATH, to install test packages into."""
    folder = tmp_path / "lib" / "site-packages"
    folder.mkdir(parents=True)

    def install(name: str, files: dict[str, str]) -> None:
        (folder / name).mkdir()
        for rel, code in files.items():
            (folder / name / rel).write_text(code)
    install.path = str(folder)
    return install
