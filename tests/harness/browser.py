"""A real JupyterLab in Debian's Chromium, driven by Playwright (no browser download: the
system's /usr/bin/chromium), for tests that assert on what a person sees."""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

from .server import Server

CHROMIUM = os.environ.get("GPUCTX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "data" / "h200-trace.jsonl"  # recorded on 2 x H200, replayed by the labs
TRACE8 = TRACE.parent / "h200x8-composed-trace.jsonl"  # 8 GPUs composed from it (tests/harness/traces.py)
# axe-core, a devDependency of labextension/ (installed by `make setup`), injected into pages
AXE = REPO / "labextension" / "node_modules" / "axe-core" / "axe.min.js"
# Screenshots go to a git-ignored folder, so `make test` leaves the tree clean; `make screenshots`
# points this at docs/img to refresh the README's pictures on purpose.
SCREENSHOTS = Path(os.environ.get("GPUCTX_SCREENSHOTS") or REPO / "build" / "screenshots")
if not SCREENSHOTS.is_absolute():
    SCREENSHOTS = REPO / SCREENSHOTS
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]

LAB_ARGS = [
    "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: switch themes from the tests
    "--LabApp.news_url=None",  # no fetch of JupyterLab's news feed (no network)
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
]


def notebook_json(cell_id: str, source: str) -> str:
    """A one-cell notebook on the python3 kernel, as a file's text."""
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": {}, "outputs": [],
                   "source": source}],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    })


def browser_required() -> bool:
    """Whether a browser test that cannot run is a failure (GPUCTX_REQUIRE_BROWSER=1, as in CI)."""
    return os.environ.get("GPUCTX_REQUIRE_BROWSER", "") not in ("", "0")


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM}: `make browser` installs Debian's (or set GPUCTX_CHROMIUM)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed: `make setup` installs it"
    return None


