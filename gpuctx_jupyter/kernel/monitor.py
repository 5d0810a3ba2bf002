"""The live GPU monitor inside a notebook, from stock ipywidgets (no custom JavaScript).

Every monitor in a kernel shares the process's one sampler thread; a monitor turns its reads into
widget updates (comm messages, which flow while other cells run). `stop()` ends the updates, the
last frame kept, "stopped"; it pauses itself (PAUSE_AFTER_S: "resume" updates again) in a kernel that
holds GPU memory and has run no cell for 20 min. `close()` also closes every widget of it, so none is
left for the frontend to look up, and leaves a static picture of its last frame (HTML and text), as
when its kernel shuts down or restarts: a saved notebook reopens with the picture, never with "Error
displaying widget: model not found". The sampler stops with the last listener.

The bars are HTML with `role="meter"` and their values for screen readers; the chart has its
scales written on it (0–100 % on the left, 0 to the GPU's memory on the right, the time span
below) and breaks its lines where no sample was taken.

Colours come from the JupyterLab theme (CSS variables, with fallbacks for the classic notebook):
utilisation is `--jp-brand-color1` and memory `--jp-accent-color1`, as in the GPU panel.
Where no frontend can draw widgets (IPython in a terminal, a plain script), `monitor()` prints one
line with one sample instead, and starts no thread.
"""
from __future__ import annotations

import html
import os
import re
import threading
import time
import uuid
import weakref

import ipywidgets as widgets
from IPython import get_ipython

from ..core import frameworks as fws
from ..core import inventory
from ..core.devices import SpecError, VisibleDevice, parse_spec
from ..core.sampler import Point, Sample, Sampler, process_sampler
from .render import gib, pct, temp, watts
from .state import of as state_of

_open: "weakref.WeakSet[GpuMonitor]" = weakref.WeakSet()
# Updates are comm messages, which jupyter_server counts as the kernel's activity: in a kernel that holds
# GPU memory a monitor pauses itself after this long without a cell, lest it never be idle to the server.
PAUSE_AFTER_S = 1200.0
STOP_TIP = "stop updating; the last frame stays"

# The panel's colours (labextension/style/base.css); the fallbacks are the light theme's values.
UTIL_COLOR = "var(--jp-brand-color1, #1976d2)"
MEMORY_COLOR = "var(--jp-accent-color1, #388e3c)"
ERROR_COLOR = "var(--jp-error-color1, #d32f2f)"
TEXT_COLOR = "var(--jp-ui-font-color1, rgba(0, 0, 0, 0.87))"
WARN_MARK = "var(--jp-warn-color0, #e65100)"  # a bar beside text, never text: 3.8:1 on white
TRACK_COLOR = "var(--jp-layout-color2, #eeeeee)"
# The replay banner as the panel draws it: light orange in both themes, so dark text (≥ 13:1).
REPLAY_STYLE = ("background:var(--jp-warn-color3, #ffe0b2);border:2px solid var(--jp-warn-color1, #f57c00);"
                "color:rgba(0, 0, 0, 0.87);border-radius:2px;padding:2px 8px;margin:0 0 4px")
NO_FRONTEND = "gpuctx monitor: widgets need a notebook frontend (JupyterLab, Notebook 7, VS Code)"


AXIS_COLOR = "var(--jp-ui-font-color2, rgba(0, 0, 0, 0.54))"  # 4.6:1 on the light theme's page
GAP_MIN_S = 3.0  # as the panel: samples further apart than this (and 2.5 intervals) have a gap between


def _segments(values: list[tuple[float, float | None]], gap: float) -> list[list[tuple[float, float]]]:
    """Runs of (t, value) with no missing value and no gap longer than `gap` seconds inside."""
    runs: list[list[tuple[float, float]]] = [[]]
    last_t = None
    for t, v in values:
        if v is None or (last_t is not None and t - last_t > gap):
            if runs[-1]:
                runs.append([])
        if v is not None:
            runs[-1].append((t, v))
        last_t = t
    return [r for r in runs if r]


