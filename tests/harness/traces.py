"""Composed replay traces: more GPUs than the recording machine had, made from a real recorded
trace, for UI states that need them (the panel's compact mode above `compactAbove` GPUs).

Each composed GPU is a copy of a recorded one (its samples unchanged) under a new nvidia-smi
index, UUID and PCI bus id. The header says the trace is composed and from what, and the file
name should say so too: the panel's replay banner shows the file name, so whoever sees it knows
the figures are recorded ones, replayed, and multiplied."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

# A fixed namespace: the same source composes the same UUIDs (the committed file is reproducible).
_NAMESPACE = uuid.UUID("6f1d3c5e-8a2b-4c7d-9e0f-0123456789ab")


def compose_trace(source: Path, gpus: int = 8, samples: int = 60) -> str:
    """The text of a trace with `gpus` GPUs, made from the first `samples` samples of `source`
    (a recorded trace): GPU i copies the recording's GPU i % n."""
    lines = source.read_text().splitlines()
    header = json.loads(lines[0])
    recorded = [json.loads(line) for line in lines[1:] if line.strip()][:samples]
    n = len(recorded[0]["records"])
    header = dict(header, host=f"{header.get('host')} (composed: {gpus} GPUs from {n})", composed={
        "from": source.name, "gpus": gpus, "samples": len(recorded),
        "how": f"GPU i is the recording's GPU i % {n} under a new index, UUID and PCI bus id; "
               f"made by tests/harness/traces.py:compose_trace",
    })
    out = [json.dumps(header)]
    for sample in recorded:
        records = []
        for i in range(gpus):
            r = dict(sample["records"][i % n])
            r["nvml_index"] = i
            r["uuid"] = f"GPU-{uuid.uuid5(_NAMESPACE, f'{source.name}/{i}')}"
            r["pci_bus_id"] = f"00000000:{0x10 + i:02X}:00.0"
            records.append(r)
        out.append(json.dumps({"t": sample["t"], "records": records}))
    return "\n".join(out) + "\n"
