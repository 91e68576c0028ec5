"""Benchmarks: the committed bench figures, each redrawn from the JSON rows of the run that drew it.

Builds on: bench/common.py (write_rows_beside, read_rows), the benches' report modules (their figures).
Read with: chapters/97-architecture.md (Benchmarks).

Five benches draw a figure that a chapter shows and quotes numbers from. One run of a bench
writes both files, so the figure and the numbers cannot come from two different runs:

    pagedlab bench memory       figures/02_memory.png       figures/02_memory.json       chapter 2
    pagedlab bench sharing      figures/03_sharing.png      figures/03_sharing.json      chapter 3
    pagedlab bench prefix       figures/04_prefix.png       figures/04_prefix.json       chapter 4
    pagedlab bench throughput   figures/05_throughput.png   figures/05_throughput.json   chapter 5
    pagedlab bench real         figures/07_real.png         figures/07_real.json         chapter 7 (SmolLM2)

`pagedlab figures` redraws the PNGs from the committed JSON (seconds, the same picture every
time); `pagedlab figures --rerun-benches` measures again (minutes) and rewrites both. The
chapters' tables are rendered from the same JSON (scripts/chapter_tables.py), and
tests/test_figures_match_chapters.py checks that the chapters still say what the JSON says.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pagedlab.bench.common import read_rows

# bench -> the figure's file name without its suffix; the JSON beside it has the same stem
BENCH_FIGURES = {
    "memory": "02_memory",
    "sharing": "03_sharing",
    "prefix": "04_prefix",
    "throughput": "05_throughput",
    "real": "07_real",  # measuring it again needs the fetched model (`pagedlab fetch smollm2`)
    "serve": "08_serve",
}
# Rough seconds of each bench at its defaults on a quiet 2-core CPU (the estimate printed before a rerun)
ROUGH_SECONDS = {"memory": 6, "sharing": 50, "prefix": 15, "throughput": 125, "real": 210, "serve": 70}


def figure_savers() -> dict[str, Callable[[list[dict], str | Path], Path]]:
    """bench -> its save_*_figure(rows, figures_dir), imported only when a figure is drawn."""
    from pagedlab.bench.memory import save_memory_figure
    from pagedlab.bench.prefix_report import save_prefix_figure
    from pagedlab.bench.real_report import save_real_figure
    from pagedlab.bench.serve import save_serve_figure
    from pagedlab.bench.sharing_report import save_sharing_figure
    from pagedlab.bench.throughput_report import save_throughput_figure

    return {
        "memory": save_memory_figure,
        "sharing": save_sharing_figure,
        "prefix": save_prefix_figure,
        "throughput": save_throughput_figure,
        "real": save_real_figure,
        "serve": save_serve_figure,
    }


def rows_path(name: str, rows_dir: str | Path = "figures") -> Path:
    """Where bench `name` writes its JSON rows: beside its figure."""
    if name not in BENCH_FIGURES:
        raise ValueError(f"bench {name!r} draws no committed figure; those that do: {', '.join(BENCH_FIGURES)}")
    return Path(rows_dir) / f"{BENCH_FIGURES[name]}.json"


def redraw_bench_figure(name: str, out_dir: str | Path, rows_dir: str | Path | None = None) -> Path:
    """Draw bench `name`'s figure into `out_dir` from the JSON in `rows_dir` (default: `out_dir`); no measuring."""
    path = rows_path(name, out_dir if rows_dir is None else rows_dir)
    if not path.exists():
        raise ValueError(
            f"{path} is missing: `pagedlab bench {name}` (or `pagedlab figures --rerun-benches`) writes it"
        )
    result = read_rows(path)
    if result["bench"] != name:
        raise ValueError(f"{path} holds the rows of bench {result['bench']!r}, not {name!r}")
    return figure_savers()[name](result["rows"], out_dir)


def redraw_bench_figures(out_dir: str | Path, rows_dir: str | Path | None = None) -> tuple[list[Path], list[Path]]:
    """Every committed bench figure whose JSON is in `rows_dir` (default: `out_dir`), redrawn into `out_dir`:
    (the figures written, the JSON files that were missing)."""
    written, missing = [], []
    for name in BENCH_FIGURES:
        path = rows_path(name, out_dir if rows_dir is None else rows_dir)
        if path.exists():
            written.append(redraw_bench_figure(name, out_dir, rows_dir))
        else:
            missing.append(path)
    return written, missing


def rerun_bench_figures(console, out_dir: str | Path) -> list[Path]:
    """Run every bench that draws a committed figure, at its defaults: each writes its PNG and JSON into `out_dir`."""
    from pagedlab.bench import BENCHES

    paths = []
    for name, stem in BENCH_FIGURES.items():
        BENCHES[name](console, figure=True, figures_dir=out_dir)
        paths += [Path(out_dir) / f"{stem}.png", Path(out_dir) / f"{stem}.json"]
    return paths