def sparkline(points: list[Point], now: float, window: float, total_memory: int | None,
              interval: float = 1.0, width: int = 260, height: int = 64) -> str:
    """An inline SVG of utilisation (solid, 0–100 % on the left) and memory (dashed, 0 to the GPU's
    memory on the right) over the last `window` seconds, with its scales and time span written
    on it, and a break in the lines where no sample was taken. In the theme's colours: the SVG
    names them once as custom properties, as the panel's CSS does (CSS variables work in
    `style`, not in SVG presentation attributes)."""
    left, right, top, bottom = 32, width - 46, 4, height - 16

    def x(t):
        return left + (right - left) * (1 - (now - t) / window)

    def y(v):
        return bottom - (bottom - top) * v

    gap = max(GAP_MIN_S, 2.5 * interval)

    def lines(values, style):
        out = []
        for run in _segments(values, gap):
            if len(run) < 2:
                continue
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
            out.append(f"<polyline fill='none' points='{coords}' {style}/>")
        return "".join(out)

    shown = [p for p in points if now - p.t <= window]
    util = [(p.t, None if p.utilization is None else p.utilization / 100) for p in shown]
    mem = [(p.t, None if p.memory_used is None or not total_memory else p.memory_used / total_memory)
           for p in shown]
    text = f"style='fill:{AXIS_COLOR}' font-size='9' font-family='var(--jp-ui-font-family, sans-serif)'"
    grid = "".join(f"<line x1='{left}' x2='{right}' y1='{y(v):.1f}' y2='{y(v):.1f}' "
                   "style='stroke:var(--jp-border-color2, #e0e0e0)' stroke-width='1'/>" for v in (0.5,))
    total = html.escape(gib(total_memory)) if total_memory else "–"
    labels = (f"<text x='{left - 3}' y='{top + 6}' text-anchor='end' {text}>100%</text>"
              f"<text x='{left - 3}' y='{bottom}' text-anchor='end' {text}>0%</text>"
              f"<text x='{right + 3}' y='{top + 6}' {text}>{total}</text>"
              f"<text x='{right + 3}' y='{bottom}' {text}>0</text>"
              f"<text x='{left}' y='{height - 3}' {text}>−{window:.0f} s</text>"
              f"<text x='{right}' y='{height - 3}' text-anchor='end' {text}>now</text>")
    return (f"<svg width='{width}' height='{height}' role='img' aria-label='utilisation (solid, 0 to 100%) and "
            f"memory (dashed, 0 to {total}), last {window:.0f} s' style='--gpuctx-util-color:{UTIL_COLOR};"
            f"--gpuctx-memory-color:{MEMORY_COLOR}'>"
            f"<rect x='{left}' y='{top}' width='{right - left}' height='{bottom - top}' style='fill:{TRACK_COLOR}'/>"
            + grid + labels
            + lines(util, "style='stroke:var(--gpuctx-util-color)' stroke-width='1.5'")
            + lines(mem, "style='stroke:var(--gpuctx-memory-color)' stroke-width='1.5' stroke-dasharray='3 2'")
            + "</svg>")


def meter(label: str, fraction: float | None, text: str, spoken: str, color: str) -> str:
    """A labelled bar, as the panel draws it: the label and value above, the bar under them, a
    `role="meter"` with its value for screen readers."""
    percent = 0.0 if fraction is None else min(100.0, max(0.0, fraction * 100))
    return (f"<div style='margin:0 0 4px'><div style='display:flex;justify-content:space-between;gap:8px;"
            f"color:{TEXT_COLOR}'><span>{html.escape(label)}</span><span>{html.escape(text)}</span></div>"
            f"<div role='meter' aria-label='{html.escape(spoken, quote=True)}' aria-valuemin='0' "
            f"aria-valuemax='100' aria-valuenow='{percent:.0f}' aria-valuetext='{html.escape(text, quote=True)}' "
            f"style='height:10px;background:{TRACK_COLOR};border:1px solid rgba(127,127,127,0.5);"
            f"border-radius:2px;box-sizing:border-box;overflow:hidden'>"
            f"<div style='width:{percent:.1f}%;height:100%;background:{color}'></div></div></div>")


