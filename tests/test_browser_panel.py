"""The GPU panel and status item in a real JupyterLab (Debian's Chromium), asserted as a person
sees them: meters that keep their width in a narrow sidebar, staleness and the outage line when
the server stops answering (and their end when it is back), "GPU –" for a notebook that uses no
GPU and nothing on other tabs, compact rows for eight GPUs, text and meter contrast in both
themes, the kernel actions and "Release cache" without console errors, and the notebook
monitor's widgets closed in the kernel.

Two `jupyter lab`s at most: one replays the 2 × H200 trace (tests/data/h200-trace.jsonl), the
other an 8-GPU trace composed from it (tests/data/h200x8-composed-trace.jsonl, made by
tests/harness/traces.py and labelled as composed in its header and file name). One page on each,
reused by the tests in file order: the first lab's tests run in the order a person would go."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from .harness.browser import (
    LAB_ARGS,
    TRACE,
    confirm_action,
    debugger_settled,
    kernel_idle,
    open_notebook,
    open_panel,
    screenshot,
    set_theme,
    shoot,
)
from .harness.server import Server
from .harness.traces import compose_trace
from .harness.waiting import wait_for

TRACE8 = TRACE.parent / "h200x8-composed-trace.jsonl"
BANNER = "Replay of a recorded trace — not live data"
OUTAGE = "Lost contact with the Jupyter server; retrying…"
# Two stream intervals (refreshRate 1 s) make data stale; the rest is slack for a loaded 2-core
# machine. The docs promise "live again within about 5 s of the server's return".
STALE_WITHIN_MS = 6_000
# Back within about 5 s: the stream retries at most 5 s apart (the schedule is a unit test of
# test/backoff.test.ts); the rest is a freshly started server's first answers on a loaded machine.
LIVE_AGAIN_WITHIN_MS = 15_000

# The notebook: cell 0 uses no GPU; cells 1-4 open the replayed monitor and close it again.
CELLS = [
    "import os\nprint(1, os.getpid())",
    "import ipywidgets\nprint('widgets', len(ipywidgets.widgets.widget._instances))",
    "m = %gpu monitor --replay h200-trace.jsonl --history 10",
    "print('widgets', len(ipywidgets.widgets.widget._instances))",
    "m.close()\nprint('widgets', len(ipywidgets.widgets.widget._instances))",
]


# Where an uncaught error was thrown (browser.errors holds only its message), for failure reports.
STACKS: list[str] = []


def notebook_text(cells: list[str]) -> str:
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": src} for i, src in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    })


class Lab:
    """A `jupyter lab` that can be stopped hard and started again on the same port and token,
    so that the page it served stays loaded through the outage."""

    def __init__(self, root: Path, trace: Path):
        self.root, self.args = root, [f"--GpuctxServer.replay_trace={trace}", *LAB_ARGS]
        self.orphans: list = []  # kernels a killed server left running, ended at stop()
        self.server = Server(str(root), app="jupyterlab", args=self.args).start(timeout=120)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.token

    def api(self, *args, **kwargs):
        return self.server.api(*args, **kwargs)

    def kill(self) -> None:
        import psutil  # an ipykernel dependency

        self.orphans += psutil.Process(self.server.proc.pid).children(recursive=True)
        self.server.proc.kill()
        self.server.proc.wait(20)
        self.server.stop()  # closes its log

    def restart(self) -> None:
        old = self.server
        new = Server(str(self.root), app="jupyterlab", args=self.args)
        new.port, new.token = old.port, old.token
        new.log_path = f"{old.log_path}.restarted"
        self.server = new
        new.start(timeout=120)
        assert new.port == old.port, "the restarted server had to take another port: the page cannot reach it"

    def stop(self) -> None:
        proc = self.server.proc
        if proc and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a test that failed while it was stopped
        self.server.stop()
        for child in self.orphans:
            if child.is_running():
                child.kill()


@pytest.fixture(scope="module")
def lab(browser, tmp_path_factory):  # the browser first: skipped without one, no lab started
    root = tmp_path_factory.mktemp("panel-lab")
    (root / "plain.ipynb").write_text(notebook_text(CELLS))
    shutil.copy(TRACE, root / "h200-trace.jsonl")
    lab = Lab(root, TRACE)
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def page(browser, lab):
    page = open_notebook(browser, lab, "plain.ipynb")
    page.on("pageerror", lambda exc: STACKS.append(exc.stack or str(exc)))
    yield page
    page.close()


@pytest.fixture(scope="module")
def lab8(browser, tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp("panel-lab8"), TRACE8)
    yield lab
    lab.stop()


def wait_js(page, expression: str, arg=None, timeout: float = 30_000) -> None:
    page.wait_for_function(expression, arg=arg, timeout=timeout)


def cards_drawn(page, count: int) -> None:
    wait_js(page, "n => document.querySelectorAll('#gpuctx-panel .jp-gpuctx-card').length === n", count)


def run_cell(page, index: int) -> str:
    """Run the notebook's cell `index` as Shift+Enter would, and return its output's text."""
    page.evaluate("async i => { const nb = window.jupyterapp.shell.currentWidget; nb.content.activeCellIndex = i;"
                  " await window.jupyterapp.commands.execute('notebook:run-cell'); }", index)
    kernel_idle(page, timeout=60_000)
    return page.evaluate("i => window.jupyterapp.shell.currentWidget.content.widgets[i].outputArea.node.innerText",
                         index)


def meters(page) -> list[dict]:
    """Each visible card's utilisation and memory bars: their widths and the meter's own."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#gpuctx-panel .jp-gpuctx-card')).map(card => {
        const w = sel => card.querySelector(sel).getBoundingClientRect().width;
        return {util: w('.jp-gpuctx-meter-utilization .jp-gpuctx-meter-bar'),
                mem: w('.jp-gpuctx-meter-memory .jp-gpuctx-meter-bar'),
                meter: w('.jp-gpuctx-meter-utilization'), card: card.getBoundingClientRect().width};
    })""")


def panel_width(page) -> float:
    return page.locator("#gpuctx-panel").bounding_box()["width"]


def drag_sidebar_edge(page, to_x: float) -> None:
    """Drag the handle between the left sidebar and the main area to `to_x`, as a person would."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
    box = handle.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(to_x, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()


# -- 1. meters --------------------------------------------------------------------------------------

def assert_meters(page) -> None:
    width = panel_width(page)
    for m in meters(page):
        assert m["util"] > 0 and m["util"] == m["mem"], m  # equal length, whatever the labels say
        assert m["util"] == pytest.approx(m["meter"], abs=1), m  # the bar spans the meter's width
        assert m["card"] <= width, (m, width)  # the card fits: no bar pushed out of sight


def test_meters_keep_equal_nonzero_widths_at_the_default_and_the_narrowest_sidebar(lab, page, browser):
    panel = open_panel(page)
    cards_drawn(page, 2)
    default = panel_width(page)
    assert_meters(page)
    edge = panel.bounding_box()["x"] + default
    min_width = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('#jp-left-stack')).minWidth)")
    # JupyterLab 4 opens the sidebar at its narrowest (--jp-sidebar-min-width): widen it first, so
    # that the narrowest is reached by a person's drag whatever the default
    drag_sidebar_edge(page, edge + 300)
    wait_js(page, "w => document.querySelector('#gpuctx-panel').getBoundingClientRect().width > w + 200", default)
    assert_meters(page)
    drag_sidebar_edge(page, 0)  # as narrow as JupyterLab lets the sidebar be
    wait_js(page, "w => document.querySelector('#gpuctx-panel').getBoundingClientRect().width <= w + 1", min_width)
    assert_meters(page)
    # the memory fill is drawn (the trace's GPUs always hold some memory)
    assert page.locator("#gpuctx-panel .jp-gpuctx-card .jp-gpuctx-meter-memory .jp-gpuctx-meter-fill").first \
        .evaluate("n => n.getBoundingClientRect().width") > 0

    drag_sidebar_edge(page, edge)  # back, for the tests below
    wait_js(page, "w => Math.abs(document.querySelector('#gpuctx-panel').getBoundingClientRect().width - w) <= 2",
            default)
    assert browser.errors == [], STACKS


