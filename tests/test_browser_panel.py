"""The GPU panel and status item in a real JupyterLab (Debian's Chromium), asserted as a person
sees them: meters that keep their width in a narrow sidebar, one state line (stale for N s,
offline) when the server stops answering (and its end when it is back), "GPU –" for a notebook
that uses no GPU and nothing on other tabs, eight GPUs in labelled compact rows that fit at
1280×720 under a header that stays in view, text and meter contrast and axe-core in both themes,
the kernel actions only where they apply, without console errors, and the notebook monitor's
widgets closed in the kernel.

Two `jupyter lab`s at most: one replays the 2 × H200 trace (tests/data/h200-trace.jsonl), the
other an 8-GPU trace composed from it (tests/data/h200x8-composed-trace.jsonl, made by
tests/harness/traces.py and labelled as composed in its header and file name). One page on each,
reused by the tests in file order: the first lab's tests run in the order a person would go."""
from __future__ import annotations

import re

import pytest

from .harness.browser import (
    TRACE,
    TRACE8,
    axe_violations,
    command as run_command,
    confirm_action,
    debugger_settled,
    kernel_idle,
    notebook_with,
    open_panel,
    run_cell,
    screenshot,
    set_theme,
    shoot,
)
from .harness.traces import compose_trace
from .harness.waiting import wait_for

BANNER = "Replay of a recorded trace — not live data"
OFFLINE = "Offline: lost contact with the Jupyter server; retrying…"
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


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory({"plain.ipynb": notebook_with(CELLS), "h200-trace.jsonl": TRACE.read_text()},
                       f"--GpuctxServer.replay_trace={TRACE}", name="panel-lab")


@pytest.fixture(scope="module")
def page(notebook_page, lab):
    page = notebook_page(lab, "plain.ipynb")
    page.on("pageerror", lambda exc: STACKS.append(exc.stack or str(exc)))
    return page


@pytest.fixture(scope="module")
def lab8(lab_factory):
    return lab_factory({"eight.ipynb": notebook_with(["print('eight')"])}, f"--GpuctxServer.replay_trace={TRACE8}",
                       name="panel-lab8")


def wait_js(page, expression: str, arg=None, timeout: float = 30_000) -> None:
    page.wait_for_function(expression, arg=arg, timeout=timeout)


def cards_drawn(page, count: int) -> None:
    wait_js(page, "n => document.querySelectorAll('#gpuctx-panel .jp-gpuctx-card').length === n", count)


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
    assert axe_violations(page, "#gpuctx-panel") == []
    assert axe_violations(page, ".jp-gpuctx-status") == []
    shoot(page, panel, screenshot("panel-light-notebook.png"))
    try:
        set_theme(page, "JupyterLab Dark", light=False)
        assert_contrast(page, "JupyterLab Dark")
        assert axe_violations(page, "#gpuctx-panel") == []
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
        run_command(page, command)
        page.locator(".jp-gpuctx-status").wait_for(state="hidden")
        page.evaluate("() => window.jupyterapp.shell.currentWidget.close()")
        page.locator(".jp-gpuctx-status").wait_for(state="visible")
        # back on the notebook, its kernel is asked again ("GPU …" meanwhile)
        wait_js(page, "() => document.querySelector('.jp-gpuctx-status').dataset.gpuctxState === 'none'")
        assert item.inner_text() == "GPU – (replay)"
    assert browser.errors == [], STACKS


# -- 8. who holds the GPU: Release cache -------------------------------------------------------------

def test_release_cache_is_offered_only_where_something_can_be_released(page, browser):
    # Attribution goes by PID: a replayed trace holds the recording machine's PIDs, never this
    # kernel's, so here the notebook holds no GPU memory: Release cache is not offered (the
    # release itself: test_release.py in a real server, test/controller.test.ts for its notice).
    panel = open_panel(page)
    wait_js(page, "() => document.querySelector('#gpuctx-panel .jp-gpuctx-notebook dl').textContent"
                  ".includes('none (no GPU in use)')")
    actions = panel.locator(".jp-gpuctx-notebook .jp-gpuctx-actions button")
    assert actions.all_inner_texts() == ["Interrupt", "Restart", "Shut down"]
    assert panel.locator('button[data-action="release"]').count() == 0
    # and beside its (absent) GPU memory, its host memory and CPU, as the server reads them
    wait_js(page, "() => /Host[\\d.]+ (MiB|GiB) memory, \\d+% CPU/.test(document.querySelector("
                  "'#gpuctx-panel .jp-gpuctx-notebook dl').textContent)")
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
    # the page drops the closed views: no widget of the monitor is left drawn, its last picture is
    wait_js(page, "() => window.jupyterapp.shell.currentWidget.content.widgets[2].outputArea.node"
                  ".querySelectorAll('.jupyter-widgets').length === 0")
    picture = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets[2].outputArea.node.innerText")
    assert "REPLAY of a trace recorded" in picture and " · closed at " in picture and "cuda:1 · NVIDIA H200" in picture
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


