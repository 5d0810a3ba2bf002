"""Recorded traces: records survive the round trip; replay loops in real time and is labelled."""
from __future__ import annotations

import json
import logging
import re

import pytest

from gpuctx_jupyter.core import trace

from .harness.gpus import NO_GPU, h200


def write_trace(path, samples, interval=1.0):
    with open(path, "w") as fh:
        fh.write(json.dumps({"gpuctx_trace": 1, "recorded": "2026-11-29T16:00:00+0000", "host": "h200-box",
                             "driver": "580.159.04", "interval": interval}) + "\n")
        for t, records in samples:
            fh.write(json.dumps({"t": t, "records": [trace.record_to_dict(r) for r in records]}) + "\n")


def test_records_round_trip():
    r = h200(1, used_gib=7, pids=(11, 12))
    assert trace.record_from_dict(json.loads(json.dumps(trace.record_to_dict(r)))) == r


def test_replay_plays_in_time_and_loops(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, [(0.0, [h200(0, used_gib=1)]), (1.0, [h200(0, used_gib=2)]), (2.0, [h200(0, used_gib=3)])])
    now = [100.0]
    replay = trace.Replay(str(path), clock=lambda: now[0])
    used = []
    for dt in (0.0, 1.2, 2.5, 3.1):  # 3.1 s: the 3-second trace has looped
        now[0] = 100.0 + dt
        used.append(replay.read({}).devices[0].record.memory_used // 1024**3)
    assert used == [1, 2, 3, 1]
    assert replay.label == {"source": str(path), "recorded": "2026-11-29T16:00:00+0000", "host": "h200-box",
                            "driver": "580.159.04"}


def test_replay_honours_cuda_visible_devices(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, [(0.0, [h200(0), h200(1)])])
    inv = trace.Replay(str(path)).read({"CUDA_VISIBLE_DEVICES": "1"})
    assert [(d.ordinal, d.record.nvml_index) for d in inv.devices] == [(0, 1)]


def test_not_a_trace_is_refused(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="not a gpuctx trace"):
        trace.Replay(str(path))


@pytest.mark.skipif(NO_GPU is None, reason="a GPU is visible here")
def test_recording_without_a_gpu_says_why(tmp_path, capsys):
    with pytest.raises(SystemExit, match="cannot record: .*libnvidia-ml"):
        trace.main(["record", "--seconds", "1", "--out", str(tmp_path / "t.jsonl")])


def test_a_server_replaying_a_trace_says_so_in_every_snapshot(tmp_path):
    from .harness.server import Server

    path = tmp_path / "trace.jsonl"
    write_trace(path, [(0.0, [h200(0, used_gib=3), h200(1, used_gib=9)])])
    srv = Server(str(tmp_path), ["--ServerApp.jpserver_extensions=gpuctx_jupyter=True",
                                 f"--GpuctxServer.replay_trace={path}"]).start()
    try:
        status, snap = srv.api("GET", "/gpuctx/api/devices")
        assert status == 200 and snap["gpu"] is True
        assert [d["name"] for d in snap["devices"]] == ["NVIDIA H200", "NVIDIA H200"]
        assert snap["replay"]["source"] == str(path) and snap["replay"]["host"] == "h200-box"
        assert "REPLAYING the recorded trace" in srv.log()
    finally:
        srv.stop()


def test_records_of_another_shape_are_refused_saying_which_field():
    good = trace.record_to_dict(h200(0))
    newer = dict(good, nvlink_bandwidth=1)  # a field from a newer gpuctx is ignored
    assert trace.record_from_dict(newer) == h200(0)
    for bad, why in [(dict(good, memory_used="2 GiB"), "'memory_used' is '2 GiB', not a number"),
                     ({k: v for k, v in good.items() if k != "uuid"}, "a record has no 'uuid'"),
                     (dict(good, processes=[{"pid": "x"}]), "a process is"),
                     (dict(good, utilization=True), "'utilization' is True"),
                     ([1, 2], "a record is a list")]:
        with pytest.raises(trace.BadRecord, match=re.escape(why)):
            trace.record_from_dict(bad)


def test_unreadable_samples_are_skipped_with_one_log_line(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    write_trace(path, [(0.0, [h200(0, used_gib=1)]), (2.0, [h200(0, used_gib=3)])])
    with open(path, "a") as fh:
        fh.write(json.dumps({"records": []}) + "\n")  # no t
        fh.write(json.dumps({"t": 1.0, "records": [dict(trace.record_to_dict(h200(0)), memory_total="lots")]}) + "\n")
        fh.write("{truncated\n")
    with caplog.at_level(logging.WARNING, logger="gpuctx"):
        replay = trace.Replay(str(path), clock=lambda: 0.0)
    assert [r.message for r in caplog.records if r.name.startswith("gpuctx")] == [  # (not another test's asyncio leftovers)
        f"gpuctx: trace {path}: skipped 3 unreadable samples of 5 (line 4: no time 't'; …)"]
    assert len(replay.samples) == 2 and replay.at(2.5)[0].memory_used == 3 * 1024**3


def test_a_trace_without_a_readable_sample_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"gpuctx_trace": 1}) + "\n" + json.dumps({"t": "soon", "records": []}) + "\n")
    with pytest.raises(ValueError, match=r"holds no readable samples \(line 2: 't' is 'soon', not seconds\)"):
        trace.Replay(str(path))