def meters_html(v: dict) -> str:
    """The card's utilisation and memory bars (error-coloured when the GPU errs)."""
    util_color = ERROR_COLOR if v["error"] else UTIL_COLOR
    mem_color = ERROR_COLOR if v["error"] else MEMORY_COLOR
    total = v["memory_total"]
    memory = f"{gib(v['memory_used'])} / {gib(total)}" if total else gib(v["memory_used"])
    fraction = (v["memory_used"] or 0) / total if total else None
    util = None if v["utilization"] is None else v["utilization"] / 100
    return ("<div style='min-width:14em;max-width:32em;flex:1 1 14em'>"
            + meter("Utilisation", util, pct(v["utilization"]), f"utilisation of {v['name']}", util_color)
            + meter("Memory", fraction, memory, f"memory of {v['name']}", mem_color)
            + "</div>")


def card_view(dev: VisibleDevice, sample: Sample, history: list[Point], window: float, pids: set[int],
              live: bool = True, interval: float = 1.0) -> dict:
    """Everything one GPU's card shows, as plain values (built without widgets: testable)."""
    r = dev.record
    mine = [p for p in r.processes if p.pid in pids]
    view = {
        "title": f"cuda:{dev.ordinal} · {r.name} (nvidia-smi {r.nvml_index})",
        "name": f"cuda:{dev.ordinal}",
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
        "svg": sparkline(history, sample.t, window, r.memory_total, interval),
    }
    torch = fws.TORCH
    if live and torch.loaded() and torch.initialized() and dev.ordinal < torch.device_count():
        m = torch.memory(dev.ordinal)
        if m:
            view["allocator"] = {"allocated": m.allocated, "reserved": m.reserved, "peak": m.peak}
    return view


def numbers_text(v: dict) -> str:
    """The card's line of figures, with the same formatters as `%gpu list` and the panel."""
    memory = f"{gib(v['memory_used'])} / {gib(v['memory_total'])}" if v["memory_total"] else gib(v["memory_used"])
    parts = [f"util {pct(v['utilization'])}", f"memory {memory}", temp(v["temperature"]),
             watts(v["power"], v["power_limit"])]
    if v["this_kernel_nvml"] is not None:
        parts.append(f"this kernel (NVML) {gib(v['this_kernel_nvml'])}")
    if v["allocator"]:
        a = v["allocator"]
        parts.append(f"torch: allocated {gib(a['allocated'])}, reserved {gib(a['reserved'])}, peak {gib(a['peak'])}")
    return " · ".join(parts)


class _Card(widgets.VBox):
    def __init__(self):
        self.title = widgets.HTML()
        self.meters = widgets.HTML(layout=widgets.Layout(flex="1 1 14em"))
        self.numbers = widgets.HTML()
        self.plot = widgets.HTML()
        self.procs = widgets.HTML()
        super().__init__([self.title, widgets.HBox([self.meters, self.plot],
                                                   layout=widgets.Layout(flex_flow="row wrap", align_items="center")),
                          self.numbers, self.procs],
                         layout=widgets.Layout(border="1px solid rgba(127,127,127,0.3)", padding="4px",
                                               margin="2px 0"))

    def show(self, v: dict) -> None:
        title = f"<b>{html.escape(v['title'])}</b>"
        if v["error"]:
            title += f" <span style='color:{ERROR_COLOR}'>error: {html.escape(v['error'])}</span>"
        self.title.value = title
        self.meters.value = meters_html(v)
        self.numbers.value = html.escape(numbers_text(v))
        self.plot.value = v["svg"]
        rows = "".join(
            f"<tr style='{'font-weight:bold' if p['mine'] else ''}'><td>{p['pid']}</td>"
            f"<td>{gib(p['memory'])}</td><td>{'◀ this kernel' if p['mine'] else ''}</td></tr>"
            for p in v["processes"])
        self.procs.value = (f"<table><tr><th>pid</th><th>GPU memory</th><th></th></tr>{rows}</table>"
                            if rows else "<i>no processes</i>")

    def html(self) -> str:
        """The card as one piece of static HTML: what a closed monitor leaves on the page."""
        return (f"<div style='border:1px solid rgba(127,127,127,0.3);padding:4px;margin:2px 0'>{self.title.value}"
                f"<div style='display:flex;flex-wrap:wrap;align-items:center;gap:8px'>{self.meters.value}"
                f"{self.plot.value}</div><div>{self.numbers.value}</div>{self.procs.value}</div>")


