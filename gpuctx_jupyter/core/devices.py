"""The device model: which GPUs exist, which ones CUDA shows this process, and under which ordinal.

Pure logic over plain dataclasses, so that every rule is testable without a GPU; reading the
records from the driver lives in `nvml.py`. CUDA ordinals are not NVML indices: CUDA orders
devices fastest first by default, and CUDA_VISIBLE_DEVICES hides and reorders them, so the
mapping is worked out here from the same environment variables CUDA reads.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FASTEST_FIRST = "FASTEST_FIRST"
PCI_BUS_ID = "PCI_BUS_ID"


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML reports on a device; `pid` is a host PID, which differs inside containers."""

    pid: int
    used_memory: int | None  # bytes; None where the driver does not say (e.g. WDDM)
    kind: str  # "compute", "graphics" or "compute+graphics" (listed by NVML as both)


@dataclass(frozen=True)
class GpuRecord:
    """One NVML snapshot of a physical GPU or a MIG instance; fields NVML cannot give are None."""

    nvml_index: int  # nvidia-smi's index (for a MIG instance: its parent's)
    uuid: str  # "GPU-…" or "MIG-…"
    name: str
    pci_bus_id: str = ""  # "00000000:65:00.0", upper-case hex
    compute_capability: tuple[int, int] | None = None
    memory_total: int | None = None  # bytes
    memory_used: int | None = None
    utilization: int | None = None  # percent
    temperature: int | None = None  # °C
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig_enabled: bool = False
    mig_parent: str | None = None  # parent GPU uuid, for a MIG instance
    mig_index: int | None = None
    persistence_mode: bool | None = None
    error: str | None = None  # why the device could not be read in full (e.g. the GPU is lost)

    @property
    def memory_free(self) -> int | None:
        if self.memory_total is None or self.memory_used is None:
            return None
        return self.memory_total - self.memory_used


@dataclass(frozen=True)
class VisibleDevice:
    """A device as this process's CUDA sees it: `ordinal` is what torch, cupy and jax call it."""

    ordinal: int
    record: GpuRecord


@dataclass(frozen=True)
class Visibility:
    """What CUDA will show this process, and the reasons when that differs from what exists."""

    devices: tuple[VisibleDevice, ...]
    cuda_visible_devices: str | None  # the raw value; None when unset
    device_order: str  # FASTEST_FIRST or PCI_BUS_ID
    notes: tuple[str, ...]  # sentences for a person: dropped entries, estimates, unusable GPUs

    @property
    def empty_reason(self) -> str | None:
        """Why no GPU is visible, if none is; the magics show it instead of an empty list."""
        if self.devices:
            return None
        value = self.cuda_visible_devices
        if value == "":
            return "CUDA_VISIBLE_DEVICES is set to an empty string, which hides every GPU"
        if value is not None and not value.strip():
            return f"CUDA_VISIBLE_DEVICES is set to blanks ({value!r}), which hides every GPU"
        # resolve_visibility puts the note that explains an empty result last.
        return self.notes[-1] if self.notes else "no GPU that CUDA can use was found on this machine"


class SpecError(ValueError):
    """A device spec the user typed that names no single visible device; the message says what to do."""


