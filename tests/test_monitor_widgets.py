"""The monitor's widgets as a person meets them: every widget closed with the monitor (in this
process and, through comms, in a real kernel), a stop button whose label fits, one line of text
where nothing can draw widgets, "No GPU" first, a replay label built once, the JupyterLab theme's
colours (readable in light and dark), the shared formatters, and the tour that ends with its
monitors live under Run All, and the static picture a monitor leaves when it closes or its kernel ends."""
from __future__ import annotations

import html
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ipywidgets.widgets.widget import (
    _instances,  # ipywidgets 8's registry of open widgets
)

from gpuctx_jupyter.core import inventory
from gpuctx_jupyter.core.sampler import Sampler, process_sampler
from gpuctx_jupyter.core.trace import Replay
from gpuctx_jupyter.kernel import render
from gpuctx_jupyter.kernel.monitor import (
    MEMORY_COLOR,
    UTIL_COLOR,
    GpuMonitor,
    widget_tree,
)

from .harness.gpus import GIB, h200
from .harness.kernels import manager, start, stop
from .harness.waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
TRACE = str(REPO / "tests" / "data" / "h200-trace.jsonl")  # recorded on 2 × H200
MIB = 1024**2


def open_widgets() -> int:
    return len(_instances)


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpuctx-sampler"]


def started_since(before: list[threading.Thread]) -> list[threading.Thread]:
    """Sampler threads started after `before` was taken; one that an earlier test was ending may end meanwhile."""
    return [t for t in sampler_threads() if t not in before]


def text_of(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


# -- 10. one formatter per unit, the panel's rules ----------------------------------------------------
@pytest.mark.parametrize("n, text", [
    (5.7 * GIB, "5.70 GiB"), (5.11 * GIB, "5.11 GiB"), (12.1 * GIB, "12.1 GiB"), (140 * GIB, "140 GiB"),
    (141 * GIB, "141 GiB"), (9.996 * GIB, "10.0 GiB"), (99.96 * GIB, "100 GiB"), (1 * GIB, "1.00 GiB"),
    (630 * MIB, "630 MiB"), (1023.999 * MIB, "1.00 GiB"), (0.5 * MIB, "0.50 MiB"), (0, "0 MiB"), (None, "–"),
])
def test_bytes_read_as_the_panel_writes_them(n, text):
    assert render.gib(n) == text
    assert render.gib(n, 2) == text  # older callers' digits no longer change the rule


def test_one_formatter_per_unit():
    assert [render.temp(39), render.temp(63.4), render.temp(None)] == ["39 °C", "63 °C", "–"]
    assert [render.pct(12), render.pct(37.6), render.pct(None)] == ["12%", "38%", "–"]
    assert [render.watts(534.4, 700), render.watts(77.0), render.watts(None, 700)] == ["534 / 700 W", "77 W", "–"]
    assert [render.mib(34 * MIB), render.mib(512 * MIB), render.mib(None)] == ["34.0 MiB", "512 MiB", "–"]
    assert [render.signed(48 * MIB), render.signed(-int(1.25 * GIB)), render.signed(0)] == [
        "+48.0 MiB", "-1.25 GiB", "+0 MiB"]
    assert [render.number(0.125), render.number(12.25), render.number(-9.996)] == ["0.13", "12.3", "-10.0"]


def test_monitor_and_gpu_list_write_the_same_figures(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0, used_gib=5.11)])
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        wait_for(lambda: mon._body.children)
        numbers = text_of(mon._body.children[0].numbers.value)
    finally:
        mon.close()
    assert numbers == "util 0% · memory 5.11 GiB / 141 GiB · 30 °C · 100 / 700 W"
    shell.run_line_magic("gpu", "list")
    row = next(line for line in capsys.readouterr().out.splitlines() if "cuda:0" in line)
    assert "5.11 GiB / 141 GiB" in row and "30 °C" in row and "0%" in row


# -- 7. closing closes every widget --------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [1, 2])
def test_close_closes_every_widget_of_the_monitor(nvml_records, gpus):
    nvml_records([h200(i, pids=(os.getpid(),)) for i in range(gpus)])
    before = open_widgets()
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    wait_for(lambda: len(mon._body.children) == gpus)
    tree = widget_tree(mon)
    assert open_widgets() - before == len(tree) > 24 * gpus  # children, layouts and styles, all open
    mon.close()
    assert open_widgets() == before
    assert all(w.comm is None for w in tree)
    assert wait_for(lambda: not mon.sampler.running)


