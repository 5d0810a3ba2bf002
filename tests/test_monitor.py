"""The live monitor: widgets built from samples, history, error state, the shared sampler."""
from __future__ import annotations

import html
import os
import re
import threading
import time
from dataclasses import replace

import pytest

from gpuctx_jupyter.core import inventory
from gpuctx_jupyter.core.devices import resolve_visibility
from gpuctx_jupyter.core.sampler import History, Point, Sample, Sampler
from gpuctx_jupyter.kernel.monitor import ERROR_COLOR, GpuMonitor, sparkline

from .harness.gpus import h200
from .harness.kernels import reply_to, run, start, stop, wait_idle
from .harness.waiting import wait_for

TRACE = os.path.join(os.path.dirname(__file__), "data", "h200-trace.jsonl")  # recorded on 2 × H200


def fake_read(records):
    """An inventory as NVML would give it for these records (NVML is the driver's, not ours)."""
    def read():
        inv = inventory.Inventory(records=list(records))
        inv.visibility = resolve_visibility(inv.records, {})
        return inv
    return read


def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "gpuctx-sampler"]


def meters(card) -> list[dict]:
    """The card's bars as a screen reader meets them: role="meter", its name, value and text."""
    found = re.findall(r"<div role='meter' aria-label='([^']*)' aria-valuemin='0' aria-valuemax='100' "
                       r"aria-valuenow='(\d+)' aria-valuetext='([^']*)'", card.meters.value)
    return [{"label": html.unescape(a), "now": b, "text": html.unescape(c)} for a, b, c in found]


def test_no_gpu_shows_one_line_with_the_reason():
    mon = GpuMonitor(interval=0.05, sampler=Sampler())
    try:
        assert wait_for(lambda: "No GPU is visible" in mon.status.value)
        assert "NVML reports" in mon.status.value and mon._body.children == ()
    finally:
        mon.close()


def test_cards_built_from_samples_mark_this_kernel():
    import os

    records = [h200(0, used_gib=10, pids=(os.getpid(), 4242)), h200(1, used_gib=1)]
    mon = GpuMonitor(interval=0.05, sampler=Sampler(read=fake_read(records)))
    try:
        assert wait_for(lambda: len(mon._body.children) == 2)
        first = mon._body.children[0]
        assert "cuda:0 · NVIDIA H200 (nvidia-smi 0)" in first.title.value
        util, mem = meters(first)
        assert mem == {"label": "memory of cuda:0", "now": "7", "text": "10.0 GiB / 141 GiB"}  # 10 of 141
        assert util["now"] == "0" and meters(mon._body.children[1])[0]["now"] == "10"
        assert "◀ this kernel" in first.procs.value and "4242" in first.procs.value
        assert "this kernel (NVML) 1.00 GiB" in first.numbers.value
        assert "<svg" in first.plot.value
    finally:
        mon.close()


@pytest.mark.parametrize("spec, ordinal", [("0", 0), ("cuda:1", 1), ("GPU-00000001", 1)])
def test_specs_choose_the_cards_as_gpu_use_resolves_them(spec, ordinal):
    # "0" also occurs in the name "NVIDIA H200": it must still mean cuda:0 only
    mon = GpuMonitor([spec], interval=0.05, sampler=Sampler(read=fake_read([h200(0), h200(1)])))
    try:
        assert wait_for(lambda: len(mon._body.children) == 1)
        assert f"cuda:{ordinal} " in mon._body.children[0].title.value
    finally:
        mon.close()


def test_a_lost_gpu_shows_an_error_and_the_others_go_on():
    records = [h200(0), replace(h200(1), error="GPU is lost", utilization=None, memory_used=None)]
    sampler = Sampler(read=fake_read(records))
    mon = GpuMonitor(interval=0.05, sampler=sampler)
    try:
        assert wait_for(lambda: len(mon._body.children) == 2)
        lost = mon._body.children[1]
        assert "error: GPU is lost" in lost.title.value and ERROR_COLOR in lost.meters.value
        assert ERROR_COLOR not in mon._body.children[0].meters.value
        assert meters(lost)[1] == {"label": "memory of cuda:1", "now": "0", "text": "– / 141 GiB"}  # unknown: empty
        ticks = sampler.ticks
        assert wait_for(lambda: sampler.ticks >= ticks + 3)  # sampling goes on
    finally:
        mon.close()


