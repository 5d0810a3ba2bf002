"""A real `jupyter server` in a subprocess, driven over REST and the kernel websocket as
JupyterLab drives it. Used by the server tests and by benchmarks/first_cell.py."""
from __future__ import annotations

import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime

import websocket  # websocket-client, a jupyter_server dependency

from .kernels import Run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(RuntimeError):
    """Another process bound the port first."""


class Server:
    def __init__(self, root: str, args=(), env: dict | None = None, app: str = "jupyter_server"):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        self.args, self.env, self.app = list(args), env, app
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(root, f".server-{self.port}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> Server:
        """Start the server and wait until it answers. A port taken between `free_port()` and the
        server's bind (parallel test workers) is retried on a fresh port."""
        try:
            for _attempt in range(3):
                try:
                    return self._start(timeout)
                except PortTaken:
                    self.port = free_port()
                    self.log_path = os.path.join(self.root, f".server-{self.port}.log")
            return self._start(timeout)
        except BaseException:
            self.stop()  # a server that did not come up is not left running
            raise

    def _start(self, timeout: float) -> Server:
        cmd = [sys.executable, "-m", self.app, f"--ServerApp.port={self.port}", "--ServerApp.ip=127.0.0.1",
               f"--IdentityProvider.token={self.token}", "--ServerApp.open_browser=False",
               f"--ServerApp.root_dir={self.root}", "--ServerApp.port_retries=0", "--allow-root", *self.args]
        env = dict(os.environ, **(self.env or {}))
        self._log = open(self.log_path, "w")  # noqa: SIM115 (open while the server runs)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.close()
                log = self.log()
                if "already in use" in log:
                    raise PortTaken(log)
                raise RuntimeError(f"jupyter server exited: {log}")
            try:
                self.api("GET", "/api/status", timeout=10)
                return self
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException, TimeoutError):
                # not listening yet, or another process holds the port: then the server exits saying
                # so, and start() retries on another port. A kernel's ZMQ socket on it accepts the
                # connection and never answers HTTP: hence the short timeout (asked again until the deadline)
                time.sleep(0.2)
        raise TimeoutError(f"jupyter server did not start: {self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path) as fh:
                return fh.read()
        except OSError:
            return ""

    def kernel_processes(self) -> dict[int, str]:
        """The server's kernel processes (any descendant started with `-f <connection file>`,
        standbys included): PID -> connection file."""
        import psutil

        out = {}
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return out
        for child in children:
            try:
                argv = child.cmdline()
                if child.status() != psutil.STATUS_ZOMBIE and "-f" in argv:
                    out[child.pid] = argv[argv.index("-f") + 1]
            except (psutil.Error, IndexError):
                pass
        return out

    def api(self, method: str, path: str, body=None, token: str | None = "default", timeout: float = 60,
            raw: bytes | None = None):
        """One REST call (`body` as JSON, or `raw` bytes as they are); returns (status, parsed JSON or None)."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, method=method, data=data)
        if token:
            req.add_header("Authorization", f"token {self.token if token == 'default' else token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw) if raw else None
            except ValueError:
                return err.code, {"raw": raw.decode(errors="replace")}

    def text(self, path: str, timeout: float = 60) -> str:
        """One authenticated GET of a text page (/metrics)."""
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode()

    def start_kernel(self, name: str = "python3", path: str | None = None) -> str:
        """A kernel as JupyterLab starts one: through a session when a notebook path is given."""
        if path is None:
            status, model = self.api("POST", "/api/kernels", {"name": name})
            assert status == 201, (status, model)
            return model["id"]
        status, model = self.api("POST", "/api/sessions", {"path": path, "type": "notebook",
                                                           "name": os.path.basename(path),
                                                           "kernel": {"name": name}})
        assert status == 201, (status, model)
        return model["kernel"]["id"]

    def kernel_pid(self, kernel_id: str) -> int:
        """The PID of the process behind `kernel_id`, as the kernel itself says (over its websocket)."""
        ks = self.channels(kernel_id)
        try:
            return int(ks.execute("import os; print(os.getpid())").stdout)
        finally:
            ks.close()

    def channels(self, kernel_id: str) -> KernelSocket:
        return KernelSocket(self, kernel_id)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)  # (its kernels' shutdowns, on a loaded machine: then SIGKILL)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if getattr(self, "_log", None):
            self._log.close()


class KernelSocket:
    """The kernel's websocket, JSON messages on the default protocol, like JupyterLab's."""

    def __init__(self, server: Server, kernel_id: str, timeout: float = 120):
        self.session = uuid.uuid4().hex
        url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id={self.session}"
        self.ws = websocket.create_connection(url, header=[f"Authorization: token {server.token}"], timeout=timeout)

    def send(self, msg_type: str, content: dict, channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": msg_type, "session": self.session, "username": "test",
                       "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel, "buffers": [],
        }))
        return msg_id

    def wait_ready(self, timeout: float = 120) -> float:
        """Seconds until the kernel answers kernel_info (what JupyterLab waits for)."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg_id = self.send("kernel_info_request", {})
            self.ws.settimeout(1.0)
            try:
                while True:
                    msg = json.loads(self.ws.recv())
                    if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "kernel_info_reply":
                        self.ws.settimeout(120)
                        return time.perf_counter() - t0
            except websocket.WebSocketTimeoutException:
                continue
        raise TimeoutError("kernel did not answer kernel_info")

    def execute(self, code: str, timeout: float = 120, silent: bool = False) -> Run:
        """Run `code` and wait for its reply and the kernel's idle; `silent` as a frontend's own
        requests (no history, no pre_run_cell: the kernel's cell hooks do not see it)."""
        t0 = time.perf_counter()
        msg_id = self.send("execute_request", {"code": code, "silent": silent, "store_history": not silent,
                                               "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
        run, idle = None, False
        out = Run(reply={})
        deadline = time.monotonic() + timeout  # for the whole cell: other kernels' messages keep coming
        others = 0
        while run is None or not idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {'reply' if run is None else 'idle'} to {code[:60]!r} within {timeout:g} s "
                                   f"({others} messages for other requests meanwhile)")
            self.ws.settimeout(left)
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                others += 1
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_reply":
                run = content
                out.in_kernel = in_kernel(msg)
            elif kind == "status" and content.get("execution_state") == "idle":
                idle = True
            else:
                out.absorb(msg)
        out.reply, out.seconds = run, time.perf_counter() - t0
        return out

    def close(self) -> None:
        self.ws.close()


def in_kernel(reply: dict) -> float | None:
    """An execute_reply's time inside the kernel: from ipykernel's `started` (its metadata) to the
    reply's own date, both on the kernel's clock; what the client measures beyond it is the trip
    through the server and the wait in the kernel's queue."""
    try:
        started = datetime.fromisoformat(reply["metadata"]["started"])
        return (datetime.fromisoformat(reply["header"]["date"]) - started).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def as_installed() -> dict:
    """gpuctx with its bytecode, as pip installs it: where PYTHONDONTWRITEBYTECODE is set (this
    sandbox, the GPU machine) an editable checkout has none, and every kernel would compile gpuctx
    while it starts — a cost no installation pays. For the benchmarks; returns what they record."""
    import compileall

    package = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "gpuctx_jupyter")
    compiled = compileall.compile_dir(package, quiet=1)
    return {"gpuctx_bytecode": bool(compiled), "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
            "pycache_prefix": sys.pycache_prefix}
