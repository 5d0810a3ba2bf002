"""Suspend and resume without a GPU: the real checkpoint helper (core/checkpoint.py) loading the
stand-in libcuda (tests/harness/fake_libcuda.c, which answers as driver 580 did on the H200), and a
real ipykernel with gpuctx loaded restoring itself before the user's requests (kernel/suspend.py).

What a user would notice is asserted: a suspended kernel runs the next cell only once it is
restored, whichever request brings it back (a cell, a widget's message, a completion), says so once
in that cell's output, answers the server from what it knew without touching the GPU, and keeps its
variables when a restore fails; a failed suspend leaves the process running; a request that comes
before the suspend began cancels it. The server's side is tests/test_suspend_server.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace

import pytest

from gpuctx_jupyter import contract
from gpuctx_jupyter.contract import holders as holders_file
from gpuctx_jupyter.core import checkpoint, host_memory, nvml
from gpuctx_jupyter.kernel import oom

from .harness.fake_cuda import NOT_SUPPORTED, OUT_OF_MEMORY, FakeCuda
from .harness.gpus import h200
from .harness.kernels import reply_to, run, start, stop, wait_idle
from .harness.waiting import wait_for

GIB = 2**30


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCuda:
    cuda = FakeCuda(tmp_path / "fake-cuda")
    for name, value in cuda.env.items():
        monkeypatch.setenv(name, value)
    return cuda


def helper(*args) -> dict:
    out = subprocess.run(checkpoint.helper_command(*args), capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def sleeper(fake):
    """A process that has started CUDA (as the stand-in knows it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    fake.start_cuda(proc.pid)
    yield proc
    proc.kill()
    proc.wait()


# -- the helper process and the driver's answers ------------------------------------------------------
def test_the_helper_suspends_and_resumes_and_a_second_resume_is_no_error(fake, sleeper):
    pid = sleeper.pid
    out = helper("suspend", pid, "--lock-timeout-ms", "1000")
    assert out["ok"] and out["state"] == "checkpointed" and set(out["steps"]) == {"lock", "checkpoint"}
    assert fake.state(pid) == 2
    out = helper("resume", pid)
    assert out["ok"] and out["state"] == "running" and set(out["steps"]) == {"restore", "unlock"}
    again = helper("resume", pid)
    assert again["ok"] and again["steps"] == {} and fake.steps(pid) == ["lock", "checkpoint", "restore", "unlock"]


def test_a_failed_checkpoint_is_unwound_and_the_process_runs_as_before(fake, sleeper):
    fake.fail(sleeper.pid, "checkpoint", NOT_SUPPORTED, leave=1)  # what managed memory gave on the H200
    out = helper("suspend", sleeper.pid, "--lock-timeout-ms", "1000")
    assert not out["ok"] and out["unwound"] and out["state"] == "running" and fake.state(sleeper.pid) == 0
    assert out["error_name"] == "CUDA_ERROR_NOT_SUPPORTED" and "managed (UVM) memory" in out["error"]
    assert fake.steps(sleeper.pid) == ["lock", "unlock"]


def test_a_lock_on_a_process_inside_a_cuda_call_gives_up_after_its_timeout(fake, sleeper):
    fake.busy(sleeper.pid)
    t0 = time.monotonic()
    out = helper("suspend", sleeper.pid, "--lock-timeout-ms", "300")
    assert time.monotonic() - t0 >= 0.3
    assert not out["ok"] and out["error_name"] == "CUDA_ERROR_NOT_READY" and out["state"] == "running"
    assert "stayed inside a CUDA call for the whole lock timeout" in out["error"]


def test_an_ended_process_and_one_without_cuda_get_the_drivers_reasons(fake):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    ended = helper("state", proc.pid)
    assert ended["error_name"] == "CUDA_ERROR_OPERATING_SYSTEM" and "the process ended" in ended["error"]
    no_cuda = helper("suspend", os.getpid(), "--lock-timeout-ms", "100")
    assert no_cuda["error_name"] == "CUDA_ERROR_NOT_INITIALIZED" and "has not started CUDA" in no_cuda["error"]


def test_a_cancelled_consent_stops_a_suspend_that_has_not_begun(fake, sleeper):
    checkpoint.cancel(sleeper.pid, "token-1")
    out = helper("suspend", sleeper.pid, "--lock-timeout-ms", "1000", "--token", "token-1")
    assert not out["ok"] and out["error_name"] == checkpoint.CANCELLED and fake.steps(sleeper.pid) == []
    other = helper("suspend", sleeper.pid, "--lock-timeout-ms", "1000", "--token", "token-2")
    assert other["ok"]


def test_the_waiting_helper_is_ready_before_it_is_asked_and_hidden_gpus_do_not_stop_it(fake, sleeper):
    assert helper("suspend", sleeper.pid, "--lock-timeout-ms", "1000")["ok"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the real driver finds no device with this: NO_DEVICE
    serve = subprocess.Popen(checkpoint.helper_command("serve", sleeper.pid), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    assert json.loads(serve.stdout.readline())["ready"] is True
    serve.stdin.write("resume\n")
    serve.stdin.flush()
    assert json.loads(serve.stdout.readline())["state"] == "running"
    assert serve.wait(30) == 0 and fake.state(sleeper.pid) == 0


def test_without_the_api_the_reason_says_which_driver_is_needed():
    missing = checkpoint.Driver("libc.so.6").support()
    assert not missing.available and "has no process checkpoint API (missing cuCheckpointProcessGetState" in missing.reason
    assert "driver 570 or newer" in missing.reason
    absent = checkpoint.Driver("/nonexistent/libcuda.so.1").support()
    assert not absent.available and absent.reason.startswith("no CUDA driver library here")


def test_a_restore_that_would_not_fit_is_refused_before_it_is_tried(monkeypatch):
    gpu = replace(h200(0), memory_total=141 * GIB, memory_used=136 * GIB)
    monkeypatch.setattr(nvml, "read_records", lambda: [gpu])
    why = checkpoint.room_short({gpu.uuid: 10 * GIB})
    assert why.startswith("not enough free GPU memory to resume: nvidia-smi 0 has 5.00 GiB free, it needs 10.00 GiB")
    assert checkpoint.room_short({gpu.uuid: 4 * GIB}) is None


# -- the kernel's side, in a real ipykernel ----------------------------------------------------------------
@pytest.fixture
def kernel(fake):
    km, kc = start(fake.env)
    assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
    pid = int(run(kc, "import os; print(os.getpid())").stdout)
    fake.start_cuda(pid)
    yield kc, pid, km
    stop(km, kc)


def control(kc, msg_type: str, content: dict | None = None, timeout: float = 60) -> dict:
    msg = kc.session.msg(msg_type, content or {})
    kc.control_channel.send(msg)
    return reply_to(kc, msg["header"]["msg_id"], timeout, channel="control")


def suspend_kernel(kc, pid: int, token: str | None = None) -> None:
    """What the server does: the kernel's consent, the helper, the outcome. (A consent asked right
    after a cell may come before the cell's end on a loaded machine: it is asked again then.) A
    token of its own, as the server's: a cancelled consent is kept by PID, and a PID comes back
    (32768 of them on CI, thousands of processes in the suite; other tests cancel fixed tokens)."""
    token = token or uuid.uuid4().hex
    def consented():
        c = control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": token})["content"]
        return c if c["status"] == "ok" or "running a cell" not in c.get("message", "") else None

    consent = wait_for(consented, timeout=30)
    assert consent["status"] == "ok", consent
    out = helper("suspend", pid, "--lock-timeout-ms", "1000", "--token", token)
    assert out["ok"], out  # (what the helper says: a cancelled consent, a lock that timed out, …)
    done = control(kc, contract.SUSPEND_DONE_REQUEST, {"token": token, "ok": True, "since": time.time() - 65,
                                                       "moved": {"0": 10 * GIB}})
    assert done["content"]["state"] == "suspended"


def state_in_cell(pid: int) -> str:
    return f"print('state seen by the cell:', open(os.path.join(os.environ['GPUCTX_FAKE_CUDA_DIR'], '{pid}')).read().strip())"


def test_a_suspended_kernel_restores_itself_before_the_cell_runs_and_says_so_once(kernel, fake):
    kc, pid, _ = kernel
    run(kc, "x = list(range(5))")
    suspend_kernel(kc, pid)
    assert fake.state(pid) == 2
    r = run(kc, state_in_cell(pid) + "\nprint(x)")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("gpuctx: resumed this kernel — 10.0 GiB back on the GPU in ")
    assert "suspended 1 min ago" in lines[0]
    assert lines[1:] == ["state seen by the cell: 0", "[0, 1, 2, 3, 4]"]
    assert fake.steps(pid)[-2:] == ["restore", "unlock"]
    assert "resumed" not in run(kc, "print(x)").stdout  # once


def test_a_widget_message_a_completion_and_an_inspection_resume_first_kernel_info_does_not(kernel, fake):
    kc, pid, _ = kernel
    run(kc, "seen = []\n"
            "def target(comm, msg):\n"
            f"    comm.on_msg(lambda m: seen.append(open(os.path.join(os.environ['GPUCTX_FAKE_CUDA_DIR'], '{pid}')).read()))\n"
            "get_ipython().kernel.comm_manager.register_target('probe', target)")
    comm_id = "c0ffee"
    kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": "probe", "data": {}}))
    wait_for(lambda: "c0ffee" in run(kc, "print(list(get_ipython().kernel.comm_manager.comms))").stdout)

    def comm_msg():
        msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"x": 1}})
        kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    for name, send in (("comm_msg", comm_msg), ("complete_request", lambda: kc.complete("prin", 4)),
                       ("inspect_request", lambda: kc.inspect("print", 5))):
        suspend_kernel(kc, pid)
        reply_to(kc, kc.kernel_info(), 30)  # no user code: answered while suspended
        reply_to(kc, kc.history(hist_access_type="tail", n=1), 30)
        assert fake.state(pid) == 2, f"kernel_info and history must not resume (before {name})"
        wait_idle(kc, send())
        assert fake.state(pid) == 0, f"{name} did not resume the kernel"
    r = run(kc, "print(seen)")
    assert r.stdout.strip() == "['0\\n']", "the widget callback ran only once the kernel was restored"


