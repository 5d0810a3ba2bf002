"""What `%gpu list`, `%gpu status` and `%gpu mem` show, built as `render.Report`s from plain inputs
(an inventory, the switcher, the warm-up record), apart from the magics so each is testable alone."""
from __future__ import annotations

import dataclasses
import os
import shutil
import textwrap
from dataclasses import dataclass, field

from ..contract import POOL_NOTE
from ..core import frameworks as fws
from ..core import inventory
from .render import Report, Section, gib, pct, temp

NO_GPU_TITLE = "No GPU is visible to this kernel"
ALLOCATOR_HEADER = ["device", "framework", "allocated", "reserved", "peak"]
WARNINGS_SHOWN = 5  # thread warnings quoted in `%gpu status`, the latest ones


def text_width(cap: int = 100) -> int:
    """Columns for plain text: the terminal's (a kernel falls back to $COLUMNS or 80), at most `cap`."""
    return max(40, min(cap, shutil.get_terminal_size().columns))


def current_ordinal(switcher) -> int:
    """The ordinal new CUDA work of this kernel lands on."""
    if switcher.choice is not None:
        return switcher.choice.ordinal
    if fws.TORCH.loaded() and fws.TORCH.gpu_reason() is None:
        return fws.TORCH.current() or 0
    return 0


def no_gpu(reason: str) -> Report:
    return Report([Section(NO_GPU_TITLE, lines=[reason])], data={"devices": [], "reason": reason})


def list_report(inv: inventory.Inventory, switcher) -> Report:
    """`%gpu list`: one row per visible GPU, numbered by CUDA ordinal, with nvidia-smi's index beside."""
    reason = inv.no_gpu_reason()
    if reason:
        return no_gpu(reason)
    current = current_ordinal(switcher)
    rows, data, marked = [], [], set()
    for i, d in enumerate(inv.devices):
        r = d.record
        mark = "●" if d.ordinal == current else ""
        if mark:
            marked.add(i)
        mem = f"{gib(r.memory_used)} / {gib(r.memory_total)}" if r.memory_total else "–"
        state = f"error: {r.error}" if r.error else ""
        rows.append([mark, f"cuda:{d.ordinal}", str(r.nvml_index), r.name, mem, pct(r.utilization), temp(r.temperature),
                     str(len(r.processes)), state])
        data.append({"ordinal": d.ordinal, "nvidia_smi_index": r.nvml_index, "uuid": r.uuid, "name": r.name,
                     "memory_used": r.memory_used, "memory_total": r.memory_total,
                     "utilization": r.utilization, "temperature": r.temperature,
                     "processes": len(r.processes), "current": d.ordinal == current, "error": r.error})
    header = ["", "cuda", "nvidia-smi", "name", "memory used / total", "util", "temp", "procs", ""]
    if not any(row[-1] for row in rows):
        header, rows = header[:-1], [row[:-1] for row in rows]
    lines = [f"● current in this kernel: cuda:{current}" + ("" if switcher.choice else " (CUDA's default)")]
    visible = {d.record.uuid for d in inv.devices}
    hidden = [r for r in inv.records if r.uuid not in visible and not (r.mig_enabled and not r.mig_parent)]
    if hidden:
        lines.append("hidden by CUDA_VISIBLE_DEVICES: "
                     + ", ".join(f"nvidia-smi {r.nvml_index} ({r.name})" for r in hidden))
    lines.extend(inv.notes)
    return Report([Section("", header, rows, marked, lines)], data={"devices": data})


def allocator_rows(inv: inventory.Inventory) -> list[list[str]]:
    """This kernel's allocator figures (through `frameworks.allocator_figures`), then NVML's
    figure for the whole process, one row per framework and device."""
    torch = fws.TORCH
    torch_current = torch.current() if torch.loaded() and torch.initialized() else None
    rows = [[f"cuda:{f.ordinal}", f.framework, gib(f.allocated), gib(f.reserved), gib(f.peak)]
            for f in fws.allocator_figures()
            if f.reserved or f.peak or (f.framework == "torch" and f.ordinal == torch_current)]
    for ordinal, used in sorted(inventory.process_memory(inv).items()):
        rows.append([f"cuda:{ordinal}", "NVML (whole process)", "–", gib(used), "–"])
    return rows


def _warm_line(warm, no_gpu_reason: str | None) -> str:
    """The warm-up's summary; without a GPU, the reason is said once, at the top, not again here."""
    if no_gpu_reason and "no GPU is visible" in warm.detail:
        short = warm.detail[:warm.detail.index("no GPU is visible")] + "no GPU is visible (see above)"
        warm = dataclasses.replace(warm, detail=short)
    return "warm-up: " + warm.summary()


def _thread_lines(switcher) -> list[str]:
    """What the switcher says about threads the user starts, then its thread warnings that the
    report does not already quote (the latest few)."""
    lines = switcher.threads_report()
    lines += [f"warning: {w}" for w in switcher.thread_warnings[-WARNINGS_SHOWN:]
              if not any(w in line for line in lines)]
    return lines


