"""The panel and the notebook monitor in a real JupyterLab (Debian's Chromium) fed by the trace
recorded on 2 × H200 (tests/data/h200-trace.jsonl, `scripts/record-trace.sh`), through the
explicit replay mode: the cards render from real NVML samples and every view says it is a replay.
The server also keeps a warm kernel pool, so the notebook's kernel comes from the pool and the
panel says so. The README's screenshots come from here."""
from __future__ import annotations

import re

import pytest

from .harness.browser import (
    TRACE,
    axe_violations,
    decline_news,
    notebook_json,
    open_panel,
    refreshing_docs,
    screenshot,
    set_theme,
    shoot,
)
from .harness.waiting import wait_for

BANNER = "Replay of a recorded trace — not live data"

NOTEBOOK = notebook_json("monitor", "# the server loaded gpuctx into this kernel\n"
                                    "m = %gpu monitor --replay h200-trace.jsonl --history 30")


@pytest.fixture(scope="module")
def lab(lab_factory):
    lab = lab_factory({"train.ipynb": NOTEBOOK, "h200-trace.jsonl": TRACE.read_text()},
                      f"--GpuctxServer.replay_trace={TRACE}", "--GpuctxServer.pool_size=1",
                      "--GpuctxServer.warm_policy=always", name="replay-lab")
    wait_for(lambda: "gpuctx pool: standby python3 kernel ready" in lab.log(), timeout=240)  # (it imports torch)
    return lab


@pytest.fixture(scope="module")
def page(notebook_page, lab):
    return notebook_page(lab, "train.ipynb")


def test_panel_renders_the_replayed_h200_trace_under_a_replay_banner(lab, page, browser):
    status, snapshot = lab.api("GET", "/gpuctx/api/devices")
    assert status == 200 and snapshot["gpu"] and snapshot["replay"]["source"] == str(TRACE), snapshot
    panel = open_panel(page)
    cards = panel.locator(".jp-gpuctx-card")
    cards.nth(1).wait_for(state="visible")
    assert cards.count() == 2
    banner = panel.locator(".jp-gpuctx-header .jp-gpuctx-state.jp-gpuctx-replay")  # the one state: replay
    banner.wait_for(state="visible")
    assert BANNER in banner.inner_text() and TRACE.name in banner.inner_text()
    assert banner.locator(".jp-gpuctx-state-detail").get_attribute("title") == str(TRACE)  # the full path
    assert "cuda:0 · NVIDIA H200" in cards.nth(0).inner_text() and "cuda:1 · NVIDIA H200" in cards.nth(1).inner_text()
    assert panel.locator(".jp-gpuctx-nogpu").inner_text() == ""
    # the recorded load alternates 12 s busy and 8 s idle: the history chart draws it
    page.wait_for_function("() => Array.from(document.querySelectorAll('#gpuctx-panel .jp-gpuctx-chart'))"
                           ".filter(c => Number(c.dataset.gpuctxPoints) >= 2).length === 2", timeout=30_000)
    status_item = page.locator(".jp-gpuctx-status-button")
    page.wait_for_function("() => document.querySelector('.jp-gpuctx-status-button').textContent.endsWith('(replay)')")
    assert "replay" in status_item.get_attribute("aria-label").lower()
    assert browser.errors == []


def test_the_notebook_section_says_its_kernel_came_from_the_warm_pool(page, browser):
    panel = open_panel(page)
    rows = panel.locator(".jp-gpuctx-notebook .jp-gpuctx-rows")
    page.wait_for_function("() => document.querySelector('#gpuctx-panel .jp-gpuctx-notebook .jp-gpuctx-rows')"
                           ".textContent.includes('from the warm pool')", timeout=30_000)
    assert "Started" in rows.inner_text()
    assert "train.ipynb" in panel.locator(".jp-gpuctx-notebook-name").inner_text()
    if refreshing_docs():  # for the README: a chart with a minute of history, not a few seconds
        page.wait_for_function("() => Array.from(document.querySelectorAll('#gpuctx-panel .jp-gpuctx-chart'))"
                               ".every(c => Number(c.dataset.gpuctxPoints) >= 60)", timeout=120_000)
    shoot(page, panel, screenshot("panel-light.png"))
    assert browser.errors == []


