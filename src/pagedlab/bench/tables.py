"""Benchmarks: a table of a bench's rows, specified once: printed in the terminal, quoted in Markdown by a chapter.

Builds on: rich (the terminal's rendering).
Read with: chapters/97-architecture.md (Benchmarks; How to add a bench).

A Table is its columns, each a header and the text of one cell of a row, and
the lines it shows (a bench's rows, filtered or turned into others: a ratio, a
pivot). The bench prints it with `rich`; a chapter quotes it through a marker
(scripts/chapter_tables.py renders the same spec as Markdown, and
tests/scripts/test_figures_match_chapters.py checks the chapter against the committed
rows):

    <!-- from figures/05_throughput.json: systems -->
    | system | KV blocks | tokens/s | ... |          = TABLES["systems"] of bench/throughput_report.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """One column: its header, and the text of its cell in one line of the table."""

    header: str
    cell: Callable[[dict], str]
    justify: str = "right"  # in the terminal ("left" for names); Markdown leaves alignment to the reader


@dataclass(frozen=True)
class Table:
    """A table of a bench's rows."""

    columns: tuple[Column, ...]
    lines: Callable[[list[dict]], list[dict]] = list  # the bench's rows -> the table's lines (default: the rows)
    title: Callable[[list[dict]], str] | str = ""  # the terminal's title (a function of the rows, or fixed)
    caption: str = ""  # the terminal's note under the table

    def header(self) -> list[str]:
        return [c.header for c in self.columns]

    def body(self, rows: list[dict]) -> list[list[str]]:
        return [[c.cell(line) for c in self.columns] for line in self.lines(rows)]

    def rich(self, rows: list[dict]):
        """The table for the terminal."""
        from rich.table import Table as RichTable

        title = self.title(rows) if callable(self.title) else self.title
        table = RichTable(title=title or None, caption=self.caption or None, padding=(0, 1))
        for c in self.columns:
            table.add_column(c.header, justify=c.justify, no_wrap=c.justify == "left")
        for cells in self.body(rows):
            table.add_row(*cells)
        return table


def left(header: str, cell: Callable[[dict], str]) -> Column:
    return Column(header, cell, "left")


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def times(x: float) -> str:
    return f"{x:.2f}×"


def cell(value, fmt: str) -> str:
    """A formatted cell, or – where the field does not apply (None)."""
    return "–" if value is None else fmt.format(value)