def test_while_suspended_the_kernel_answers_from_before_and_refuses_to_release(kernel, fake):
    kc, pid, _ = kernel
    before = control(kc, contract.REQUEST)["content"]
    suspend_kernel(kc, pid)
    answer = control(kc, contract.REQUEST)["content"]
    assert answer["status"] == "ok" and answer["pid"] == pid and answer["memory"] == before["memory"]
    assert answer["suspend"]["state"] == "suspended" and answer["suspend"]["moved"] == {"0": 10 * GIB}
    release = control(kc, contract.RELEASE_REQUEST)["content"]
    assert release["status"] == "error" and "this kernel is suspended" in release["message"]
    assert fake.state(pid) == 2  # nothing of that woke it


def test_a_cell_that_comes_before_the_helper_locks_cancels_the_suspend(kernel, fake):
    kc, pid, _ = kernel
    assert control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "late"})["content"]["status"] == "ok"
    assert run(kc, "print('ran')").stdout == "ran\n"  # no note: there was nothing to restore
    late = helper("suspend", pid, "--lock-timeout-ms", "1000", "--token", "late")
    assert not late["ok"] and late["error_name"] == checkpoint.CANCELLED and fake.state(pid) == 0
    assert control(kc, contract.SUSPEND_DONE_REQUEST, {"token": "late", "ok": False})["content"]["state"] == "running"


