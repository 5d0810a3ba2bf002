"""Workers beyond one machine, on one machine: `%gpu workers start --profile P` with an ipyparallel
profile whose SSH launcher starts one engine on each of two hosts (tests/harness/hosts.py: each
"host" is a UTS namespace of its own, reached by a stand-in for ssh), or on a "container" of this
machine (PID and mount namespaces of its own, the same boot id). The ranks, local ranks and
rendezvous come from where the engines say they run; stopping ends the remote engines through the
launcher. And where each engine of a profile takes its GPU on its host, in a kernel that runs in a
Slurm job (its engines see two H200s as NVML reports them: no GPU here)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest

from .harness import hosts, kernels
from .harness.gpus import NO_GPU
from .harness.kernels import reply_to, run, wait_idle
from .harness.waiting import wait_for
from .harness.workers import kernel_pid, tree, workers_state

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


# -- engines in another container of this machine ----------------------------------------------------
@pytest.fixture
def container():
    """A container on this machine: PID and mount namespaces (its own /proc) of its own, the same
    boot id; its init (entered with nsenter), which collects the processes orphaned there."""
    if WHY_NOT or shutil.which("nsenter") is None:
        pytest.skip(f"a container on one machine needs unshare and nsenter: {WHY_NOT or 'no nsenter'}")
    reaper = ("import os, time\n"
              "while True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        time.sleep(0.1)\n")
    init = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                             sys.executable, "-c", reaper])
    try:
        inner = wait_for(lambda: psutil.Process(init.pid).children(), timeout=30)[0]
        yield inner
    finally:
        init.kill()  # its init gets SIGKILL (--kill-child), and with it everything in its namespace
        init.wait()


def in_namespace(init: psutil.Process, running: str) -> list[psutil.Process]:
    """The processes running `running` (in their command line) in the PID namespace of `init`."""
    ns = os.readlink(f"/proc/{init.pid}/ns/pid")
    found = []
    for p in psutil.process_iter():
        try:
            if (os.readlink(f"/proc/{p.pid}/ns/pid") == ns and p.status() != psutil.STATUS_ZOMBIE
                    and running in p.cmdline()):
                found.append(p)
        except (OSError, psutil.Error):
            pass
    return found


def test_engines_in_another_container_of_this_machine_are_not_taken_for_this_kernels_processes(container,
                                                                                             tmp_path):
    """Two containers on one machine share its boot id, not their PIDs: engines in another one were
    judged the kernel's own processes, their PIDs (their container's) read and signalled here — a
    worker found dead at once, or another process of this container interrupted in its place."""
    folder = hosts.profile(str(tmp_path / "profile_container"), {"node-c": 2})
    enter = ["nsenter", "--target", str(container.pid), "--pid", "--mount", "--", sys.executable, hosts.HERE, "ssh"]
    with open(os.path.join(folder, "ipcluster_config.py"), "a") as fh:
        fh.write(f"c.SSHLauncher.ssh_cmd = {enter!r}\n")
    km, kc = kernels.start(cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        r = run(kc, f"%gpu workers start all --profile {folder} --cpu --master-addr 127.0.0.1", timeout=300)
        assert r.reply["status"] == "ok" and "2 workers ready in" in r.stdout, r.text
        assert [w["local"] for w in workers_state(kc)["workers"]] == [False, False]
        rows = run(kc, "%gpu workers").data[0]["text/plain"].splitlines()[3:5]
        assert [row.split()[3] for row in rows] == ["ready", "ready"], rows
        msg_id = kc.execute(f"%%on_gpu all\nimport pathlib, time, torch.distributed as dist\n"
                            f"pathlib.Path({str(tmp_path)!r}, f'inside-{{dist.get_rank()}}').touch()\ntime.sleep(600)")
        wait_for(lambda: all((tmp_path / f"inside-{r}").exists() for r in (0, 1)), timeout=60)
        km.interrupt_kernel()  # through ipyparallel, to their own PIDs there
        reply = reply_to(kc, msg_id, timeout=60)
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        wait_idle(kc, msg_id)
        r = run(kc, "%%on_gpu all\nimport os\nos.getpid()")
        assert r.reply["status"] == "ok", r.text
        assert run(kc, "%gpu workers stop", timeout=120).stdout.strip() == (
            "gpuctx: stopped 2 workers and their ipyparallel controller")
        wait_for(lambda: not in_namespace(container, "gpuctx_jupyter.kernel.worker_entry"), timeout=60)
    finally:
        kernels.stop(km, kc)


# -- a kernel in a Slurm job -------------------------------------------------------------------------
FAKE_GPUS = """
import os
if os.environ.get("GPUCTX_WORKER_PLACE") == "gpu" and os.environ.get("GPUCTX_TEST_PLACED"):
    # an engine of the test's profile: NVML reports two H200s (this machine has no GPU), and the
    # GPU the engine takes is written down
    from gpuctx_jupyter.core import nvml
    from tests.harness.gpus import h200

    nvml.read_records = lambda: [h200(0), h200(1)]
    from gpuctx_jupyter.kernel import worker_side

    place = worker_side.place

    def placed(kind):
        place(kind)
        with open(os.environ["GPUCTX_TEST_PLACED"], "a") as fh:
            fh.write(os.environ["CUDA_VISIBLE_DEVICES"] + "\\n")

    worker_side.place = placed
