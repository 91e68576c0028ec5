"""The Markdown tables the chapters quote, rendered from a bench's committed JSON rows by the bench's own tables.

Builds on: pagedlab.bench (BENCHES: each bench's `tables`, the specs its terminal report prints too).
Read with: chapters/97-architecture.md (Benchmarks); tests/scripts/test_figures_match_chapters.py.

A chapter quotes a bench through a marked table, the marker naming the JSON and the table:

    <!-- from figures/05_throughput.json: systems -->
    | system | KV blocks | tokens/s | ... |      must equal markdown of the bench's tables(rows)["systems"]

and may discuss the numbers in a marked paragraph, whose measured numbers (those with a decimal
point, a % or a ×) must all appear in one of that JSON's tables:

    <!-- numbers from figures/05_throughput.json -->
    In the same memory, ... serves 2.22× the tokens per second ...

After `pagedlab figures --rerun-benches`, the test prints each table that changed, ready to paste:
`python scripts/chapter_tables.py figures/05_throughput.json systems` prints one.
"""

from __future__ import annotations

import sys

from pagedlab.bench import BENCHES
from pagedlab.bench.common import read_rows
from pagedlab.bench.tables import Table


def markdown(table: Table, rows: list[dict]) -> str:
    """A Markdown table: a header row, a rule, one line per line of the table."""
    lines = [table.header(), ["---"] * len(table.columns), *table.body(rows)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def chapter_tables(stem: str, rows: list[dict]) -> dict[str, str]:
    """Every table of the bench that writes figures/{stem}.json, rendered from `rows`, by name."""
    bench = next((b for b in BENCHES.values() if b.figure == stem), None)
    if bench is None:
        raise ValueError(f"figures/{stem}.json: no bench writes it")
    return {name: markdown(table, rows) for name, table in bench.part("tables")(rows).items()}


def main(argv: list[str]) -> int:
    path, name = argv
    result = read_rows(path)
    stem = path.rsplit("/", 1)[-1].removesuffix(".json")
    print(chapter_tables(stem, result["rows"])[name])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