def test_the_kernel_refuses_its_consent_while_a_cell_runs(kernel, tmp_path):
    from .harness.kernels import held_cell

    kc, _pid, _ = kernel
    go = tmp_path / "go"
    msg_id = held_cell(kc, go)
    refused = control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"]
    assert refused == {"status": "refused", "message": "it is running a cell: suspend it once it is idle"}
    go.write_text("")
    assert reply_to(kc, msg_id, 30)["content"]["status"] == "ok"


def in_subshell(kc, subshell_id: str, code: str) -> str:
    """Send a cell to one of the kernel's subshells (ipykernel 7); returns its msg_id."""
    msg = kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": False,
                                             "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
    msg["header"]["subshell_id"] = subshell_id
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def test_a_request_in_a_subshell_neither_ends_a_running_cell_nor_goes_unnoticed(kernel, tmp_path):
    """ipykernel 7 runs a subshell's requests in a thread of their own, through the same hooks as
    the main shell's: a console's cell there ending while the notebook trains must not let a
    suspend in (its cache emptied mid-cell, the checkpoint of a running kernel), nor may a cell
    running there while the main shell is idle."""
    from .harness.kernels import held_cell, wait_output

    kc, _pid, _ = kernel
    created = control(kc, "create_subshell_request")["content"]
    if created.get("status") != "ok":
        pytest.skip(f"this ipykernel has no subshells (it runs every request in the main thread): {created}")
    sub = created["subshell_id"]
    running = {"status": "refused", "message": "it is running a cell: suspend it once it is idle"}
    go_main, go_sub = tmp_path / "go-main", tmp_path / "go-sub"
    main_cell = held_cell(kc, go_main)
    assert reply_to(kc, in_subshell(kc, sub, "1 + 1"), 30)["content"]["status"] == "ok"
    assert control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"] == running
    go_main.write_text("")
    assert reply_to(kc, main_cell, 30)["content"]["status"] == "ok"
    sub_cell = in_subshell(kc, sub, f"import os, time\nprint('held', flush=True)\n"
                                    f"while not os.path.exists({str(go_sub)!r}): time.sleep(0.02)")
    wait_output(kc, sub_cell, "held")
    assert run(kc, "pass").reply["status"] == "ok"  # the main shell's request ends meanwhile
    assert control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"] == running
    go_sub.write_text("")
    assert reply_to(kc, sub_cell, 30)["content"]["status"] == "ok"
    # (ipykernel sends the reply before its post-handler hook ends the request in that thread)
    wait_for(lambda: control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"]["status"] == "ok",
             timeout=60)
    assert control(kc, contract.SUSPEND_DONE_REQUEST, {"token": "t", "ok": False})["content"]["state"] == "running"