def widget_tree(root: widgets.Widget) -> list[widgets.Widget]:
    """`root` and every widget it holds — children, layouts, styles — each once, root first."""
    seen: dict[int, widgets.Widget] = {}
    stack = [root]
    while stack:
        w = stack.pop()
        if id(w) in seen:
            continue
        seen[id(w)] = w
        for name in w.keys:
            value = getattr(w, name, None)
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, widgets.Widget):
                    stack.append(v)
    return list(seen.values())


class GpuMonitor(widgets.VBox):
    """`%gpu monitor`: live cards for the chosen GPUs, fed by the kernel's one sampler."""

    def __init__(self, specs=(), interval: float = 1.0, history: float = 60.0, sampler: Sampler | None = None,
                 replay=None):
        self.specs, self.interval, self.window = tuple(specs), float(interval), float(history)
        # A replay (trace.Replay) gets a sampler of its own: live monitors in this kernel stay live.
        self.replay = replay
        self.sampler = sampler or (Sampler(read=replay.read) if replay else process_sampler())
        self.sampler.history.seconds = max(self.sampler.history.seconds, self.window)
        self._lock = threading.Lock()  # updates come from the sampler thread, stop/close from the cell's
        self.stopped = self.paused = False
        self.pause_after = 0.0 if replay else PAUSE_AFTER_S
        self._resumed = time.monotonic()
        self._pids: set[int] = set()  # this kernel's processes, as the last sample saw them
        self.last_sample: Sample | None = None
        self._headline = ""  # the status line's first part, kept when the monitor stops
        self.status = widgets.HTML(self._header("gpuctx monitor · no sample yet"),
                                   layout=widgets.Layout(flex="1 1 auto"))
        # A fixed width let a long status line squeeze the label to "st…": size it to its text.
        self.stop_button = widgets.Button(description="stop", tooltip=STOP_TIP,
                                          layout=widgets.Layout(width="auto", min_width="5em", flex="0 0 auto"))
        self.stop_button.on_click(self._clicked)
        self.cards: dict[str, _Card] = {}
        self.details = widgets.HTML(layout=widgets.Layout(display="none"))  # shown, collapsed, without a GPU
        self._body = widgets.VBox()
        self._own = inventory.OwnPids()
        self._displayed_at: int | None = None
        self._cell: str | None = None  # the notebook cell that displayed it
        self.display_id: str | None = None  # its outputs, replaced by a static picture when it ends
        self._texts: list[str] = []  # the last frame's cards, as text
        top = [widgets.HBox([self.status, self.stop_button], layout=widgets.Layout(align_items="center")),
               self.details, self._body]
        # The replay label is said before anything else, and built once: it never changes.
        self.replay_label = widgets.HTML(replay_banner(replay)) if replay else None
        super().__init__(([self.replay_label] if replay else []) + top)
        _open.add(self)
        self._token = self.sampler.subscribe(self.update, self.interval)

    @staticmethod
    def _header(text: str, mark: bool = False) -> str:
        style = f"color:{TEXT_COLOR}"
        if mark:  # stopped: a warn-coloured bar beside the text (text in warn orange would be too faint)
            style += f";border-left:3px solid {WARN_MARK};padding-left:6px"
        return f"<span style='{style}'>{text}</span>"

    def update(self, sample: Sample) -> None:
        """Called from the sampler thread: refresh every card from one sample."""
        with self._lock:
            if self.stopped:
                return  # a read that was already under way when the monitor stopped
            self.last_sample = sample
            self._show(sample)
            why = self._idle_holder(sample)
            if why:
                self._halt()
                self.paused = True
                self.status.value = self._header(self._ended("paused") + html.escape(f" — {why}"), mark=True)
                self.stop_button.description, self.stop_button.tooltip = "resume", "update again"

    def _idle_holder(self, sample: Sample) -> str | None:
        """Why it pauses now, if it does (PAUSE_AFTER_S)."""
        st = state_of(get_ipython()) if self.pause_after else None
        if st is None or st.cells_running or time.monotonic() - max(st.last_cell, self._resumed) < self.pause_after:
            return None
        held = sum(p.used_memory or 0 for d in sample.inventory.devices for p in d.record.processes
                   if p.pid in self._pids)
        return None if not held else (f"no cell has run for {self.pause_after / 60:g} min and this kernel holds {gib(held)} of GPU memory: "
                "its updates would keep it from counting as idle (the server's release and culling)")

    def resume(self) -> None:
        """Update again after pausing itself."""
        with self._lock:
            if not self.paused:
                return
            self.stopped = self.paused = False
            self._resumed = time.monotonic()
            self._token = self.sampler.subscribe(self.update, self.interval)
            self.stop_button.description, self.stop_button.tooltip = "stop", STOP_TIP

    def _show(self, sample: Sample) -> None:
        inv = sample.inventory
        stamp = time.strftime("%H:%M:%S", time.localtime(sample.t))
        reason = inv.no_gpu_reason()
        if reason:
            self._texts = [f"No GPU is visible: {' '.join(reason.split())}"]
            self._headline = f"<b>No GPU is visible</b>: {html.escape(' '.join(reason.split()))}"
            self.status.value = self._header(f"{self._headline} <span style='white-space:nowrap'>(checked {stamp})"
                                             "</span>")
            self.details.value = self._no_gpu_details(inv)
            self.details.layout.display = None
            self._body.children = ()
            return
        self.details.layout.display = "none"
        devices = wanted(self.specs, inv.devices)
        pids = self._pids = set() if self.replay else self._own.update(inv)
        self._headline = html.escape(f"gpuctx monitor · {len(devices)} GPU{'' if len(devices) == 1 else 's'}")
        self.status.value = self._header(
            self._headline + html.escape(f" · every {self.interval:g} s · last {self.window:g} s · {stamp}"))
        fresh = False
        texts: list[str] = []
        for d in devices:
            if d.record.uuid not in self.cards:
                self.cards[d.record.uuid] = _Card()
                fresh = True
            view = card_view(d, sample, self.sampler.history.of(d.record.uuid), self.window, pids,
                             live=self.replay is None, interval=self.interval)
            self.cards[d.record.uuid].show(view)
            texts.append(f"{view['title']}: {numbers_text(view)}")
        self._texts = texts
        if fresh or len(self._body.children) != len(devices):
            self._body.children = tuple(self.cards[d.record.uuid] for d in devices)

    def _no_gpu_details(self, inv: inventory.Inventory) -> str:
        """What else there is to know without a GPU, folded away under the one-line reason. Its text
        changes only when the facts do, so an unfolded <details> stays open between samples."""
        items = [f"sampled every {self.interval:g} s; the monitor shows the GPUs as soon as one is visible",
                 *inv.notes]
        warmup = _warmup_summary()
        if warmup:
            items.append(f"warm-up: {warmup}")
        items.append("%gpu doctor checks the driver, NVML, CUDA_VISIBLE_DEVICES and torch, each with its fix")
        lis = "".join(f"<li>{html.escape(i)}</li>" for i in items)
        return (f"<details style='color:{TEXT_COLOR}'><summary>details</summary>"
                f"<ul style='margin:2px 0'>{lis}</ul></details>")

    def _clicked(self, _button) -> None:
        """The button does what it says: "stop" stops (as `stop()`), then "close" closes; "resume"
        (a monitor that paused itself) updates again."""
        if self.paused:
            self.resume()
        elif self.stopped:
            self.close()
        else:
            self.stop()

    def _halt(self) -> bool:
        """Leave the sampler (it stops with its last listener); False if that was done before."""
        if self.stopped:
            return False
        self.stopped = True
        self.sampler.unsubscribe(self._token)
        return True

    def stop(self) -> None:
        """Stop updating, and keep the last frame on screen, marked "stopped" (`close()` removes it)."""
        with self._lock:
            if not self._halt() and not self.paused:
                return
            self.paused = False
            self.status.value = self._header(self._ended("stopped"), mark=True)
            self.stop_button.description = "close"
            self.stop_button.tooltip = "remove this stopped monitor"

    def _ended(self, how: str) -> str:
        """The status line of a monitor that no longer updates (HTML): what its last frame shows."""
        now = time.strftime("%H:%M:%S")
        if self.last_sample is None:
            return html.escape(f"gpuctx monitor · {how} at {now}, before the first sample")
        last = time.strftime("%H:%M:%S", time.localtime(self.last_sample.t))
        if self.last_sample.inventory.no_gpu_reason():  # no GPU sample was ever shown
            return self._headline + html.escape(f" · {how} at {now} (last checked {last})")
        return self._headline + html.escape(f" · {how} at {now}: the last sample, from {last}, stays shown")

    def snapshot(self, how: str = "closed") -> dict:
        """The last frame as static display data: HTML (the replay label, the status line, the
        cards) and text (one line per GPU), with no widget in it."""
        status = self._header(self._ended(how), mark=True)
        parts = [replay_banner(self.replay)] if self.replay else []
        parts.append(f"<div>{status}</div>")
        parts += [card.html() for card in self._body.children]
        text = [replay_text(self.replay)] if self.replay else []
        text.append(html.unescape(re.sub(r"<[^>]+>", "", self._ended(how))))
        text += self._texts if self.last_sample is not None else []
        return {"text/html": "<div class='gpuctx-monitor-snapshot'>" + "".join(parts) + "</div>",
                "text/plain": "\n".join(text)}

    def leave_picture(self, how: str = "closed") -> bool:
        """Replace every output showing this monitor with `snapshot(how)` (an update of its
        display, which the page applies to the cell that shows it, whichever cell runs now);
        False when it was never displayed through a kernel."""
        if self.display_id is None:
            return False
        from IPython import get_ipython

        ip = get_ipython()
        pub = getattr(ip, "display_pub", None) if ip is not None else None
        if pub is None:
            return False
        try:
            pub.publish(self.snapshot(how), metadata={}, transient={"display_id": self.display_id}, update=True)
        except Exception:  # noqa: BLE001 — a picture is a nicety; closing must go on
            return False
        return True

    def close(self) -> None:
        """Stop updates (the sampler stops with the last monitor), leave a static picture of the
        last frame in its place, and close every widget of the monitor, so that none is left open
        in the kernel or looked up by the frontend."""
        with self._lock:  # after this, no update is under way or to come
            self._halt()
        if self in _open:  # the first close: a second has nothing left to picture
            self.leave_picture("closed")
        _open.discard(self)
        # Cards of GPUs that went away are no longer in the tree, but still open.
        for root in (self, *self.cards.values()):
            for w in widget_tree(root):
                widgets.Widget.close(w)  # the widget itself (ours would recurse); twice does nothing

    def _ipython_display_(self):
        # `%gpu monitor` already displayed it: don't show it twice when the magic is the cell's last line.
        from IPython import get_ipython
        from IPython.display import display

        ip = get_ipython()
        if ip is not None and self._displayed_at == ip.execution_count:
            self._displayed_at = None
            return
        display(self.bundle(), raw=True, **({"display_id": self.display_id} if self.display_id else {}))

    def bundle(self) -> dict:
        """The widget's display data, whose text/plain (shown where widgets are not drawn: a
        notebook viewer, a text export) says what it is, not the widget's repr."""
        data = self._repr_mimebundle_()
        what = f"{replay_text(self.replay)}; " if self.replay else ""
        data["text/plain"] = (f"gpuctx monitor: {what}a widget that a notebook frontend (JupyterLab, Notebook 7, "
                              "VS Code) draws while its kernel runs")
        return data


