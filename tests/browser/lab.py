"""A real JupyterLab in Debian's Chromium, driven by Playwright (no browser download: the
system's /usr/bin/chromium), for tests that assert on what a person sees."""
from __future__ import annotations

import os
import shutil
import tempfile

CHROMIUM = os.environ.get("GPUCTX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]

def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM}: `apt-get install chromium` (make test does)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (make test installs it)"
    return None


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