def slow_site(tmp_path, seconds: float) -> str:
    site = tmp_path / "lib" / "site-packages"
    (site / "gpuctx_slow_mod").mkdir(parents=True)
    (site / "gpuctx_slow_mod" / "__init__.py").write_text(f"import time\ntime.sleep({seconds})\n")
    return (f"import sys; sys.path.insert(0, {str(site)!r})\n"
            "from gpuctx_jupyter.kernel.warm import plan as plans, scheduler\n"
            "w = get_ipython()._gpuctx.warmer\n")


def warm_up_waiting_for_its_turn(kc, tmp_path) -> None:
    started = run(kc, slow_site(tmp_path, 0) + "scheduler.HEAVY_IDLE_S = 600  # its import waits for 10 min of idleness\n"
                  "print(w.start_plan(lambda: plans.imports_only(['gpuctx_slow_mod'])))")
    assert started.stdout.split() == ["True"], started.text
    wait_for(lambda: plan_steps(kc) == [("import gpuctx_slow_mod", "planned")], timeout=60)  # its plan read


def plan_steps(kc) -> list[tuple[str, str]]:
    return [(st["name"], st["state"]) for st in (control(kc, contract.REQUEST)["content"].get("plan") or {})
            .get("steps", [])]


def test_a_warm_up_waiting_for_its_turn_is_given_up_for_a_suspend_and_goes_on_once_resumed(kernel, tmp_path):
    """Suspending a kernel whose warm-up waits for its turn is not refused: the warm-up stops
    there (`%gpu status` says why while suspended), the kernel consents, and once resumed the
    warm-up goes on with what it had left (the next cells may need it)."""
    kc, pid, _ = kernel
    warm_up_waiting_for_its_turn(kc, tmp_path)
    suspend_kernel(kc, pid)
    assert plan_steps(kc) == [("import gpuctx_slow_mod", "skipped")]
    status = control(kc, contract.REQUEST)["content"]["warmup"]
    assert (status["state"], status["detail"]) == ("off", "stopped: a suspend was asked for")
    run(kc, "scheduler.HEAVY_IDLE_S = 0.0")  # (resumes the kernel first)
    wait_for(lambda: plan_steps(kc) == [("import gpuctx_slow_mod", "done")], timeout=60)
    assert "gpuctx_slow_mod" in run(kc, "print(sorted(m for m in sys.modules if m.startswith('gpuctx_slow')))").stdout


