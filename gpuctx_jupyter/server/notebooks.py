"""The server's reading of notebooks: the contract's one reader, never on the event loop.

Every read runs in a small thread pool of its own with a time limit, so that a notebook on a hung
network mount (or anything else that never finishes reading) costs one worker thread and a
sentence in the answer, never the server's event loop, and never the threads other work needs.
The contract's reader refuses anything but a regular file and stops at its byte cap.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from ..contract import notebook as nbread
from ..contract.notebook import Facts

READ_TIMEOUT_S = 5.0
WORKERS = 2


class Notebooks:
    def __init__(self, timeout: float = READ_TIMEOUT_S):
        self.timeout = timeout
        self.reader = nbread.Reader()
        self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="gpuctx-notebooks")

    async def facts(self, path: str | None) -> Facts:
        """The notebook's facts (from the cache while the file is unchanged); never an exception."""
        if not path:
            return nbread.read(path)
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._executor, self.reader.facts, path), self.timeout)
        except asyncio.TimeoutError:
            return Facts(path=path, error=f"cannot read the notebook {path}: reading took over {self.timeout:g} s")
        except Exception as exc:  # noqa: BLE001 — an answer, whatever went wrong
            return Facts(path=path, error=f"cannot read the notebook {path}: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
