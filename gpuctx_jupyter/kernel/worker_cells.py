"""`%%on_gpu all`: one cell on every worker at once (kernel/workers.py starts them).

The cell goes to each rank's ipyparallel engine as its own execute request, so every rank has its
own result, error and output. While they run, the kernel's main thread shows what each rank
prints, grouped per rank under a header with its state, in one display it updates live (a
terminal gets the lines as they come, prefixed with the rank). It returns when every rank is
done: rank 0's value of the last expression (the first rank named, with a list), every rank's in
`_ranks`; names the cell defines stay on the workers.

What can go wrong, and what the user gets:
- a rank raises: one exception whose traceback shows every failing rank's traceback; the others
  get `failure_grace` s to finish (in DDP they usually wait for the failed rank in a collective),
  then an interrupt; the workers stay usable.
- Interrupt: SIGINT to every rank still running (ipyparallel's signal, or the PID for a local
  worker); KeyboardInterrupt once they have stopped.
- `--timeout S`: the ranks still running after S s are interrupted; a one-line UsageError.
- a rank that ignores the interrupt (stuck in C code, in a collective) for `interrupt_grace` s, or
  a worker that dies: the workers are stopped (their process group cannot go on without a
  member), and a one-line UsageError says so. Nothing is left running.
- their ipyparallel controller ends (killed, out of memory): nothing reaches the workers or comes
  back from them without it, so they are stopped at once, with a one-line UsageError.
"""
from __future__ import annotations

import concurrent.futures
import html
import os
import pickle
import signal
import sys
import time
from dataclasses import dataclass

from IPython.core.error import UsageError

from . import worker_side
from .commands import one_line

REFRESH_S = 0.1  # the live display is updated at most this often
SHOW_AFTER_S = 2.0  # a cell that prints nothing gets its per-rank states shown after this long
CSS_ERR = "background: var(--jp-rendermime-error-background, #fdd); margin: 0"
LIVE_LINES = 40  # while the cell runs, each rank's last lines of each stream (all of them once it has ended)


@dataclass
class NotBroughtBack:
    """A rank's value that did not come back to the notebook (too large, not picklable, or not
    unpicklable here); its repr, as the rank made it."""

    rank: int
    text: str
    kind: str
    why: str

    def __repr__(self) -> str:
        return f"<rank {self.rank}: {self.kind} not brought back ({self.why}): {self.text}>"


class RanksFailed(Exception):
    """One or more ranks raised: the traceback IPython shows is every failing rank's."""

    def __init__(self, failures: list, total: int, note: str):
        self.failures = failures  # [(Worker, ipyparallel RemoteError)]
        self.total = total
        self.note = note
        first = failures[0][1]
        ranks = ", ".join(str(w.rank) for w, _ in failures)
        super().__init__(f"rank{'s' if len(failures) > 1 else ''} {ranks} of {total} failed: "
                         f"{getattr(first, 'ename', '')}: {getattr(first, 'evalue', first)}")

    def _render_traceback_(self) -> list[str]:
        """Each failing rank's traceback; ranks that failed alike (a syntax error) share one."""
        alike: dict[str, list] = {}
        for w, err in self.failures:
            alike.setdefault(getattr(err, "traceback", None) or str(err), []).append((w, err))
        lines = []
        for tb, group in alike.items():
            labels = ", ".join(w.label for w, _ in group)
            lines.append(f"\x1b[1;31m── {labels}: {getattr(group[0][1], 'ename', type(group[0][1]).__name__)}\x1b[0m")
            lines.extend(tb.splitlines())
        lines.append(f"%%on_gpu: {self}; {self.note}")
        return lines


def _tail(stream: str) -> str:
    lines = stream.splitlines(keepends=True)
    if len(lines) <= LIVE_LINES:
        return stream
    earlier = f"… {len(lines) - LIVE_LINES} earlier lines (all shown when the cell ends)\n"
    return earlier + "".join(lines[-LIVE_LINES:])