def cuda_enumeration(records: Sequence[GpuRecord], device_order: str) -> list[GpuRecord]:
    """The devices CUDA enumerates, in CUDA's order, before CUDA_VISIBLE_DEVICES applies.

    PCI_BUS_ID sorts by PCI bus id (NVML index where that is unknown), which is nvidia-smi's order.
    FASTEST_FIRST, CUDA's default, ranks by a performance estimate that cannot be read without
    initialising CUDA; this approximates it by higher compute capability first, then bus id. That
    is exact for identical GPUs; for mixed ones the magics check the result against the
    framework's UUIDs once CUDA is up. A GPU in MIG mode is replaced by its MIG instances in
    mig_index order (CUDA cannot use the GPU itself, so one without instances drops out).
    """
    if device_order not in (FASTEST_FIRST, PCI_BUS_ID):
        raise ValueError(f"device_order must be {FASTEST_FIRST} or {PCI_BUS_ID}, not {device_order!r}")

    def by_bus(r: GpuRecord) -> tuple:
        return (not r.pci_bus_id, r.pci_bus_id, r.nvml_index)

    def fastest(r: GpuRecord) -> tuple:
        cc = r.compute_capability
        return ((1, 0, 0) if cc is None else (0, -cc[0], -cc[1])) + by_bus(r)

    gpus = sorted(
        (r for r in records if r.mig_parent is None),
        key=by_bus if device_order == PCI_BUS_ID else fastest,
    )
    order: list[GpuRecord] = []
    for gpu in gpus:
        if not gpu.mig_enabled:
            order.append(gpu)
            continue
        instances = [r for r in records if r.mig_parent == gpu.uuid]
        order.extend(sorted(instances, key=lambda r: (r.mig_index is None, r.mig_index or 0)))
    return order