# -- 5. contrast --------------------------------------------------------------------------------------

# WCAG 2.1 contrast of every visible text element in the panel (and the status item) against the
# background it is drawn on: semi-transparent backgrounds are composed up the ancestors, text
# colour alpha and ancestors' opacity blended in. Disabled buttons are exempt (WCAG 1.4.3), as is
# SVG text. Meter fills are compared with their track.
CONTRAST_JS = """() => {
  const parse = c => { const m = /rgba?\\(([^)]*)\\)/.exec(c || ''); if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, bottom) => [0, 1, 2].map(i => top[3] * top[i] + (1 - top[3]) * bottom[i]).concat([1]);
  const background = el => {
    const layers = [];
    for (let n = el; n; n = n.parentElement) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  };
  const opacity = el => { let o = 1; for (let n = el; n; n = n.parentElement) o *= Number(getComputedStyle(n).opacity); return o; };
  const lum = c => { const l = c.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const visible = el => el.getClientRects().length > 0 && !el.closest('[hidden]') && getComputedStyle(el).visibility === 'visible';
  const name = el => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
  const text = [], fills = [];
  for (const root of document.querySelectorAll('#gpuctx-panel, .jp-gpuctx-status')) {
    for (const el of [root, ...root.querySelectorAll('*')]) {
      if (el instanceof SVGElement || !visible(el) || el.closest('button:disabled')) continue;
      if (!Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim())) continue;
      const bg = background(el), fg = parse(getComputedStyle(el).color);
      fg[3] *= opacity(el);
      text.push({el: name(el), text: el.textContent.trim().slice(0, 40), ratio: ratio(over(fg, bg), bg),
                 color: getComputedStyle(el).color});
    }
  }
  for (const fill of document.querySelectorAll('#gpuctx-panel .jp-gpuctx-meter-fill')) {
    if (!visible(fill.parentElement)) continue;
    const track = background(fill.parentElement), c = parse(getComputedStyle(fill).backgroundColor);
    fills.push({el: name(fill.parentElement.parentElement), ratio: ratio(over(c, track), track),
                color: getComputedStyle(fill).backgroundColor});
  }
  return {text, fills};
}"""