# -- 2. stale data and the outage: one state, said once ------------------------------------------

def wait_stale(page, stale: bool, timeout: float) -> None:
    wait_js(page, "s => ['#gpuctx-panel', '.jp-gpuctx-status'].every(q => "
                  "document.querySelector(q).classList.contains('jp-gpuctx-stale') === s)", stale, timeout=timeout)


def state_of(page) -> tuple[str, str, str]:
    """The panel's one state line (its kind and text) and the status bar's text."""
    return page.evaluate("() => { const s = document.querySelector('#gpuctx-panel .jp-gpuctx-state');"
                         " return [s.dataset.state, s.querySelector('.jp-gpuctx-state-text').textContent,"
                         " document.querySelector('.jp-gpuctx-status-button').textContent]; }")


def test_a_hung_server_is_stale_for_n_seconds_in_one_state_line_and_the_status_bar(lab, page, browser):
    panel = open_panel(page)
    lab.pause()
    try:
        wait_stale(page, True, STALE_WITHIN_MS)
        wait_js(page, "() => /^Stale for [3-9] s/.test(document.querySelector('#gpuctx-panel .jp-gpuctx-state')"
                      ".textContent)", timeout=STALE_WITHIN_MS)
        kind, text, status = state_of(page)
        assert kind == "stale" and re.fullmatch(r"Stale for \d+ s: no data from the server since \d\d:\d\d:\d\d"
                                                r" \(a replay of a recorded trace\)", text), text
        assert re.fullmatch(r"GPU – \(replay, stale \d+ s\)", status), status
        # said once: no second line, and no kernel action while the server does not answer
        assert panel.locator(".jp-gpuctx-state").count() == 1
        assert "connected" not in panel.inner_text()
        assert panel.locator(".jp-gpuctx-notebook button").count() == 0
    finally:
        lab.resume()
    wait_stale(page, False, LIVE_AGAIN_WITHIN_MS)
    assert state_of(page)[0] == "replay"


def test_stale_then_offline_while_the_server_is_gone_and_cleared_when_back(lab, page, browser):
    panel = open_panel(page)
    wait_stale(page, False, LIVE_AGAIN_WITHIN_MS)
    errors_before = len(browser.errors)
    # Gone (SIGKILL): the socket drops; offline, said in the one state line, until it is back on its port.
    lab.kill()
    wait_js(page, "() => document.querySelector('#gpuctx-panel .jp-gpuctx-state').dataset.state === 'offline'",
            timeout=STALE_WITHIN_MS)
    kind, text, status = state_of(page)
    assert text.startswith(OFFLINE) and re.search(r"Last update \d\d:\d\d:\d\d\.", text), text
    assert status == "GPU – (replay, offline)"
    assert OFFLINE in page.locator(".jp-gpuctx-status-button").get_attribute("aria-label")
    assert panel.locator(".jp-gpuctx-state [role='status']").inner_text().startswith(OFFLINE)
    lab.restart()
    wait_stale(page, False, LIVE_AGAIN_WITHIN_MS)
    wait_js(page, "() => document.querySelector('#gpuctx-panel .jp-gpuctx-state').dataset.state === 'replay'",
            timeout=LIVE_AGAIN_WITHIN_MS)
    assert state_of(page)[2] == "GPU – (replay)"
    # While the server is gone, Chromium itself logs every refused connection of the page (JupyterLab's
    # own polls, and this stream's reconnects) as a console error, and every request in flight when
    # it was killed as reset: the browser's network log, not an error of the page's code, so only
    # those are let through, and only for this outage.
    network = re.compile(r"^(Failed to load resource: net::ERR_CONNECTION_(REFUSED|RESET|CLOSED)"
                         r"|WebSocket connection to 'ws://127\.0\.0\.1:\d+/.*' failed: "
                         r"(Error in connection establishment|Connection closed before receiving a handshake).*)$")
    outage_errors = browser.errors[errors_before:]
    del browser.errors[errors_before:]  # not left for the next test to find, whatever this one finds
    assert [e for e in outage_errors if not network.match(e)] == [], outage_errors