def test_close_also_closes_the_cards_of_gpus_that_went_away(nvml_records):
    records = [h200(0), h200(1)]
    nvml_records(records)  # read_records returns a copy of this list on every sample
    before = open_widgets()
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    wait_for(lambda: len(mon._body.children) == 2)
    records.pop()  # cuda:1 is gone: its card leaves the screen, not the kernel
    wait_for(lambda: len(mon._body.children) == 1)
    mon.close()
    assert open_widgets() == before


def test_close_of_a_replay_monitor_closes_its_label_too():
    before = open_widgets()
    mon = GpuMonitor(interval=0.05, replay=Replay(TRACE))
    wait_for(lambda: len(mon._body.children) == 2)
    mon.close()
    assert open_widgets() == before and mon.replay_label.comm is None
    assert wait_for(lambda: not mon.sampler.running)


def test_stop_button_stops_then_closes(nvml_records):
    nvml_records([h200(0), h200(1)])
    before = open_widgets()
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    wait_for(lambda: len(mon._body.children) == 2)
    opened = open_widgets()
    mon.stop_button.click()  # what the frontend's click message does
    assert mon.stopped and mon.sampler.listeners == 0
    assert "stopped at" in mon.status.value and mon.stop_button.description == "close"
    assert open_widgets() == opened  # stopped, still on screen
    mon.stop_button.click()
    assert open_widgets() == before


def test_stop_button_label_is_never_squeezed(nvml_records):
    nvml_records([h200(0)])
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        layout = mon.stop_button.layout
        assert layout.flex == "0 0 auto"  # the status line gives way, the button does not
        assert layout.min_width == "5em" and layout.width == "auto"  # room for "close" at any font size
        assert mon.status.layout.flex == "1 1 auto"  # a long status line wraps instead
    finally:
        mon.close()


# -- 9. stop() keeps the last frame, says so ----------------------------------------------------------
def test_a_stopped_monitor_keeps_its_last_frame_and_says_stopped(nvml_records):
    nvml_records([h200(0, used_gib=3)])
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        wait_for(lambda: mon._body.children)
        mon.stop()
        card = mon._body.children[0]
        frame = (card.numbers.value, card.plot.value)
        wait_for(lambda: not mon.sampler.running)  # a read under way when stop() came may finish
        ticks = mon.sampler.ticks
        time.sleep(0.3)  # six intervals
        assert mon.sampler.ticks == ticks and not mon.sampler.running  # nothing samples for it any more
        assert (card.numbers.value, card.plot.value) == frame and card.comm is not None
        status = text_of(mon.status.value)
        assert re.fullmatch(r"gpuctx monitor · 1 GPU · stopped at \d\d:\d\d:\d\d: the last sample, from "
                            r"\d\d:\d\d:\d\d, stays shown", status), status
    finally:
        mon.close()


def test_before_any_sample_and_without_a_gpu_it_says_so_and_never_claims_a_sample_stays_shown(nvml_records):
    nvml_records([])
    blocked = threading.Event()

    def first_read_held():
        blocked.wait(30)
        return inventory.Inventory(nvml_error="held by the test")

    sampler = Sampler(read=first_read_held)
    mon = GpuMonitor(interval=0.05, sampler=sampler)
    try:
        assert text_of(mon.status.value) == "gpuctx monitor · no sample yet"
        mon.stop()
        assert re.fullmatch(r"gpuctx monitor · stopped at \d\d:\d\d:\d\d, before the first sample",
                            text_of(mon.status.value))
    finally:
        blocked.set()
        mon.close()
    wait_for(lambda: not sampler.running)  # the held read ends, and the thread with it
    mon = GpuMonitor(interval=0.05, sampler=Sampler())  # no GPU here: samples say so
    try:
        wait_for(lambda: "No GPU" in mon.status.value)
        mon.stop()
        status = text_of(mon.status.value)
        assert re.search(r" · stopped at \d\d:\d\d:\d\d \(last checked \d\d:\d\d:\d\d\)$", status), status
        assert "stays shown" not in status
    finally:
        mon.close()


