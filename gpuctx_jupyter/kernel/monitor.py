"""The live GPU monitor inside a notebook, from stock ipywidgets (no custom JavaScript).

Every monitor in a kernel shares the process's one sampler thread; a monitor only turns the
sampler's reads into widget updates (comm messages, which flow while other cells run). Closing
the last monitor stops the sampler.
"""
from __future__ import annotations

import html
import time
import weakref

import ipywidgets as widgets

from ..core import frameworks as fws
from ..core import inventory
from ..core.devices import SpecError, VisibleDevice, parse_spec
from ..core.sampler import Point, Sample, Sampler, process_sampler
from .render import gib

_open: "weakref.WeakSet[GpuMonitor]" = weakref.WeakSet()


def sparkline(points: list[Point], now: float, window: float, total_memory: int | None,
              width: int = 240, height: int = 40) -> str:
    """An inline SVG of utilisation (solid) and memory (dashed) over the last `window` seconds."""
    def x(t):
        return width * (1 - (now - t) / window)

    def line(values, style):
        pts = [(x(p.t), height * (1 - v)) for p, v in values if v is not None]
        if len(pts) < 2:
            return ""
        coords = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
        return f"<polyline fill='none' points='{coords}' {style}/>"

    shown = [p for p in points if now - p.t <= window]
    util = [(p, None if p.utilization is None else p.utilization / 100) for p in shown]
    mem = [(p, None if p.memory_used is None or not total_memory else p.memory_used / total_memory) for p in shown]
    return (f"<svg width='{width}' height='{height}' role='img' aria-label='utilisation and memory, last "
            f"{window:.0f} s' style='background:rgba(127,127,127,0.08)'>"
            + line(util, "stroke='#2e7d32' stroke-width='1.5'")
            + line(mem, "stroke='#1565c0' stroke-width='1.5' stroke-dasharray='3,2'")
            + "</svg>")


def card_view(dev: VisibleDevice, sample: Sample, history: list[Point], window: float, pids: set[int],
              live: bool = True) -> dict:
    """Everything one GPU's card shows, as plain values (built without widgets: testable)."""
    r = dev.record
    mine = [p for p in r.processes if p.pid in pids]
    view = {
        "title": f"cuda:{dev.ordinal} · {r.name} (nvidia-smi {r.nvml_index})",
        "error": r.error,
        "utilization": r.utilization,
        "memory_used": r.memory_used,
        "memory_total": r.memory_total,
        "temperature": r.temperature,
        "power": r.power_w,
        "power_limit": r.power_limit_w,
        "processes": [{"pid": p.pid, "memory": p.used_memory, "mine": p.pid in pids} for p in r.processes],
        "this_kernel_nvml": sum(p.used_memory or 0 for p in mine) if mine else None,
        "allocator": None,
        "svg": sparkline(history, sample.t, window, r.memory_total),
    }
    torch = fws.TORCH
    if live and torch.loaded() and torch.initialized() and dev.ordinal < torch.device_count():
        m = torch.memory(dev.ordinal)
        if m:
            view["allocator"] = {"allocated": m.allocated, "reserved": m.reserved, "peak": m.peak}
    return view


class _Card(widgets.VBox):
    def __init__(self):
        self.title = widgets.HTML()
        self.util = widgets.FloatProgress(min=0, max=100, description="util", bar_style="success")
        self.mem = widgets.FloatProgress(min=0, max=1, description="memory", bar_style="info")
        self.numbers = widgets.HTML()
        self.plot = widgets.HTML()
        self.procs = widgets.HTML()
        super().__init__([self.title, widgets.HBox([widgets.VBox([self.util, self.mem]), self.plot]),
                          self.numbers, self.procs],
                         layout=widgets.Layout(border="1px solid rgba(127,127,127,0.3)", padding="4px",
                                               margin="2px 0"))

    def show(self, v: dict) -> None:
        self.title.value = f"<b>{html.escape(v['title'])}</b>"
        if v["error"]:
            self.title.value += f" <span style='color:#c62828'>error: {html.escape(v['error'])}</span>"
            self.util.bar_style = self.mem.bar_style = "danger"
        else:
            self.util.bar_style, self.mem.bar_style = "success", "info"
        self.util.value = v["utilization"] or 0
        if v["memory_total"]:
            self.mem.max = v["memory_total"]
            self.mem.value = min(v["memory_used"] or 0, v["memory_total"])
        temp = "–" if v["temperature"] is None else f"{v['temperature']}°C"
        power = "–" if v["power"] is None else f"{v['power']:.0f}" + (
            f" / {v['power_limit']:.0f} W" if v["power_limit"] else " W")
        util = "–" if v["utilization"] is None else f"{v['utilization']}%"
        parts = [f"util {util}", f"memory {gib(v['memory_used'])} / {gib(v['memory_total'])}", temp, power]
        if v["this_kernel_nvml"] is not None:
            parts.append(f"this kernel (NVML) {gib(v['this_kernel_nvml'], 2)}")
        if v["allocator"]:
            a = v["allocator"]
            parts.append(f"torch: allocated {gib(a['allocated'], 2)}, reserved {gib(a['reserved'], 2)}, "
                         f"peak {gib(a['peak'], 2)}")
        self.numbers.value = " · ".join(html.escape(p) for p in parts)
        self.plot.value = v["svg"]
        rows = "".join(
            f"<tr style='{'font-weight:bold' if p['mine'] else ''}'><td>{p['pid']}</td>"
            f"<td>{gib(p['memory'], 2)}</td><td>{'◀ this kernel' if p['mine'] else ''}</td></tr>"
            for p in v["processes"])
        self.procs.value = (f"<table><tr><th>pid</th><th>GPU memory</th><th></th></tr>{rows}</table>"
                            if rows else "<i>no processes</i>")


