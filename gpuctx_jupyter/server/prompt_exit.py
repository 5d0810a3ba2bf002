"""The server's process ends when it is stopped, also with a request in flight.

jupyter_server runs the blocking part of many requests (reading files and directories, listing
checkpoints, nbconvert's list of exporters, which JupyterLab asks for on every page load) in
anyio's worker threads. Such a thread ends when its request's task ends. One whose request was in
flight when the server's event loop stopped (SIGTERM, Ctrl-C twice, JupyterHub stopping a user's
server) hands its result to a loop that no longer runs and then waits for more work for ever. It
is not a daemon thread, so Python waits for it at exit: the process never ends (seen with
`GET /api/nbconvert` sent 0.3 s before SIGTERM, with or without gpuctx). The kernels are shut
down by then; what stays is the process, and whatever it would only have ended at its exit,
until something kills it.

Once the loop has stopped nothing gives those threads work again, so each is told to end, as
anyio tells it when a request's task ends (`WorkerThread.stop`: anyio has no public call for
it). A thread still running its request's work finishes that first.
"""
from __future__ import annotations

import asyncio
import threading
import time


def end_workers_after_stop(log, poll: float = 0.1, within: float = 300.0) -> threading.Thread | None:
    """From the running event loop (the server's shutdown): watch it, and once it has stopped, tell
    anyio's worker threads to end. None where this anyio has no such threads to tell. A loop that
    runs on `within` s after the shutdown (a server embedded in a test suite) is left alone."""
    worker_class = _worker_class()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    if worker_class is None:
        return None

    def watch() -> None:
        deadline = time.monotonic() + within
        while loop.is_running():
            if time.monotonic() > deadline:
                return
            time.sleep(poll)
        told = 0
        for thread in threading.enumerate():
            # (only the server loop's: another loop's threads are that loop's to end)
            if isinstance(thread, worker_class) and thread.is_alive() and getattr(thread, "loop", loop) is loop:
                try:
                    thread.stop()
                    told += 1
                except Exception as exc:  # (its queue full: it has work, and ends after it)
                    log.debug("gpuctx: a worker thread could not be told to end: %s", exc)
        if told:
            log.info("gpuctx: the server's event loop has stopped: %d worker thread%s of requests in "
                     "flight told to end, so that the process can exit", told, "" if told == 1 else "s")

    watcher = threading.Thread(target=watch, name="gpuctx prompt exit", daemon=True)
    watcher.start()
    return watcher


def _worker_class() -> type | None:
    try:
        from anyio._backends._asyncio import WorkerThread
    except ImportError:
        return None
    return WorkerThread if callable(getattr(WorkerThread, "stop", None)) else None