def test_a_warm_up_given_up_for_a_suspend_that_then_fails_goes_on(kernel, tmp_path):
    """The kernel consented (its warm-up given up) but the suspend failed, as when the helper finds
    no room in host memory: the kernel runs as before, and so does its warm-up."""
    kc, _pid, _ = kernel
    warm_up_waiting_for_its_turn(kc, tmp_path)
    assert control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"]["status"] == "ok"
    assert plan_steps(kc) == [("import gpuctx_slow_mod", "skipped")]
    assert control(kc, contract.SUSPEND_DONE_REQUEST, {"token": "t", "ok": False})["content"]["state"] == "running"
    wait_for(lambda: plan_steps(kc) == [("import gpuctx_slow_mod", "planned")], timeout=30)  # its turn awaited again
    run(kc, "scheduler.HEAVY_IDLE_S = 0.0")
    wait_for(lambda: plan_steps(kc) == [("import gpuctx_slow_mod", "done")], timeout=60)


def test_a_suspend_that_comes_while_the_warm_up_imports_waits_for_it_and_leaves_it_be(kernel, tmp_path):
    """An import under way cannot be stopped half-done (nor left running in a checkpointed
    process): the kernel refuses with the reason after a second, the warm-up goes on to its end
    as if not asked, and the suspend asked again then is consented to."""
    kc, pid, _ = kernel
    started = run(kc, slow_site(tmp_path, 4) + "scheduler.HEAVY_IDLE_S = 0.0\n"
                  "print(w.start_plan(lambda: plans.imports_only(['gpuctx_slow_mod'])))")
    assert started.stdout.split() == ["True"], started.text
    wait_for(lambda: control(kc, contract.REQUEST)["content"]["warmup"]["phase"] == "import gpuctx_slow_mod", timeout=60)
    refused = control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"]
    assert refused["status"] == "refused" and refused["message"].startswith("its warm-up is in the middle of a step")
    done = wait_for(lambda: (lambda w: w if w["state"] != "running" else None)(
        control(kc, contract.REQUEST)["content"]["warmup"]), timeout=60)
    assert done["state"] == "done", done  # not stopped by the refused suspend
    suspend_kernel(kc, pid)
    assert "gpuctx_slow_mod" in run(kc, "print(sorted(m for m in sys.modules if m.startswith('gpuctx_slow')))").stdout


def test_the_kernel_refuses_its_consent_while_it_has_data_parallel_workers(kernel):
    pytest.importorskip("ipyparallel")
    from .harness.gpus import NO_GPU

    kc, _pid, _ = kernel
    started = run(kc, "%gpu workers start 1" + ("" if NO_GPU else " --cpu"), timeout=300)
    assert started.reply["status"] == "ok", started.text
    try:
        refused = control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"]
        assert refused["status"] == "refused" and refused["message"].startswith("it has data-parallel workers")
        assert "`%gpu workers stop` first" in refused["message"]
    finally:
        assert run(kc, "%gpu workers stop", timeout=120).reply["status"] == "ok"
    consent = control(kc, contract.SUSPEND_PREPARE_REQUEST, {"token": "t"})["content"]
    assert consent["status"] == "ok"
    assert control(kc, contract.SUSPEND_DONE_REQUEST, {"token": "t", "ok": False})["content"]["state"] == "running"


