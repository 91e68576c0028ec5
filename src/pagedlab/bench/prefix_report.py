"""Benchmarks: the tables and the figure of `pagedlab bench prefix`, drawn from its rows.

Builds on: bench/prefix.py (the rows: one without and one with caching per workload), rich, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/04-prefix-caching.md.

    TABLES["runs"]   one line per run: prompt tokens, those computed, hit rate, mean TTFT, requests/s, CPU time
    TABLES["gains"]  caching on ÷ off per workload, the paper's throughput gain beside ours
    draw_prefix      three panels: prompt tokens computed vs hit, mean TTFT, throughput gain vs the paper's
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.tables import Column, Table, left, pct, times

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _title(rows: list[dict]) -> str:
    first = rows[0]
    return (
        f"Shared prefix (vLLM paper §6.4), stage 4, max_num_seqs {first['max_num_seqs']}, "
        f"block {first['block_size']}: prefill computed and time"
    )


TABLES = {
    "runs": Table(
        (
            left("workload", lambda r: f"{r['workload']} ({r['num_prefix_tokens']}-token prefix)"),
            left("caching", lambda r: "on" if r["caching"] else "off"),
            Column("prompt tokens", lambda r: str(r["prompt_tokens"])),
            Column("computed", lambda r: str(r["computed_prefill_tokens"])),
            Column("hit rate", lambda r: pct(r["hit_rate"])),
            Column("mean TTFT", lambda r: f"{r['ttft_s']:.2f} s"),
            Column("requests/s", lambda r: f"{r['requests_per_s']:.1f}"),
            Column("CPU time", lambda r: f"{r['cpu_s']:.2f} s"),
        ),
        title=_title,
    ),
    "gains": Table(
        (
            left("caching on vs off", lambda r: r["workload"]),
            Column("prefill computed", lambda r: pct(r["computed_ratio"])),
            Column("mean TTFT", lambda r: f"{times(r['ttft_speedup'])} lower"),
            Column("requests/s", lambda r: f"{times(r['throughput_gain'])} higher"),
            Column("per CPU-second", lambda r: f"{times(r['cpu_gain'])} higher"),
            Column("paper", lambda r: f"{times(r['paper_throughput_gain'])} higher"),
        ),
        lambda rows: [r for r in rows if r["caching"]],
        "Caching on vs off (paper: vLLM vs Orca (Oracle), LLaMA-13B on a GPU)",
    ),
}


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES


def report(console, rows: list[dict]) -> None:
    for table in TABLES.values():
        console.print(table.rich(rows))
    for r in (r for r in rows if r["caching"]):
        same = "the same tokens" if r["same_tokens"] else "OTHER TOKENS (a bug)"
        console.print(f"prefix: {r['workload']}: caching on and off made {same}")


def draw_prefix(rows: list[dict]) -> Figure:
    """Three panels per workload pair: prompt tokens computed vs hit, mean TTFT, throughput gain vs the paper's."""
    from pagedlab import viz

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    by = {(r["workload"], r["caching"]): r for r in rows}
    fig, (tokens_ax, ttft_ax, gain_ax) = viz.plt.subplots(1, 3, figsize=(13, 4.2))
    _plot_tokens(tokens_ax, workloads, by)
    _plot_ttft(ttft_ax, workloads, by)
    _plot_gain(gain_ax, workloads, by)
    first = rows[0]
    fig.suptitle(
        f"Shared prefix, stage 4: {first['num_requests']} requests per stream, "
        f"max_num_seqs {first['max_num_seqs']}, block {first['block_size']}"
    )
    fig.tight_layout()
    return fig


def _plot_tokens(ax, workloads: list[str], by: dict) -> None:
    """Stacked bars per run: prompt tokens computed, and those the cache supplied."""
    from matplotlib.patches import Patch

    from pagedlab import viz

    for i, workload in enumerate(workloads):
        for j, caching in enumerate((False, True)):
            r, x = by[(workload, caching)], 3 * i + j
            computed, hits = r["computed_prefill_tokens"], r["prefix_cache_hits"]
            ax.bar(x, computed, color=viz.USED, edgecolor="white")
            ax.bar(x, hits, bottom=computed, color=viz.CACHED, edgecolor="white")
            ax.text(x, computed, f"{computed}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([3 * i + j for i in range(len(workloads)) for j in (0, 1)])
    ax.set_xticklabels([f"{w}\n{c}" for w in workloads for c in ("off", "on")])
    ax.set_ylim(0, 1.15 * max(r["prompt_tokens"] for r in by.values()))  # room for the labels
    ax.set_ylabel("tokens")
    ax.set_title("prompt tokens: computed vs cache hits")
    handles = [Patch(color=viz.USED, label="computed"), Patch(color=viz.CACHED, label="cache hits")]
    ax.legend(handles=handles, frameon=False)


def _plot_ttft(ax, workloads: list[str], by: dict) -> None:
    """Mean time to first token per workload, caching off and on side by side."""
    from pagedlab import viz

    for i, workload in enumerate(workloads):
        for j, (caching, colour) in enumerate(((False, viz.USED), (True, viz.CACHED))):
            ttft = by[(workload, caching)]["ttft_s"]
            ax.bar(3 * i + j, ttft, color=colour, label=f"caching {'on' if caching else 'off'}" if i == 0 else None)
            ax.text(3 * i + j, ttft, f"{ttft:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([3 * i + 0.5 for i in range(len(workloads))])
    ax.set_xticklabels(workloads)
    ax.set_ylim(0, 1.15 * max(r["ttft_s"] for r in by.values()))
    ax.set_ylabel("seconds")
    ax.set_title("mean time to first token (all queued at t=0)")
    ax.legend(frameon=False)


def _plot_gain(ax, workloads: list[str], by: dict) -> None:
    """Our gain from caching (wall and CPU time) beside the paper's (vLLM vs Orca (Oracle), a different baseline)."""
    from pagedlab import viz

    bars = (
        ("throughput_gain", dict(color=viz.CACHED), "ours: caching on ÷ off, wall time"),
        ("cpu_gain", dict(color="white", edgecolor=viz.CACHED, hatch="//"), "ours: caching on ÷ off, CPU time"),
        ("paper_throughput_gain", dict(color=viz.FREE), "paper: vLLM ÷ Orca (Oracle)"),
    )
    for k, (field, style, label) in enumerate(bars):
        xs = [i + 0.27 * (k - 1) for i in range(len(workloads))]
        gains = [by[(w, True)][field] for w in workloads]
        ax.bar(xs, gains, width=0.27, label=label, **style)
        for x, gain in zip(xs, gains):
            ax.text(x, gain, f"{gain:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads)
    ax.set_ylim(0, 1.3 * max(by[(w, True)][f] for w in workloads for f, _, _ in bars))  # room for the legend
    ax.set_title("throughput gain (requests/s)")
    ax.legend(frameon=False, loc="upper left", fontsize=8)
