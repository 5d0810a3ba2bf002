"""The JupyterLab extension in a real JupyterLab, in Debian's Chromium: the GPU panel, the
status-bar item and a kernel action, as a person sees and uses them. No GPU here: what is
asserted is the no-GPU state with the server's own reason (CUDA_VISIBLE_DEVICES="" makes a GPU
machine look the same), and that the panel's buttons really act on a running kernel."""
from __future__ import annotations

import time
from functools import partial

import pytest

from .harness.browser import (
    command,
    confirm_action,
    kernel_idle,
    notebook_json,
    open_panel,
    screenshot,
    shoot,
)

NOTEBOOK = notebook_json("sleepy", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\nprint('slept', 'on')")


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory({"sleep.ipynb": NOTEBOOK, "quiet.ipynb": notebook_json("quiet", "print(1)")},
                       env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.fixture(scope="module")
def page(notebook_page, lab):
    return notebook_page(lab, "sleep.ipynb")


def test_panel_shows_no_gpu_with_the_server_reason(lab, page, browser):
    status, snapshot = lab.api("GET", "/gpuctx/api/devices")
    assert status == 200 and snapshot["gpu"] is False and snapshot["reason"], snapshot
    panel = open_panel(page)
    no_gpu = panel.locator(".jp-gpuctx-nogpu")
    no_gpu.wait_for(state="visible")
    page.wait_for_function("r => document.querySelector('#gpuctx-panel .jp-gpuctx-nogpu').textContent.includes(r)",
                           arg=snapshot["reason"])
    assert no_gpu.inner_text() == f"No GPU: {snapshot['reason']}"
    assert no_gpu.get_attribute("role") == "status"
    assert panel.locator(".jp-gpuctx-card").count() == 0
    assert panel.get_by_role("heading", name="GPUs").is_visible()
    assert panel.locator(".jp-gpuctx-replay").count() == 0  # live data: no replay mark
    # the stream is live (said once, in the header), and the notebook section names the active notebook
    page.wait_for_function("() => document.querySelector('#gpuctx-panel .jp-gpuctx-state').dataset.state === 'live'")
    assert panel.locator(".jp-gpuctx-state").count() == 1 and panel.locator(".jp-gpuctx-state-text").inner_text() == "Live"
    assert "sleep.ipynb" in panel.locator(".jp-gpuctx-notebook-name").inner_text()
    shoot(page, panel, screenshot("panel-nogpu.png"))
    assert browser.errors == []


def test_status_bar_says_no_gpu_and_opens_the_panel(lab, page, browser):
    item = page.locator(".jp-gpuctx-status-button")
    item.wait_for(state="visible")
    page.wait_for_function("() => document.querySelector('.jp-gpuctx-status').dataset.gpuctxState === 'no-gpu'")
    _, snapshot = lab.api("GET", "/gpuctx/api/devices")
    assert item.inner_text() == "GPU –"
    assert item.get_attribute("aria-label").startswith(f"No GPU: {snapshot['reason']}")
    page.locator('.jp-SideBar .lm-TabBar-tab[data-id="filebrowser"]').click()
    page.locator("#gpuctx-panel").wait_for(state="hidden")
    item.click()
    page.locator("#gpuctx-panel").wait_for(state="visible")
    assert browser.errors == []


def test_interrupt_from_the_panel_stops_a_running_cell(lab, page, browser):
    panel = open_panel(page)
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'busy'",
                           timeout=30_000)
    page.wait_for_function("() => document.querySelector('.jp-Notebook .jp-OutputArea').textContent"
                           ".includes('sleeping')", timeout=30_000)  # inside time.sleep(60) now
    started = time.monotonic()
    button = panel.locator('.jp-gpuctx-notebook button[data-action="interrupt"]')
    assert button.get_attribute("aria-label") == "Interrupt the kernel of sleep.ipynb"
    assert "Interrupt the kernel of sleep.ipynb?" in confirm_action(page, "interrupt")
    output = page.locator(".jp-Notebook .jp-OutputArea-output").first
    output.wait_for(state="visible", timeout=30_000)
    page.wait_for_function("() => document.querySelector('.jp-Notebook .jp-OutputArea').textContent.includes('KeyboardInterrupt')",
                           timeout=30_000)
    kernel_idle(page, timeout=30_000)
    assert time.monotonic() - started < 55, "the cell ran on: the interrupt did not reach the kernel"  # (it sleeps 60 s)
    assert "slept on" not in page.locator(".jp-Notebook .jp-OutputArea").first.inner_text()
    assert browser.errors == []


def stream_watched_page(lab, browser):
    """A page and notebook of its own (the other tests' page keeps its layout), and the list of the
    GPU stream's websockets it opens."""
    page = browser.page()
    streams = []
    page.on("websocket", lambda ws: streams.append(ws) if "/gpuctx/api/stream" in ws.url else None)
    page.goto(f"{lab.url}/lab/tree/quiet.ipynb?reset&token={lab.token}")
    page.locator(".jp-Notebook").first.wait_for(timeout=60_000)
    kernel_idle(page)
    return page, streams


def wait_on(page, cond, what: str, timeout: float = 30) -> None:
    """Wait for `cond()` while the page runs (Playwright hands over its events only in its calls)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s: {what}"
        page.wait_for_timeout(100)


def still_open(streams) -> list:
    return [ws for ws in streams if not ws.is_closed()]


def test_the_stream_runs_only_while_something_shows_it(lab, browser):
    """No GPU panel on screen and the status bar hidden (View → Show Status Bar): nothing shows
    the GPU data, so the page's stream closes; it opens again when the status bar is back."""
    errors = len(browser.errors)
    page, streams = stream_watched_page(lab, browser)
    until, open_streams = partial(wait_on, page), partial(still_open, streams)
    item = page.locator(".jp-gpuctx-status")
    item.wait_for(state="visible")
    assert not page.locator("#gpuctx-panel").is_visible()  # the file browser is the open sidebar
    until(open_streams, "no stream for the status bar")
    command(page, "statusbar:toggle")
    item.wait_for(state="hidden")
    until(lambda: not open_streams(), "the stream runs on with nothing showing it")
    opened = len(streams)
    command(page, "statusbar:toggle")
    item.wait_for(state="visible")
    until(lambda: len(streams) > opened and open_streams(), "the stream did not come back with the status bar")
    # JupyterLab saves the toggle after showing it: a page closed before that save lands leaves the
    # status bar hidden for every later page of this test process (it did, in CI)
    until(lambda: statusbar_saved(lab) is not False, "the shown status bar was not saved")
    assert browser.errors[errors:] == []
    page.close()


def statusbar_saved(lab) -> bool | None:
    """The status bar's visibility as the server has it saved (None: never saved, shown)."""
    status, plugin = lab.api("GET", "/lab/api/settings/@jupyterlab/statusbar-extension:plugin")
    assert status == 200, plugin
    return plugin.get("settings", {}).get("visible")


HIDE_PAGE = """hidden => {
  // what the browser does when its tab goes to the background, or comes back
  Object.defineProperty(document, 'hidden', {configurable: true, get: () => hidden});
  Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => hidden ? 'hidden' : 'visible'});
  document.dispatchEvent(new Event('visibilitychange'));
}"""


def test_a_page_in_a_background_tab_lets_its_stream_go_and_is_live_again_when_shown(lab, browser):
    """Fifty tabs left in the background must cost the server nothing: a hidden page keeps its
    stream a few seconds (a glance at another tab), then closes it; shown again, it reconnects at
    once and the status bar is never shown stale for the time it was away."""
    errors = len(browser.errors)
    assert statusbar_saved(lab) is not False, "an earlier test left the status bar hidden"
    page, streams = stream_watched_page(lab, browser)
    until, open_streams = partial(wait_on, page), partial(still_open, streams)
    item = page.locator(".jp-gpuctx-status")
    item.wait_for(state="visible")
    until(open_streams, "no stream for the status bar")
    page.evaluate(HIDE_PAGE, True)
    hidden_at = time.monotonic()
    until(lambda: not open_streams(), "a hidden page kept its stream")
    assert time.monotonic() - hidden_at >= 4, "the stream went at once: a glance at another tab would reconnect"
    page.wait_for_timeout(3000)  # away for longer than the stream's staleness (two intervals)
    assert not open_streams()
    opened = len(streams)
    page.evaluate(HIDE_PAGE, False)
    # at once, and without a stale moment: the status bar's text is watched from the first frame
    page.evaluate("""() => { window.__gpuctxSeen = []; const item = document.querySelector('.jp-gpuctx-status');
        const note = () => window.__gpuctxSeen.push(item.className + ' ' + item.textContent);
        note(); new MutationObserver(note).observe(item, {subtree: true, childList: true, characterData: true,
                                                          attributes: true}); }""")
    until(lambda: len(streams) > opened and open_streams(), "the stream did not come back when the page was shown", 10)
    page.wait_for_timeout(1500)
    seen = page.evaluate("() => window.__gpuctxSeen")
    assert seen and not [s for s in seen if "stale" in s.lower()], seen
    assert browser.errors[errors:] == []
    page.close()