def resolve_visibility(records: Sequence[GpuRecord], env: Mapping[str, str]) -> Visibility:
    """Apply CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES from `env` as the CUDA driver does.

    Rules measured with cuInit on driver 580 (CUDA 13) on two H200s, stricter or looser than
    one might guess:
    - CUDA_DEVICE_ORDER must be exactly FASTEST_FIRST or PCI_BUS_ID; any other value, even
      lower case or empty, makes CUDA fail to start (CUDA_ERROR_INVALID_DEVICE).
    - An index entry is read like strtoul: leading blanks and a sign are allowed and anything
      after the digits is ignored ("1x" is 1). A UUID entry is "GPU-" or "MIG-" (either, upper
      case) and a unique prefix of the hex digits, in any case, with dashes anywhere; after 32
      digits the rest is ignored. The first entry fixes the kind: the other kind is invalid.
    - At the first invalid entry (garbage, negative, out of range, unknown or ambiguous UUID,
      empty) CUDA stops: the devices before it stay visible and the rest are dropped.
    - A device listed twice before that point makes CUDA fail to start.
    The legacy `MIG-GPU-<uuid>/<gi>/<ci>` form is not resolved and counts as invalid.
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    raw_order = env.get("CUDA_DEVICE_ORDER")
    note = device_order_problem(raw_order)
    if note:
        return Visibility((), value, FASTEST_FIRST, (note,))
    order = raw_order or FASTEST_FIRST

    notes: list[str] = []
    gpus = [r for r in records if r.mig_parent is None]
    kinds = {(r.name, r.compute_capability) for r in gpus if r.error is None}
    if order == FASTEST_FIRST and len(kinds) > 1:
        notes.append(
            "the GPUs differ, so CUDA's fastest-first order is estimated here; set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID before CUDA starts to make ordinals follow nvidia-smi"
        )
    for gpu in gpus:
        if gpu.mig_enabled and not any(r.mig_parent == gpu.uuid for r in records):
            notes.append(
                f"GPU {gpu.nvml_index} ({gpu.name}) is in MIG mode with no MIG instance: "
                "CUDA cannot use it until one is created"
            )
    enumeration = cuda_enumeration(records, order)
    chosen = enumeration if value is None else _apply_visible_devices(value, enumeration, notes)
    return Visibility(
        devices=tuple(VisibleDevice(i, r) for i, r in enumerate(chosen)),
        cuda_visible_devices=value,
        device_order=order,
        notes=tuple(notes),
    )


def _apply_visible_devices(
    value: str, enumeration: list[GpuRecord], notes: list[str]
) -> list[GpuRecord]:
    """The devices a CUDA_VISIBLE_DEVICES value keeps, in its order; the notes say what CUDA did."""
    chosen: list[GpuRecord] = []
    if not value.strip():
        return chosen
    kind = None
    for entry in value.split(","):
        record, entry_kind, problem = _match_entry(entry, enumeration)
        if record is not None and kind not in (None, entry_kind):
            record, problem = None, (
                f"is {'an index' if entry_kind == 'index' else 'a UUID'} in a list of "
                f"{'indices' if kind == 'index' else 'UUIDs'}, which CUDA does not allow"
            )
        if record is None:
            rest = ", which leaves no GPU" if not chosen else ""
            notes.append(f"CUDA_VISIBLE_DEVICES entry {entry!r} {problem}: "
                         f"CUDA ignores it and every entry after it{rest}")
            break
        if any(record is c for c in chosen):
            notes.append(f"CUDA_VISIBLE_DEVICES={value!r} names {record.uuid or 'a device'} twice, "
                         "so CUDA fails to start (CUDA_ERROR_INVALID_DEVICE): list each GPU once")
            return []
        if problem:
            notes.append(f"CUDA_VISIBLE_DEVICES entry {entry!r} {problem}")
        kind = entry_kind
        chosen.append(record)
    return chosen


_INDEX = re.compile(r"\s*([+-]?)([0-9]+)")  # what strtoul reads; CUDA ignores what follows
_UUID_PREFIXES = ("GPU-", "MIG-")


def _match_entry(entry: str, enumeration: list[GpuRecord]) -> tuple[GpuRecord | None, str, str]:
    """(device or None, "index" or "uuid", what is wrong or worth saying about the entry)."""
    index = _INDEX.match(entry)
    if index:
        sign, digits = index.groups()
        if sign == "-" and int(digits):
            return None, "index", "is a negative index"
        if int(digits) >= len(enumeration):
            return None, "index", f"is out of range: CUDA sees {_count(len(enumeration))}"
        read_as = f"counts as {int(digits)}: CUDA reads its leading digits only"
        return enumeration[int(digits)], "index", "" if entry.strip() == digits else read_as
    if entry.startswith("MIG-GPU-"):
        return None, "uuid", "uses the legacy MIG-GPU-<uuid>/<gi>/<ci> form, which gpuctx does not resolve"
    if not entry.startswith(_UUID_PREFIXES):
        return None, "uuid", "is not a device: neither an index nor a GPU-/MIG- UUID"
    digits = ""
    for char in entry[4:]:
        if len(digits) == 32:
            break
        if char in "0123456789abcdefABCDEF":
            digits += char.lower()
        elif char != "-":
            return None, "uuid", f"has {char!r} where CUDA expects a hex digit of a UUID"
    matches = [r for r in enumeration if digits and _uuid_digits(r.uuid).startswith(digits)]
    if not matches:
        return None, "uuid", "matches no device UUID that CUDA can use"
    if len(matches) > 1:
        return None, "uuid", f"is ambiguous: it is a prefix of {len(matches)} device UUIDs"
    return matches[0], "uuid", ""


def _uuid_digits(uuid: str) -> str:
    return uuid[4:].replace("-", "").lower() if uuid.startswith(_UUID_PREFIXES) else ""


def _count(n: int) -> str:
    return "no device" if n == 0 else f"{n} device{'s' if n > 1 else ''} (0-{n - 1})"


_SPEC_HELP = "use an ordinal like 1, cuda:1, a GPU UUID, a name fragment or auto"
_ASCII_DIGITS = frozenset("0123456789")


@dataclass(frozen=True)
class Spec:
    """A device spec as typed, read without looking at any device: what kind of name it is."""

    kind: str  # "ordinal", "uuid", "name" or "auto"
    text: str  # stripped, as typed
    ordinal: int | None = None  # for kind "ordinal"


def read_spec(spec: str) -> Spec:
    """The syntax of a device spec, the same for every magic and for the server: `auto`, a CUDA
    ordinal (`1`, `cuda:1`, `cuda` meaning 0; ASCII digits only, so `١` or `²` is no ordinal),
    a GPU-/MIG- UUID or prefix, or a name fragment (it has a letter). SpecError otherwise."""
    text = spec.strip()
    key = text.lower()
    if key == "auto":
        return Spec("auto", text)
    ordinal = re.fullmatch(r"(?:cuda:)?([0-9]+)|cuda", key, flags=re.ASCII)
    if ordinal:
        return Spec("ordinal", text, int(ordinal.group(1) or 0))
    if key.startswith(("gpu-", "mig-")):
        return Spec("uuid", text)
    if key.startswith("cuda") or not re.search(r"[a-z]", key):
        if any(ch.isdigit() and ch not in _ASCII_DIGITS for ch in text):
            raise SpecError(f"{text!r} is not a device spec: write ordinals with the digits 0-9 "
                            "(1, cuda:1), or give a GPU UUID, a name fragment or auto")
        raise SpecError(f"{text!r} is not a device spec: {_SPEC_HELP}")
    return Spec("name", text)


def parse_spec(spec: str, devices: Sequence[VisibleDevice]) -> VisibleDevice:
    """The visible device that a user's spec (`%gpu use …`, `%%on_gpu …`) names.

    Accepts what `read_spec` reads: a CUDA ordinal, a GPU-/MIG- UUID or unique prefix, a
    fragment of exactly one device's name (`h200`), or `auto`: the most free memory, ties to the
    lowest ordinal. Ordinals, not NVML indices, because they are what the user's framework uses.
    """
    if not devices:
        raise SpecError("no GPU is visible")
    parsed = read_spec(spec)
    text, key = parsed.text, parsed.text.lower()
    if parsed.kind == "auto":
        return most_free(devices)

    if parsed.kind == "ordinal":
        wanted = parsed.ordinal
        for device in devices:
            if device.ordinal == wanted:
                return device
        raise SpecError(
            f"GPU {wanted} is not visible: this kernel sees {_ordinals(devices)} "
            "(use one of those ordinals, or `%gpu list`)"
        )

    if parsed.kind == "uuid":
        matches = [d for d in devices if d.record.uuid.lower().startswith(key)]
        if len(matches) > 1:
            raise SpecError(
                f"{text!r} matches {len(matches)} GPUs ({_listed(matches)}): "
                "give a longer UUID prefix or an ordinal"
            )
        if not matches:
            listing = ", ".join(f"{d.ordinal} {d.record.uuid}" for d in devices)
            raise SpecError(f"{text!r} matches no visible GPU (visible: {listing})")
        return matches[0]

    matches = [d for d in devices if key in d.record.name.lower()]
    if len(matches) > 1:
        raise SpecError(f"{text!r} matches {len(matches)} GPUs ({_listed(matches)}): give an ordinal or a UUID")
    if not matches:
        listing = ", ".join(f"{d.ordinal} {d.record.name}" for d in devices)
        raise SpecError(f"{text!r} matches no visible GPU (visible: {listing})")
    return matches[0]


def most_free(devices: Sequence[VisibleDevice]) -> VisibleDevice | None:
    """The device with the most free memory (`auto`, least-used assignment): a device whose free
    memory is unknown comes last, and a tie goes to the lowest ordinal. None for no device."""
    def rank(device: VisibleDevice) -> tuple:
        free = device.record.memory_free
        return (free is None, -(free or 0), device.ordinal)

    return min(devices, key=rank, default=None)


def device_order_problem(value: str | None) -> str | None:
    """Why a CUDA_DEVICE_ORDER value makes CUDA fail to start, or None when CUDA accepts it.
    Only the exact spellings work: lower case or an empty value fail (measured with cuInit)."""
    if value is None or value in (FASTEST_FIRST, PCI_BUS_ID):
        return None
    return (f"CUDA_DEVICE_ORDER={value!r} is neither FASTEST_FIRST nor PCI_BUS_ID (spelled "
            "exactly so), so CUDA fails to start (CUDA_ERROR_INVALID_DEVICE): fix or unset it")


def _listed(devices: Sequence[VisibleDevice]) -> str:
    return ", ".join(str(d.ordinal) for d in devices)


def _ordinals(devices: Sequence[VisibleDevice]) -> str:
    ordinals = sorted(d.ordinal for d in devices)
    if len(ordinals) == 1:
        return f"GPU {ordinals[0]}"
    if ordinals == list(range(ordinals[0], ordinals[-1] + 1)):
        return f"GPUs {ordinals[0]}-{ordinals[-1]}"
    return "GPUs " + ", ".join(map(str, ordinals))
