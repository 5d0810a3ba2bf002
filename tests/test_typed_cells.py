"""Warming what is being typed (issue #25) through a real jupyter_server and real kernels, no GPU:
`PUT /gpuctx/api/kernels/<id>/cells` carries a notebook's cells as the frontend holds them, the
kernel re-plans from them and warms what they need before they run (here the CPU side: imports,
torch._dynamo, an optimizer step on the CPU). Bad input is refused with one line; no cell text
reaches the server's log."""
from __future__ import annotations

import json
import threading
import time
import urllib.parse

import websocket  # websocket-client, a jupyter_server dependency

from gpuctx_jupyter import contract

from .harness.kernels import reply_to, run, start, stop
from .harness.notebooks import notebook
from .harness.warm_kernels import kernel, plan_of, warmup_now
from .harness.waiting import wait_for

MARK = "gpuctx_typed_secret_5e1f"  # in a typed cell: must never appear in a log
CELLS = [f"import torch\nimport torch.nn as nn  # {MARK}",
         "model = nn.Linear(8, 2)\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)",
         "for _ in range(2):\n    loss = model(torch.randn(4, 8)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
         "    opt.step()\nprint('trained')"]
ENDED = ("done", "skipped", "failed")


def put(srv, kid: str, cells=None, raw: bytes | None = None, token="default"):
    return srv.api("PUT", f"/gpuctx/api/kernels/{kid}/cells", None if raw is not None else {"cells": cells},
                   raw=raw, token=token)


def view(srv, kid: str) -> dict:
    """The kernel's view, asked again while the kernel does not answer within the server's query
    timeout (2 s: on a loaded machine, the warm-up's imports can hold the GIL that long)."""
    def answered():
        status, answer = srv.api("GET", f"/gpuctx/api/kernels/{kid}")
        assert status == 200 and answer["status"] in ("ok", "no-answer"), answer
        return answer if answer["status"] == "ok" else None

    return wait_for(answered, timeout=60, every=0.25)


def settled(srv, kid: str) -> dict:
    """The kernel's view once its warm-up has ended."""
    return wait_for(lambda: (v := view(srv, kid))["warmup"]["state"] in ENDED and v["plan"] and v, timeout=240,
                    every=0.25)


def steps(answer: dict) -> dict:
    return {s["name"]: s for s in answer["plan"]["steps"]}


def new_notebook(tmp_path, name: str = "new.ipynb") -> str:
    notebook(tmp_path / name, [])  # as JupyterLab saves a notebook just made: no cells
    return name


def test_a_new_notebook_typed_cell_by_cell_gets_each_cells_needs_warmed_before_it_runs(server_factory, tmp_path):
    srv = server_factory()
    kid = srv.start_kernel(path=new_notebook(tmp_path))
    ks = srv.channels(kid)
    try:
        ks.wait_ready()
        first = settled(srv, kid)
        assert first["plan"]["recipe"] == "imports only"  # the file is empty: torch only, no CUDA

        status, answer = put(srv, kid, CELLS[:1])  # the first cell typed
        assert status == 202 and answer["status"] == "ok" and answer["cells"] == 1, answer
        assert answer["planned"] >= 1  # import torch.nn, and the GPU work (skipped here: no GPU)
        assert "torch.nn" not in json.dumps(answer) and MARK not in json.dumps(answer)  # counts only
        assert ks.execute(CELLS[0]).reply["status"] == "ok"

        status, answer = put(srv, kid, CELLS[:2])  # the second: an optimizer
        assert status == 202 and answer["planned"] >= 1, answer
        after = wait_for(lambda: (v := settled(srv, kid)) and "optimizer step (AdamW) on the CPU" in steps(v) and
                         steps(v)["optimizer step (AdamW) on the CPU"]["state"] in ENDED and v, timeout=240)
        done = steps(after)
        assert done["optimizer step (AdamW) on the CPU"]["state"] == "done"
        assert done["optimizer step (AdamW) on the CPU"]["where"] == "cell 2, line 2"
        assert done["import torch._dynamo"]["state"] == "done"
        assert after["plan"]["reading"] == "2 code cells as typed (unsaved edits included)"
        assert after["warmup"]["source"] == "typed cells"
        names = [s["name"] for s in after["plan"]["steps"]]
        assert names.count("import torch") == 1 and done["import torch"]["state"] == "done"  # not again
        # what the cell needs is there before it runs
        assert ks.execute("import sys; print('torch._dynamo' in sys.modules)").stdout.strip() == "True"
        assert ks.execute(CELLS[1]).reply["status"] == "ok"

        status, answer = put(srv, kid, CELLS)  # the training loop: nothing it needs is new
        assert status == 202 and answer["planned"] == 0 and answer["detail"] == "nothing new to warm for these cells"
        assert ks.execute(CELLS[2]).stdout.strip() == "trained"
        shown = ks.execute("%gpu status").text
        assert "warm plan (notebook) from new.ipynb: 2 code cells as typed" in shown, shown
        assert "optimizer step (AdamW) on the CPU" in shown
    finally:
        ks.close()
    log = srv.log()
    assert MARK not in log and "AdamW(model" not in log and "opt.step" not in log


