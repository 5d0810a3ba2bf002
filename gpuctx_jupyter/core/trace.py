"""Recorded NVML traces: record real samples on a GPU machine, replay them where there is none.

    python -m gpuctx_jupyter.trace record --seconds 60 --interval 1 --out trace.jsonl

Replay is explicit and labelled: a server started with `--GpuctxServer.replay_trace=trace.jsonl`
serves the trace instead of NVML, and every snapshot says it is a replay (for UI tests and the
no-GPU demo). Nothing ever replays silently.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time

from . import inventory, nvml
from .devices import GpuProcess, GpuRecord, resolve_visibility

VERSION = 1


def record_to_dict(r: GpuRecord) -> dict:
    d = dataclasses.asdict(r)
    d["compute_capability"] = list(r.compute_capability) if r.compute_capability else None
    return d


def record_from_dict(d: dict) -> GpuRecord:
    d = dict(d)
    d["processes"] = tuple(GpuProcess(**p) for p in d.get("processes", ()))
    cc = d.get("compute_capability")
    d["compute_capability"] = tuple(cc) if cc else None
    return GpuRecord(**d)


def record(seconds: float, interval: float, out: str) -> int:
    """Write `seconds` of real NVML samples to `out` (JSON lines); returns the sample count."""
    nvml.init()
    start = time.monotonic()
    n = 0
    with open(out, "w") as fh:
        fh.write(json.dumps({"gpuctx_trace": VERSION, "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "host": platform.node(), "driver": nvml.driver_version(),
                             "cuda_driver": nvml.cuda_driver_version(), "interval": interval}) + "\n")
        while time.monotonic() - start < seconds:
            t = time.monotonic() - start
            fh.write(json.dumps({"t": round(t, 3), "records": [record_to_dict(r) for r in nvml.read_records()]})
                     + "\n")
            n += 1
            time.sleep(max(0.0, interval - (time.monotonic() - start - t)))
    return n


class Replay:
    """Plays a trace back in a loop, in real time; `read()` stands where `inventory.take` would."""

    def __init__(self, path: str, clock=time.monotonic):
        not_a_trace = f"{path} is not a gpuctx trace (record one with `python -m gpuctx_jupyter.trace record`)"
        with open(path) as fh:
            try:
                lines = [json.loads(line) for line in fh if line.strip()]
            except (ValueError, UnicodeDecodeError):
                raise ValueError(not_a_trace) from None
        if not lines or not isinstance(lines[0], dict) or lines[0].get("gpuctx_trace") != VERSION:
            raise ValueError(not_a_trace)
        self.header, self.samples = lines[0], lines[1:]
        if not self.samples:
            raise ValueError(f"{path} holds no samples")
        self.path, self._clock, self._t0 = path, clock, clock()
        last = self.samples[-1]["t"]
        self.duration = last + float(self.header.get("interval") or 1.0)

    @property
    def label(self) -> dict:
        """What every replayed snapshot carries, so that no one mistakes it for live data."""
        return {"source": self.path, "recorded": self.header.get("recorded"), "host": self.header.get("host"),
                "driver": self.header.get("driver")}

    def at(self, elapsed: float) -> list[GpuRecord]:
        pos = elapsed % self.duration
        chosen = self.samples[0]
        for s in self.samples:
            if s["t"] > pos:
                break
            chosen = s
        return [record_from_dict(d) for d in chosen["records"]]

    def read(self, env=None) -> inventory.Inventory:
        import os

        inv = inventory.Inventory(records=self.at(self._clock() - self._t0))
        inv.visibility = resolve_visibility(inv.records, os.environ if env is None else env)
        inv.notes.extend(inv.visibility.notes)
        return inv


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gpuctx_jupyter.trace", description="Record an NVML trace.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record real NVML samples (needs a GPU)")
    rec.add_argument("--seconds", type=float, default=60)
    rec.add_argument("--interval", type=float, default=1.0)
    rec.add_argument("--out", default="trace.jsonl")
    args = ap.parse_args(argv)
    try:
        n = record(args.seconds, args.interval, args.out)
    except nvml.NvmlUnavailable as exc:
        raise SystemExit(f"cannot record: {exc}")
    print(f"recorded {n} samples to {args.out}")


if __name__ == "__main__":
    main()
