"""Benchmarks: the tables and the figure of `pagedlab bench serve`, drawn from its rows.

Builds on: bench/serve.py (the rows), bench/tables.py, matplotlib.
Read with: chapters/97-architecture.md (Benchmarks), chapters/08-online-serving.md.

    TABLES["rates"]   one line per (rate, system): throughput, normalized latency, TTFT and ITL percentiles
    TABLES["ratios"]  continuous ÷ static at each rate
    draw_serve        normalized latency and TTFT p50 against the request rate (the paper's Figure 12)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.serve import NUM_REQUESTS, PAPER, RATES, REPEATS, SYSTEMS
from pagedlab.bench.tables import Column, Table, left, times

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def start_line(options: dict) -> str:
    rates, repeats = options.get("rates", RATES), options.get("repeats", REPEATS)
    num = options.get("num_requests", NUM_REQUESTS)
    if options.get("url"):
        return f"serve: the server at {options['url']} x {len(rates)} rates x {repeats} rounds, {num} requests each"
    return f"serve: {len(SYSTEMS)} systems x {len(rates)} rates x {repeats} rounds, {num} requests each"


def _ratio_lines(rows: list[dict]) -> list[dict]:
    by = {(r["system"], r["request_rate"]): r for r in rows}
    lines = []
    for rate in sorted({r["request_rate"] for r in rows}):
        if ("static", rate) not in by or ("continuous", rate) not in by:
            continue  # --url: one server, nothing to divide by
        s, c = by[("static", rate)], by[("continuous", rate)]
        lines.append({"request_rate": rate, "tokens": c["tokens_per_s"] / s["tokens_per_s"],
                      "latency": s["normalized_latency_s"] / c["normalized_latency_s"],
                      "ttft": s["ttft_p50_s"] / c["ttft_p50_s"]})  # fmt: skip
    return lines


TABLES = {
    "rates": Table(
        (
            Column("requests/s", lambda r: f"{r['request_rate']:g}"),
            left("system", lambda r: r["system"]),
            Column("tokens/s", lambda r: f"{r['tokens_per_s']:.0f}"),
            Column("normalized latency", lambda r: f"{r['normalized_latency_s'] * 1e3:.1f} ms"),
            Column("TTFT p50 / p99", lambda r: f"{r['ttft_p50_s'] * 1e3:.0f} / {r['ttft_p99_s'] * 1e3:.0f} ms"),
            Column("ITL p50 / p99", lambda r: f"{r['itl_p50_s'] * 1e3:.1f} / {r['itl_p99_s'] * 1e3:.1f} ms"),
        ),
        lambda rows: sorted(rows, key=lambda r: (r["request_rate"], r["system"] != "static")),
        "pagedlab serve under Poisson load (127.0.0.1, the bundled model, CPU)",
    ),
    "ratios": Table(
        (
            Column("requests/s", lambda r: f"{r['request_rate']:g}"),
            Column("tokens/s, continuous ÷ static", lambda r: times(r["tokens"])),
            Column("normalized latency, static ÷ continuous", lambda r: times(r["latency"])),
            Column("TTFT p50, static ÷ continuous", lambda r: times(r["ttft"])),
        ),
        _ratio_lines,
        "continuous ÷ static at each request rate",
    ),
}


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES


def report(console, rows: list[dict]) -> None:
    for table in TABLES.values():
        console.print(table.rich(rows))
    console.print(f"[dim]{PAPER}[/dim]")


def draw_serve(rows: list[dict]) -> Figure:
    """Normalized latency and TTFT p50 against the request rate, static vs continuous (the paper's Figure 12)."""
    import matplotlib.pyplot as plt

    from pagedlab.viz.palette import RESERVED, USED

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    rates = sorted({r["request_rate"] for r in rows})
    for system, marker, colour in (("static (stage 4)", "s", RESERVED), ("continuous (stage 5)", "o", USED)):
        mine = sorted((r for r in rows if system.startswith(r["system"])), key=lambda r: r["request_rate"])
        x = [r["request_rate"] for r in mine]
        left.plot(x, [r["normalized_latency_s"] * 1e3 for r in mine], marker=marker, color=colour, label=system)
        right.plot(x, [r["ttft_p50_s"] * 1e3 for r in mine], marker=marker, color=colour, label=system)
    for ax, label in ((left, "normalized latency (ms per output token)"), (right, "time to first token, p50 (ms)")):
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.set_xlabel("request rate (requests/s, Poisson)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("pagedlab serve on 127.0.0.1 under Poisson load: static vs continuous batching")
    return fig