def test_the_last_frame_as_a_static_picture_html_and_text_with_no_widget(nvml_records):
    nvml_records([h200(0, used_gib=3), h200(1, used_gib=9)])
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        wait_for(lambda: len(mon._body.children) == 2)
        picture = mon.snapshot("closed")
    finally:
        mon.close()
    assert set(picture) == {"text/html", "text/plain"}  # no widget: nothing for the page to look up
    page = picture["text/html"]
    assert page.count("role='meter'") == 4 and page.count("<svg") == 2 and "cuda:1 · NVIDIA H200" in page
    assert re.search(r"closed at \d\d:\d\d:\d\d: the last sample, from \d\d:\d\d:\d\d, stays shown", text_of(page))
    lines = picture["text/plain"].splitlines()
    assert lines[0].startswith("gpuctx monitor · 2 GPUs · closed at ")
    assert lines[1] == "cuda:0 · NVIDIA H200 (nvidia-smi 0): util 0% · memory 3.00 GiB / 141 GiB · 30 °C · 100 / 700 W"
    assert len(lines) == 3


# -- 7. a plain terminal gets one line ----------------------------------------------------------------
def test_in_a_terminal_shell_the_magic_prints_one_sample_and_starts_nothing(shell, nvml_records, clean_env, capsys):
    """The test shell is IPython's TerminalInteractiveShell: no kernel, no comm, nothing draws widgets."""
    nvml_records([h200(0, used_gib=5.11), h200(1)])
    threads, widgets, listeners = sampler_threads(), open_widgets(), process_sampler().listeners
    result = shell.run_cell("%gpu monitor")
    assert result.success and result.result is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "GpuMonitor(" not in out and "HBox(" not in out
    assert out == ("gpuctx monitor: widgets need a notebook frontend (JupyterLab, Notebook 7, VS Code); one sample: "
                   "cuda:0 NVIDIA H200 0% 5.11 GiB / 141 GiB 30 °C 100 / 700 W · "
                   "cuda:1 NVIDIA H200 10% 1.00 GiB / 141 GiB 31 °C 100 / 700 W\n")
    assert not started_since(threads) and open_widgets() == widgets and process_sampler().listeners == listeners
    shell.run_line_magic("gpu", f"monitor --replay {TRACE} 1")
    out = capsys.readouterr().out
    assert out.startswith("gpuctx monitor: widgets need a notebook frontend (JupyterLab, Notebook 7, VS Code); "
                          "one sample of a REPLAY of a trace recorded 2026-")
    assert "not live data (h200-trace.jsonl): cuda:1 NVIDIA H200" in out and "cuda:0" not in out
    assert out.count("\n") == 1 and not started_since(threads) and open_widgets() == widgets


def test_ipython_in_a_terminal_prints_one_line_per_monitor():
    """A real `ipython` process (no fake NVML there: no GPU on this machine, or the real ones)."""
    code = ("%load_ext gpuctx\n%gpu monitor\nimport gpuctx; gpuctx.monitor()\nimport threading\n"
            "print(sorted(t.name for t in threading.enumerate() if t.name == 'gpuctx-sampler'))")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ipython"), "-c", code],
                          cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    for line in lines[:2]:
        assert line.startswith("gpuctx monitor: widgets need a notebook frontend (JupyterLab, Notebook 7, VS Code); ")
        assert "No GPU is visible: " in line or "one sample: cuda:0 " in line
    assert "GpuMonitor(" not in proc.stdout and "HBox(" not in proc.stdout and "Out[" not in proc.stdout
    assert lines[2] == "[]"  # no sampler thread


