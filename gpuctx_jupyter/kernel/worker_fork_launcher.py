"""ipyparallel's local launchers, forking the controller and each engine from the workers'
imports (kernel/worker_zygote.py) instead of spawning a fresh Python: the same process, arguments,
environment, output file and stop, with its imports done. ipyparallel keeps every other part
(signals, stop, its output, noticing the end); only how the process comes to be differs.

Imports ipyparallel: imported only when the workers start.
"""
from __future__ import annotations

import os

import psutil
from ipyparallel.cluster.launcher import (
    LocalControllerLauncher,
    LocalEngineLauncher,
    LocalEngineSetLauncher,
    ProcessStateError,
)

from . import worker_zygote


class Forked:
    """A local process of ipyparallel's, forked from the process that did the workers' imports."""

    def start(self):
        if self.state != "before":
            raise ProcessStateError(f"The process was already started and has state: {self.state}")
        zygote = worker_zygote.current()
        if zygote is None:
            raise worker_zygote.ForkError("the process that did the workers' imports has ended")
        env = os.environ.copy()
        env.update(self.get_env())
        pid = zygote.fork(self.args, env, os.path.abspath(self.work_dir), self.output_file, zygote.timeout)

        def started():
            self.pid, self.process, self._zygote = pid, psutil.Process(pid), zygote
            self.notify_start(pid)

        if not worker_zygote.adopt_fork(self.cluster_id, started):
            worker_zygote.end_forked(pid)
            raise worker_zygote.ForkError("the workers were stopped while this one was forked")
        self._start_waiting()

    def _wait(self):
        """Wait for the engine to end; its exit status comes from the process it was forked from
        (its parent: psutil gives none for a process that is not this one's child)."""
        while not self._stop_waiting.is_set() and self.state == "running":
            try:
                self.process.wait(timeout=self.poll_seconds)
            except psutil.TimeoutExpired:
                continue
            break
        code = None
        for _ in range(50):  # its parent writes it as it collects the process: at once, or nearly
            code = self._zygote.exit_status(self.output_file)
            if code is not None or not self._zygote.alive():
                break
            self._stop_waiting.wait(0.02)
        stop_data = dict(exit_code=code, pid=self.pid, identifier=self.identifier)
        self.loop.add_callback(lambda: self.notify_stop(stop_data))


class ForkedEngineLauncher(Forked, LocalEngineLauncher):
    """One engine."""


class ForkedControllerLauncher(Forked, LocalControllerLauncher):
    """The controller: `Cluster(controller_launcher_class=ForkedControllerLauncher)`."""


class ForkedEngineSetLauncher(LocalEngineSetLauncher):
    """`Cluster(engine_launcher_class=ForkedEngineSetLauncher)`: its engines are forked."""

    launcher_class = ForkedEngineLauncher


def launchers() -> dict:
    """The Cluster's arguments for a controller and engines forked from the workers' imports."""
    return {"engine_launcher_class": ForkedEngineSetLauncher, "controller_launcher_class": ForkedControllerLauncher}
