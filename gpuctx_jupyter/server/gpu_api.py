"""What the GPU API's routes share: the settings, the process's one sampler, and the snapshot —
every exposed GPU, who holds what on it (holders.py), the warm pool, the suspended notebooks
(suspend.py) — built once per sample.

NVML is read in the process's one sampler thread (or an executor), never on the event loop of a
request; the websocket clients of the server share that sampler and, per tick, one serialised
snapshot. Every read path (REST, stream, /metrics) is as fault-tolerant as the sampler: a read or
a snapshot that fails becomes a snapshot that says why (`gpu: false`, `reason`), logged once per
distinct error, never a 500 or a traceback per tick.
"""
from __future__ import annotations

import asyncio
import json
import time

from ..core import inventory
from ..core.sampler import Sample, process_sampler
from . import snapshot
from .config import GpuctxServer


class GpuApi:
    def __init__(self, serverapp, cfg: GpuctxServer, replay=None, launcher=None, pool=None, lifecycle=None,
                 holders=None, pressure=None, culler=None, history=None, suspend=None, reported: dict | None = None,
                 typed=None):
        self.serverapp, self.cfg = serverapp, cfg
        self.sampler = process_sampler()
        self.replay = replay  # a trace.Replay: read from it, and label every snapshot
        self._read = replay.read if replay else inventory.take
        self.launcher, self.pool, self.lifecycle = launcher, pool, lifecycle
        self.holders, self.pressure, self.culler, self.suspend = holders, pressure, culler, suspend
        self.history = history  # history.StreamHistory: sent to each stream client first (None: off)
        self.typed = typed  # typed_cells.TypedCells: cells as they are typed, on their way to kernels
        # kernel id -> (local pid, own pid): the PIDs kernels report, shared with the holders round
        self.reported: dict[str, tuple[int | None, int]] = reported if reported is not None else {}
        self._message: tuple[Sample | None, str] = (None, "")
        self._logged: set[str] = set()  # errors already logged (each once)

    def log_once(self, what: str, exc: Exception) -> str:
        """`what failed: Type: message`, logged the first time it happens (not at every tick)."""
        line = f"{what} failed: {type(exc).__name__}: {exc}"
        if line not in self._logged and len(self._logged) < 100:
            self._logged.add(line)
            self.serverapp.log.error("gpuctx: %s (logged once)", line)
        return line

    def _take(self) -> inventory.Inventory:
        try:
            return self._read()
        except Exception as exc:  # as the sampler does: show it, keep serving
            return inventory.Inventory(nvml_error=self.log_once("reading the GPUs", exc))

    def remember_pid(self, kernel_id: str, local_pid: int | None, own_pid: int) -> None:
        """Keep the PID a kernel reported; entries of kernels gone meanwhile are dropped here."""
        live = set(self.serverapp.kernel_manager.list_kernel_ids())
        for gone in [k for k in self.reported if k not in live]:
            del self.reported[gone]
        self.reported[kernel_id] = (local_pid, own_pid)

    def _fresh(self) -> Sample | None:
        """The sampler's latest sample if no older than the fastest rate a client may ask for."""
        sample = self.sampler.latest
        return sample if sample and time.time() - sample.t <= self.cfg.min_interval else None

    async def read(self) -> Sample:
        sample = self._fresh()
        if sample is None:
            t = time.time()
            sample = Sample(t, await asyncio.get_running_loop().run_in_executor(None, self._take))
        return sample

    def read_now(self) -> Sample:
        """For /metrics, which jupyter_server serves synchronously: NVML is µs per field."""
        return self._fresh() or Sample(time.time(), self._take())

    def snapshot(self, sample: Sample) -> dict:
        try:
            snap = snapshot.build(sample.inventory, sample.t, self.cfg.expose_gpus,
                                  lambda: snapshot.list_kernels(self.serverapp, self.reported))
        except Exception as exc:  # a record of an unexpected shape: say so, as an answer
            snap = {"gpu": False, "reason": self.log_once("building the GPU snapshot", exc), "time": sample.t,
                    "devices": [], "hidden": [], "notes": []}
        if self.replay is not None:
            snap["replay"] = self.replay.label
        snap["pool"] = self.pool_status()
        if self.holders is not None:
            self._add_holders(snap)
        if self.suspend is not None:
            try:
                self.suspend.annotate(snap)
            except Exception as exc:  # the snapshot stands without the extra fields
                self.log_once("adding suspended kernels to the GPU snapshot", exc)
        if self.history is not None:
            try:
                self.history.annotate(snap, sample, self.sampler)
            except Exception as exc:  # the snapshot stands without the extra fields
                self.log_once("adding the GPU history to the snapshot", exc)
        return snap

    def _add_holders(self, snap: dict) -> None:
        """Idle time, allocator figures and culling per kernel, and the "holders" block."""
        cfg, culler, pressure = self.cfg, self.culler, self.pressure
        try:
            self.holders.annotate(snap, cfg.idle_holder_seconds, culler.cull_at if culler else {},
                                  cfg.cull_warning_seconds)
        except Exception as exc:  # the snapshot stands without the extra fields
            self.log_once("adding idle times to the GPU snapshot", exc)
        snap["holders"] = {"idle_holder_seconds": cfg.idle_holder_seconds,
                           "release_below_free_fraction": cfg.release_below_free_fraction,
                           "release_idle_seconds": cfg.release_idle_seconds,
                           "cull_after_s": cfg.cull_idle_gpu_kernels_after,
                           "cull_warning_s": cfg.cull_warning_seconds,
                           "released": pressure.history[-5:] if pressure else [],
                           "culled": culler.culled[-5:] if culler else []}

    def pool_status(self) -> dict | None:
        """The warm pool's status (None without a pool); never an exception."""
        if self.pool is None:
            return None
        try:
            return self.pool.status()
        except Exception as exc:
            return {"error": self.log_once("reading the pool's status", exc)}

    def stream_message(self, sample: Sample) -> str:
        """One serialised message per sample, whatever the number of clients."""
        if self._message[0] is not sample:
            self._message = (sample, json.dumps({"type": "snapshot", **self.snapshot(sample)}))
        return self._message[1]