# The reserve as the panel shows it, read in one go (headline and lines of one render): reading them
# one after the other could mix two snapshots of a pool that is changing.
RESERVE = ("() => { const r = document.querySelector('#gpuctx-panel .jp-gpuctx-reserve');"
           " if (!r || r.hidden) return null;"
           " const h = r.querySelector('.jp-gpuctx-reserve-heading');"
           " return [h ? h.textContent : '', Array.from(r.querySelectorAll('.jp-gpuctx-reserve-line'))"
           ".map(l => l.textContent)]; }")


def standby_after_adoption(lab) -> dict | None:
    """The pool's ready standby, once it is another process than the notebook's kernel (the
    standby the kernel was adopted from is the kernel now); None before."""
    kernels = lab.api("GET", "/api/kernels")[1] or []
    pids = {(lab.api("GET", f"/gpuctx/api/kernels/{k['id']}")[1] or {}).get("pid") for k in kernels}
    pool = lab.api("GET", "/gpuctx/api/devices")[1].get("pool") or {}
    ready = [s for s in pool.get("standbys") or [] if s.get("ready") and s.get("pid") not in pids]
    return ready[0] if kernels and None not in pids and len(ready) == 1 else None


def diagnosis(lab, page) -> str:
    """For a failure: what the panel's reserve and the pool say now, and the pool's lines of
    JupyterLab's log (the log itself is in the test's temporary folder, kept for a few runs)."""
    try:
        shown, pool = page.evaluate(RESERVE), lab.api("GET", "/gpuctx/api/devices")[1].get("pool")
    except Exception as exc:  # noqa: BLE001 — the log matters most
        shown = pool = f"unreadable: {type(exc).__name__}: {exc}"
    lines = [line for line in lab.log().splitlines() if "gpuctx" in line or "Kernel started" in line]
    return (f"the panel's reserve: {shown}\nthe pool: {pool}\nJupyterLab's log ({lab.server.log_path}), "
            "its pool and kernel lines:\n" + "\n".join(lines[-80:]))


def test_the_panel_shows_the_warm_reserve_and_what_it_holds(lab, page, browser):
    """The notebook's kernel came from the pool, which then started the next standby: once that
    one is ready, the panel says the reserve is ready and names the standby (kernelspec, kind, GPU,
    RSS, state) and the host memory the standbys hold of their budget. (Right after the hand-over
    the panel may still show the standby the kernel was adopted from — its snapshot is up to a
    stream interval old — and then, truly, an empty reserve: neither is what this test is about.)"""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    panel = open_panel(page)
    try:
        wait_for(lambda: standby_after_adoption(lab), timeout=120, every=0.25)
        handle = page.wait_for_function(
            f"() => {{ const v = ({RESERVE})(); return v && v[0] === 'Warm reserve: 1 kernel ready'"
            " && v[1].length === 2 && v[1][0].endsWith(' · ready') ? v : null; }", timeout=30_000)
        _headline, lines = handle.json_value()
        assert re.fullmatch(r"python3 · GPU-ready · GPU 0 · RSS [\d.]+ [MG]iB · ready", lines[0]), lines
        assert re.fullmatch(r"Standbys' host memory: [\d.]+ ([MG]iB )?/ [\d.]+ [MG]iB budget \((machine|container)\)",
                            lines[1]), lines
    except (AssertionError, PlaywrightTimeout) as exc:
        raise AssertionError(f"{exc}\n{diagnosis(lab, page)}") from None
    assert panel.locator(".jp-gpuctx-reserve").get_attribute("aria-labelledby")
    assert browser.errors == []