# -- 4. eight GPUs: compact rows ----------------------------------------------------------------

def test_the_composed_eight_gpu_trace_is_what_compose_trace_makes():
    assert TRACE8.read_text() == compose_trace(TRACE, gpus=8, samples=60), \
        "regenerate it: compose_trace(TRACE, 8, 60) in tests/harness/traces.py"


def test_eight_gpus_fit_at_1280x720_as_labelled_compact_rows_under_a_header_that_stays(lab8, browser):
    browser.errors.clear()  # the first lab's outage came before: this test's errors only
    page = browser.page()
    try:
        page.set_viewport_size({"width": 1280, "height": 720})
        page.goto(f"{lab8.url}/lab/tree/eight.ipynb?reset&token={lab8.token}")  # with a notebook's section too
        page.locator(".jp-Notebook").first.wait_for(timeout=120_000)
        kernel_idle(page)
        panel = open_panel(page)
        rows = panel.locator(".jp-gpuctx-compact-row")
        wait_js(page, "() => document.querySelectorAll('#gpuctx-panel .jp-gpuctx-compact-row').length === 8")
        wait_js(page, "() => document.querySelector('#gpuctx-panel .jp-gpuctx-notebook dl').textContent.includes('Host')")
        assert page.locator("#gpuctx-panel[data-gpuctx-compact]").count() == 1
        assert panel.locator(".jp-gpuctx-card").count() == 0
        banner = panel.locator(".jp-gpuctx-state.jp-gpuctx-replay")
        assert BANNER in banner.inner_text() and "composed" in banner.inner_text()  # the file name says so
        names = rows.locator(".jp-gpuctx-compact-name").all_inner_texts()
        assert len(set(names)) == 8, names
        for row in rows.all():  # labelled: what each figure is, used / total, the board, its temperature
            text = row.inner_text()
            assert re.search(r"cuda:\d H200 \d+ °C", text) and re.search(r"Util\s*\d+%", text), text
            assert re.search(r"Mem\s*[\d.]+ / 140 GiB", text), text
            util, mem = (row.locator(f".jp-gpuctx-meter-{kind} .jp-gpuctx-meter-bar").bounding_box()["width"]
                         for kind in ("utilization", "memory"))
            assert util > 0 and util == pytest.approx(mem, abs=0.5), (util, mem)  # subpixel layout
        # all eight in view at 1280x720, under the header, without scrolling
        box = page.evaluate("() => { const p = document.querySelector('#gpuctx-panel').getBoundingClientRect();"
                            " const h = document.querySelector('#gpuctx-panel .jp-gpuctx-header').getBoundingClientRect();"
                            " const r = Array.from(document.querySelectorAll('#gpuctx-panel .jp-gpuctx-compact-row'))"
                            ".map(n => n.getBoundingClientRect());"
                            " return {top: p.top, bottom: p.bottom, header: [h.top, h.bottom],"
                            " rows: r.map(b => [b.top, b.bottom])}; }")
        assert box["header"][0] >= box["top"] - 1 and box["header"][1] <= box["rows"][0][0], box
        assert all(top >= box["header"][1] - 1 and bottom <= box["bottom"] + 1 for top, bottom in box["rows"]), box
        shoot(page, panel, screenshot("panel-compact.png"))
        # the header (the state of the data) stays in view when the panel scrolls
        page.evaluate("() => { const p = document.querySelector('#gpuctx-panel'); p.scrollTop = p.scrollHeight; }")
        wait_js(page, "() => document.querySelector('#gpuctx-panel').scrollTop > 0")
        top = page.evaluate("() => document.querySelector('#gpuctx-panel .jp-gpuctx-header').getBoundingClientRect().top"
                            " - document.querySelector('#gpuctx-panel').getBoundingClientRect().top")
        assert abs(top) <= 1, top

        toggle = panel.locator(".jp-gpuctx-compact-toggle")
        assert toggle.inner_text() == "Compact" and toggle.get_attribute("aria-pressed") == "true"
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