def wanted(specs, devices) -> list[VisibleDevice]:
    """The devices the specs name, resolved as `%gpu use` resolves them (all without specs)."""
    if not specs:
        return list(devices)
    uuids = set()
    for spec in specs:
        try:
            uuids.add(parse_spec(spec, devices).record.uuid)
        except SpecError:
            pass  # the magic already refused a bad spec; a GPU that went away just drops out
    return [d for d in devices if d.record.uuid in uuids]


def replay_text(replay) -> str:
    """Said before anything else, so that no one takes a replay for live data."""
    label = replay.label
    return (f"REPLAY of a trace recorded {label.get('recorded') or '(date unknown)'} on {label.get('host') or '?'}, "
            f"not live data ({os.path.basename(label['source'])})")


def replay_banner(replay) -> str:
    return (f"<div role='note' title='{html.escape(os.path.abspath(replay.label['source']), quote=True)}' "
            f"style='{REPLAY_STYLE}'>{html.escape(replay_text(replay))}</div>")


def _warmup_summary() -> str | None:
    """The kernel's warm-up state, where the gpuctx extension is loaded."""
    from IPython import get_ipython

    from .state import of

    st = of(get_ipython())
    return st.warmer.status.summary() if st is not None else None


def renders_widgets(ip) -> bool:
    """Whether a displayed widget reaches a frontend that draws it: only through a kernel's comms
    (ipykernel's shell has a kernel; IPython in a terminal and plain Python have none)."""
    return ip is not None and getattr(ip, "kernel", None) is not None


