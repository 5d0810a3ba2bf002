"""Displayable reports: HTML in a notebook, aligned plain text in a terminal, from one model."""
from __future__ import annotations

import html
from dataclasses import dataclass, field

GIB = 1024**3


def gib(n: int | None, digits: int = 1) -> str:
    return "–" if n is None else f"{n / GIB:.{digits}f} GiB"


def mib(n: int | None) -> str:
    return "–" if n is None else f"{n / 1024**2:.0f} MiB"


def signed(n: int) -> str:
    sign = "+" if n >= 0 else "-"
    n = abs(n)
    return f"{sign}{n / GIB:.2f} GiB" if n >= 64 * 1024**2 else f"{sign}{n / 1024**2:.1f} MiB"


def pct(n: int | None) -> str:
    return "–" if n is None else f"{n}%"


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
