"""Whatever is typed after `%gpu` or `%%on_gpu`, the answer is a result or a one-line UsageError:
never another exception, never a hang. Device specs are read by one parser (core/devices.read_spec)
in every magic, ASCII digits only."""
from __future__ import annotations

import contextlib
import re
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from gpuctx_jupyter.core import inventory
from gpuctx_jupyter.core.devices import SpecError, parse_spec, read_spec
from gpuctx_jupyter.kernel import commands

from .harness.gpus import h200

# Words the magics know, the spellings that used to break them, and arbitrary text around them.
WORDS = ("--default", "--no-default", "--no-threads", "--time", "--mem", "--wait", "--frameworks", "torch",
         "cupy,jax", "--interval", "0.5", "--history", "--replay", "1", "0", "cuda:1", "cuda", "auto", "h200",
         "GPU-0000", "-1", "²", "١", "１", '"', "'", '"1"', "'x", "\\", "\x00", "\n", "\t", "--", "-h", "nan", "1e400")
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
ARGS = st.lists(st.one_of(st.sampled_from(WORDS), TEXT), max_size=5).map(" ".join)
SUBCOMMANDS = st.sampled_from([*commands.SUBCOMMANDS, "", "on_gpu", "lsit", "HELP"])
FAST = settings(max_examples=200, deadline=3000, suppress_health_check=[HealthCheck.function_scoped_fixture],
                derandomize=True, database=None)


class Hang(Exception):
    pass


@contextlib.contextmanager
def watchdog(seconds: float = 10):
    """Turn a hang into a failure: hypothesis's deadline only judges calls that return."""
    def expire(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def answer(call):
    """The call's result, or its UsageError checked to be one line that says something."""
    with watchdog():
        try:
            result = call()
        except UsageError as exc:
            message = str(exc)
            assert message.strip() and "\n" not in message and "\r" not in message, repr(message)
            return exc
    if hasattr(result, "close") and type(result).__name__ == "GpuMonitor":
        result.close()
    return result


@pytest.fixture(params=["no GPU", "two GPUs"])
def machine(request, shell, nvml_records, clean_env, monkeypatch):
    """The shell on this machine (no GPU), or with two H200s as NVML reports them."""
    import torch  # noqa: F401 — `%gpu warm` then returns at once instead of importing torch

    if request.param == "two GPUs":
        nvml_records([h200(0), h200(1)])
    monkeypatch.chdir(request.config.rootpath)
    yield shell
    shell._gpuctx.warmer.wait(30)
    from gpuctx_jupyter.kernel import monitor

    monitor.close_all()


@FAST
@given(sub=SUBCOMMANDS, rest=ARGS)
def test_every_gpu_subcommand_answers_or_says_what_is_wrong(machine, capsys, sub, rest):
    answer(lambda: machine.run_line_magic("gpu", f"{sub} {rest}"))
    capsys.readouterr()


@FAST
@given(line=st.one_of(TEXT, ARGS))
def test_any_gpu_line_answers_or_says_what_is_wrong(machine, capsys, line):
    answer(lambda: machine.run_line_magic("gpu", line))
    capsys.readouterr()


@FAST
@given(line=st.one_of(TEXT, ARGS))
def test_any_on_gpu_line_runs_the_cell_or_says_what_is_wrong(machine, capsys, line):
    machine.user_ns.pop("_gpuctx_probe", None)
    result = answer(lambda: machine.run_cell_magic("on_gpu", line, "_gpuctx_probe = 1\n_gpuctx_probe + 1"))
    assert result == 2 or (isinstance(result, UsageError) and "_gpuctx_probe" not in machine.user_ns)
    capsys.readouterr()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True, database=None)
@given(spec=st.one_of(TEXT, st.sampled_from(WORDS), st.from_regex(r"(cuda:)?[0-9\u0660-\u0669\u00b2]{1,3}")))
def test_the_fast_path_reads_specs_as_parse_spec_does(shell, nvml_records, clean_env, spec):
    nvml_records([h200(0), h200(1)])
    devices = inventory.take().devices
    fast = shell.magics_manager.registry["GpuMagics"]._fast_ordinal
    try:
        parsed = read_spec(spec)
    except SpecError as exc:  # the same refusal, word for word, from both
        with pytest.raises(SpecError, match=f"^{re.escape(str(exc))}$"):
            parse_spec(spec, devices)
        with pytest.raises(UsageError, match=f"^{re.escape(str(exc))}$"):
            fast(spec)
        return
    if parsed.kind == "ordinal" and parsed.ordinal < len(devices):
        assert fast(spec) == parse_spec(spec, devices).ordinal == parsed.ordinal
    else:
        assert fast(spec) is None  # the slow path (parse_spec) decides


@pytest.mark.parametrize("spec", ["²", "١", "１", "cuda:١", "cuda:²"])
def test_non_ascii_digits_are_no_ordinal_in_any_magic(machine, spec):
    machine.user_ns.pop("ran", None)
    result = machine.run_cell(f"%%on_gpu {spec}\nran = True")
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert "write ordinals with the digits 0-9" in str(result.error_in_exec)
    assert "ran" not in machine.user_ns
    with pytest.raises(UsageError, match="write ordinals with the digits 0-9"):
        machine.run_line_magic("gpu", f"use {spec}")
    with pytest.raises(UsageError, match="write ordinals with the digits 0-9"):
        machine.run_line_magic("gpu", f"monitor {spec}")


@pytest.mark.parametrize("line", ['use "x', "use 'x", 'monitor --replay "my trace', '"'])
def test_an_unclosed_quote_is_a_one_line_usage_error(shell, line):
    with pytest.raises(UsageError, match=r"^%gpu: a quotation mark is not closed in .*: close it or leave it out$"):
        shell.run_line_magic("gpu", line)


def test_an_unclosed_quote_in_on_gpu(shell):
    result = shell.run_cell('%%on_gpu "1\nx = 1')
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec).startswith("%%on_gpu: a quotation mark is not closed")


def test_quotes_group_words_and_backslashes_stay(shell, nvml_records, clean_env, capsys):
    nvml_records([h200(0), h200(1)])
    shell.run_line_magic("gpu", 'use "1"')
    assert shell._gpuctx.switcher.choice.ordinal == 1
    with pytest.raises(UsageError, match=r"cannot replay C:\\traces\\my trace\.jsonl: "):
        shell.run_line_magic("gpu", r'monitor --replay "C:\traces\my trace.jsonl"')


@pytest.mark.parametrize(("line", "message"), [
    ("use 0 --bogus", r"^%gpu use: unrecognized arguments: --bogus \(`%gpu help use` shows its options\)$"),
    ("monitor --interval ١", r"^%gpu monitor: argument --interval: '١' is not a number of seconds"),
    ("monitor --interval nan", r"is not a number of seconds"),
    ("warm --frameworks ,", r"^--frameworks names none"),
    ("status now", r"^%gpu status: unrecognized arguments: now"),
    ('use "a\nb" 1', r"^%gpu use: unrecognized arguments: 1 \("),
    ('"ab\ncd"', r"^unknown %gpu subcommand 'ab\\ncd'"),
    ("on_gpu 1", r"^on_gpu is a cell magic: put `%%on_gpu 1` on the first line of the cell$"),
])
def test_mistakes_are_one_line_usage_errors_that_say_what_to_do(shell, line, message):
    with pytest.raises(UsageError, match=message) as raised:
        shell.run_line_magic("gpu", line)
    assert "\n" not in str(raised.value)