class Groups:
    """What each rank has printed, shown grouped per rank."""

    def __init__(self, chosen, ars: dict, shell):
        self.chosen, self.ars = chosen, ars  # rank -> its ipyparallel AsyncResult
        self.states = {w.rank: "running" for w in chosen}
        self.in_kernel = getattr(shell, "kernel", None) is not None
        self.handle = None
        self.shown = ""
        self.outputs = {w.rank: 0 for w in chosen}  # rich outputs republished so far
        self.printed: dict[tuple[int, str], int] = {}  # terminal: characters printed per stream
        self.t0 = time.monotonic()

    def _streams(self, rank: int) -> tuple[str, str, str]:
        md = self.ars[rank].metadata  # ipyparallel adds to it as the rank's output arrives
        result = (md.get("execute_result") or {}).get("data", {}).get("text/plain", "")
        return md.get("stdout") or "", md.get("stderr") or "", result

    def refresh(self, final: bool = False) -> None:
        if not self.in_kernel:
            self._print_new(final)
            return
        self._republish()
        streams = {w.rank: self._streams(w.rank) for w in self.chosen}
        anything = any(any(s) for s in streams.values())
        if self.handle is None and not anything and (final or time.monotonic() - self.t0 < SHOW_AFTER_S):
            return
        text, markup = self._render(streams, final)
        if text == self.shown:
            return
        bundle = {"text/plain": text, "text/html": markup}
        from IPython.display import display

        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)
        self.shown = text

    def _render(self, streams, final: bool = True) -> tuple[str, str]:
        """Every rank's output under its name. While the cell runs, each stream's last LIVE_LINES
        lines: the display is sent again at every refresh, and a training loop's log on 8 ranks
        would be megabytes a second over the kernel's channel."""
        text, parts = [], []
        for w in self.chosen:
            out, err, result = streams[w.rank]
            if not final:
                out, err = _tail(out), _tail(err)
            head = f"── {w.label} · {self.states[w.rank]}"
            text.append(head)
            text += [s.rstrip("\n") for s in (out, err) if s]
            if result:
                text.append(f"Out: {result}")
            parts.append(f"<div><b>{html.escape(w.label)}</b> · {html.escape(self.states[w.rank])}</div>")
            if out:
                parts.append(f"<pre style='margin: 0'>{html.escape(out.rstrip(chr(10)))}</pre>")
            if err:
                parts.append(f"<pre style='{CSS_ERR}'>{html.escape(err.rstrip(chr(10)))}</pre>")
            if result:
                parts.append(f"<pre style='margin: 0'>Out: {html.escape(result)}</pre>")
        return "\n".join(text), "<div class='gpuctx-ranks'>" + "".join(parts) + "</div>"

    def _republish(self) -> None:
        """Rich outputs (plots, tables) a rank displays, under a line naming the rank."""
        from IPython.display import publish_display_data

        for w in self.chosen:
            md = self.ars[w.rank].metadata
            outputs = md.get("outputs") or []
            for out in outputs[self.outputs[w.rank]:]:
                publish_display_data({"text/plain": f"[{w.label}]"})
                publish_display_data(out.get("data", {}), out.get("metadata", {}))
            self.outputs[w.rank] = len(outputs)

    def _print_new(self, final: bool = False) -> None:
        """A terminal: each rank's new text as it comes, every line prefixed with the rank (a last
        line without its newline once the cell has ended)."""
        for w in self.chosen:
            for name, text in zip(("stdout", "stderr"), self._streams(w.rank)[:2], strict=True):
                seen = self.printed.get((w.rank, name), 0)
                new = text[seen:]
                if "\n" not in new and not (final and new):
                    continue
                complete = new if final else new[: new.rindex("\n") + 1]
                self.printed[(w.rank, name)] = seen + len(complete)
                stream = sys.stdout if name == "stdout" else sys.stderr
                for line in complete.splitlines():
                    print(f"[rank {w.rank}] {line}", file=stream)