def assert_contrast(page, theme: str) -> None:
    found = page.evaluate(CONTRAST_JS)
    assert len(found["text"]) >= 20 and len(found["fills"]) >= 4, found  # the cards were measured
    low_text = [t for t in found["text"] if t["ratio"] < 4.5]
    low_fill = [f for f in found["fills"] if f["ratio"] < 3]
    assert not low_text, f"{theme}: text below 4.5:1: {low_text}"
    assert not low_fill, f"{theme}: meter fills below 3:1 on their track: {low_fill}"


def test_text_and_meter_contrast_in_the_light_and_the_dark_theme(page, browser):
    panel = open_panel(page)
    cards_drawn(page, 2)
    wait_js(page, "() => document.querySelector('.jp-gpuctx-status-button').textContent.endsWith('(replay)')")
    assert_contrast(page, "JupyterLab Light")
    shoot(page, panel, screenshot("panel-light-notebook.png"))
    try:
        set_theme(page, "JupyterLab Dark", light=False)
        assert_contrast(page, "JupyterLab Dark")
    finally:
        set_theme(page, "JupyterLab Light", light=True)
    assert browser.errors == [], STACKS


# -- 3. the status bar ---------------------------------------------------------------------------

def test_status_bar_says_gpu_dash_for_a_notebook_without_gpu_and_hides_on_other_tabs(page, browser):
    assert run_cell(page, 0).startswith("1 ")  # the kernel runs, and touched no GPU
    item = page.locator(".jp-gpuctx-status-button")
    wait_js(page, "() => document.querySelector('.jp-gpuctx-status').dataset.gpuctxState === 'none'")
    assert item.inner_text() == "GPU – (replay)"
    assert "uses no GPU" in item.get_attribute("aria-label")
    # another kind of tab: the Launcher, then the Settings editor; the item goes, and comes back
    for command in ("launcher:create", "settingeditor:open"):
        page.evaluate("c => window.jupyterapp.commands.execute(c)", command)
        page.locator(".jp-gpuctx-status").wait_for(state="hidden")
        page.evaluate("() => window.jupyterapp.shell.currentWidget.close()")
        page.locator(".jp-gpuctx-status").wait_for(state="visible")
        # back on the notebook, its kernel is asked again ("GPU …" meanwhile)
        wait_js(page, "() => document.querySelector('.jp-gpuctx-status').dataset.gpuctxState === 'none'")
        assert item.inner_text() == "GPU – (replay)"
    assert browser.errors == [], STACKS


# -- 8. who holds the GPU: Release cache -------------------------------------------------------------

def test_release_cache_from_the_notebook_section_says_what_was_released(page, browser):
    # Attribution goes by PID: a replayed trace holds the recording machine's PIDs, never this
    # kernel's, so here the notebook holds nothing and the friendly "nothing to release" is due.
    panel = open_panel(page)
    button = panel.locator('.jp-gpuctx-notebook button[data-action="release"]')
    assert button.inner_text() == "Release cache"
    assert button.get_attribute("aria-label") == "Release the cached GPU memory of plain.ipynb"
    assert "Release the cached GPU memory of plain.ipynb?" in confirm_action(page, "release")
    toast = page.locator(".Toastify__toast", has_text="plain.ipynb")
    toast.wait_for(state="visible", timeout=30_000)
    message = toast.inner_text()
    assert re.search(r"plain\.ipynb (uses no GPU|held no cached GPU memory): nothing to release( \(.+\))?\.", message), message
    assert "Could not" not in message
    assert browser.errors == [], STACKS


