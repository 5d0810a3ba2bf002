"""Recorded NVML traces: record real samples on a GPU machine, replay them where there is none.

    python -m gpuctx_jupyter.trace record --seconds 60 --interval 1 --out trace.jsonl

Replay is explicit and labelled: a server started with `--GpuctxServer.replay_trace=trace.jsonl`
serves the trace instead of NVML, and every snapshot says it is a replay (for UI tests and the
no-GPU demo). Nothing ever replays silently.

A trace is read whole and checked when it is loaded: a sample that cannot be read (not JSON, no
time `t`, a record of the wrong shape, such as memory as a string) is skipped with one log line
for the file, and fields a newer gpuctx added are ignored; so what is replayed is always records
of the shape the rest of gpuctx expects.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import platform
import time

from . import inventory, nvml
from .devices import GpuProcess, GpuRecord, resolve_visibility

VERSION = 1
log = logging.getLogger("gpuctx")

# The shape of a record in a trace: field -> (accepted JSON types, required). Fields not listed
# (from a newer gpuctx) are ignored.
_NUMBER = (int, float)
_FIELDS = {
    "nvml_index": (_NUMBER, True), "uuid": (str, True), "name": (str, True), "pci_bus_id": (str, False),
    "memory_total": (_NUMBER, False), "memory_used": (_NUMBER, False), "utilization": (_NUMBER, False),
    "temperature": (_NUMBER, False), "power_w": (_NUMBER, False), "power_limit_w": (_NUMBER, False),
    "mig_enabled": (bool, False), "mig_parent": (str, False), "mig_index": (_NUMBER, False),
    "persistence_mode": (bool, False), "error": (str, False),
}
_INTS = {"nvml_index", "memory_total", "memory_used", "utilization", "temperature", "mig_index"}


class BadRecord(ValueError):
    """A record in a trace that gpuctx cannot read."""


def record_to_dict(r: GpuRecord) -> dict:
    d = dataclasses.asdict(r)
    d["compute_capability"] = list(r.compute_capability) if r.compute_capability else None
    return d


def record_from_dict(d: dict) -> GpuRecord:
    """A GpuRecord from its trace form; BadRecord (saying which field) when it has another shape."""
    if not isinstance(d, dict):
        raise BadRecord(f"a record is a {type(d).__name__}, not an object")
    out: dict = {}
    for name, (types, required) in _FIELDS.items():
        value = d.get(name)
        if value is None:
            if required:
                raise BadRecord(f"a record has no {name!r}")
            if name in d:
                out[name] = None
            continue
        if not _is(value, types):
            raise BadRecord(f"{name!r} is {value!r}, not a {_type_name(types)}")
        out[name] = int(value) if name in _INTS else value
    cc = d.get("compute_capability")
    if cc is not None and not (isinstance(cc, list) and len(cc) == 2 and all(_is(v, int) for v in cc)):
        raise BadRecord(f"'compute_capability' is {cc!r}, not [major, minor]")
    out["compute_capability"] = tuple(cc) if cc else None
    processes = d.get("processes") or []
    if not isinstance(processes, list):
        raise BadRecord(f"'processes' is {processes!r}, not a list")
    out["processes"] = tuple(_process(p) for p in processes)
    return GpuRecord(**out)


def _process(p) -> GpuProcess:
    if not (isinstance(p, dict) and _is(p.get("pid"), int) and (p.get("used_memory") is None
                                                                or _is(p.get("used_memory"), _NUMBER))):
        raise BadRecord(f"a process is {p!r}, not {{pid, used_memory, kind}}")
    used = p.get("used_memory")
    return GpuProcess(pid=p["pid"], used_memory=None if used is None else int(used), kind=str(p.get("kind", "compute")))


def _is(value, types) -> bool:
    """JSON type check: booleans are not numbers, and a number is finite."""
    if isinstance(value, bool):
        return types is bool
    if types is bool:
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, types)


def _type_name(types) -> str:
    return "number" if types is _NUMBER else {str: "string", bool: "boolean"}.get(types, str(types))


def load_samples(lines: list[str]) -> tuple[list[tuple[float, list[GpuRecord]]], list[str]]:
    """The readable samples of a trace's sample lines, in time order, and what was wrong with
    each line skipped ("line 3: …", numbered as in the file, the header being line 1)."""
    samples, skipped = [], []
    for number, line in enumerate(lines, start=2):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise BadRecord("not an object")
            t = raw.get("t")
            if not _is(t, _NUMBER) or t < 0:
                raise BadRecord("no time 't'" if t is None else f"'t' is {t!r}, not seconds")
            records = raw.get("records")
            if not isinstance(records, list):
                raise BadRecord("no 'records' list")
            samples.append((float(t), [record_from_dict(r) for r in records]))
        except (ValueError, TypeError) as exc:  # json's errors and ours are ValueErrors
            skipped.append(f"line {number}: {exc}")
    samples.sort(key=lambda s: s[0])
    return samples, skipped


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

    def __init__(self, path: str, clock=time.monotonic, log=log):
        not_a_trace = f"{path} is not a gpuctx trace (record one with `python -m gpuctx_jupyter.trace record`)"
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
        try:
            header = json.loads(lines[0]) if lines else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("gpuctx_trace") != VERSION:
            raise ValueError(not_a_trace)
        self.header = header
        self.samples, skipped = load_samples(lines[1:])
        if skipped:
            log.warning("gpuctx: trace %s: skipped %d unreadable sample%s of %d (%s%s)", path, len(skipped),
                        "s" if len(skipped) > 1 else "", len(skipped) + len(self.samples), skipped[0],
                        "; …" if len(skipped) > 1 else "")
        if not self.samples:
            raise ValueError(f"{path} holds no readable samples" + (f" ({skipped[0]})" if skipped else ""))
        self.skipped = skipped
        self.path, self._clock, self._t0 = path, clock, clock()
        interval = header.get("interval")
        interval = float(interval) if _is(interval, _NUMBER) and interval > 0 else 1.0
        self.duration = self.samples[-1][0] + interval

    @property
    def label(self) -> dict:
        """What every replayed snapshot carries, so that no one mistakes it for live data."""
        return {"source": self.path, "recorded": self.header.get("recorded"), "host": self.header.get("host"),
                "driver": self.header.get("driver")}

    def at(self, elapsed: float) -> list[GpuRecord]:
        pos = elapsed % self.duration
        chosen = self.samples[0]
        for s in self.samples:
            if s[0] > pos:
                break
            chosen = s
        return list(chosen[1])

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