# -- 8. without a GPU: "No GPU" and its reason first, the rest folded away ----------------------------
def test_no_gpu_comes_first_with_its_reason_and_the_details_folded(shell, nvml_records, clean_env):
    nvml_records([])
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        wait_for(lambda: "No GPU" in mon.status.value)
        header = mon.children[0]
        assert header.children[0] is mon.status  # nothing comes before it
        status = text_of(mon.status.value)
        # (a torch imported earlier in this process adds "; also, torch … is a CPU-only build")
        assert re.fullmatch(r"No GPU is visible: NVML lists no NVIDIA GPU on this machine(; also, [^\n]*)? "
                            r"\(checked \d\d:\d\d:\d\d\)", status), status
        assert mon.children[1] is mon.details and mon.details.layout.display is None
        details = mon.details.value
        assert details.startswith("<details") and " open" not in details.split(">")[0]  # folded
        assert "warm-up: " in text_of(details) and "%gpu doctor" in text_of(details)
        assert mon._body.children == ()
        ticks = mon.sampler.ticks
        wait_for(lambda: mon.sampler.ticks >= ticks + 3)
        assert mon.details.value == details  # unchanged between samples: unfolded, it stays open
        mon.stop()
        assert text_of(mon.status.value).startswith("No GPU is visible: NVML lists no NVIDIA GPU")
        assert "stopped at" in mon.status.value
    finally:
        mon.close()


def test_details_hide_when_a_gpu_is_there(nvml_records):
    nvml_records([h200(0)])
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        wait_for(lambda: mon._body.children)
        assert mon.details.layout.display == "none"
    finally:
        mon.close()


# -- 6. the replay label and the theme's colours ------------------------------------------------------
def test_replay_label_is_built_once_first_and_names_the_trace_file():
    mon = GpuMonitor(interval=0.05, replay=Replay(TRACE))
    changes = []
    mon.replay_label.observe(changes.append, "value")
    try:
        label = mon.children[0]
        assert label is mon.replay_label
        wait_for(lambda: len(mon._body.children) == 2)
        ticks = mon.sampler.ticks
        wait_for(lambda: mon.sampler.ticks >= ticks + 5)
        assert mon.children[0] is label and changes == []  # never rebuilt, never re-sent
        text = text_of(label.value)
        assert re.fullmatch(r"REPLAY of a trace recorded 2026-\S+ on \S+, not live data \(h200-trace\.jsonl\)", text)
        assert f"title='{TRACE}'" in label.value  # the full path on hover
        assert "REPLAY" not in mon.status.value
    finally:
        mon.close()


def test_colours_come_from_the_jupyterlab_theme(nvml_records):
    nvml_records([h200(0, used_gib=3), h200(1, used_gib=9)])
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        wait_for(lambda: len(mon._body.children) == 2 and "<polyline" in mon._body.children[0].plot.value)
        card = mon._body.children[0]
        svg = card.plot.value
        assert "--gpuctx-util-color:var(--jp-brand-color1, #1976d2)" in svg
        assert "--gpuctx-memory-color:var(--jp-accent-color1, #388e3c)" in svg
        assert "stroke:var(--gpuctx-util-color)" in svg and "stroke:var(--gpuctx-memory-color)" in svg
        bars = re.findall(r"role='meter'.*?<div style='width:[\d.]+%;height:100%;background:([^']+)'", card.meters.value)
        assert bars == [UTIL_COLOR, MEMORY_COLOR]
        assert "var(--jp-ui-font-color1" in mon.status.value
        emitted = [w.value for w in widget_tree(mon) if hasattr(w, "value") and isinstance(w.value, str)]
        fixed = [re.sub(r"var\(--[\w-]+, [^)]+\)", "", v) for v in emitted]
        assert not [v for v in fixed if re.search(r"#[0-9a-fA-F]{3,8}\b", v)]  # no colour outside the theme
    finally:
        mon.close()


def theme(name: str) -> dict[str, str]:
    """JupyterLab's own theme variables, resolved to colours, from the installed theme CSS."""
    import jupyterlab

    css = (Path(jupyterlab.__file__).parent / "themes" / "@jupyterlab" / f"theme-{name}-extension"
           / "index.css").read_text()
    raw = dict(re.findall(r"(--[\w-]+):\s*([^;}]+)", css))

    def resolve(value: str) -> str:
        m = re.fullmatch(r"var\((--[\w-]+)(?:,\s*(.+))?\)", value.strip())
        if not m:
            return value.strip()
        return resolve(raw[m.group(1)]) if m.group(1) in raw else resolve(m.group(2))

    return {k: resolve(v) for k, v in raw.items()}