# -- 7. the notebook monitor's widgets --------------------------------------------------------------

def widget_count(output: str) -> int:
    return int(re.search(r"widgets (\d+)", output).group(1))


def test_closing_the_monitor_brings_the_widget_count_back_to_baseline(page, browser):
    baseline = widget_count(run_cell(page, 1))
    run_cell(page, 2)
    wait_js(page, "() => { const o = window.jupyterapp.shell.currentWidget.content.widgets[2].outputArea.node;"
                  " return o.textContent.includes('cuda:1 · NVIDIA H200') && o.textContent.includes('REPLAY'); }")
    views = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets[2].outputArea.node"
                          ".querySelectorAll('.jupyter-widgets').length")
    assert views >= 2, views  # the monitor and its two cards are drawn as widget views
    opened = widget_count(run_cell(page, 3))
    assert opened > baseline
    after = widget_count(run_cell(page, 4))
    assert after == baseline, (baseline, opened, after)
    # the page drops the closed views: nothing of the monitor is left drawn
    wait_js(page, "() => window.jupyterapp.shell.currentWidget.content.widgets[2].outputArea.node"
                  ".querySelectorAll('.jupyter-widgets').length === 0")
    assert not [e for e in browser.errors if "Comm" in e], browser.errors
    assert browser.errors == [], STACKS


# -- 6. restart and shut down from the panel -------------------------------------------------------

def restart_from_the_panel(page) -> None:
    """Restart through the panel; returns once the page has heard of the new kernel (its
    `starting`, or the page's own `restarting`)."""
    debugger_settled(page)  # not in the middle of JupyterLab's own questions to the kernel
    page.evaluate("() => { window.gpuctxSeen = []; const k = window.jupyterapp.shell.currentWidget.sessionContext"
                  ".session.kernel; k.statusChanged.connect((_, s) => window.gpuctxSeen.push(s)); }")
    confirm_action(page, "restart")
    wait_js(page, "() => window.gpuctxSeen.some(s => s === 'starting' || s === 'restarting')")


def test_after_a_restart_from_the_panel_the_notebook_is_ready_without_running_a_cell(page, browser):
    restart_from_the_panel(page)
    kernel_idle(page)  # no cell run: the page hears of the new kernel by itself


def test_restart_and_shut_down_from_the_panel_log_no_console_error(lab, page, browser):
    pid = run_cell(page, 0).split()[1]
    restart_from_the_panel(page)
    assert run_cell(page, 0).split()[1] != pid  # a new process: the kernel was really restarted
    debugger_settled(page)  # as a person would: JupyterLab's debugger is done asking the new kernel
    confirm_action(page, "shutdown")
    wait_for(lambda: lab.api("GET", "/api/kernels")[1] == [], timeout=30)  # the server has no kernel left
    wait_js(page, "() => document.querySelector('.jp-gpuctx-status-button').textContent.startsWith('GPU –')")
    assert browser.errors == [], STACKS


# -- 2. stale data and the outage ------------------------------------------------------------------

def wait_stale(page, stale: bool, timeout: float) -> None:
    wait_js(page, "s => ['#gpuctx-panel', '.jp-gpuctx-status'].every(q => "
                  "document.querySelector(q).classList.contains('jp-gpuctx-stale') === s)", stale, timeout=timeout)


def test_a_hung_server_is_reported_as_an_outage(lab, page, browser):
    open_panel(page)
    pid = lab.server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_stale(page, True, STALE_WITHIN_MS)
        page.locator("#gpuctx-panel .jp-gpuctx-outage").wait_for(state="visible", timeout=STALE_WITHIN_MS)
    finally:
        os.kill(pid, signal.SIGCONT)
        wait_stale(page, False, LIVE_AGAIN_WITHIN_MS)


