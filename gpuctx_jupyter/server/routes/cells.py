"""PUT <base>/gpuctx/api/kernels/<id>/cells {"cells": ["<source>", ...]}: a notebook's code cells
as the frontend holds them, unsaved edits included, for the kernel's warm plan (issue #25).

202 with the kernel's counts when it takes them; 400 for a body that is not that (not UTF-8, not
JSON, wrong types), 413 over the caps (contract/cells.py; a body over 8 times the cap is refused by
its length before it is read), 404 for an unknown kernel, 409 where the kernel does not warm typed cells (gpuctx not
installed there, warming off, a fixed recipe — the sentence says which), 200 with a `status` when
the kernel cannot answer (as GET kernels/<id> does) or is suspended (`"status": "suspended"`: the
frontend sends again once it has resumed). Each refusal is one warning line naming the
kernel and what was wrong; no line ever holds the cells' text.
"""
from __future__ import annotations

import json

from jupyter_server.auth.decorator import authorized
from tornado import web

from ...contract.cells import MAX_BODY_BYTES, BadCells, TooLarge, check_cells
from .base import GpuctxHandler

READ_AND_DROP = 8


@web.stream_request_body
class CellsHandler(GpuctxHandler):
    auth_resource = "kernels"

    async def prepare(self):
        await super().prepare()  # authentication first: a stranger learns nothing of the caps
        self._body, self._size = [], 0
        declared = self.request.headers.get("Content-Length")
        # A body up to READ_AND_DROP times the cap is read (and dropped past it) before the 413: a
        # client still sending when the server answers and closes gets a broken pipe instead of
        # the message (urllib, fetch). Anything larger is refused by its length, unread.
        if declared and declared.isdigit() and int(declared) > READ_AND_DROP * MAX_BODY_BYTES:
            raise self._refuse(413, f"the body is {int(declared)} bytes, more than {MAX_BODY_BYTES} "
                                    "(contract/cells.py's cap)")

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= MAX_BODY_BYTES:  # past the cap, the rest is read and dropped
            self._body.append(chunk)

    @web.authenticated
    @authorized("execute")  # what the kernel then imports is the caller's to say: as running code is
    async def put(self, kernel_id: str):
        if self._size > MAX_BODY_BYTES:
            raise self._refuse(413, f"the body is {self._size} bytes, more than {MAX_BODY_BYTES} "
                                    "(contract/cells.py's cap)")
        cells = self._cells(b"".join(self._body))
        self._body = []
        kernel = self.kernel_or_404(kernel_id)
        launched = self.api.launcher.launched.get(kernel_id) if self.api.launcher else None
        if launched is not None and launched.missing:
            raise self._refuse(409, f"{launched.missing}: typed cells are warmed only where gpuctx runs")
        if launched is not None and not launched.warmed:
            raise self._refuse(409, "this server leaves this kernel's warm-up off "
                                    "(c.GpuctxServer.warm_policy = 'never', or warm_kernelspecs leaves it out)")
        if self.api.typed is None:
            raise self._refuse(409, "typed cells are not set up on this server (see the server's log)")
        answer = await self.api.typed.send(kernel_id, kernel, cells)
        if answer.get("status") == "refused":
            raise self._refuse(409, answer.get("reason") or "the kernel declined")
        self.set_status(202 if answer.get("status") == "ok" else 200)
        self.finish({"kernel_id": kernel_id, **answer})

    def _cells(self, raw: bytes) -> list[str]:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._refuse(400, f"the body is not UTF-8 text (byte {exc.start} cannot be decoded): "
                                    'send JSON {"cells": ["<source>", ...]}') from None
        try:
            content = json.loads(text)
        except json.JSONDecodeError as exc:
            raise self._refuse(400, f"the body is not JSON ({exc.msg}: line {exc.lineno}, column {exc.colno}): "
                                    'send {"cells": ["<source>", ...]}') from None
        except RecursionError:
            raise self._refuse(400, "the body is JSON nested too deeply") from None
        except ValueError:  # (an integer of more than 4300 digits: Python's conversion limit)
            raise self._refuse(400, 'the body holds a number too long to read: '
                                    'send {"cells": ["<source>", ...]}') from None
        try:
            return check_cells(content)
        except TooLarge as exc:
            raise self._refuse(413, str(exc)) from None
        except BadCells as exc:
            raise self._refuse(400, str(exc)) from None

    def _refuse(self, status: int, message: str) -> web.HTTPError:
        """The error to raise: its message is the JSON answer's, and tornado logs it once (with the
        request's method, path and status) — a sentence of ours, never the cells' text."""
        return web.HTTPError(status, "%s", message)