def rgb(colour: str, over=(255, 255, 255)) -> tuple[float, float, float]:
    colour = {"white": "#ffffff", "black": "#000000"}.get(colour, colour)
    if colour.startswith("#"):
        h = colour[1:]
        h = "".join(c * 2 for c in h) if len(h) == 3 else h
        return tuple(int(h[i:i + 2], 16) for i in (0, 2, 4))
    parts = [float(v) for v in re.findall(r"[\d.]+", colour)]
    alpha = parts[3] if len(parts) > 3 else 1.0
    return tuple(alpha * c + (1 - alpha) * o for c, o in zip(parts[:3], over))


def contrast(fg, bg) -> float:
    def lum(c):
        lin = [(v / 255 / 12.92) if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(fg), lum(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("name", ["light", "dark"])
def test_text_and_charts_are_readable_in_both_themes(name):
    """WCAG AA: 4.5:1 for text, 3:1 for the chart lines, with the colours the monitor names."""
    t = theme(name)
    page = rgb(t["--jp-layout-color0"])
    replay_bg = rgb(t["--jp-warn-color3"])
    assert contrast(rgb("rgba(0, 0, 0, 0.87)", replay_bg), replay_bg) >= 4.5  # the replay banner
    assert contrast(rgb(t["--jp-ui-font-color1"], page), page) >= 4.5  # the status line
    assert contrast(rgb(t["--jp-error-color1"]), page) >= 4.5  # "error: GPU is lost"
    track = rgb(t["--jp-layout-color2"])
    assert contrast(rgb(t["--jp-brand-color1"]), track) >= 3  # utilisation line
    assert contrast(rgb(t["--jp-accent-color1"]), track) >= 3  # memory line


# -- 7 and 9 in a real kernel: the frontend is told about every widget that closes ------------------
def execute(kc, code: str, timeout: float = 60) -> tuple[dict, list[dict]]:
    """Run `code`; its reply and every iopub message read until it is idle (any parent: the
    sampler thread's comm messages too)."""
    msg_id = kc.execute(code)
    msgs, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        msgs.append(msg)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            reply = kc.get_shell_msg(timeout=timeout)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = kc.get_shell_msg(timeout=timeout)
            return reply["content"], msgs
    raise AssertionError(f"no idle for {code!r}")


def test_in_a_kernel_every_widget_comm_is_closed_by_the_stop_button():
    km, kc = start()
    try:
        msgs = []
        reply, got = execute(kc, f"%load_ext gpuctx\nfrom ipywidgets.widgets.widget import _instances\n"
                                 f"before = len(_instances)\nm = %gpu monitor --replay {TRACE} --interval 0.1\n"
                                 "import time\nwhile len(m._body.children) < 2: time.sleep(0.05)")
        assert reply["status"] == "ok", reply
        msgs += got
        opened = {m["content"]["comm_id"]: m["content"]["data"]["state"] for m in msgs
                  if m["msg_type"] == "comm_open" and m["content"]["target_name"] == "jupyter.widget"}
        button = next(cid for cid, state in opened.items() if state["_model_name"] == "ButtonModel")
        shown = [m["content"]["data"] for m in msgs if m["msg_type"] == "display_data"]
        assert len(shown) == 1 and "GpuMonitor(" not in shown[0]["text/plain"]
        assert shown[0]["text/plain"].startswith("gpuctx monitor: REPLAY of a trace recorded 2026-")
        for _ in range(2):  # "stop", then "close": what a person's two clicks send
            click = kc.session.msg("comm_msg", {"comm_id": button,
                                                "data": {"method": "custom", "content": {"event": "click"}}})
            kc.shell_channel.send(click)
            reply, got = execute(kc, "print(m.stopped, m.stop_button.description)")
            msgs += got
        reply, got = execute(kc, "import time; time.sleep(0.3)\nprint(len(_instances) - before)")
        msgs += got
        out = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
        assert out.split() == ["True", "close", "True", "close", "0"]
        closed = {m["content"]["comm_id"] for m in msgs if m["msg_type"] == "comm_close"}
        assert len(opened) >= 40 and set(opened) <= closed  # nothing left for the frontend to look up
        # in its place a static picture of its last frame: an update of the same display, no widget
        display_id = next(m["content"]["transient"]["display_id"] for m in msgs if m["msg_type"] == "display_data")
        pictures = [m["content"] for m in msgs if m["msg_type"] == "update_display_data"]
        assert [p["transient"]["display_id"] for p in pictures] == [display_id]
        assert set(pictures[0]["data"]) == {"text/html", "text/plain"}
        assert "cuda:1 · NVIDIA H200" in pictures[0]["data"]["text/html"]
        assert pictures[0]["data"]["text/plain"].startswith("REPLAY of a trace recorded 2026-")
        assert " · closed at " in pictures[0]["data"]["text/plain"]
        updates_after = [m for m in msgs[msgs.index(next(m for m in msgs if m["msg_type"] == "comm_close")):]
                         if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] in closed]
        assert updates_after == []  # no update for a closed widget ("Comm not found")
    finally:
        stop(km, kc)


def test_a_kernel_that_shuts_down_or_restarts_leaves_the_last_picture_of_each_monitor():
    """What a saved notebook keeps: the kernel replaces each live monitor's output with a static
    picture when it is asked to shut down (or restart), before it replies, so no output is left
    pointing at a widget that died with the kernel ("Error displaying widget: model not found")."""
    for restart in (False, True):
        km, kc = start()
        try:
            reply, msgs = execute(kc, f"%load_ext gpuctx\nm = %gpu monitor --replay {TRACE} --interval 0.1\n"
                                      "n = %gpu monitor --interval 0.1\nimport time\n"
                                      "while len(m._body.children) < 2: time.sleep(0.05)")
            assert reply["status"] == "ok", reply
            ids = [m["content"]["transient"]["display_id"] for m in msgs if m["msg_type"] == "display_data"]
            assert len(ids) == 2
            kc.shutdown(restart=restart)  # what the server sends on its control channel
            pictures, deadline = {}, time.monotonic() + 30
            while len(pictures) < 2 and time.monotonic() < deadline:
                try:
                    msg = kc.get_iopub_msg(timeout=1)
                except queue.Empty:
                    continue
                if msg["msg_type"] == "update_display_data":
                    pictures[msg["content"]["transient"]["display_id"]] = msg["content"]["data"]
            assert sorted(pictures) == sorted(ids)
            how = "kernel restarted" if restart else "kernel shut down"
            replay, live = (pictures[i] for i in ids)
            assert "application/vnd.jupyter.widget-view+json" not in replay
            assert f" · {how} at " in replay["text/plain"] and "cuda:0 · NVIDIA H200" in replay["text/html"]
            assert f"{how} at" in live["text/plain"] and "No GPU is visible" in live["text/plain"]
        finally:
            stop(km, kc)


# -- 9. the tour keeps its monitors live under Run All ----------------------------------------------
def test_the_tour_runs_all_and_leaves_both_monitors_live(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(REPO / "examples" / "tour.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, km=manager("python3"),
                   resources={"metadata": {"path": str(REPO / "examples")}}).execute()
    nbformat.write(nb, tmp_path / "tour-run.ipynb")  # for a person to look at when this fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    views = [o.data["application/vnd.jupyter.widget-view+json"]["model_id"] for o in outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 2
    plain = [o.data["text/plain"] for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert plain[0].startswith("gpuctx monitor: a widget that a notebook frontend")  # where it is not drawn
    assert plain[1].startswith("gpuctx monitor: REPLAY of a trace recorded 2026-")  # not its repr
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert all(v in state for v in views)  # both monitors still open when Run All ended

    def statuses(model_id):
        for child in state[model_id]["state"]["children"]:
            m = state[child.removeprefix("IPY_MODEL_")]["state"]
            if m["_model_name"] == "HTMLModel":
                yield text_of(m["value"])
            for grandchild in m.get("children", ()):
                # nbclient keeps only the comm messages of the cell running when they arrive: a card
                # the monitor's thread made after its cell ended can be named and yet missing here
                g = state.get(grandchild.removeprefix("IPY_MODEL_"), {}).get("state")
                if g and g["_model_name"] == "HTMLModel":
                    yield text_of(g["value"])

    live, replay = (list(statuses(v)) for v in views)
    # nothing in the tour stops them: Run All in JupyterLab leaves both monitors updating
    assert not [s for s in live + replay if "stopped at" in s or "closed at" in s]
    assert replay[0].startswith("REPLAY of a trace recorded 2026-")
    assert not [c for c in nb.cells if c.cell_type == "code" and re.search(r"\.(stop|close)\(\)", c.source)]
    assert nb.cells[-1].cell_type == "markdown" and "m.close()" in nb.cells[-1].source