class CellRun:
    """One `%%on_gpu all` cell on the chosen ranks, from submission to its value."""

    def __init__(self, workers, chosen, cell: str, timeout: float | None = None):
        self.workers, self.chosen, self.cell, self.timeout = workers, chosen, cell, timeout
        self.shell = workers.parent

    def run(self):
        __tracebackhide__ = True  # noqa: F841 — the ranks' tracebacks are what matters
        workers = self.workers
        cut_off = workers.ended(controller_only=True)
        if cut_off:
            self._stop_all()
            raise UsageError(one_line(f"the cell did not run: {cut_off}; the workers were stopped, as nothing reaches "
                                      "them without it; `%gpu workers start` starts new ones"))
        gone = workers.died()
        if gone:
            exit_words = workers.exit_words(gone[0])
            self._stop_all()
            raise UsageError(one_line(f"{_named(gone)} died since the last cell{exit_words}: the other workers were stopped, as "
                                      "their process group lost a member; `%gpu workers start` starts new ones"))
        client = workers.client
        ars = {w.rank: client[w.engine].execute(self.cell, silent=False, block=False) for w in self.chosen}
        workers.cells += 1
        groups = Groups(self.chosen, ars, self.shell)
        for w in self.chosen:
            w.state = "busy"
        try:
            outcome = self._wait(ars, groups)
        finally:
            for w in self.chosen:
                if w.state == "busy":
                    w.state = "ready"
        stuck, died, why = outcome
        for ar in ars.values():
            if ar.ready():
                try:
                    ar.wait_for_output(1.0)  # the last lines of a rank come after its reply
                except Exception:  # noqa: BLE001
                    pass
        groups.refresh(final=True)
        if why == "controller":
            self._stop_all()
            raise UsageError(one_line(f"the cell was cut off: {died}; the workers were stopped, as nothing reaches "
                                      "them or comes back from them without it; `%gpu workers start` starts new ones"))
        failures = [(w, ars[w.rank].exception()) for w in self.chosen
                    if ars[w.rank].done() and ars[w.rank].exception() is not None]
        if died or stuck:
            exit_words = workers.exit_words(died[0]) if died else ""
            self._stop_all()
            if died:
                raise UsageError(one_line(
                    f"{_named(died)} died mid-cell{exit_words}: the other workers were stopped, as their process group "
                    "lost a member; `%gpu workers start` starts new ones"))
            stopped = (f"{_named(stuck)} did not stop within {workers.interrupt_grace:g} s of the "
                       f"{'interrupt that followed' if why == 'failure' else why}")
            if why == "failure":  # the failure is what matters: its traceback, and what became of the rest
                raise RanksFailed(failures, len(self.chosen), f"{stopped} (waiting for it in a collective?): the "
                                  "workers were stopped; `%gpu workers start` starts new ones")
            raise UsageError(one_line(f"{stopped} (stuck in C code or in a collective?): the workers were stopped; "
                                      "`%gpu workers start` starts new ones"))
        values = self._values([w for w in self.chosen if ars[w.rank].exception() is None])
        self.shell.user_ns["_ranks"] = [values.get(w.rank) for w in self.chosen]
        interrupted = [w for w, err in failures if getattr(err, "ename", "") == "KeyboardInterrupt"]
        if why == "interrupt":
            print(f"gpuctx: interrupted {_named(interrupted) if interrupted else 'no rank (all had finished)'}; "
                  "the workers are ready for the next cell", file=sys.stderr)
            raise KeyboardInterrupt
        if why == "timeout":
            raise UsageError(one_line(f"{_named(interrupted)} did not finish within {self.timeout:g} s (--timeout): "
                                      "interrupted; the workers are ready for the next cell"))
        if failures:
            first = [w for w, err in failures if getattr(err, "ename", "") != "KeyboardInterrupt"]
            late = [w for w, err in failures if w not in first]
            note = "the workers are ready for the next cell"
            if why == "failure" and late and first:
                note = (f"{_named(late)} {'was' if len(late) == 1 else 'were'} interrupted "
                        f"{workers.failure_grace:g} s after it; {note}")
                failures = [(w, err) for w, err in failures if w in first]
            raise RanksFailed(failures, len(self.chosen), note)
        return values.get(self.chosen[0].rank)

    def _wait(self, ars: dict, groups: Groups) -> tuple[list, list, str]:
        """Until every rank is done; returns (ranks that ignored an interrupt, ranks that died,
        why they were interrupted: interrupt | timeout | failure | death | ""), or ([], how the
        controller ended, "controller") when it has."""
        workers = self.workers
        by_rank = {w.rank: w for w in self.chosen}
        pending = dict(ars)
        start, signalled, failed_at, why, last = time.monotonic(), None, None, "", 0.0
        while pending:
            try:  # an Interrupt may come at any point of a round
                done, _ = concurrent.futures.wait(list(pending.values()), timeout=REFRESH_S)
                now = time.monotonic()
                for rank in [r for r, ar in pending.items() if ar in done]:
                    exc = pending.pop(rank).exception()
                    if exc is not None and getattr(exc, "ename", "") == "EngineError":
                        groups.states[rank] = "died"
                        return [], [by_rank[rank]], "death"
                    groups.states[rank] = (f"failed ({getattr(exc, 'ename', type(exc).__name__)})" if exc is not None
                                           else f"done in {now - start:.1f} s")
                    if exc is not None and failed_at is None:
                        failed_at = now
                dead = [w for w in workers.died() if w.rank in pending]
                if dead:
                    for w in dead:
                        groups.states[w.rank] = "died"
                    return [], dead, "death"
                cut_off = workers.ended(controller_only=True)
                if cut_off:  # (the ranks may finish, but their results would never come back)
                    for rank in pending:
                        groups.states[rank] = "cut off"
                    return [], cut_off, "controller"
                if now - last >= REFRESH_S:
                    groups.refresh()
                    last = now
                if not pending:
                    break
                if signalled is None:
                    if self.timeout and now - start > self.timeout:
                        why = "timeout"
                    elif failed_at is not None and now - failed_at > workers.failure_grace:
                        why = "failure"
                    if why:
                        signalled = now
                        self._interrupt([by_rank[r] for r in pending])
                elif now - signalled > workers.interrupt_grace:
                    return [by_rank[r] for r in pending], [], why
            except KeyboardInterrupt:
                if why == "interrupt":  # a second Interrupt: stop now
                    return [by_rank[r] for r in pending], [], why
                why, signalled = "interrupt", time.monotonic()
                self._interrupt([by_rank[r] for r in pending])
        return [], [], why

    def _interrupt(self, ranks) -> None:
        """SIGINT to each rank: to a local worker's PID directly, through ipyparallel otherwise."""
        remote = []
        for w in ranks:
            if w.local:
                try:
                    os.kill(w.pid, signal.SIGINT)
                except OSError:
                    pass
            else:
                remote.append(w.engine)
        if remote:
            self.workers.client.send_signal("SIGINT", targets=remote, block=False)

    def _values(self, ranks) -> dict:
        """Each rank's value of the cell's last expression and memory (worker_side.after_cell)."""
        if not ranks:
            return {}
        client, limit = self.workers.client, self.workers.result_limit
        ars = {w.rank: client[w.engine].apply_async(worker_side.after_cell, limit) for w in ranks}
        values = {}
        deadline = time.monotonic() + 60
        for w in ranks:
            try:
                packed, memory = ars[w.rank].get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 — a value that cannot come back is said, never raised
                values[w.rank] = NotBroughtBack(w.rank, "", "value", f"{type(exc).__name__}: {exc}")
                continue
            w.memory = memory
            values[w.rank] = _unpack(w.rank, packed)
        return values

    def _stop_all(self) -> None:
        self.workers._teardown()


def _unpack(rank: int, packed):
    if packed is None:
        return None
    if packed[0] == "summary":
        return NotBroughtBack(rank, *packed[1:])
    try:
        return pickle.loads(packed[1])
    except Exception as exc:  # noqa: BLE001 — e.g. a class the cell defined on the workers only
        return NotBroughtBack(rank, "", "value", f"it cannot be unpickled here: {type(exc).__name__}: {exc}")


def _named(ranks) -> str:
    ranks = list(ranks)
    if len(ranks) == 1:
        w = ranks[0]
        return f"{w.label} (pid {w.pid})"
    return "ranks " + ", ".join(str(w.rank) for w in ranks)

