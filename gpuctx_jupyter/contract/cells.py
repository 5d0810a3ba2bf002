"""Cells as a frontend holds them, unsaved edits included: what JupyterLab may send to a kernel's
warm plan through the server, and the one check of it that both sides run (issue #25).

    PUT <base>/gpuctx/api/kernels/<id>/cells  {"cells": ["<source>", ...]}
      → the server checks the body (`check_cells`) and sends CELLS_REQUEST {"cells": [...]} on the
        kernel's control channel; the kernel checks it again (anything may send on that channel)
        and answers CELLS_REPLY {"status": "ok", "cells", "planned", "warmup", "detail"} or
        {"status": "refused", "message"}.

The text of the cells is the user's: no message here names any of it (a refusal says where and
what kind, never what was written), and neither side logs it. Standard library only.
"""
from __future__ import annotations

MAX_CELLS = 1000  # code cells a request may carry
MAX_CELLS_BYTES = 2**20  # their sources together, encoded as UTF-8
MAX_BODY_BYTES = 2 * 2**20  # the request body: JSON escapes make the same text longer

_KINDS = {dict: "JSON object", list: "list", str: "string", int: "number", float: "number", bool: "boolean",
          type(None): "null"}


class BadCells(ValueError):
    """A message that is not `{"cells": [<string>, ...]}`: one sentence that quotes none of it."""


class TooLarge(BadCells):
    """More cells or more text than the caps allow."""


def kind(value) -> str:
    """A JSON value's kind, as an error names it."""
    return _KINDS.get(type(value), type(value).__name__)


def check_cells(content) -> list[str]:
    """The code cells' sources of a typed-cells message; BadCells (TooLarge for a cap) when it is
    not `{"cells": [<string>, ...]}` within MAX_CELLS and MAX_CELLS_BYTES."""
    if not isinstance(content, dict):
        raise BadCells(f'expected a JSON object {{"cells": ["<source>", ...]}}, got a {kind(content)}')
    if "cells" not in content:
        raise BadCells('missing "cells": send {"cells": ["<source>", ...]}, the code cells in order')
    if len(content) > 1:
        raise BadCells(f'only "cells" is accepted; the message has {len(content) - 1} other key(s)')
    cells = content["cells"]
    if not isinstance(cells, list):
        raise BadCells(f'"cells" must be a list of strings, got a {kind(cells)}')
    if len(cells) > MAX_CELLS:
        raise TooLarge(f"{len(cells)} cells: at most {MAX_CELLS} are read")
    total = 0
    for i, source in enumerate(cells):
        if not isinstance(source, str):
            raise BadCells(f"cells[{i}] is a {kind(source)}, not a string")
        try:
            total += len(source.encode("utf-8"))
        except UnicodeEncodeError:
            raise BadCells(f"cells[{i}] is not valid Unicode text (it holds a lone surrogate)") from None
        if total > MAX_CELLS_BYTES:
            raise TooLarge(f"the cells hold more than {MAX_CELLS_BYTES // 2**20} MiB of text: at most that is read")
    return cells