"""
SLURM_STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "0", "SLURM_NTASKS": "1"}  # what srun gives the one task that runs Jupyter


@pytest.fixture
def slurm_kernel(tmp_path):
    """A kernel started in a Slurm job step, whose engines see two H200s; the file that lists the GPU
    each engine took."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAKE_GPUS)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    placed = tmp_path / "placed"
    env = dict(SLURM_STEP, GPUCTX_TEST_PLACED=str(placed), PYTHONPATH=os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")]), repo]))
    km, kc = kernels.start(env=env, cwd=str(tmp_path))
    try:
        assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
        yield kc, placed
    finally:
        kernels.stop(km, kc)


def local_profile(folder, engine_env: dict | None = None) -> str:
    """An ipyparallel profile whose engines are processes of this machine (the kernel's environment)."""
    os.makedirs(folder)
    with open(os.path.join(folder, "ipcluster_config.py"), "w") as fh:
        fh.write("c.Cluster.engine_launcher_class = 'local'\n")
        if engine_env:
            fh.write(f"c.LocalEngineSetLauncher.environment = {engine_env!r}\n")
    return str(folder)


def test_in_a_slurm_job_a_profiles_engines_take_a_gpu_each_not_the_kernels_place(slurm_kernel, tmp_path):
    """The kernel runs in a Slurm job step (JupyterHub's batch spawner): its SLURM_LOCALID came down
    to every engine a local launcher started, and each took local slot 0 — two ranks on one GPU."""
    kc, placed = slurm_kernel
    before = {p.pid for p in tree(kernel_pid(kc))}
    r = run(kc, f"%gpu workers start 2 --profile {local_profile(tmp_path / 'profile_job')}", timeout=300)
    gpus = placed.read_text().split()
    assert len(gpus) == 2 and len(set(gpus)) == 2, gpus  # one GPU each
    # (on through its GPU, NCCL stops them here: this machine has no CUDA)
    assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError", r.text
    assert "\n" not in r.reply["evalue"] and "were both given GPU" not in r.reply["evalue"], r.reply["evalue"]
    wait_for(lambda: {p.pid for p in tree(kernel_pid(kc))} <= before, timeout=60)


def test_two_engines_a_launcher_gives_one_local_rank_are_refused_in_one_line(slurm_kernel, tmp_path):
    """A launcher that gives two engines of one host the same local rank (two steps, a wrong
    template): both took one GPU, and NCCL failed on it later, or hung."""
    kc, placed = slurm_kernel
    before = {p.pid for p in tree(kernel_pid(kc))}
    folder = local_profile(tmp_path / "profile_one_rank", {"OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    r = run(kc, f"%gpu workers start 2 --profile {folder}", timeout=300)
    assert r.reply["status"] == "error" and r.reply["ename"] == "UsageError", r.text
    says = r.reply["evalue"]
    assert says.startswith("ranks 0 and 1 were both given GPU GPU-00000000-aaaa-bbbb-cccc-000000000000 on "), says
    assert says.endswith("(local slot 0, from OMPI_COMM_WORLD_LOCAL_RANK): one rank per GPU — the profile's launcher "
                         "must give each engine on a host a local rank of its own") and "\n" not in says
    assert placed.read_text().split() == ["GPU-00000000-aaaa-bbbb-cccc-000000000000"] * 2
    wait_for(lambda: {p.pid for p in tree(kernel_pid(kc))} <= before, timeout=60)