def status_report(inv: inventory.Inventory, switcher, warm, plan_lines: list[str] | None = None,
                  pooled: str | None = None) -> Report:
    """`%gpu status`: without a GPU, that first (one line); then the device in force and who chose
    it, who started CUDA, the warm-up, where the kernel came from (`pooled`: the seconds it waited
    in the warm pool), each framework's state, this kernel's memory, threads."""
    choice = switcher.choice
    reason = inv.no_gpu_reason()
    started = [fw.name for fw in fws.loaded() if fw.initialized()]
    if choice:
        device = (f"device: cuda:{choice.ordinal} chosen by {choice.source}"
                  + (" (also the default for new tensors)" if choice.default else ""))
    elif reason:
        device = "device: none chosen (there is no GPU to choose)"
    else:
        device = "device: none chosen; frameworks use cuda:0, CUDA's default (`%gpu use N` to switch)"
    head = [device,
            "CUDA started by: " + (", ".join(started) if started else "nothing yet (no CUDA context in this kernel)"),
            _warm_line(warm, reason)]
    if pooled is not None:
        head.append(f"kernel: from gpuctx's warm pool (started and warmed {pooled} s before you asked for it)")
    elif os.environ.get(POOL_NOTE):
        head.append(f"kernel: started fresh, not from the warm pool: {os.environ[POOL_NOTE]}")
    rows, fw_data = [], {}
    for fw in fws.ALL:
        if not fw.loaded():
            state = "installed, not imported" if fw.installed() else "not installed"
            rows.append([fw.name, state, "–", "–"])
            fw_data[fw.name] = {"state": state}
            continue
        why = fws.reason_without_starting(fw)
        if why:
            rows.append([fw.name, why, "–", "–"])
            fw_data[fw.name] = {"state": why}
            continue
        cur = fw.current()
        rows.append([fw.name, "GPU ready" + (", CUDA started" if fw.initialized() else ""),
                     "–" if cur is None else f"cuda:{cur}", fw.default_device() or "cpu"])
        fw_data[fw.name] = {"state": "gpu", "current": cur, "default": fw.default_device(),
                            "cuda_started": fw.initialized()}
    sections = [Section(NO_GPU_TITLE, lines=[reason])] if reason else []
    sections += [Section("gpuctx status", lines=head),
                 Section("frameworks", ["framework", "state", "current", "default device"], rows)]
    mem = allocator_rows(inv)
    if mem:
        sections.append(Section("this kernel's GPU memory", ALLOCATOR_HEADER, mem))
    if plan_lines:  # what the warm-up read from the notebook, each step with the line that asked for it
        sections.append(Section("warm plan", lines=plan_lines))
    threads = _thread_lines(switcher)
    if threads and (not reason or switcher.thread_warnings):  # no GPU: nothing to follow, say nothing
        sections.append(Section("threads", lines=threads))
    return Report(sections, data={"choice": choice.__dict__ if choice else None, "frameworks": fw_data,
                                  "warmup": warm.as_dict(), "pooled": pooled is not None,
                                  "cuda_started": started, "no_gpu_reason": reason, "threads": threads})


def memory_report(inv: inventory.Inventory) -> Report:
    """`%gpu mem`: NVML's used/free/total per GPU with this kernel's share, then its allocators."""
    reason = inv.no_gpu_reason()
    if reason:
        return no_gpu(reason)
    mine = inventory.process_memory(inv)
    rows, data = [], []
    for d in inv.devices:
        r = d.record
        rows.append([f"cuda:{d.ordinal}", r.name, gib(r.memory_used), gib(r.memory_free), gib(r.memory_total),
                     gib(mine.get(d.ordinal)) if d.ordinal in mine else "–"])
        data.append({"ordinal": d.ordinal, "used": r.memory_used, "free": r.memory_free,
                     "total": r.memory_total, "this_kernel": mine.get(d.ordinal)})
    sections = [Section("GPU memory", ["device", "name", "used", "free", "total", "this kernel"], rows)]
    alloc = allocator_rows(inv)
    if alloc:
        sections.append(Section("allocators in this kernel", ALLOCATOR_HEADER, alloc))
    return Report(sections, data={"devices": data})


@dataclass(repr=False)  # keep Report's text repr
class WrappedReport(Report):
    """A Report whose plain text wraps one column to the terminal's width (HTML needs no help:
    the notebook wraps table cells itself). `wrap` names the column, by index, per section."""

    wrap: dict[int, int] = field(default_factory=dict)  # section index -> column index
    width: int = 0  # 0: text_width() when rendered

    def text(self) -> str:
        width = self.width or text_width()
        sections = []
        for i, s in enumerate(self.sections):
            col = self.wrap.get(i)
            if col is None or not s.header:
                sections.append(s)
                continue
            others = [max(len(str(c)) for c in column)
                      for j, column in enumerate(zip(s.header, *s.rows, strict=True)) if j != col]
            room = max(20, width - sum(others) - 2 * (len(s.header) - 1))
            rows: list[list[str]] = []
            for row in s.rows:
                pieces = textwrap.wrap(str(row[col]), room, break_on_hyphens=False) or [""]
                rows.append([*row[:col], pieces[0], *row[col + 1:]])
                rows += [["" if j != col else piece for j in range(len(row))] for piece in pieces[1:]]
            header = [*s.header[:col], textwrap.shorten(s.header[col], room), *s.header[col + 1:]]
            sections.append(dataclasses.replace(s, header=header, rows=rows, marked=set()))
        return Report(sections).text()