def test_stale_and_outage_shown_while_the_server_is_gone_and_cleared_when_back(lab, page, browser):
    panel = open_panel(page)
    wait_stale(page, False, LIVE_AGAIN_WITHIN_MS)
    freshness = panel.locator(".jp-gpuctx-freshness")
    outage = panel.locator(".jp-gpuctx-outage")
    errors_before = len(browser.errors)

    # Stopped (SIGSTOP): the socket stays open but nothing comes; the data turns stale.
    pid = lab.server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_stale(page, True, STALE_WITHIN_MS)
        assert freshness.is_visible() and re.fullmatch(r"Last update \d\d:\d\d:\d\d", freshness.inner_text())
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_stale(page, False, LIVE_AGAIN_WITHIN_MS)
    assert freshness.is_hidden()

    # Gone (SIGKILL): the socket drops; stale, and the outage line, until it is back on its port.
    lab.kill()
    wait_stale(page, True, STALE_WITHIN_MS)
    outage.wait_for(state="visible", timeout=STALE_WITHIN_MS)
    assert outage.inner_text() == OUTAGE and outage.get_attribute("role") == "status"
    assert OUTAGE in page.locator(".jp-gpuctx-status-button").get_attribute("aria-label")
    lab.restart()
    wait_stale(page, False, LIVE_AGAIN_WITHIN_MS)
    outage.wait_for(state="hidden", timeout=LIVE_AGAIN_WITHIN_MS)
    wait_js(page, "() => document.querySelector('#gpuctx-panel .jp-gpuctx-connection').dataset.state === 'open'",
            timeout=LIVE_AGAIN_WITHIN_MS)
    # While the server is gone, Chromium itself logs every refused connection of the page (JupyterLab's
    # own polls, and this stream's reconnects) as a console error, and every request in flight when
    # it was killed as reset: the browser's network log, not an error of the page's code, so only
    # those are let through, and only for this outage.
    network = re.compile(r"^(Failed to load resource: net::ERR_CONNECTION_(REFUSED|RESET|CLOSED)"
                         r"|WebSocket connection to 'ws://127\.0\.0\.1:\d+/.*' failed: .*)$")
    outage_errors = browser.errors[errors_before:]
    del browser.errors[errors_before:]  # not left for the next test to find, whatever this one finds
    assert [e for e in outage_errors if not network.match(e)] == [], outage_errors


# -- 4. eight GPUs: compact rows ----------------------------------------------------------------

def test_the_composed_eight_gpu_trace_is_what_compose_trace_makes():
    assert TRACE8.read_text() == compose_trace(TRACE, gpus=8, samples=60), \
        "regenerate it: compose_trace(TRACE, 8, 60) in tests/harness/traces.py"


def test_eight_gpus_are_shown_as_compact_rows_and_the_toggle_switches_to_cards(lab8, page, browser):
    page.close()  # the first lab's page, whose server outage came before: this test's errors only
    browser.errors.clear()
    page = browser.page()
    try:
        page.goto(f"{lab8.url}/lab?reset&token={lab8.token}")
        panel = open_panel(page)
        rows = panel.locator(".jp-gpuctx-compact-row")
        wait_js(page, "() => document.querySelectorAll('#gpuctx-panel .jp-gpuctx-compact-row').length === 8")
        assert page.locator("#gpuctx-panel[data-gpuctx-compact]").count() == 1
        assert panel.locator(".jp-gpuctx-card").count() == 0
        banner = panel.locator(".jp-gpuctx-replay")
        assert BANNER in banner.inner_text() and "composed" in banner.inner_text()  # the file name says so
        names = rows.locator(".jp-gpuctx-compact-name").all_inner_texts()
        assert len(set(names)) == 8, names
        for row in rows.all():  # the sidebar is at its narrowest (JupyterLab's default)
            util, mem = (row.locator(f".jp-gpuctx-meter-{kind} .jp-gpuctx-meter-bar").bounding_box()["width"]
                         for kind in ("utilization", "memory"))
            assert util > 0 and util == pytest.approx(mem, abs=0.5), (util, mem)  # subpixel layout
        toggle = panel.locator(".jp-gpuctx-compact-toggle")
        assert toggle.inner_text() == "Compact" and toggle.get_attribute("aria-pressed") == "true"
        shoot(page, panel, screenshot("panel-compact.png"))

        toggle.click()
        cards_drawn(page, 8)
        assert page.locator("#gpuctx-panel[data-gpuctx-compact]").count() == 0
        assert rows.count() == 0 or panel.locator(".jp-gpuctx-compact-list").is_hidden()
        assert toggle.get_attribute("aria-pressed") == "false"
        toggle.click()
        wait_js(page, "() => document.querySelector('#gpuctx-panel').dataset.gpuctxCompact === 'true'")
        assert browser.errors == [], STACKS
    finally:
        page.close()