def test_a_monitor_left_running_in_an_idle_kernel_that_holds_gpu_memory_pauses_and_resumes(shell):
    """Its updates are comm messages, which jupyter_server counts as the kernel's activity: left
    running, it kept a kernel holding GPU memory from ever being idle for the server's release and
    culling. With no cell for its pause time it stops itself, says why, and resumes on its button;
    a kernel that holds no GPU memory is never paused (a dashboard notebook watching others)."""
    st = shell._gpuctx
    watching = GpuMonitor(interval=0.05, sampler=Sampler(read=fake_read([h200(0, pids=(4242,))])))
    mine = GpuMonitor(interval=0.05, sampler=Sampler(read=fake_read([h200(0, pids=(os.getpid(),))])))
    try:
        for mon in (watching, mine):
            mon.pause_after, mon._resumed = 60.0, time.monotonic() - 120
        st.last_cell = time.monotonic() - 120  # no cell for two minutes
        assert wait_for(lambda: mine.paused)
        status = html.unescape(mine.status.value)
        assert "paused at" in status and "no cell has run for 1 min and this kernel holds 1.00 GiB of GPU memory" \
            in status, status
        assert mine.stop_button.description == "resume"
        seen = watching.last_sample.t
        assert wait_for(lambda: watching.last_sample.t > seen) and not watching.paused
        last = mine.last_sample.t
        mine._clicked(None)  # "resume"
        assert not mine.paused and mine.stop_button.description == "stop"
        assert wait_for(lambda: mine.last_sample.t > last) and not mine.paused  # (its pause time counts anew)
    finally:
        watching.close()
        mine.close()


def test_nvml_failing_mid_run_never_stops_the_sampler():
    calls = {"n": 0}
    good = fake_read([h200(0)])

    def flaky():
        calls["n"] += 1
        if calls["n"] % 2:
            raise RuntimeError("driver reloaded")
        return good()

    sampler = Sampler(read=flaky)
    mon = GpuMonitor(interval=0.05, sampler=sampler)
    try:
        assert wait_for(lambda: calls["n"] >= 6)  # failures came and went
        assert wait_for(lambda: len(mon._body.children) == 1)  # the good reads' card is shown (rendered apart from the read)
    finally:
        mon.close()


def test_history_keeps_only_the_window():
    hist = History(seconds=10)
    inv = fake_read([h200(0)])()
    for t in range(21):
        hist.add(Sample(float(t), inv))
    points = hist.of(inv.records[0].uuid)
    assert [p.t for p in points] == [float(t) for t in range(10, 21)]
    svg = sparkline([Point(t, 50, 1) for t in range(0, 21)], now=20, window=5, total_memory=2)
    assert svg.count("<polyline") == 2
    assert svg.split("points='")[2].count(",") == 6  # t = 15..20 only (after the grid line's)


def test_the_chart_has_its_scales_and_breaks_where_no_sample_was_taken():
    gib = 1024**3
    points = [Point(t, 50, gib) for t in (0, 1, 2, 3)] + [Point(t, 60, gib) for t in (30, 31, 32)]
    svg = sparkline(points, now=32, window=60, total_memory=141 * gib, interval=1.0)
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert labels == ["100%", "0%", "141 GiB", "0", "−60 s", "now"]
    assert svg.count("<polyline") == 4  # two runs each for utilisation and memory: the 27 s gap stays empty
    assert "0 to 141 GiB" in svg and "last 60 s" in svg  # said to screen readers too


def test_hundred_monitors_share_one_sampler_and_leave_no_thread():
    sampler = Sampler(read=fake_read([h200(0)]))
    monitors = [GpuMonitor(interval=0.05, sampler=sampler) for _ in range(100)]
    thread = sampler._thread
    assert thread.is_alive() and thread in sampler_threads()
    assert wait_for(lambda: all(m._body.children for m in monitors))
    assert sampler._thread is thread  # still the one thread
    for m in monitors:
        m.close()
    assert wait_for(lambda: not thread.is_alive())
    assert not sampler.running and thread not in sampler_threads()


def test_bad_monitor_arguments(shell):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--interval 0 is out of range"):
        shell.run_line_magic("gpu", "monitor --interval 0")
    with pytest.raises(UsageError, match="--history"):
        shell.run_line_magic("gpu", "monitor --interval 5 --history 1")


def test_in_a_kernel_updates_flow_while_another_cell_runs(tmp_path):
    km, kc = start()
    release = tmp_path / "release"
    try:
        r = run(kc, "%load_ext gpuctx\nm = %gpu monitor --interval 0.2")
        views = [d for d in r.data if "application/vnd.jupyter.widget-view+json" in d]
        assert len(views) == 1  # shown once, although the magic also returned it
        msg_id = kc.execute(f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)")
        updates, busy, deadline = 0, False, time.monotonic() + 60
        while updates < 2 and time.monotonic() < deadline:  # the cell runs until two have come
            msg = kc.get_iopub_msg(timeout=30)
            mine = msg["parent_header"].get("msg_id") == msg_id
            if mine and msg["msg_type"] == "status":
                busy = msg["content"]["execution_state"] == "busy"
            if busy and msg["msg_type"] == "comm_msg" and msg["content"]["data"].get("method") == "update":
                updates += 1
        release.touch()
        assert updates >= 2 and busy  # the status line ticks every second while the other cell runs
        wait_idle(kc, msg_id)
        r = run(kc, "m.close(); import threading, time; deadline = time.monotonic() + 30\n"
                    "sampling = lambda: [t.name for t in threading.enumerate() if t.name == 'gpuctx-sampler']\n"
                    "while sampling() and time.monotonic() < deadline: time.sleep(0.05)\n"
                    "print(sampling())")
        assert r.stdout.strip() == "[]"
    finally:
        stop(km, kc)