def on_control(ks, msg_type: str, content: dict, timeout: float = 60) -> dict:
    """One request on the kernel's control channel through its websocket, as the server's suspend
    sends it; the reply's content."""
    msg_id = ks.send(msg_type, content, channel="control")
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ks.ws.settimeout(left)
        try:
            msg = json.loads(ks.ws.recv())
        except websocket.WebSocketTimeoutException:
            continue
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"].endswith("_reply"):
            return msg["content"]
    raise AssertionError(f"no reply to {msg_type} within {timeout:g} s")


def probe_site(tmp_path, *names: str) -> str:
    """Installed packages (outside the notebook's folder) that typed cells import; their folder."""
    site = tmp_path / "lib" / "site-packages"
    for name in names:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("")
    return str(site)


def test_cells_taken_while_a_suspend_asks_the_kernels_consent_are_warmed_all_the_same(server_factory, tmp_path):
    """Typed cells answered 202 are warmed, whatever comes next. Here they wait behind a warm-up
    waiting for its turn, and a suspend's consent gives that warm-up up (the suspend then fails, as
    when the host has no room): the kernel warms the cells once it runs again. The frontend does not
    send cells it was told were taken a second time, so nothing else would warm them."""
    site = probe_site(tmp_path, "gpuctx_probe_first", "gpuctx_probe_typed")
    srv = server_factory(env={"PYTHONPATH": site})
    kid = srv.start_kernel(path=new_notebook(tmp_path))
    ks = srv.channels(kid)
    try:
        ks.wait_ready()
        settled(srv, kid)
        held = ks.execute("from gpuctx_jupyter.kernel.warm import scheduler\n"
                          "scheduler.HEAVY_IDLE_S = 600  # an import's turn: 10 min after the last cell")
        assert held.reply["status"] == "ok", held.text
        first = ["import torch\nimport gpuctx_probe_first"]
        assert put(srv, kid, first)[0] == 202
        wait_for(lambda: ("import gpuctx_probe_first", "planned") in
                 {(s["name"], s["state"]) for s in (view(srv, kid)["plan"] or {"steps": []})["steps"]}, timeout=60)
        status, answer = put(srv, kid, [*first, "import gpuctx_probe_typed"])  # typed on
        assert status == 202 and answer["status"] == "ok" and answer["planned"] >= 1, answer

        # (ipykernel answers a cell before its post-handler hook ends it: a consent then is refused)
        consent = wait_for(lambda: (c := on_control(ks, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"}))
                           ["status"] == "ok" and c, timeout=60)
        assert consent["pid"], consent  # consented: the warm-up waiting for its turn was given up for it
        assert on_control(ks, contract.SUSPEND_DONE_REQUEST, {"token": "t", "ok": False})["state"] == "running"
        assert ks.execute("scheduler.HEAVY_IDLE_S = 0.0").reply["status"] == "ok"

        seen = {}

        def typed_done():
            seen.update(view(srv, kid))
            return steps(seen).get("import gpuctx_probe_typed", {}).get("state") == "done"

        try:
            wait_for(typed_done, timeout=60)
        except AssertionError:
            raise AssertionError(f"the typed cell's import was not warmed: {seen['warmup']}, "
                                 f"{[(s['name'], s['state'], s['detail']) for s in seen['plan']['steps']]}") from None
        assert ks.execute("import sys; print('gpuctx_probe_typed' in sys.modules)").stdout.strip() == "True"
    finally:
        ks.close()


def test_cells_without_a_gpu_framework_warm_nothing_and_reach_only_their_kernel(server_factory, tmp_path):
    srv = server_factory()
    a = srv.start_kernel(path=new_notebook(tmp_path, "a.ipynb"))
    b = srv.start_kernel(path=new_notebook(tmp_path, "b.ipynb"))
    before_b = settled(srv, b)["plan"]
    settled(srv, a)
    status, answer = put(srv, a, ["import json\nprint(json.dumps({}))"])
    assert status == 202 and answer["planned"] == 0, answer
    assert "no GPU framework" in answer["detail"]
    status, answer = put(srv, a, CELLS[:2])
    assert status == 202 and answer["planned"] >= 1
    wait_for(lambda: "reading" in (p := settled(srv, a)["plan"]) and "as typed" in p["reading"], timeout=240)
    assert settled(srv, b)["plan"] == before_b  # the other notebook's kernel is untouched
    # a session's id is not a kernel's: typed cells go to the kernel the URL names, or nowhere
    session = next(s for s in srv.api("GET", "/api/sessions")[1] if s["kernel"]["id"] == b)
    status, answer = put(srv, session["id"], CELLS[:1])
    assert status == 404 and answer["message"].startswith("no kernel"), answer


def test_bad_input_is_refused_with_one_line_and_no_cell_text_in_the_log(server_factory, tmp_path):
    srv = server_factory()
    kid = srv.start_kernel(path=new_notebook(tmp_path))
    huge = json.dumps({"cells": ["x" * (3 * 2**20)]}).encode()
    cases = {  # what is sent -> (status, the start of the message)
        "huge body": (dict(raw=huge), 413, "the body is"),
        "huge text": (dict(cells=[f"# {MARK}\n" + "x" * (2**20)]), 413, "the cells hold more than 1 MiB"),
        "too many cells": (dict(cells=[""] * 1001), 413, "1001 cells"),
        "binary": (dict(raw=b"\xff\xfe\x00\x01" + MARK.encode()), 400, "the body is not UTF-8 text"),
        "not JSON": (dict(raw=b'{"cells": ["' + MARK.encode()), 400, "the body is not JSON"),
        "deep": (dict(raw=b"[" * 100_000), 400, "the body is JSON nested too deeply"),
        "a list": (dict(raw=b'["import torch"]'), 400, "expected a JSON object"),
        "a string": (dict(raw=json.dumps({"cells": MARK}).encode()), 400, '"cells" must be a list of strings'),
        "numbers": (dict(cells=[MARK, 7]), 400, "cells[1] is a number"),
        "a number too long": (dict(raw=b'{"cells": [' + b"9" * 5000 + b"]}"), 400,
                              "the body holds a number too long to read"),
        "other keys": (dict(raw=json.dumps({"cells": [], MARK: 1}).encode()), 400, 'only "cells" is accepted'),
        "lone surrogate": (dict(raw=b'{"cells": ["\\ud800"]}'), 400, "cells[0] is not valid Unicode"),
    }
    for what, (kwargs, want, message) in cases.items():
        status, answer = put(srv, kid, **kwargs)
        assert status == want and answer["message"].startswith(message), (what, status, answer)
        assert MARK not in answer["message"]
    assert put(srv, kid, CELLS, token=None)[0] == 403
    assert put(srv, kid, CELLS, token="not-the-token")[0] == 403
    odd = "no-such-kernel%s%d%(x)s"
    status, answer = put(srv, urllib.parse.quote(odd), CELLS)
    assert status == 404 and answer["message"] == f"no kernel {odd!r} on this server (GET /api/kernels lists them)"
    assert srv.api("GET", f"/gpuctx/api/kernels/{urllib.parse.quote(odd)}")[1]["message"] == answer["message"]
    ks = srv.channels(kid)  # the kernel and the server work on
    assert ks.execute("6 * 7").text == "42"
    ks.close()
    assert put(srv, kid, CELLS[:1])[0] == 202
    log = srv.log()
    assert MARK not in log and "Traceback" not in log and "Logging error" not in log
    refusals = [line for line in log.splitlines() if any(f"{code} PUT /gpuctx/api/kernels/{kid}/cells (" in line
                                                         for code in (400, 413)) and "referer=" not in line]
    assert len(refusals) == len(cases), "\n".join(refusals)  # one line each, with its reason (and the access log's)
    assert all(line.split("): ", 1)[1].startswith(message) for line, (_k, _s, message) in zip(refusals, cases.values()))


def test_a_body_declared_far_over_the_cap_is_refused_before_it_is_sent(server_factory, tmp_path):
    import http.client

    srv = server_factory()
    kid = srv.start_kernel(path=new_notebook(tmp_path))
    url = urllib.parse.urlsplit(srv.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.putrequest("PUT", f"{url.path.rstrip('/')}/gpuctx/api/kernels/{kid}/cells")
    conn.putheader("Authorization", f"token {srv.token}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(10**9))  # a gigabyte announced, none of it sent
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["message"].startswith("the body is 1000000000 bytes")
    conn.close()


def test_kernels_that_do_not_warm_refuse_typed_cells_with_the_reason(server_factory, tmp_path):
    name = new_notebook(tmp_path)
    never = server_factory("--GpuctxServer.warm_policy=never")
    status, answer = put(never, never.start_kernel(path=name), CELLS)
    assert status == 409 and "warm-up off" in answer["message"] and "warm_policy" in answer["message"], answer
    basic = server_factory("--GpuctxServer.warm_recipe=basic", "--GpuctxServer.warm_policy=always")
    status, answer = put(basic, basic.start_kernel(path=name), CELLS)
    assert status == 409 and "fixed basic recipe" in answer["message"], answer
    opted = server_factory(env={"GPUCTX_WARM": "0"})  # the user's own opt-out reaches the kernel
    status, answer = put(opted, opted.start_kernel(path=name), CELLS)
    assert status == 409 and "GPUCTX_WARM=0" in answer["message"], answer


def test_many_puts_at_once_are_all_answered_and_are_not_user_activity(server_factory, tmp_path):
    srv = server_factory()
    kid = srv.start_kernel(path=new_notebook(tmp_path))
    settled(srv, kid)
    activity = srv.api("GET", f"/api/kernels/{kid}")[1]["last_activity"]
    answers: list[tuple[int, dict]] = []

    def send(i: int) -> None:
        answers.append(put(srv, kid, [f"import torch\nx{i} = {i}"]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answers) == 30 and all(status in (200, 202) for status, _ in answers), answers
    assert all(a["status"] == "ok" for _, a in answers), answers
    assert srv.api("GET", f"/api/kernels/{kid}")[1]["last_activity"] == activity  # gpuctx's, not the user's
    status, answer = put(srv, kid, CELLS[:2])  # and the kernel takes the next as the one before
    assert status == 202 and answer["planned"] >= 1
    ks = srv.channels(kid)
    assert ks.execute("6 * 7").text == "42"
    ks.close()


def test_the_kernel_checks_typed_cells_itself(tmp_path):
    """Anything that reaches the kernel's control channel gets the same check as the server's."""
    nb = tmp_path / "new.ipynb"
    notebook(nb, [])
    km, kc = start(env={"JPY_SESSION_NAME": str(nb), "GPUCTX_WARM": "auto"}, extra_arguments=["--ext=gpuctx"],
                   cwd=str(tmp_path))
    try:
        for content, message in (({"cells": [1]}, "cells[0] is a number"), ({"source": "x"}, 'missing "cells"'),
                                 ({"cells": ["x"] * 1001}, "1001 cells")):
            request = kc.session.msg("gpuctx_cells_request", content)
            kc.control_channel.send(request)
            reply = reply_to(kc, request["header"]["msg_id"], timeout=30, channel="control")
            assert reply["msg_type"] == "gpuctx_cells_reply"
            assert reply["content"]["status"] == "refused" and reply["content"]["message"].startswith(message)
        assert run(kc, "6 * 7").text == "42"
    finally:
        stop(km, kc)


def test_cells_typed_while_a_cell_runs_are_planned_once_it_has_finished(tmp_path):
    """Making the warm-up's plan is Python work (reading cells, parsing them): like every step it
    waits for the running cell instead of taking the GIL from it, and is made once the cell ends."""
    nb, started, release = tmp_path / "new.ipynb", tmp_path / "started", tmp_path / "release"
    notebook(nb, [])
    km, kc = start(env={"JPY_SESSION_NAME": str(nb), "GPUCTX_WARM": "auto"}, extra_arguments=["--ext=gpuctx"],
                   cwd=str(tmp_path))
    try:
        wait_for(lambda: warmup_now(kc)["state"] in ENDED, timeout=240)  # the empty notebook's own plan
        cell = kc.execute(f"import os, time\nopen({str(started)!r}, 'w').close()\n"
                          f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.02)")
        wait_for(started.exists)
        request = kc.session.msg("gpuctx_cells_request", {"cells": ["import torch"]})
        kc.control_channel.send(request)
        assert reply_to(kc, request["header"]["msg_id"], timeout=30, channel="control")["content"]["status"] == "ok"
        def waiting_to_read():
            now = warmup_now(kc)
            return now if "reading the plan" in now["phase"] else None

        waiting = wait_for(waiting_to_read)
        assert waiting["state"] == "running" and "once your cells finish" in waiting["phase"], waiting
        release.write_text("go")
        assert reply_to(kc, cell, timeout=30)["content"]["status"] == "ok"
        wait_for(lambda: warmup_now(kc)["state"] in ENDED)
        out = plan_of(kc)
        assert any(s["name"] == "import torch" and s["state"] == "done" for s in out["plan"]["steps"]), out["plan"]
    finally:
        release.write_text("go")
        stop(km, kc)


def test_cells_typed_before_the_kernel_has_read_its_notebook_are_warmed_all_the_same(tmp_path):
    """Under policy auto the warm-up thread reads whether the notebook uses a GPU framework. Cells
    typed before it has (here: while a cell runs and the thread waits its turn) are warmed after it
    found the saved notebook uses none, not dropped with that decision."""
    nb, started, release = tmp_path / "plain.ipynb", tmp_path / "started", tmp_path / "release"
    notebook(nb, "print('no GPU framework here')")
    km, kc = kernel(tmp_path, nb)
    try:
        wait_for(lambda: warmup_now(kc)["state"] == "off")  # the kernel's own start: nothing to warm
        cell = kc.execute("import os, time\nfrom gpuctx_jupyter.kernel.extension import warm_from_env\n"
                          "warm_from_env(get_ipython())  # as the server's request starts it again\n"
                          f"open({str(started)!r}, 'w').close()\n"
                          f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.02)")
        wait_for(started.exists)
        wait_for(lambda: "once your cells finish" in warmup_now(kc)["phase"])  # its plan waits its turn
        request = kc.session.msg("gpuctx_cells_request", {"cells": ["import torch"]})
        kc.control_channel.send(request)
        answer = reply_to(kc, request["header"]["msg_id"], timeout=30, channel="control")["content"]
        assert answer["status"] == "ok" and answer["planned"] > 0, answer
        release.write_text("go")
        assert reply_to(kc, cell, timeout=30)["content"]["status"] == "ok"
        out = plan_of(kc)
        assert out["status"]["source"] == "typed cells" and out["status"]["state"] != "off", out["status"]
        assert any(s["name"] == "import torch" and s["state"] == "done" for s in out["plan"]["steps"]), out["plan"]
    finally:
        release.write_text("go")
        stop(km, kc)


def test_a_new_notebook_behind_a_gateway_takes_typed_cells(server_factory, kernel_gateway, tmp_path):
    """The server decides a gateway kernel's policy (it cannot read our notebook): a new notebook's
    kernel gets `auto`, so its typed cells are warmed, and nothing is warmed at its start."""
    srv = server_factory(f"--GatewayClient.url={kernel_gateway}")
    kid = srv.start_kernel(path=new_notebook(tmp_path))
    ks = srv.channels(kid)
    try:
        wait_for(lambda: ks.execute("print('_gpuctx' in dir(get_ipython()))").stdout.strip() == "True", timeout=60)
        status, answer = wait_for(lambda: (r := put(srv, kid, CELLS[:2]))[0] != 200 and r, timeout=60)
        assert status == 202 and answer["status"] == "ok" and answer["planned"] >= 1, answer
    finally:
        ks.close()


def test_typed_cells_for_one_kernel_coalesce_the_latest_waits_and_every_request_is_answered(monkeypatch):
    """The server's side alone, the kernel's answer held back: one message in flight per kernel,
    the newest cells behind it, the ones in between never sent, every request answered."""
    import asyncio
    import logging

    from gpuctx_jupyter.server import typed_cells
    from gpuctx_jupyter.server.tasks import Background

    sent: list[tuple[str, list[str]]] = []

    async def main():
        gate = asyncio.Event()

        async def control(kernel, request, reply_type, timeout, dead, content=None):
            sent.append((kernel, content["cells"]))
            await gate.wait()
            return {"status": "ok", "cells": len(content["cells"])}

        monkeypatch.setattr(typed_cells.kernel_query, "control", control)
        typed = typed_cells.TypedCells(1.0, Background(logging.getLogger("test-typed")))
        first = asyncio.ensure_future(typed.send("k1", "kernel 1", ["a"]))
        while not sent:
            await asyncio.sleep(0.01)
        later = [asyncio.ensure_future(typed.send("k1", "kernel 1", ["b"] * n)) for n in range(2, 12)]
        other = asyncio.ensure_future(typed.send("k2", "kernel 2", ["c"]))  # another kernel: not held up
        while len(sent) < 2:
            await asyncio.sleep(0.01)
        gate.set()
        answers = await asyncio.gather(first, *later, other)
        return answers, typed.in_flight()

    answers, in_flight = asyncio.run(main())
    assert sent == [("kernel 1", ["a"]), ("kernel 2", ["c"]), ("kernel 1", ["b"] * 11)]
    assert [a["cells"] for a in answers] == [1] + [11] * 10 + [1]
    assert in_flight == 0  # nothing of the cells is kept once answered


def test_merging_keeps_what_was_done_and_its_record():
    from gpuctx_jupyter.kernel.warm.plan import Plan, Step
    from gpuctx_jupyter.kernel.warm.typed import merge

    torch = Step("framework", "import torch", module="torch", framework="torch", state="done", seconds=3.0)
    numpy = Step("import", "import numpy", module="numpy", state="done", seconds=0.2)
    budget = Step("import", "import big", module="big", state="skipped", detail="the import budget (60 s) is spent")
    gpu = Step("gpu", "matmul fp32", op="matmul_fp32", framework="torch", state="skipped", detail="no GPU is visible")
    before = Plan(recipe="imports only", steps=[torch, numpy, budget, gpu])
    derived = Plan(recipe="notebook", steps=[
        Step("import", "import torch", module="torch", framework="torch"),
        Step("import", "import big", module="big"),
        Step("gpu", "matmul fp32", op="matmul_fp32", framework="torch"),
        Step("cpu", "optimizer step (AdamW)", op="optimizer", framework="torch", names=("adamw",))])
    merged = merge(derived, before)
    assert merged.steps[0] is numpy  # done before, not asked for now: kept as the record
    assert merged.steps[1] is torch and merged.steps[3] is gpu  # done or decided: never again
    assert [s.state for s in merged.steps[2:]] == ["planned", "skipped", "planned"]  # the budget's: tried again
    assert [s.name for s in merged.steps if s.state == "planned"] == ["import big", "optimizer step (AdamW)"]


def test_steps_given_up_for_a_suspend_are_warmed_by_typed_cells_that_still_need_them():
    """A suspend's consent gives the warm-up's steps up and the kernel's resume takes them again,
    unless a warm-up runs by then: typed cells taken up first (their plan kept until it is made)
    must not leave those steps skipped for a suspend that is over."""
    from gpuctx_jupyter.kernel.suspend import STOPPING
    from gpuctx_jupyter.kernel.warm.plan import Plan, Step
    from gpuctx_jupyter.kernel.warm.typed import merge

    torch = Step("framework", "import torch", module="torch", framework="torch", state="done", seconds=3.0)
    given_up = Step("import", "import big", module="big", state="skipped", detail=STOPPING)
    derived = Plan(recipe="notebook", steps=[Step("import", "import torch", module="torch", framework="torch"),
                                             Step("import", "import big", module="big"),
                                             Step("import", "import typed", module="typed")])
    merged = merge(derived, Plan(recipe="notebook", steps=[torch, given_up]))
    assert merged.steps[0] is torch  # done: never again
    assert [s.name for s in merged.steps if s.state == "planned"] == ["import big", "import typed"]


def test_gpu_work_that_waited_for_a_typed_device_line_is_warmed_once_that_line_has_run():
    """While the typed cells choose a device nobody has chosen yet, the GPU work waits (skipped,
    waiting); a message after that cell has run (the plan no longer waits) warms it, one before
    does not ask for it again."""
    from gpuctx_jupyter.kernel.warm.plan import Plan, Step
    from gpuctx_jupyter.kernel.warm.typed import merge

    def derived(blocked: str) -> Plan:
        return Plan(recipe="notebook", gpu_blocked=blocked, steps=[
            Step("framework", "import torch", module="torch", framework="torch"),
            Step("gpu", "cuda init", op="init", framework="torch"),
            Step("cpu", "optimizer step (AdamW)", op="optimizer", framework="torch", names=("adamw",))])

    waiting = "the typed cells choose a device (cell 1, line 1): its GPU is warmed once that cell has run"
    before = derived(waiting)
    before.steps[0].state = "done"
    before.steps[1].state, before.steps[1].detail = "skipped", "the typed cells choose a device (cell 1, line 1)"
    before.steps[2].state, before.steps[2].name = "done", "optimizer step (AdamW) on the CPU"  # its CPU stand-in
    for step in before.steps[1:]:
        step.waits = True
    assert [s.name for s in merge(derived(waiting), before).steps if s.state == "planned"] == []
    after = merge(derived(""), before)
    assert [s.name for s in after.steps if s.state == "planned"] == ["cuda init", "optimizer step (AdamW)"]
    assert after.steps[0] is before.steps[0]  # the import done: never again


def test_work_a_recipe_names_after_its_device_is_not_planned_again():
    """JAX's and Numba's steps are shown with the device they ran on ("… on cuda:0"), and another
    device's copy is its own work: neither makes the same typed cells plan them again."""
    from gpuctx_jupyter.kernel.warm.plan import Plan, Step
    from gpuctx_jupyter.kernel.warm.typed import merge

    def derived() -> Plan:
        return Plan(recipe="notebook", steps=[Step("gpu", "jit(grad) tiny", op="jax_jit", framework="jax")])

    before = derived()
    before.steps[0].name, before.steps[0].state = "jit(grad) tiny on cuda:0", "done"
    before.steps.append(Step("gpu", "jit(grad) tiny on cuda:1", op="jax_jit", framework="jax", state="done",
                             ordinal=1))
    merged = merge(derived(), before)
    assert [s.state for s in merged.steps] == ["done", "done"]
    assert {s.name for s in merged.steps} == {"jit(grad) tiny on cuda:0", "jit(grad) tiny on cuda:1"}


def _typed(sources, choice=None):
    from traitlets.config import Config

    from gpuctx_jupyter.contract import notebook as nbread
    from gpuctx_jupyter.kernel.warm.settings import GpuWarmup
    from gpuctx_jupyter.kernel.warm.typed import typed_plan

    cfg = GpuWarmup(config=Config({"GpuWarmup": {"policy": "always", "recipe": "notebook"}}))
    return typed_plan(cfg, "", nbread.facts_from_sources(sources), choice)


def test_typed_settings_are_not_applied_and_typed_devices_move_nothing(monkeypatch):
    """A typed line has not run and may never run as it stands: no setting of it reaches the
    kernel's environment, and no device it names becomes the kernel's or is warmed before it runs."""
    from gpuctx_jupyter.kernel.switching import Choice

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = _typed(["import os\nos.environ['TOKENIZERS_PARALLELISM'] = 'false'\nimport torch",
                   "x = torch.ones(3, device='cuda:1')"])
    setting = next(s for s in plan.steps if s.kind == "setup")
    assert setting.state == "skipped" and setting.env is None and "typed, not yet run" in setting.detail
    assert next(s for s in plan.steps if s.module == "torch").state == "skipped"  # imports wait for it
    assert plan.devices == [] and "typed cells choose a device (cell 2, line 1)" in plan.gpu_blocked
    assert "cuda:1" not in plan.gpu_blocked  # the line itself stays in the kernel's cells
    # the user has chosen (a %gpu use that ran): that device is warmed, the typed one moves nothing
    chosen = _typed(["import torch", "x = torch.ones(3, device='cuda:1')"], Choice(0, source="%gpu use 0"))
    assert chosen.devices == [] and not chosen.gpu_blocked
    assert _typed(["import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\nimport torch\nx = torch.ones(3).cuda()"]
                  ).gpu_blocked  # a GPU setting typed: no GPU work before its cell has run


def test_a_suspended_kernel_puts_typed_cells_off_rather_than_refusing_them(tmp_path):
    from types import SimpleNamespace

    from gpuctx_jupyter.kernel.warm import typed

    state = SimpleNamespace(suspend=SimpleNamespace(suspended=True))
    answer = typed.accept(state, None, {"cells": ["import torch"]})
    assert answer["status"] == "suspended" and "resumed" in answer["message"]
