"""Benchmarks: the committed bench figures, each redrawn from the JSON rows of the run that drew it.

Builds on: bench/common.py (read_rows), bench/__init__.py (BENCHES: which bench draws which figure, and how).
Read with: chapters/97-architecture.md (Benchmarks).

The benches with a `figure` in BENCHES draw one that a chapter shows and quotes numbers from. One
run of a bench writes both files, so the figure and the numbers cannot come from two different runs:

    pagedlab bench memory       figures/02_memory.png       figures/02_memory.json       chapter 2
    pagedlab bench sharing      figures/03_sharing.png      figures/03_sharing.json      chapter 3
    pagedlab bench prefix       figures/04_prefix.png       figures/04_prefix.json       chapter 4
    pagedlab bench traces       figures/04_traces.png       figures/04_traces.json       chapter 4 (Real traffic)
    pagedlab bench throughput   figures/05_throughput.png   figures/05_throughput.json   chapter 5
    pagedlab bench real         figures/07_real.png         figures/07_real.json         chapter 7 (SmolLM2)

`pagedlab figures` redraws the PNGs from the committed JSON (seconds, the same picture every
time); `pagedlab figures --rerun-benches` measures again (minutes) and rewrites both. The
chapters' tables are rendered from the same JSON (scripts/chapter_tables.py), and
tests/scripts/test_figures_match_chapters.py checks that the chapters still say what the JSON says.
"""

from __future__ import annotations

from pathlib import Path

from pagedlab.bench.common import read_rows


def figure_benches() -> list:
    """The benches whose figure a chapter shows, in chapter order."""
    from pagedlab.bench import BENCHES

    return [b for b in BENCHES.values() if b.figure]


def rows_path(name: str, rows_dir: str | Path = "figures") -> Path:
    """Where bench `name` writes its JSON rows: beside its figure."""
    stems = {b.name: b.figure for b in figure_benches()}
    if name not in stems:
        raise ValueError(f"bench {name!r} draws no committed figure; those that do: {', '.join(stems)}")
    return Path(rows_dir) / f"{stems[name]}.json"


def redraw_bench_figure(name: str, out_dir: str | Path, rows_dir: str | Path | None = None) -> Path:
    """Draw bench `name`'s figure into `out_dir` from the JSON in `rows_dir` (default: `out_dir`); no measuring."""
    from pagedlab.bench import get_bench, save_bench_figure

    path = rows_path(name, out_dir if rows_dir is None else rows_dir)
    if not path.exists():
        raise ValueError(
            f"{path} is missing: `pagedlab bench {name}` (or `pagedlab figures --rerun-benches`) writes it"
        )
    result = read_rows(path)
    if result["bench"] != name:
        raise ValueError(f"{path} holds the rows of bench {result['bench']!r}, not {name!r}")
    return save_bench_figure(get_bench(name), result["rows"], out_dir)


def redraw_bench_figures(out_dir: str | Path, rows_dir: str | Path | None = None) -> tuple[list[Path], list[Path]]:
    """Every committed bench figure whose JSON is in `rows_dir` (default: `out_dir`), redrawn into `out_dir`:
    (the figures written, the JSON files that were missing)."""
    written, missing = [], []
    for bench in figure_benches():
        path = rows_path(bench.name, out_dir if rows_dir is None else rows_dir)
        if path.exists():
            written.append(redraw_bench_figure(bench.name, out_dir, rows_dir))
        else:
            missing.append(path)
    return written, missing


def rerun_bench_figures(console, out_dir: str | Path) -> list[Path]:
    """Run every bench that draws a committed figure, at its defaults: each writes its PNG and JSON into `out_dir`."""
    from pagedlab.bench import run_bench

    paths = []
    for bench in figure_benches():
        run_bench(bench.name, figure=True, figures_dir=out_dir, console=console)
        paths += [Path(out_dir) / f"{bench.figure}.png", Path(out_dir) / f"{bench.figure}.json"]
    return paths