class Lab:
    """A real `jupyter lab` (gpuctx enabled) over a folder, that can be stopped hard (`kill`),
    hung (`pause`/`resume`: SIGSTOP/SIGCONT) and started again on the same port and token
    (`restart`), so that a page it served stays loaded through an outage."""

    def __init__(self, root: Path, args=(), env: dict | None = None):
        self.root, self.args, self.env = root, [*args, *LAB_ARGS], env
        self.orphans: list = []  # kernels a killed server left running, ended at stop()
        self.server = Server(str(root), app="jupyterlab", args=self.args, env=env).start(timeout=120)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.token

    def api(self, *args, **kwargs):
        return self.server.api(*args, **kwargs)

    def log(self) -> str:
        return self.server.log()

    def pause(self) -> None:
        os.kill(self.server.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.server.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        import psutil  # an ipykernel dependency

        self.orphans += psutil.Process(self.server.proc.pid).children(recursive=True)
        self.server.proc.kill()
        self.server.proc.wait(20)
        self.server.stop()  # closes its log

    def restart(self) -> None:
        old = self.server
        new = Server(str(self.root), app="jupyterlab", args=self.args, env=self.env)
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


class Browser:
    """One headless Chromium with a fresh profile; pages collect console errors."""

    def __init__(self):
        os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        from playwright.sync_api import sync_playwright

        self.profile = tempfile.mkdtemp(prefix="gpuctx-chromium-")
        self._pw = sync_playwright().start()
        self.context = self._pw.chromium.launch_persistent_context(
            self.profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        self.context.set_default_timeout(60_000)  # Playwright's 30 s is short for a loaded 2-core machine
        self.errors: list[str] = []

    def page(self):
        page = self.context.new_page()
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        return page

    def _console(self, msg) -> None:
        if msg.type == "error":  # every one counts: JupyterLab itself logs none on this path
            self.errors.append(msg.text)

    def close(self) -> None:
        try:
            self.context.close()
        finally:
            self._pw.stop()
            shutil.rmtree(self.profile, ignore_errors=True)


def kernel_idle(page, timeout: float = 60_000) -> None:
    page.wait_for_function(
        "() => { const a = window.jupyterapp; const nb = a && a.shell.currentWidget;"
        " const k = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;"
        " return !!k && k.status === 'idle'; }", timeout=timeout)


def debugger_settled(page, timeout: float = 60_000) -> None:
    """Wait until JupyterLab's debugger has no request open on the notebook's kernel.

    Once a kernel is up (after open, restart) JupyterLab's debugger asks it for its state, a chain
    of `debugInfo` requests; a restart or shutdown before the chain ends makes JupyterLab itself log
    "Could not restore the debugger state". A person takes longer than that chain; a test waits.
    The open requests are the kernel connection's own futures, so none sent before this call is
    missed."""
    page.wait_for_function(
        "() => { const nb = window.jupyterapp.shell.currentWidget;"
        " const k = nb && nb.sessionContext.session && nb.sessionContext.session.kernel;"
        " return !!k && ![...k._futures.values()].some(f => f.msg.header.msg_type === 'debug_request'); }",
        timeout=timeout)


def command(page, name: str, args: dict | None = None) -> None:
    """Run a JupyterLab command as a menu or shortcut would, and wait for it to finish. Nothing is
    returned: a command's result (a widget) is a graph Playwright may refuse to serialize."""
    page.evaluate("([c, a]) => window.jupyterapp.commands.execute(c, a).then(() => null)", [name, args or {}])


def focus_current(page) -> None:
    """Give the keyboard to the main area's current widget, as a click on it would, and wait until
    it has it. Lumino activates a widget on a later frame: a key pressed before then opens, say,
    the command palette, and the activation then takes the focus back and the palette closes."""
    page.wait_for_function(
        "() => { const s = window.jupyterapp.shell, w = s.currentWidget; if (!w) return false;"
        " if (!w.node.contains(document.activeElement)) s.activateById(w.id);"
        " return w.node.contains(document.activeElement); }", timeout=30_000)


def set_theme(page, theme: str, light: bool) -> None:
    """Switch JupyterLab's theme and return once it is in place and the switch is over."""
    command(page, "apputils:change-theme", {"theme": theme})
    page.wait_for_function("l => document.body.dataset.jpThemeLight === String(l)", arg=light, timeout=30_000)
    # the theme's stylesheet has loaded when the panel's background has the theme's lightness
    page.wait_for_function(
        "l => { const m = getComputedStyle(document.querySelector('#gpuctx-panel')).backgroundColor"
        ".match(/\\d+/g).slice(0, 3).map(Number); const s = m[0] + m[1] + m[2];"
        " return l ? s > 600 : s < 300; }", arg=light, timeout=30_000)
    # JupyterLab shows its splash screen while it changes themes and removes it 200 ms after; a
    # second change before then makes JupyterLab itself throw (removeChild of a node already gone)
    page.locator("#jupyterlab-splash").wait_for(state="detached")


def screenshot(name: str) -> Path:
    """Where the screenshot `name` goes (the folder is made): build/screenshots/ unless
    GPUCTX_SCREENSHOTS says otherwise."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / name


def refreshing_docs() -> bool:
    """Whether the screenshots are for the README (`make screenshots`): then waits that only make
    a better picture are worth their seconds."""
    return SCREENSHOTS.resolve() == (REPO / "docs" / "img").resolve()


def shoot(page, panel, path: Path) -> None:
    """The panel down to its last section (the sidebar below it is empty), for the README."""
    box = panel.bounding_box()
    bottom = panel.evaluate("n => Math.max(...Array.from(n.children).map(c => c.getBoundingClientRect().bottom))")
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), clip={"x": box["x"], "y": box["y"], "width": box["width"],
                                          "height": min(box["height"], bottom - box["y"] + 12)})


def decline_news(page) -> None:
    """Answer JupyterLab's own "notified about official Jupyter news?" toast, if it is up."""
    toast = page.locator(".Toastify__toast", has_text="Jupyter news")
    if toast.count():
        toast.locator("button", has_text="No").click()
        toast.wait_for(state="detached")


def open_panel(page):
    """The GPU panel, opened from its sidebar tab unless the restored layout already shows it."""
    # JupyterLab's first load from a fresh server is slow when loaded; a reload restores the layout
    # (the panel open or not) first: its tab clicked before that would close what it reopens
    page.wait_for_function("() => !!window.jupyterapp", timeout=120_000)
    page.evaluate("() => window.jupyterapp.restored.then(() => true)")
    panel = page.locator("#gpuctx-panel")
    if not panel.is_visible():
        tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="gpuctx-panel"]')
        tab.wait_for(timeout=120_000)
        tab.click()
    panel.wait_for(state="visible")
    return panel


def confirm_action(page, action: str) -> str:
    """Click the GPU panel's notebook-section button for `action`, accept JupyterLab's dialog and
    return the dialog's text (what the user was asked)."""
    open_panel(page).locator(f'.jp-gpuctx-notebook button[data-action="{action}"]').click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(state="visible")
    question = dialog.inner_text()
    dialog.locator("button.jp-mod-accept").click()
    dialog.wait_for(state="detached")
    return question


def axe_violations(page, selector: str, impacts=("serious", "critical")) -> list[dict]:
    """axe-core's WCAG 2.1 A/AA violations of `impacts` inside `selector` (injected into the page
    once), each as {id, impact, help, nodes: [target, ...]}."""
    if not page.evaluate("() => !!window.axe"):
        page.add_script_tag(path=str(AXE))
    found = page.evaluate("""async sel => {
        const r = await axe.run(document.querySelector(sel),
                                {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}});
        return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                       nodes: v.nodes.map(n => n.target.join(' ') + ': ' + n.failureSummary)}));
    }""", selector)
    return [v for v in found if v["impact"] in impacts]


def notebook_with(cells: list[str]) -> str:
    """A notebook of these code cells on the python3 kernel, as a file's text."""
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": src} for i, src in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    })


def run_cell(page, index: int) -> str:
    """Run the current notebook's cell `index` as Shift+Enter would; its output's text."""
    page.evaluate("async i => { const nb = window.jupyterapp.shell.currentWidget; nb.content.activeCellIndex = i;"
                  " await window.jupyterapp.commands.execute('notebook:run-cell'); }", index)
    kernel_idle(page, timeout=60_000)
    return page.evaluate("i => window.jupyterapp.shell.currentWidget.content.widgets[i].outputArea.node.innerText",
                         index)


def open_notebook(browser: Browser, lab, name: str):
    """A new page with the notebook open in JupyterLab and its kernel idle."""
    page = browser.page()
    page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}")
    page.locator(".jp-Notebook").first.wait_for(timeout=60_000)
    kernel_idle(page)
    return page
