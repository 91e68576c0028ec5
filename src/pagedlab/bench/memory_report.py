"""Benchmarks: the tables and the figure of `pagedlab bench memory`, drawn from its rows.

Builds on: bench/memory.py (the rows), bench/tables.py, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/02-paged-blocks.md.

    TABLES["systems"]      where the pool goes, per workload and system (paged at block 16, as in the figure)
    TABLES["block sizes"]  paged: token states by block size, one line per workload
    LAYOUTS                with --layouts: a hybrid model's KV bytes, full-only vs vLLM's groups vs window-only
    draw_memory            stacked bars like the paper's Fig. 2: one bar per system, one panel per workload
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.memory import PAPER_BLOCK_SIZE, SHARES, batch_gain
from pagedlab.bench.tables import Column, Table, left, pct

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INTERNAL_FRAGMENTATION = "#d55e00"  # Okabe-Ito vermillion: viz's palette has no colour for slots wasted for good
WORKLOADS = {"sharegpt": "ShareGPT-like", "alpaca": "Alpaca-like"}
SYSTEMS = {"contiguous-max": "Max", "contiguous-pow2": "Pow2", "contiguous-oracle": "Oracle", "paged": "paged"}


def figure_rows(rows: list[dict]) -> list[dict]:
    """The Figure-2 systems' rows (without --layouts' rows, which have a table of their own)."""
    return [r for r in rows if r["system"] != "kv-layout"]


def _at_paper_block(rows: list[dict]) -> list[dict]:
    return [r for r in figure_rows(rows) if r["block_size"] in (None, PAPER_BLOCK_SIZE)]


def _by_block_size(rows: list[dict]) -> list[dict]:
    """One line per workload: paged's token states at each block size."""
    lines, rows = [], figure_rows(rows)
    for workload in dict.fromkeys(r["workload"] for r in rows):
        by = {r["block_size"]: r["token_states"] for r in rows if r["system"] == "paged" and r["workload"] == workload}
        lines.append({"workload": workload, **{f"block {b}": share for b, share in by.items()}})
    return lines


def _block_size_table(rows: list[dict]) -> Table:
    sizes = list(dict.fromkeys(r["block_size"] for r in rows if r["system"] == "paged"))
    columns = [left("token states, paged, block of", lambda r: WORKLOADS[r["workload"]])]
    columns += [Column(str(b), lambda r, b=b: pct(r[f"block {b}"])) for b in sizes]
    return Table(tuple(columns), _by_block_size, "Paged: the share of token states by block size")


TABLES = {
    "systems": Table(
        (
            left("workload", lambda r: WORKLOADS[r["workload"]]),
            left("system", lambda r: SYSTEMS[r["system"]]),
            Column("token states", lambda r: pct(r["token_states"])),
            Column("reservation", lambda r: pct(r["reservation"])),
            Column("internal", lambda r: pct(r["internal_fragmentation"])),
            Column("external", lambda r: pct(r["external_fragmentation"])),
            Column("paper", lambda r: pct(r["paper_token_states"])),
            Column("batch", lambda r: f"{r['mean_batched_requests']:.1f}"),
        ),
        _at_paper_block,
        "KV cache memory (vLLM paper Fig. 2): share of the pool, averaged over saturated steps",
    ),
}


LAYOUTS = Table(
    (
        left("model", lambda r: r["model"]),
        left("layout", lambda r: r["layout"] + (f" ({r['groups']} groups)" if r["layout"] == "hybrid" else "")),
        Column("KV held", lambda r: f"{r['kv_bytes'] / 2**30:.2f} GiB"),
        Column("of full-only", lambda r: pct(r["share_of_full"])),
    ),
    lambda rows: [r for r in rows if r["system"] == "kv-layout"],
    "A hybrid model's KV bytes for the same 40 requests: every layer full, vLLM's KV cache groups, every layer sliding",
)


def tables(rows: list[dict]) -> dict[str, Table]:
    """Every table of the rows (the block-size table's columns are the block sizes measured; the layouts' table
    with --layouts)."""
    extra = {"layouts": LAYOUTS} if any(r["system"] == "kv-layout" for r in rows) else {}
    return TABLES | {"block sizes": _block_size_table(figure_rows(rows))} | extra


def report(console, rows: list[dict]) -> None:
    for table in tables(rows).values():
        console.print(table.rich(rows))
    for workload in dict.fromkeys(r["workload"] for r in figure_rows(rows)):
        gain = batch_gain(rows, workload)
        if gain is not None:
            console.print(f"{workload}: paged (block 16) batches {gain:.1f}x the requests of contiguous-max")


def draw_memory(rows: list[dict]) -> Figure:
    """Stacked bars like the paper's Fig. 2: one bar per system (paged at block 16), one panel per workload."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from pagedlab import viz

    colours = dict(zip(SHARES, (viz.USED, viz.RESERVED, INTERNAL_FRAGMENTATION, viz.FREE)))
    shown = _at_paper_block(rows)
    workloads = list(dict.fromkeys(r["workload"] for r in shown))
    fig, axes = viz.plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4.2), squeeze=False, sharey=True)
    for ax, workload in zip(axes[0], workloads):
        bars = [r for r in shown if r["workload"] == workload]
        labels = [r["system"].replace("contiguous-", "").replace("paged", "paged\n(block 16)") for r in bars]
        bottom = [0.0] * len(bars)
        for share in SHARES:
            values = [100 * r[share] for r in bars]
            ax.bar(labels, values, bottom=bottom, color=colours[share], edgecolor="white", linewidth=0.5)
            bottom = [b + v for b, v in zip(bottom, values)]
        for x, r in enumerate(bars):
            tokens = 100 * r["token_states"]
            inside = tokens > 8  # a thin bar gets its label above it
            y, colour = (tokens / 2, "white") if inside else (tokens + 1, "black")
            ax.text(x, y, f"{tokens:.1f}", ha="center", va="center" if inside else "bottom", color=colour)
            if r["paper_token_states"] is not None:
                ax.plot([x - 0.4, x + 0.4], [100 * r["paper_token_states"]] * 2, color="black", linestyle="--")
        ax.set_title(f"{workload} ({bars[0]['num_requests']} requests, {bars[0]['pool_slots']} slots)")
        ax.set_ylim(0, 100)
    axes[0][0].set_ylabel("share of the KV pool (%)")
    names = ("token states", "reservation", "internal fragmentation", "external fragmentation & other")
    handles = [Patch(color=colours[s], label=n) for s, n in zip(SHARES, names)]
    handles.append(Line2D([], [], color="black", linestyle="--", label="paper: token states"))
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    return fig
