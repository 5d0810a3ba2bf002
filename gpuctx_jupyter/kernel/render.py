"""Displayable reports: HTML in a notebook, aligned plain text in a terminal, from one model.

One formatter per unit, shared by `%gpu`, the monitor and (in TypeScript, labextension/src/format.ts)
the panel and status bar, so that a figure reads the same wherever it appears:

- precision: about three significant figures — two decimals below 10, one below 100, else none
  (`5.70 GiB`, `12.1 GiB`, `140 GiB`), decided on the rounded value (9.996 is `10.0`);
- bytes are binary: GiB from 1 GiB up, MiB below (`630 MiB`); exactly zero is `0 MiB`;
- percentages, temperatures and watts are integers: `37%`, `39 °C`, `534 / 700 W`;
- unknown is an en dash, `–`.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

GIB = 1024**3
MIB = 1024**2
UNKNOWN = "–"


def number(value: float) -> str:
    """`value` with the precision rule: 5.70, 12.1, 140 (rounded half away from zero, as the
    frontend's `toFixed` does)."""
    exact = Decimal(value)
    decimals = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    while True:
        text = str(exact.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))
        if decimals == 0 or abs(Decimal(text)) < (10 if decimals == 2 else 100):
            return text
        decimals -= 1  # 9.996 rounds to 10.00: one decimal fewer, as if it had been 10


def _bytes_parts(n: float) -> tuple[str, str]:
    if n == 0:
        return "0", "MiB"
    if abs(n) >= GIB:
        return number(n / GIB), "GiB"
    m = number(n / MIB)
    if abs(Decimal(m)) >= 1024:  # rounds up to 1024 MiB: write it as 1.00 GiB
        return number(n / GIB), "GiB"
    return m, "MiB"


def gib(n: int | None, digits: int | None = None) -> str:
    """Bytes as every gpuctx view writes them: `5.70 GiB`, `12.1 GiB`, `140 GiB`, `630 MiB`; `–`
    when unknown. `digits` is accepted for older callers and ignored: the precision rule decides."""
    if n is None:
        return UNKNOWN
    value, unit = _bytes_parts(n)
    return f"{value} {unit}"


def mib(n: int | None) -> str:
    """Bytes always in MiB (amounts that are small by nature): `34.0 MiB`, `512 MiB`."""
    return UNKNOWN if n is None else f"{number(n / MIB)} MiB"


def signed(n: int) -> str:
    """A change in bytes with its sign: `+48.0 MiB`, `-1.25 GiB`, `+0 MiB`."""
    return ("+" if n >= 0 else "-") + gib(abs(n))


def pct(n: float | None) -> str:
    """`37%` (an integer, no space, as nvidia-smi writes it)."""
    return UNKNOWN if n is None else f"{_int(n)}%"


def temp(celsius: float | None) -> str:
    """`39 °C` (with a space)."""
    return UNKNOWN if celsius is None else f"{_int(celsius)} °C"


def watts(w: float | None, limit: float | None = None) -> str:
    """`534 / 700 W`, or `534 W` without a limit."""
    if w is None:
        return UNKNOWN
    return f"{_int(w)} / {_int(limit)} W" if limit else f"{_int(w)} W"


def _int(v: float) -> int:
    return int(Decimal(v).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def html_table(header: list[str], rows: list[list[str]], marked: set[int] = frozenset()) -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        style = " style='font-weight:bold'" if i in marked else ""
        cells = "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in row)
        body.append(f"<tr{style}>{cells}</tr>")
    return f"<table class='gpuctx'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


@dataclass
class Section:
    title: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    marked: set[int] = field(default_factory=set)
    lines: list[str] = field(default_factory=list)  # free text under the table


@dataclass
class Report:
    """What a `%gpu` subcommand shows; `data` keeps the numbers for programmatic use."""

    sections: list[Section]
    data: dict = field(default_factory=dict)

    def text(self) -> str:
        parts = []
        for s in self.sections:
            block = [s.title] if s.title else []
            if s.header:
                block.append(text_table(s.header, s.rows))
            block.extend(s.lines)
            parts.append("\n".join(block))
        return "\n\n".join(parts)

    def _repr_html_(self) -> str:
        parts = []
        for s in self.sections:
            if s.title:
                parts.append(f"<b>{html.escape(s.title)}</b>")
            if s.header:
                parts.append(html_table(s.header, s.rows, s.marked))
            if s.lines:
                parts.append("<br>".join(html.escape(line) for line in s.lines))
        return "<div class='gpuctx-report'>" + "<br>".join(parts) + "</div>"

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())

    def __repr__(self) -> str:
        return self.text()


def ago(seconds: float) -> str:
    """How long ago, in the unit a person reads at a glance: "40 s ago", "12 min ago", "2.5 h ago"."""
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"