def test_a_failed_restore_answers_the_cell_with_the_reason_and_the_variables_stay(kernel, fake):
    kc, pid, _ = kernel
    run(kc, "x = 41")
    suspend_kernel(kc, pid)
    fake.fail(pid, "restore", OUT_OF_MEMORY, leave=2)  # no room on the GPU: it stays checkpointed
    r = run(kc, "x += 1")
    assert r.reply["status"] == "error" and r.error["ename"] == "GpuctxResumeError"
    assert "could not be brought back: restore failed: CUDA_ERROR_OUT_OF_MEMORY" in r.error["evalue"]
    assert "Its variables are safe in host memory" in r.error["evalue"] and fake.state(pid) == 2
    answer = control(kc, contract.REQUEST)["content"]["suspend"]
    assert answer["state"] == "suspended" and "OUT_OF_MEMORY" in answer["error"]
    r = run(kc, "print(x)")  # the next cell tries again, and the cell that failed never ran
    assert r.stdout.splitlines()[-1] == "41" and fake.state(pid) == 0


def test_a_restore_that_hangs_holds_neither_the_control_channel_nor_the_kernel(kernel, fake):
    """A driver call that never returns: the server's Resume and question are answered meanwhile
    (the kernel is resuming), and the request is answered with the reason after RESTORE_TIMEOUT_S,
    the variables safe; the next request resumes it."""
    kc, pid, _ = kernel
    run(kc, "x = 41")
    suspend_kernel(kc, pid)
    fake.hang(pid, "restore")
    try:
        cell = kc.execute("print(x)")
        wait_for(lambda: fake.hanging(pid, "restore"), timeout=30)
        resume = control(kc, contract.RESUME_REQUEST, timeout=10)["content"]
        assert resume["status"] == "error" and resume["state"] == "resuming", resume
        assert resume["message"].startswith("it is resuming already (for execute_request, ")
        assert control(kc, contract.REQUEST, timeout=10)["content"]["suspend"]["state"] == "resuming"
        fake.hang(pid, "restore", False)
        assert reply_to(kc, cell, 30)["content"]["status"] == "ok" and fake.state(pid) == 0

        run(kc, "import gpuctx_jupyter.kernel.suspend as s; s.RESTORE_TIMEOUT_S = 1.0")
        suspend_kernel(kc, pid)
        fake.hang(pid, "restore")
        r = run(kc, "x += 1", timeout=30)
        assert r.reply["status"] == "error" and r.error["ename"] == "GpuctxResumeError"
        assert "could not be brought back: the restore had not ended after 1 s" in r.error["evalue"]
        assert fake.state(pid) == 2
        assert control(kc, contract.REQUEST)["content"]["suspend"]["state"] == "suspended"
        fake.hang(pid, "restore", False)
        assert run(kc, "print(x)").stdout.splitlines()[-1] == "41" and fake.state(pid) == 0
    finally:
        fake.unhang_all()


def test_withdrawing_a_consent_gives_up_when_a_suspend_holds_the_process_too_long(fake, sleeper):
    with checkpoint.target_lock(sleeper.pid):  # a suspend helper stuck in the driver holds it
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="another checkpoint step on process .* had not ended after 0.3 s"):
            checkpoint.cancel(sleeper.pid, "t", timeout=0.3)
        assert time.monotonic() - t0 >= 0.3
    checkpoint.cancel(sleeper.pid, "t", timeout=0.3)  # free again


def test_the_servers_resume_request_restores_and_a_restart_never_restores_first(kernel, fake):
    kc, pid, km = kernel
    suspend_kernel(kc, pid)
    resumed = control(kc, contract.RESUME_REQUEST)["content"]
    assert resumed["status"] == "ok" and resumed["resumed"] is True and fake.state(pid) == 0
    assert control(kc, contract.RESUME_REQUEST)["content"]["resumed"] is False
    suspend_kernel(kc, pid)
    km.restart_kernel(now=False)  # a shutdown_request first: no user code, no restore
    kc.wait_for_ready(timeout=60)
    assert fake.steps(pid).count("restore") == 1 and fake.state(pid) == 2


