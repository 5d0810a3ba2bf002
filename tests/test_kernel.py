"""The magics in a real ipykernel process started through jupyter_client (no GPU here)."""
from __future__ import annotations

from .harness.kernels import held_cell, reply_to, run, wait_idle
from .harness.waiting import wait_for


def test_gpu_list_renders_html_and_text_saying_no_gpu(loaded_kernel):
    _, kc = loaded_kernel
    r = run(kc, "%gpu")
    assert r.reply["status"] == "ok"
    assert "No GPU is visible to this kernel" in r.html
    assert "NVML reports:" in r.text


def test_usage_error_is_one_line_without_traceback(loaded_kernel):
    _, kc = loaded_kernel
    r = run(kc, "%gpu use 0")
    assert r.reply["status"] == "error"
    assert r.reply["ename"] == "UsageError"
    assert r.reply["evalue"].startswith("no GPU is visible: NVML reports:")
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr  # one line, no traceback


def test_on_gpu_runs_cell_and_interrupt_restores(loaded_kernel, tmp_path):
    km, kc = loaded_kernel
    # the cell writes a file just before its sleep: the interrupt is sent once that file exists, so
    # it lands in the sleep, not in the cell's output machinery
    inside = tmp_path / "inside"
    msg_id = kc.execute(f"%%on_gpu 0\nimport pathlib, time\nstarted = True\npathlib.Path({str(inside)!r}).touch()\n"
                        "time.sleep(60)")
    wait_for(inside.exists, timeout=60)  # the cell body runs inside %%on_gpu
    km.interrupt_kernel()
    reply = reply_to(kc, msg_id, timeout=30)  # long before the 60 s sleep ends
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    wait_idle(kc, msg_id)  # done, as a frontend sees it: the next cell is not aborted
    r = run(kc, "print(started, get_ipython()._gpuctx.switcher.choice)")
    assert r.stdout.strip() == "True None"


def test_doctor_names_a_cpu_only_torch_before_it_is_imported(loaded_kernel):
    _, kc = loaded_kernel
    r = run(kc, "%gpu doctor\nimport sys\nprint('torch' in sys.modules)")
    assert r.reply["status"] == "ok"
    assert r.stdout.strip() == "False"  # doctor read torch's package metadata, it did not import torch
    assert "2.13.0+cpu is a CPU-only build (read from its installed package; not imported yet)" in r.html


def test_on_gpu_without_gpu_warns_on_stdout_not_stderr(loaded_kernel):
    _, kc = loaded_kernel
    r = run(kc, "%%on_gpu 0 --time\nx = 1")
    assert r.reply["status"] == "ok"
    assert r.stdout.startswith("gpuctx warning: no GPU is visible") and "on_gpu: no GPU · wall " in r.stdout
    assert r.stderr == ""  # JupyterLab paints stderr red, as if the cell had failed


def test_status_and_doctor_in_kernel(loaded_kernel):
    _, kc = loaded_kernel
    r = run(kc, "import torch\n%gpu status\n%gpu doctor")
    assert r.reply["status"] == "ok"
    assert "CPU-only build" in r.html and "gpuctx doctor" in r.html


def test_unload_removes_magics(loaded_kernel):
    _, kc = loaded_kernel
    assert run(kc, "%unload_ext gpuctx").reply["status"] == "ok"
    r = run(kc, "%gpu")
    assert r.reply["status"] == "error" and "not found" in r.reply["evalue"]
    assert run(kc, "%load_ext gpuctx").reply["status"] == "ok"
    assert run(kc, "%gpu").reply["status"] == "ok"


def test_kernel_answers_gpuctx_request_on_the_control_channel_while_busy(loaded_kernel, tmp_path):
    km, kc = loaded_kernel
    run(kc, "%load_ext gpuctx")
    release = tmp_path / "release"
    msg_id = held_cell(kc, release)  # runs until released: any answer now came while it ran
    request = kc.session.msg("gpuctx_request", {})
    kc.control_channel.send(request)
    reply = reply_to(kc, request["header"]["msg_id"], timeout=30, channel="control")
    assert reply["msg_type"] == "gpuctx_reply" and reply["content"]["status"] == "ok"
    assert reply["content"]["pid"] > 0 and "warmup" in reply["content"]
    release.write_text("go")
    assert reply_to(kc, msg_id, timeout=30)["content"]["status"] == "ok"  # the cell's own reply


def test_a_control_answer_that_cannot_be_written_is_answered_with_why(loaded_kernel):
    """An answer holding what the message packer cannot write (an object of no JSON type): ipykernel only logs the
    failure, and the server waited its whole timeout for a reply that never came."""
    _km, kc = loaded_kernel
    run(kc, "%load_ext gpuctx")
    run(kc, "import gpuctx_jupyter.kernel.kernel_view as _kv\n_kv._real_report = _kv.report\n"
            "_kv.report = lambda state: {'status': 'ok', 'odd': object()}")
    try:
        request = kc.session.msg("gpuctx_request", {})
        kc.control_channel.send(request)
        reply = reply_to(kc, request["header"]["msg_id"], timeout=30, channel="control")
        assert reply["msg_type"] == "gpuctx_reply" and reply["content"]["status"] == "error"
        assert reply["content"]["message"].startswith("the answer could not be sent: ")
    finally:
        run(kc, "_kv.report = _kv._real_report")