def test_this_kernel_is_found_in_a_container_where_nvml_lists_host_pids(monkeypatch):
    """NVML reports host PIDs (5555, 6666) that are not ours; torch's reserved memory tells."""
    from gpuctx_jupyter.core.devices import GpuProcess

    def inv_with(procs):
        return fake_read([replace(h200(0), processes=tuple(GpuProcess(p, m, "compute") for p, m in procs))])()

    own = inventory.OwnPids()
    reserved = {0: 0}
    monkeypatch.setattr(inventory, "_torch_reserved", lambda: dict(reserved))
    mib = 1024**2
    assert own.update(inv_with([(5555, 500 * mib), (6666, 700 * mib)])) == own.pids  # nothing known yet
    reserved[0] = 20 * mib  # we allocated: torch reserved 20 MiB more ...
    found = own.update(inv_with([(5555, 500 * mib), (6666, 720 * mib)]))  # ... and so did host pid 6666
    assert 6666 in found and 5555 not in found

    alone = inventory.OwnPids()
    assert 7777 in alone.update(inv_with([(7777, 600 * mib)]))  # the only process while we hold memory


def test_replay_of_a_recorded_h200_trace_is_labelled_and_leaves_live_monitors_live(shell):
    """The monitor `%gpu monitor --replay` shows in a kernel: the recorded H200 trace in tests/data,
    its own sampler, and a label before anything else; a bad trace is a one-line UsageError. (The
    test shell is a terminal: there the magic prints one line, see test_monitor_widgets.py.)"""
    from IPython.core.error import UsageError

    from gpuctx_jupyter.core.trace import Replay

    live = GpuMonitor(interval=0.05)  # the process's sampler: no GPU here
    mon = GpuMonitor(interval=0.05, replay=Replay(TRACE))
    try:
        assert mon.sampler is not live.sampler
        assert wait_for(lambda: len(mon._body.children) == 2)
        assert mon.children[0] is mon.replay_label
        assert "REPLAY of a trace recorded 2026-" in mon.replay_label.value
        assert "not live data" in mon.replay_label.value and "h200-trace.jsonl" in mon.replay_label.value
        card = mon._body.children[0]
        assert "cuda:0 · NVIDIA H200 (nvidia-smi 0)" in card.title.value and "/ 140 GiB" in meters(card)[1]["text"]
        assert "◀ this kernel" not in card.procs.value and "torch:" not in card.numbers.value
        assert wait_for(lambda: "No GPU is visible" in live.status.value)  # still live, still honest
    finally:
        mon.close()
        live.close()
    assert wait_for(lambda: not sampler_threads())
    with pytest.raises(UsageError, match="cannot replay nowhere.jsonl: .*No such file"):
        shell.run_line_magic("gpu", "monitor --replay nowhere.jsonl")
    with pytest.raises(UsageError, match="is not a gpuctx trace"):
        shell.run_line_magic("gpu", f"monitor --replay {__file__}")


def test_a_broken_viewer_is_logged_once_and_the_others_go_on(caplog):
    sampler = Sampler(read=fake_read([h200(0)]))
    good = []

    def broken(sample):
        raise RuntimeError("viewer bug")

    tokens = [sampler.subscribe(broken, 0.05), sampler.subscribe(good.append, 0.05)]
    try:
        assert wait_for(lambda: len(good) >= 5)
    finally:
        for t in tokens:
            sampler.unsubscribe(t)
    failures = [r for r in caplog.records if "a GPU viewer failed" in r.getMessage()]
    assert len(failures) == 1 and "viewer bug" in failures[0].exc_text


def test_rerunning_a_monitor_cell_replaces_its_monitor():
    """JupyterLab names the cell in each execute_request (`cellId`): a re-run closes that cell's
    old monitor, whose output the re-run cleared; a monitor of another cell stays."""
    km, kc = start()

    def run_in_cell(cell_id, code):
        msg = kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                                 "user_expressions": {}, "allow_stdin": False,
                                                 "stop_on_error": True}, metadata={"cellId": cell_id})
        kc.shell_channel.send(msg)
        reply = reply_to(kc, msg["header"]["msg_id"], timeout=30)
        assert reply["content"]["status"] == "ok", reply["content"]

    try:
        run_in_cell("a", "%load_ext gpuctx")
        for _ in range(3):
            run_in_cell("a", "m = %gpu monitor --interval 0.2")
        run_in_cell("b", "n = %gpu monitor --interval 0.2")
        r = run(kc, "from gpuctx_jupyter.kernel import monitor as _m\n"
                    "print(len(_m._open), _m.process_sampler().listeners, n in _m._open, m in _m._open)")
        assert r.stdout.split() == ["2", "2", "True", "True"]
    finally:
        stop(km, kc)