class GpuMonitor(widgets.VBox):
    """`%gpu monitor`: live cards for the chosen GPUs, fed by the kernel's one sampler."""

    def __init__(self, specs=(), interval: float = 1.0, history: float = 60.0, sampler: Sampler | None = None,
                 replay=None):
        self.specs, self.interval, self.window = tuple(specs), float(interval), float(history)
        # A replay (trace.Replay) gets a sampler of its own: live monitors in this kernel stay live.
        self.replay = replay
        self.sampler = sampler or (Sampler(read=replay.read) if replay else process_sampler())
        self.sampler.history.seconds = max(self.sampler.history.seconds, self.window)
        self.status = widgets.HTML("gpuctx monitor: waiting for the first sample…")
        self.stop_button = widgets.Button(description="stop", tooltip="stop this monitor", layout={"width": "60px"})
        self.stop_button.on_click(lambda _: self.close())
        self.cards: dict[str, _Card] = {}
        self._body = widgets.VBox()
        self._own = inventory.OwnPids()
        self._displayed_at: int | None = None
        self._cell: str | None = None  # the notebook cell that displayed it
        super().__init__([widgets.HBox([self.status, self.stop_button]), self._body])
        _open.add(self)
        self._token = self.sampler.subscribe(self.update, self.interval)

    def update(self, sample: Sample) -> None:
        """Called from the sampler thread: refresh every card from one sample."""
        inv = sample.inventory
        stamp = time.strftime("%H:%M:%S", time.localtime(sample.t))
        reason = inv.no_gpu_reason()
        if reason:
            self.status.value = html.escape(f"No GPU is visible: {reason} (checked {stamp})")
            self._body.children = ()
            return
        devices = self._wanted(inv.devices)
        pids = set() if self.replay else self._own.update(inv)
        self.status.value = self._replay_mark() + html.escape(
            f"gpuctx monitor · {len(devices)} GPU(s) · every {self.interval:g} s · last {self.window:g} s · {stamp}")
        fresh = False
        for d in devices:
            if d.record.uuid not in self.cards:
                self.cards[d.record.uuid] = _Card()
                fresh = True
            self.cards[d.record.uuid].show(card_view(d, sample, self.sampler.history.of(d.record.uuid),
                                                     self.window, pids, live=self.replay is None))
        if fresh or len(self._body.children) != len(devices):
            self._body.children = tuple(self.cards[d.record.uuid] for d in devices)

    def _replay_mark(self) -> str:
        """Said before anything else, so that no one takes a replay for live data."""
        if not self.replay:
            return ""
        label = self.replay.label
        text = (f"REPLAY of a trace recorded {label.get('recorded') or ''} on {label.get('host') or '?'}, "
                f"not live data ({label['source']})")
        return f"<b style='color:#e65100'>{html.escape(text)}</b><br>"

    def _wanted(self, devices) -> list[VisibleDevice]:
        """The devices the specs name, resolved as `%gpu use` resolves them (all without specs)."""
        if not self.specs:
            return list(devices)
        uuids = set()
        for spec in self.specs:
            try:
                uuids.add(parse_spec(spec, devices).record.uuid)
            except SpecError:
                pass  # the magic already refused a bad spec; a GPU that went away just drops out
        return [d for d in devices if d.record.uuid in uuids]

    def close(self) -> None:
        """Stop updates (the sampler stops with the last monitor) and remove the widget."""
        self.sampler.unsubscribe(self._token)
        _open.discard(self)
        for card in self.cards.values():
            card.close()
        super().close()

    def _ipython_display_(self):
        # `%gpu monitor` already displayed it: don't show it twice when the magic is the cell's last line.
        from IPython import get_ipython
        from IPython.display import display

        ip = get_ipython()
        if ip is not None and self._displayed_at == ip.execution_count:
            self._displayed_at = None
            return
        display(self._repr_mimebundle_(), raw=True)


def monitor(*specs, interval: float = 1.0, history: float = 60.0, replay=None) -> GpuMonitor:
    """Display a live monitor of the given GPUs (all when none) and return it (`.close()` stops it).
    `replay`: a `trace.Replay` (or a trace's path) to show instead of the live GPUs, labelled so."""
    from IPython import get_ipython
    from IPython.display import display

    if isinstance(replay, str):
        from ..core.trace import Replay

        replay = Replay(replay)
    ip = get_ipython()
    cell = _cell_id(ip)
    if cell is not None:  # re-running a cell replaces its monitor (its old output is gone) instead of stacking
        for old in [m for m in list(_open) if m._cell == cell]:
            old.close()
    mon = GpuMonitor(specs, interval=interval, history=history, replay=replay)
    mon._cell = cell
    display(mon._repr_mimebundle_(), raw=True)
    mon._displayed_at = ip.execution_count if ip is not None else None
    return mon


def _cell_id(ip) -> str | None:
    """The notebook cell being run, where the frontend says (JupyterLab sends `cellId`)."""
    kernel = getattr(ip, "kernel", None)
    try:
        parent = kernel.get_parent() if kernel is not None else None
    except Exception:
        return None
    return ((parent or {}).get("metadata") or {}).get("cellId")


def close_all() -> None:
    for mon in list(_open):
        mon.close()
