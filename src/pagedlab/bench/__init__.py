"""Benchmarks (apps): `pagedlab bench NAME [--json]`, the paper's tables and figures at our scale.

Builds on: bench/common.py (threads, the rows beside a figure), the bench modules, each imported when it runs.
Read with: chapters/97-architecture.md (Benchmarks; How to add a bench).

A bench is one `Bench` record in BENCHES: what it measures, how long it takes,
and where its parts are, as "module:name" strings imported only when it runs
(so `pagedlab bench --help` loads none of them):

    measure   (console, **options) -> rows       progress lines on the console; a flat row per configuration
    report    (console, rows) -> None            its tables (bench/tables.py) and verdicts, in words
    draw      (rows) -> a matplotlib figure      for a bench whose figure a chapter shows
    tables    (rows) -> {name: Table}            what a chapter may quote (scripts/chapter_tables.py)

`run_bench` does the rest the same way for every bench: the start line, torch
on one thread, the report, the figure and the rows beside it in one run
(figures/NN_NAME.png and .json), the duration; with `--json`, stdout carries
exactly one object {"bench": NAME, "rows": [...]} and the rest goes to stderr.
Each row has the fields chapters/97-architecture.md (Benchmarks) lists, null
where they do not apply, fractions as 0-1 numbers and times in seconds. The
`pagedlab bench` sub-command, its arguments and their checks: bench/cli.py.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pagedlab.errors import InvariantError


@dataclass(frozen=True)
class Bench:
    """One bench. Every part is a "module:name" in pagedlab.bench, imported when the bench runs."""

    name: str  # `pagedlab bench NAME`
    what: str  # what it measures, in a line (the paper's figure or section it reproduces)
    duration: str  # roughly how long at its defaults on a quiet 2-core CPU, in words
    seconds: float  # the same as a number, for the estimate before `pagedlab figures --rerun-benches`
    measure: str  # (console, **options) -> rows
    report: str  # (console, rows, **report_options) -> None: tables and verdicts
    tables: str  # (rows) -> {table name: Table}
    figure: str | None = None  # "05_throughput": figures/05_throughput.png, and its rows in .json beside it
    draw: str | None = None  # (rows) -> Figure
    start: str | None = None  # (options) -> the line printed before it runs: what, and how long
    repeats: int | None = None  # its rounds at the defaults, where --repeats applies
    report_options: tuple[str, ...] = ()  # options that its report takes, not its measure
    options: tuple[str, ...] = ()  # the command line's bench-specific options it takes (kv_budgets, dtypes, peer)

    def part(self, name: str):
        """One of its parts, imported now: "throughput:throughput_rows" -> the function."""
        module, attr = getattr(self, name).split(":")
        return getattr(importlib.import_module(f"pagedlab.bench.{module}"), attr)


BENCHES: dict[str, Bench] = {
    b.name: b
    for b in (
        Bench("memory", "Figure 2: where KV memory goes, contiguous vs paged", "6 s (a fake model: no forward pass)",
              6, "memory:measure_memory", "memory_report:report", "memory_report:tables", "02_memory",
              "memory_report:draw_memory", options=("layouts",)),
        Bench("sharing", "Figure 15: KV blocks saved by sharing, parallel sampling and beam search", "50 s", 50,
              "sharing:measure_sharing", "sharing_report:report", "sharing_report:tables", "03_sharing",
              "sharing_report:draw_sharing"),
        Bench("prefix", "§6.4: prefill computed and time to first token with a shared prefix, cached or not",
              "15 s (3 runs of each configuration, taking turns)", 15, "prefix:measure_prefix",
              "prefix_report:report", "prefix_report:tables", "04_prefix", "prefix_report:draw_prefix",
              repeats=3),
        Bench("traces", "real traffic through the prefix cache: Mooncake's traces, eviction policies vs the optimum",
              "1.5 min (130 replays of two real traces, no model, 2 processes)", 90, "traces:measure_traces",
              "traces_report:report", "traces_report:tables", "04_traces", "traces_report:draw_traces",
              "traces:start_line", options=("traces", "policies", "pool_sizes", "concurrency", "jobs")),
        Bench("throughput", "§6.2 at our scale: continuous vs static batching (and Hugging Face generate), CPU",
              "2 min (5 systems x 2 rounds, taking turns; --repeats N: about 50 s a round)", 125,
              "throughput:throughput_rows", "throughput_report:report", "throughput_report:tables", "05_throughput",
              "throughput_report:draw_throughput", "throughput_report:start_line", repeats=2,
              report_options=("priority_table",)),
        Bench("scheduler", "microseconds per schedule() + update() as the running batch grows (--peer vllm: beside "
              "vLLM 0.33.0's own Scheduler)", "2 s (a fake model; --peer vllm about 90 s, most of it vLLM's import)", 2,
              "scheduler:measure_scheduler", "scheduler:report", "scheduler:tables", options=("peer",)),
        Bench("kernel", "stage 6's Triton kernels vs torch: parity on a CPU, latency and bandwidth on a GPU",
              "3 s on a CPU (parity only, under TRITON_INTERPRET=1); a GPU also times the kernels", 3,
              "kernel:measure_kernel", "kernel:report", "kernel:tables", options=("dtypes",)),
        Bench("real", "Fig. 12 on a real model: SmolLM2-135M-Instruct, every system given the same KV bytes",
              "13 min (SmolLM2-135M-Instruct, 4 systems at 3 KV budgets, then the step profile; needs `pagedlab "
              "fetch smollm2`)", 780,
              "real:real_rows", "real_report:report", "real_report:tables", "07_real", "real_report:draw_real",
              "real_report:start_line", repeats=2, options=("kv_budgets", "dtypes", "device")),
        Bench("serve", "Figure 12 at our scale: pagedlab serve under Poisson load, continuous vs static",
              "70 s (pagedlab serve on 127.0.0.1: 2 systems x 3 Poisson rates x 2 rounds, the openai client)", 70,
              "serve:serve_rows", "serve_report:report", "serve_report:tables", "08_serve", "serve_report:draw_serve",
              "serve_report:start_line", repeats=2),
    )
}  # fmt: skip


def get_bench(name: str) -> Bench:
    if name not in BENCHES:
        raise ValueError(f"unknown bench {name!r}; known: {', '.join(BENCHES)}")
    return BENCHES[name]


def run_bench(
    name: str,
    as_json: bool = False,
    figure: bool = True,
    figures_dir: str | Path = "figures",
    console=None,
    threads: int = 1,
    **options,
) -> dict:
    """Run bench `name` (tables on stderr) on `threads` torch threads; with `as_json`, also print its result to
    stdout as one JSON object."""
    from rich.console import Console

    from pagedlab.bench.common import torch_threads

    bench = get_bench(name)
    if "repeats" in options:
        _check_repeats(bench, options["repeats"])
    _check_options(bench, options, threads)
    console = console or Console(stderr=True, width=None if sys.stderr.isatty() else 120)  # logs: no 80-column squeeze
    report_options = {k: options.pop(k) for k in bench.report_options if k in options}
    begin = time.perf_counter()
    if bench.start:
        console.print(bench.part("start")(options))
    console.print(f"[dim]{name}: torch on {threads} thread{'s' if threads > 1 else ''} (--threads N)[/dim]")
    with torch_threads(threads):  # the machine's cores are shared: one thread keeps timings comparable
        rows = bench.part("measure")(console, **options)
        bench.part("report")(console, rows, **report_options)
    result = {"bench": name, "rows": rows}
    if not isinstance(rows, list):
        raise InvariantError(f"bench {name} measured {rows!r}")
    if figure and bench.figure and rows:
        _write_figure(bench, result, figures_dir, time.perf_counter() - begin, console)
    console.print(f"[dim]{name}: {time.perf_counter() - begin:.1f} s[/dim]")
    if as_json:
        json.dump(result, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
        sys.stdout.flush()
    return result


def _check_repeats(bench: Bench, repeats) -> None:
    if bench.repeats is None:
        rounds = [b.name for b in BENCHES.values() if b.repeats]
        names = f"{', '.join(rounds[:-1])} and {rounds[-1]}"
        raise ValueError(f"--repeats: only {names} repeat their runs, not {bench.name}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")


def _check_options(bench: Bench, options: dict, threads) -> None:
    """A bench-specific option given to a bench that does not take it is a mistake, not something to ignore."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {threads!r}")
    for option in CLI_OPTIONS:
        if option in options and option not in bench.options:
            takers = [b.name for b in BENCHES.values() if option in b.options]
            verb = "takes" if len(takers) == 1 else "take"
            raise ValueError(f"{CLI_OPTIONS[option]}: only {' and '.join(takers)} {verb} it, not {bench.name}")


# the bench-specific options, each by its command-line flag
CLI_OPTIONS = {"kv_budgets": "--kv-budget", "dtypes": "--dtype", "device": "--device", "peer": "--peer",
               "traces": "--trace", "policies": "--policies", "pool_sizes": "--pool-sizes",
               "concurrency": "--concurrency", "jobs": "--jobs", "layouts": "--layouts"}  # fmt: skip


def save_bench_figure(bench: Bench, rows: list[dict], figures_dir: str | Path) -> Path:
    """The bench's figure, drawn from `rows`, as figures_dir/NN_NAME.png."""
    from pagedlab.viz.palette import save_figure

    return save_figure(bench.part("draw")(rows), Path(figures_dir) / f"{bench.figure}.png")


def _write_figure(bench: Bench, result: dict, figures_dir, seconds: float, console) -> None:
    from pagedlab.bench.common import write_rows_beside, wrote_line

    png = save_bench_figure(bench, result["rows"], figures_dir)
    console.print(wrote_line(png, write_rows_beside(result, png, seconds)))
