"""ipyparallel's local launchers as the workers use them. Each ends its process when the line's
stop overtook its start: a cell's `_sync` calls run on ipyparallel's thread, and a launcher knows
its process only once its start returns, so a line interrupted just before stopped the cluster
without it, and it ran for the kernel's life. Where the workers' imports are done ahead
(kernel/worker_zygote.py), the controller and each engine are forked from them instead of
spawned: the same process, arguments, environment, output file and stop, with its imports done.
ipyparallel keeps every other part (signals, stop, its output, noticing the end).

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

# The clusters being stopped (ids are unique; one short string per stop). A fork may wait long
# for the workers' imports to finish, a spawn seconds on a loaded machine.
_abandoned: set[str] = set()


class Abandoned(RuntimeError):
    """The cluster was stopped while this process started: it was ended."""


def abandon(cluster_id: str) -> None:
    """Cluster `cluster_id` is stopping: a process started for it from now on is ended at once."""
    _abandoned.add(cluster_id)


class Stopped:
    """A launcher whose process ends at once when its cluster was stopped as it started."""

    def start(self):
        super().start()
        self._unless_abandoned()

    def _unless_abandoned(self):
        """Checked once the process counts as running: the stop marks the cluster abandoned before
        it looks, so either it finds this process running and stops it, or this sees the mark."""
        if self.cluster_id not in _abandoned:
            return
        try:
            procs = [self.process, *self.process.children(recursive=True)]
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        raise Abandoned(f"the workers were stopped while process {self.pid} started: it was ended")


class Forked(Stopped):
    """A local process of ipyparallel's, forked from the process that did the workers' imports."""

    def start(self):
        if self.state != "before":
            raise ProcessStateError(f"The process was already started and has state: {self.state}")
        zygote = worker_zygote.current()
        if zygote is None:
            raise worker_zygote.ForkError("the process that did the workers' imports has ended")
        env = os.environ.copy()
        env.update(self.get_env())
        self.pid = zygote.fork(self.args, env, os.path.abspath(self.work_dir), self.output_file, zygote.timeout)
        self.process = psutil.Process(self.pid)
        self._zygote = zygote
        self.notify_start(self.pid)
        self._start_waiting()
        self._unless_abandoned()

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


class StoppedEngineLauncher(Stopped, LocalEngineLauncher):
    """One engine, spawned."""


class StoppedControllerLauncher(Stopped, LocalControllerLauncher):
    """The controller, spawned."""


class StoppedEngineSetLauncher(LocalEngineSetLauncher):
    launcher_class = StoppedEngineLauncher


class ForkedEngineLauncher(Forked, LocalEngineLauncher):
    """One engine, forked."""


class ForkedControllerLauncher(Forked, LocalControllerLauncher):
    """The controller, forked."""


class ForkedEngineSetLauncher(LocalEngineSetLauncher):
    launcher_class = ForkedEngineLauncher


def launchers(forked: bool) -> dict:
    """The Cluster's arguments for its local controller and engines (forked from the workers'
    imports with `forked`)."""
    if forked:
        return {"engine_launcher_class": ForkedEngineSetLauncher, "controller_launcher_class": ForkedControllerLauncher}
    return {"engine_launcher_class": StoppedEngineSetLauncher, "controller_launcher_class": StoppedControllerLauncher}
