"""One action at a time per kernel: a restart, shutdown or interrupt of a kernel never overlaps
another action on the same kernel.

jupyter_client restarts a kernel by stopping its process and starting a new one on the same
ports: two restarts at once both stop the same process, and the second start finds its ports
taken ("Address already in use"), leaving a process that no one tracks. The warm pool restarts by
swapping a standby in under the kernel id: two at once would both swap, and one standby would be
lost. So every action on a kernel — gpuctx's routes, jupyter_server's own
/api/kernels/<id>/restart, the idle culler, a session deleted — goes through `KernelActions`,
which wraps the kernel manager's methods outermost (around the pool's and the hook's):

- an action asked while the same action is in flight on that kernel joins it: both callers get
  its outcome, and the kernel is restarted (or stopped) once;
- any other action waits for the one in flight, then runs;
- gpuctx's own routes do not wait: they answer 409 with a message (`Busy`).
"""
from __future__ import annotations

import asyncio

from jupyter_core.utils import ensure_async

METHODS = ("restart_kernel", "shutdown_kernel", "interrupt_kernel")


class Busy(Exception):
    """Another action on this kernel is in flight (the caller asked not to wait)."""

    def __init__(self, action: str):
        super().__init__(f"an action on this kernel is in progress ({action.replace('_kernel', '')}): "
                         "try again once it has finished")
        self.action = action


class KernelActions:
    def __init__(self, mkm):
        self.mkm = mkm
        self._next = {name: getattr(mkm, name) for name in METHODS}
        self._inflight: dict[str, tuple[str, asyncio.Future]] = {}  # kernel id -> (method, outcome)

    def install(self) -> None:
        for name in METHODS:
            setattr(self.mkm, name, self._wrapped(name))

    def _wrapped(self, method: str):
        async def call(kernel_id, *args, **kwargs):
            return await self.run(method, kernel_id, *args, **kwargs)

        call.__name__ = method
        return call

    def busy(self, kernel_id: str) -> str | None:
        """The method in flight on this kernel, if any."""
        current = self._inflight.get(kernel_id)
        return current[0] if current else None

    async def run(self, method: str, kernel_id: str, *args, wait: bool = True, **kwargs):
        """Run `method` on the kernel once no other action is in flight on it (see the module's
        docstring); with wait=False, raise Busy instead of waiting."""
        while (current := self._inflight.get(kernel_id)) is not None:
            running, outcome = current
            if not wait:
                raise Busy(running)
            if running == method:
                return await asyncio.shield(outcome)
            await asyncio.wait([outcome])  # its outcome is its own callers'; then our turn
        outcome = asyncio.get_running_loop().create_future()
        self._inflight[kernel_id] = (method, outcome)
        pending = None
        try:
            result = await ensure_async(self._next[method](kernel_id, *args, **kwargs))
        except asyncio.CancelledError:
            outcome.cancel()
            raise
        except BaseException as exc:
            outcome.set_exception(exc)
            outcome.exception()  # retrieved: a failure nobody joined is not "never retrieved"
            raise
        else:
            # jupyter_server's restart returns a future that resolves once the new kernel answers
            # kernel_info: the restart is in flight until then.
            if isinstance(result, asyncio.Future) and not result.done():
                pending = result
                pending.add_done_callback(lambda _f: self._finish(kernel_id, outcome, result))
            else:
                outcome.set_result(result)
            return result
        finally:
            if pending is None and self._inflight.get(kernel_id, (None, None))[1] is outcome:
                del self._inflight[kernel_id]

    def _finish(self, kernel_id: str, outcome: asyncio.Future, result: asyncio.Future) -> None:
        if not result.cancelled():
            result.exception()  # jupyter_server has logged a failed restart; nothing more to say
        if not outcome.done():
            outcome.set_result(result)
        if self._inflight.get(kernel_id, (None, None))[1] is outcome:
            del self._inflight[kernel_id]