def one_line(specs=(), replay=None, inv: inventory.Inventory | None = None) -> str:
    """The monitor as one line of text, from one read: what a terminal gets instead of widgets."""
    inv = (replay.read() if replay else inventory.take()) if inv is None else inv
    reason = inv.no_gpu_reason()
    if reason:
        return f"{NO_FRONTEND}; No GPU is visible: {' '.join(reason.split())}"
    cards = []
    for d in wanted(specs, inv.devices):
        r = d.record
        memory = f"{gib(r.memory_used)} / {gib(r.memory_total)}" if r.memory_total else gib(r.memory_used)
        card = f"cuda:{d.ordinal} {r.name} {pct(r.utilization)} {memory} {temp(r.temperature)} " \
               f"{watts(r.power_w, r.power_limit_w)}"
        cards.append(card + (f" (error: {r.error})" if r.error else ""))
    what = f"one sample of a {replay_text(replay)}" if replay else "one sample"
    return f"{NO_FRONTEND}; {what}: " + " · ".join(cards)


def monitor(*specs, interval: float = 1.0, history: float = 60.0, replay=None) -> GpuMonitor | None:
    """Display a live monitor of the given GPUs (all when none) and return it (`.stop()` freezes
    it, `.close()` removes it). `replay`: a `trace.Replay` (or a trace's path) to show instead of
    the live GPUs, labelled so. Without a frontend that draws widgets, print one line of one
    sample instead, start nothing, and return None."""
    from IPython import get_ipython
    from IPython.display import display

    if isinstance(replay, str):
        from ..core.trace import Replay

        replay = Replay(replay)
    ip = get_ipython()
    if not renders_widgets(ip):
        print(one_line(specs, replay))
        return None
    cell = _cell_id(ip)
    if cell is not None:  # re-running a cell replaces its monitor (its old output is gone) instead of stacking
        for old in [m for m in list(_open) if m._cell == cell]:
            old.close()
    mon = GpuMonitor(specs, interval=interval, history=history, replay=replay)
    mon._cell = cell
    mon.display_id = f"gpuctx-monitor-{uuid.uuid4().hex}"
    display(mon.bundle(), raw=True, display_id=mon.display_id)
    mon._displayed_at = ip.execution_count
    _leave_pictures_at_shutdown(ip)
    return mon


def _cell_id(ip) -> str | None:
    """The notebook cell being run, where the frontend says (JupyterLab sends `cellId`)."""
    kernel = getattr(ip, "kernel", None)
    try:
        parent = kernel.get_parent() if kernel is not None else None
    except Exception:
        return None
    return ((parent or {}).get("metadata") or {}).get("cellId")


def _leave_pictures_at_shutdown(ip) -> None:
    """When the kernel is asked to shut down or restart, every open monitor leaves a static
    picture of its last frame in its place first (ipykernel's `do_shutdown`, on its control
    thread, before the kernel replies and exits). Installed once per kernel."""
    kernel = getattr(ip, "kernel", None)
    if kernel is None or getattr(kernel, "_gpuctx_monitor_pictures", False):
        return
    original = kernel.do_shutdown

    def do_shutdown(restart):
        for mon in list(_open):
            try:
                with mon._lock:
                    mon._halt()
                mon.leave_picture("kernel restarted" if restart else "kernel shut down")
            except Exception:  # noqa: BLE001 — never keep a kernel from shutting down
                pass
        return original(restart)

    kernel.do_shutdown = do_shutdown
    kernel._gpuctx_monitor_pictures = True


def close_all() -> None:
    for mon in list(_open):
        mon.close()