def test_monitor_in_the_notebook_replays_the_trace_labelled(page, browser):
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    output = page.locator(".jp-Notebook .jp-OutputArea-output").first
    output.wait_for(state="visible", timeout=60_000)
    page.wait_for_function("() => { const o = document.querySelector('.jp-Notebook .jp-OutputArea-output');"
                           " return o && o.textContent.includes('cuda:1 · NVIDIA H200') &&"
                           " o.textContent.includes('GPU memory') && /util [1-9]\\d*%/.test(o.textContent) &&"
                           " o.querySelectorAll('svg polyline').length >= 4; }", timeout=60_000)  # the busy phase
    text = output.inner_text()
    assert text.startswith("REPLAY of a trace recorded 2026-") and "not live data" in text
    assert "cuda:0 · NVIDIA H200 (nvidia-smi 0)" in text and "GPU memory" in text
    assert re.search(r"util \d+%", text) and "/ 700 W" in text
    if refreshing_docs():  # for the README: wait until the plot shows busy, idle, busy (27 s of trace)
        page.wait_for_function("() => { const p = document.querySelector('.jp-Notebook .jp-OutputArea-output svg polyline');"
                               " return p && p.getAttribute('points').trim().split(/\\s+/).length >= 28; }", timeout=60_000)
    decline_news(page)  # JupyterLab's own question would sit on the picture
    output.screenshot(path=str(screenshot("monitor.png")))
    assert browser.errors == []


def test_the_monitor_has_no_serious_accessibility_violation_in_either_theme(page, browser):
    output = ".jp-Notebook .jp-OutputArea-output"
    page.wait_for_function("o => { const n = document.querySelector(o); return n && n.querySelectorAll('[role=meter]')"
                           ".length === 4; }", arg=output)
    meters = page.evaluate("o => Array.from(document.querySelector(o).querySelectorAll('[role=meter]'))"
                           ".map(m => [m.getAttribute('aria-label'), m.getAttribute('aria-valuetext')])", output)
    assert [m[0] for m in meters] == ["utilisation of cuda:0", "memory of cuda:0", "utilisation of cuda:1",
                                      "memory of cuda:1"]
    assert re.fullmatch(r"\d+%", meters[0][1]) and re.fullmatch(r".+ GiB / 140 GiB", meters[1][1]), meters
    labels = page.evaluate("o => Array.from(document.querySelector(o).querySelectorAll('svg text'))"
                           ".map(t => t.textContent)", output)
    assert labels[:6] == ["100%", "0%", "140 GiB", "0", "−30 s", "now"]  # the chart's scales, on the chart
    try:
        for theme, light in (("JupyterLab Light", True), ("JupyterLab Dark", False)):
            set_theme(page, theme, light)
            assert axe_violations(page, output) == [], theme
    finally:
        set_theme(page, "JupyterLab Light", light=True)
    assert browser.errors == []


def test_dark_theme(page, browser):
    panel = open_panel(page)
    set_theme(page, "JupyterLab Dark", light=False)
    bg = panel.evaluate("n => getComputedStyle(n).backgroundColor")
    assert re.match(r"rgb\((\d+), (\d+), (\d+)\)", bg) and sum(map(int, re.findall(r"\d+", bg)[:3])) < 3 * 100, bg
    card_bg = panel.locator(".jp-gpuctx-card").first.evaluate("n => getComputedStyle(n).color")
    assert sum(map(int, re.findall(r"\d+", card_bg)[:3])) > 3 * 150, card_bg  # light text on dark
    banner = panel.locator(".jp-gpuctx-state.jp-gpuctx-replay")
    fg, bg = banner.evaluate("n => [getComputedStyle(n).color, getComputedStyle(n).backgroundColor]")
    assert contrast(fg, bg) >= 4.5, (fg, bg)  # the replay warning stays readable (WCAG AA)
    shoot(page, panel, screenshot("panel-dark.png"))
    set_theme(page, "JupyterLab Light", light=True)
    assert browser.errors == []


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two CSS rgb()/rgba() colours (fg's alpha blended over bg)."""
    f = [float(v) for v in re.findall(r"[\d.]+", fg)]
    b = [float(v) for v in re.findall(r"[\d.]+", bg)][:3]
    alpha = f[3] if len(f) > 3 else 1.0
    f = [alpha * c + (1 - alpha) * d for c, d in zip(f[:3], b)]

    def lum(rgb):
        lin = [(c / 255 / 12.92) if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(f), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