# -- the out-of-memory explanation, and the host's room ----------------------------------------------------
def test_the_oom_explanation_offers_suspend_above_shutting_down_and_names_suspended_notebooks(
        nvml_records, clean_env, tmp_path, monkeypatch):
    from dataclasses import replace as copy

    from gpuctx_jupyter.core import frameworks as fws
    from gpuctx_jupyter.core.devices import GpuProcess

    monkeypatch.setattr(fws, "allocator_figures", lambda ordinal=None: [])
    a, b = 999_901, 999_902
    procs = [(os.getpid(), GIB), (a, 60 * GIB)]
    nvml_records([copy(h200(0), memory_total=140 * GIB, memory_used=121 * GIB,
                       processes=tuple(GpuProcess(p, n, "compute") for p, n in procs))])
    now = time.time()
    live = holders_file.Holder("kid-a", "python3", ("live.ipynb",), frozenset({a}), "idle", now - 900, 900,
                           memory=({"framework": "torch", "ordinal": 0, "allocated": 60 * GIB, "reserved": 60 * GIB},))
    away = holders_file.Holder("kid-b", "python3", ("away.ipynb",), frozenset({b}), "idle", now - 9000, 9000,
                           suspended={"since": now - 3600, "moved": {"0": 60 * GIB}, "moved_total": 60 * GIB})
    path = tmp_path / "holders.json"
    path.write_text(holders_file.HoldersFile(1, now, (live, away), "/gpuctx/api/kernels/{id}/release",
                                         "/gpuctx/api/kernels/{id}/suspend").to_json())
    monkeypatch.setenv(holders_file.HOLDERS, str(path))
    error = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})(
        "CUDA out of memory. Tried to allocate 40.00 GiB. GPU 0 has a total capacity of 139.81 GiB")
    text = oom.explain(error, now=now)
    lines = text.splitlines()
    assert len(lines) <= oom.MAX_LINES
    assert any(line.startswith("  away.ipynb is suspended: 60.0 GiB in host memory since ") for line in lines)
    fixes = lines[lines.index("  fixes, best first:") + 1:]
    assert fixes[0] == ("   1. suspend live.ipynb (60.0 GiB, idle 15 min; its variables stay; it resumes on its next "
                        "cell): the GPU panel's Suspend button, or POST /gpuctx/api/kernels/kid-a/suspend")
    assert not any("shut down live.ipynb" in f for f in fixes)  # suspending it is enough


@pytest.mark.parametrize("cached", [16 * GIB, 0])
def test_an_idle_holders_cache_that_covers_the_shortage_is_released_rather_than_the_notebook_suspended(
        nvml_records, clean_env, tmp_path, monkeypatch, cached):
    """tests/test_gpu_suspend.py's situation: idle-holder.ipynb holds 8 GiB of tensors, 4 GiB are
    free, this kernel asks for 6 GiB. `x.sum(dtype=torch.float64)` on an 8 GiB float32 tensor first
    copies it to float64 (16 GiB) and torch keeps that cached: with the cache, releasing it covers the
    2 GiB short and is the gentler fix, so suspending that notebook is not offered; without, suspend
    is, above shutting it down."""
    from dataclasses import replace as copy

    from gpuctx_jupyter.core import frameworks as fws
    from gpuctx_jupyter.core.devices import GpuProcess

    monkeypatch.setattr(fws, "allocator_figures", lambda ordinal=None: [])
    holder_pid, context, free = 999_901, 612 * 2**20, 4 * GIB
    held = 8 * GIB + cached + context
    procs = [(os.getpid(), 140 * GIB - free - held), (holder_pid, held)]
    nvml_records([copy(h200(0), memory_total=140 * GIB, memory_used=140 * GIB - free,
                       processes=tuple(GpuProcess(p, n, "compute") for p, n in procs))])
    now = time.time()
    idle = holders_file.Holder("kid-a", "python3", ("idle-holder.ipynb",), frozenset({holder_pid}), "idle", now - 60,
                               60, memory=({"framework": "torch", "ordinal": 0, "allocated": 8 * GIB,
                                            "reserved": 8 * GIB + cached},))
    path = tmp_path / "holders.json"
    path.write_text(holders_file.HoldersFile(1, now, (idle,), "/gpuctx/api/kernels/{id}/release",
                                             "/gpuctx/api/kernels/{id}/suspend").to_json())
    monkeypatch.setenv(holders_file.HOLDERS, str(path))
    error = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})(
        "CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 139.81 GiB")
    lines = oom.explain(error, now=now).splitlines()
    fixes = lines[lines.index("  fixes, best first:") + 1:]
    assert not any("shut down idle-holder.ipynb" in f for f in fixes)  # a gentler fix covers it
    if cached:
        assert fixes[0].startswith("   1. release the cache of idle-holder.ipynb (16.0 GiB, idle 1 min; its variables "
                                   "stay)")
        assert not any("suspend idle-holder.ipynb" in f for f in fixes)
    else:
        assert fixes[0] == ("   1. suspend idle-holder.ipynb (8.60 GiB, idle 1 min; its variables stay; it resumes on "
                            "its next cell): the GPU panel's Suspend button, or POST /gpuctx/api/kernels/kid-a/suspend")


