"""Warming what is being typed, in a real JupyterLab in Debian's Chromium: a person opens a new,
empty notebook and types; a second after they stop, the page sends the code cells (PUT …/cells,
seen here as the browser's own requests) and the kernel re-plans from them before anything is
saved. While a cell runs nothing is sent: what is typed meanwhile goes once the kernel is idle."""
from __future__ import annotations

import json
import time

import pytest

from .harness.browser import command, kernel_idle
from .harness.waiting import wait_for

EMPTY = json.dumps({"cells": [], "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)",
                                                            "language": "python", "name": "python3"}},
                    "nbformat": 4, "nbformat_minor": 5})
TYPED = "import torch\nmodel = torch.nn.Linear(8, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)"
LATER = "x = 1  # typed while a cell runs"
HELD = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.05)"  # a cell that runs a while


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory({"new.ipynb": EMPTY, "views.ipynb": EMPTY}, env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.timeout(600)
def test_typing_in_a_new_notebook_warms_its_cells_and_nothing_goes_while_a_cell_runs(lab, notebook_page, browser):
    page = notebook_page(lab, "new.ipynb")
    puts: list[tuple[float, list[str]]] = []  # (when, the cells a PUT carried)

    def seen(request) -> None:
        if request.method == "PUT" and request.url.split("?")[0].endswith("/cells"):
            puts.append((time.monotonic(), json.loads(request.post_data or "{}").get("cells", [])))

    page.on("request", seen)

    def until(cond, timeout: float):
        """Wait for `cond()` while the page runs (Playwright hands over its events only in its calls)."""
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out after {timeout:g} s; PUTs seen: {puts}"
            page.wait_for_timeout(100)
    kid = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id")
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
    page.keyboard.type(TYPED)
    until(lambda: any(cells and cells[0] == TYPED for _t, cells in puts), timeout=60)
    assert lab.api("GET", "/api/contents/new.ipynb")[1]["content"]["cells"] == []  # nothing saved yet

    def replanned():
        status, view = lab.api("GET", f"/gpuctx/api/kernels/{kid}")
        plan = (view or {}).get("plan") or {}
        return status == 200 and "as typed" in plan.get("reading", "") and plan
    plan = wait_for(replanned, timeout=120, every=0.25)
    step = next(s for s in plan["steps"] if s["name"].startswith("optimizer step (SGD with momentum)"))
    assert step["where"] == "cell 1, line 3", step  # the typed line asked for it

    # a cell that runs for a while; what is typed meanwhile waits for its end
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below
    page.keyboard.press("Enter")
    page.keyboard.type(HELD)  # runs until the test has typed below it
    page.keyboard.press("Shift+Enter")
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
                           " === 'busy'", timeout=30_000, polling=50)
    page.keyboard.press("Escape")  # the cell run-and-advance made below it, in edit mode
    page.keyboard.press("Enter")
    page.keyboard.type(LATER)
    busy = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status")
    (lab.root / "go").touch()  # (first: the module's kernel must not stay held if the check fails)
    assert busy == "busy", "the held cell ended before the typing did"
    kernel_idle(page, timeout=60_000)
    idle_at = time.monotonic()
    assert not [t for t, cells in puts if LATER in cells and t < idle_at]  # nothing went while it ran
    until(lambda: any(LATER in cells for _t, cells in puts), timeout=60)
    last = next(cells for _t, cells in reversed(puts) if LATER in cells)
    assert last == [TYPED, HELD, LATER]  # the code cells, in order
    assert browser.errors == []
    assert "opt = torch.optim" not in lab.log()


@pytest.mark.timeout(300)
def test_a_notebook_in_two_views_sends_each_edit_once(lab, notebook_page, browser):
    """JupyterLab's "New View for Notebook" shows one notebook in two panels: its kernel is sent
    each edit once, not once per view."""
    page = notebook_page(lab, "views.ipynb")
    puts: list[list[str]] = []  # the cells each PUT carried

    def seen(request) -> None:
        if request.method == "PUT" and request.url.split("?")[0].endswith("/cells"):
            puts.append(json.loads(request.post_data or "{}").get("cells", []))

    page.on("request", seen)

    def until(cond, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out after {timeout:g} s; PUTs seen: {puts}"
            page.wait_for_timeout(100)

    command(page, "docmanager:clone")  # New View for Notebook
    views = page.locator(".jp-NotebookPanel")
    until(lambda: views.count() == 2 and views.nth(1).is_visible())
    views.nth(1).locator(".jp-Cell .cm-content").first.click()
    page.keyboard.type("import math")
    until(lambda: ["import math"] in puts)
    page.keyboard.type(", json")  # both views' sends of the first edit were due before this one's
    until(lambda: ["import math, json"] in puts)
    assert puts.count(["import math"]) == 1, puts
    assert browser.errors == []
