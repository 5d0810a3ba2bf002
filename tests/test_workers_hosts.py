"""Workers beyond one machine, on one machine: `%gpu workers start --profile P` with an ipyparallel
profile whose SSH launcher starts one engine on each of two hosts (tests/harness/hosts.py: each
"host" is a UTS namespace of its own, reached by a stand-in for ssh). The ranks, local ranks and
rendezvous come from where the engines say they run; stopping ends the remote engines through the
launcher."""
from __future__ import annotations

import json

import psutil
import pytest

from .harness import hosts, kernels
from .harness.gpus import NO_GPU
from .harness.kernels import run
from .harness.waiting import wait_for

pytestmark = pytest.mark.timeout(600)
pytest.importorskip("ipyparallel")
WHY_NOT = hosts.can_run()


@pytest.fixture
def two_hosts(tmp_path):
    if WHY_NOT:
        pytest.skip(f"two hosts on one machine need UTS namespaces: {WHY_NOT}")
    folder = hosts.profile(str(tmp_path / "profile_two_hosts"), {"node-a": 1, "node-b": 1})
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        yield kc, folder
    finally:
        kernels.stop(km, kc)


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_two_engine_groups_from_a_profiles_launcher_are_one_process_group(two_hosts):
    kc, folder = two_hosts
    r = run(kc, f"%gpu workers start all --profile {folder} --cpu --master-addr 127.0.0.1", timeout=300)
    assert r.reply["status"] == "ok", r.text
    assert f"on the hosts of profile '{folder}'" in r.stdout and "2 workers ready in" in r.stdout
    listing = run(kc, "%gpu workers").data[0]["text/plain"].splitlines()
    assert listing[1].split()[:3] == ["rank", "host", "GPU"]
    assert [row.split()[:3] for row in listing[3:5]] == [["0", "node-a", "cpu"], ["1", "node-b", "cpu"]]
    assert f"started by ipyparallel profile '{folder}'" in "\n".join(listing)
    r = run(kc, "%%on_gpu all\nimport json, os, socket, torch, torch.distributed as dist\n"
                "t = torch.ones(1)\ndist.all_reduce(t)\n"
                "print('WHO ' + json.dumps({'host': socket.gethostname(), 'pid': os.getpid(), 'sum': t.item(), "
                "**{k: os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', "
                "'MASTER_ADDR')}}))")
    assert r.reply["status"] == "ok", r.text
    who = sorted((json.loads(line.split("WHO ", 1)[1]) for line in r.data[0]["text/plain"].splitlines()
                  if line.startswith("WHO ")), key=lambda w: w["RANK"])
    assert [(w["host"], w["RANK"], w["LOCAL_RANK"], w["LOCAL_WORLD_SIZE"]) for w in who] == [
        ("node-a", "0", "0", "1"), ("node-b", "1", "0", "1")]
    assert {w["WORLD_SIZE"] for w in who} == {"2"} and {w["sum"] for w in who} == {2.0}
    r = run(kc, "%gpu workers stop", timeout=120)
    assert r.stdout.strip() == "gpuctx: stopped 2 workers and their ipyparallel controller"
    wait_for(lambda: not alive([w["pid"] for w in who]), timeout=60)


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU: there every engine has one")
def test_an_engine_without_a_gpu_on_its_host_is_one_line_and_nothing_stays(two_hosts):
    kc, folder = two_hosts
    r = run(kc, f"%gpu workers start 2 --profile {folder}", timeout=300)
    assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError"
    assert r.reply["evalue"].startswith("no GPU for local slot 0 (slot lock) on node-")
    assert "NVML reports:" in r.reply["evalue"] and "\n" not in r.reply["evalue"]
    r = run(kc, "%gpu workers")
    assert "none: `%gpu workers start all`" in r.text
    engines = [p for p in psutil.process_iter(["cmdline"])
               if folder in " ".join(p.info["cmdline"] or []) and "worker_entry" in " ".join(p.info["cmdline"] or [])]
    wait_for(lambda: not alive([p.pid for p in engines]), timeout=60)