def test_the_hosts_room_is_the_tighter_of_memavailable_and_the_containers_limit(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 100000000 kB\nMemAvailable: 50000000 kB\n")
    (proc / "42" / "cgroup").write_text("0::/kube/pod1\n")
    (cg / "kube" / "pod1").mkdir(parents=True)
    (cg / "kube" / "pod1" / "memory.max").write_text("max\n")
    (cg / "kube" / "memory.max").write_text(f"{20 * GIB}\n")
    (cg / "kube" / "memory.current").write_text(f"{5 * GIB}\n")
    (cg / "kube" / "pod1" / "memory.current").write_text(f"{4 * GIB}\n")
    room = host_memory.available(proc=str(proc), cgroup=str(cg), pid=42)
    assert room.available == 15 * GIB and room.source == "its container's memory limit, cgroup"
    (cg / "kube" / "memory.max").write_text("max\n")
    room = host_memory.available(proc=str(proc), cgroup=str(cg), pid=42)
    assert room.available == 50000000 * 1024 and room.source == "the machine's MemAvailable"


def test_a_containers_page_cache_does_not_count_as_memory_it_holds(tmp_path):
    """cgroup v2's memory.current and v1's memory.usage_in_bytes count the page cache, which the
    kernel reclaims first: its inactive part (memory.stat) is room, not use (review of issue 24)."""
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 100000000 kB\nMemAvailable: 50000000 kB\n")
    (proc / "42" / "cgroup").write_text("0::/pod\n")
    (cg / "pod").mkdir(parents=True)
    (cg / "pod" / "memory.max").write_text(f"{8 * GIB}\n")
    (cg / "pod" / "memory.current").write_text(f"{7 * GIB}\n")
    (cg / "pod" / "memory.stat").write_text(f"anon {2 * GIB}\nfile {5 * GIB}\nactive_file {1 * GIB}\n"
                                           f"inactive_file {4 * GIB}\n")
    room = host_memory.available(proc=str(proc), cgroup=str(cg), pid=42)
    assert room.limit == "cgroup" and room.available == 5 * GIB  # 8 - (7 - 4)
    (proc / "42" / "cgroup").write_text("4:memory:/pod\n2:cpu,cpuacct:/pod\n")  # v1
    v1 = cg / "memory" / "pod"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{8 * GIB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{7 * GIB}\n")
    (v1 / "memory.stat").write_text(f"cache {5 * GIB}\ninactive_file {GIB}\ntotal_inactive_file {3 * GIB}\n")
    room = host_memory.available(proc=str(proc), cgroup=str(cg), pid=42)
    assert room.limit == "cgroup" and room.available == 4 * GIB  # 8 - (7 - 3): the hierarchy's total


def test_a_helpers_answer_is_read_on_a_descriptor_past_1024():
    """A busy kernel (data loaders, sockets, files) has descriptors past select()'s limit: the
    restore helper's answer is still read."""
    import resource
    from types import SimpleNamespace

    from gpuctx_jupyter.kernel.suspend import _outcome_of

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    r, w = os.pipe()
    high = os.dup2(r, 1100)
    try:
        os.write(w, b'{"ready": true}\n{"ok": true, "seconds": 0.5}\n')
        helper = SimpleNamespace(stdout=SimpleNamespace(fileno=lambda: high))
        assert _outcome_of(helper, time.monotonic() + 5) == {"ok": True, "seconds": 0.5}
    finally:
        for fd in (r, w, high):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
