"""Benchmarks: the tables and the figure of `pagedlab bench throughput`, drawn from its rows.

Builds on: bench/throughput.py (the rows, its system names and target), rich, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/05-continuous-batching.md.

Three things are printed after the runs, and one figure is written:

    throughput_table   one line per system: speed, latency, and where the steps went
    ratios_table       continuous ÷ each baseline (static, hf-generate), metric by metric
    target_line        is continuous >= TARGET_SPEEDUP x static in tokens/s?
    05_throughput.png  tokens/s and normalized latency, one bar per system
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pagedlab.bench.throughput import HF_SYSTEM, TARGET_SPEEDUP

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.table import Table


def throughput_table(rows: list[dict]) -> Table:
    """A rich table of the rows: speed, latency, and where the steps went."""
    from rich.table import Table

    r0, n = rows[0], rows[0]["num_requests"]
    title = (
        f"Throughput, {r0['workload']}-like lengths x {r0['length_scale']:g} ({n} requests, prompt "
        f"{r0['prompt_tokens'] / n:.0f} + output {r0['output_tokens'] / n:.0f} tokens on average), all queued at t=0, "
        f"max_num_seqs {r0['max_num_seqs']}, block {r0['block_size']}, CPU, torch threads {r0['torch_threads']}"
    )
    table = Table(title=title, padding=(0, 1), show_edge=False)
    table.add_column("system", no_wrap=True)
    cols = ("blocks", "tok/s", "req/s", "ms/tok", "TTFT", "preempt", "steps", "batch", "ctx×", "model", "CPU s", "same")
    for col in cols:
        table.add_column(col, justify="right", min_width=len(col))
    for r in rows:
        table.add_row(
            r["system"],
            dash(r["num_kv_blocks"], "d"),
            f"{r['tokens_per_s']:.0f}",
            f"{r['requests_per_s']:.2f}",
            f"{1000 * r['normalized_latency_s']:.0f}",
            f"{r['ttft_s']:.1f}",
            dash(r["preemptions"], "d"),
            str(r["steps"]),
            f"{r['tokens_per_step']:.1f}",
            dash(r["context_padding"], ".2f"),
            dash(r["forward_share"], ".0%"),
            f"{r['cpu_s']:.1f}",
            dash(r["same_tokens_as_static"], ".0%"),
        )
    table.caption = (
        "blocks: KV pool; ms/tok: normalized latency; TTFT in s; batch: output tokens per step; ctx×: context "
        "slots a decode attention padded to each batch's longest would read ÷ those needed (ours reads tiles); "
        "model: share "
        "of step time in forward + sampling; CPU s: this process's CPU time (below the wall time when other programs "
        "share the cores); same: requests whose tokens equal static's"
    )
    return table


def dash(value, fmt: str) -> str:
    """A table cell: '-' where a field does not apply."""
    return "-" if value is None else format(value, fmt)


RATIO_KEYS = {  # metric -> label; continuous ÷ a baseline
    "tokens_per_s": "tokens/s (wall)",
    "tokens_per_cpu_s": "tokens per CPU-second",
    "requests_per_s": "requests/s",
    "normalized_latency_s": "normalized latency",
    "ttft_s": "time to first token",
    "steps": "steps",
}


def ratios(rows: list[dict], base: str) -> dict[str, float] | None:
    """continuous ÷ `base` for each of RATIO_KEYS, None if either row is missing."""
    by = {r["system"]: r for r in rows}
    if "continuous" not in by or base not in by:
        return None
    return {k: by["continuous"][k] / by[base][k] for k in RATIO_KEYS}


def ratios_table(rows: list[dict]) -> Table:
    from rich.table import Table

    table = Table(title="continuous ÷ baseline (speeds: higher is better; latencies and steps: lower)")
    bases = [b for b in ("static", HF_SYSTEM) if ratios(rows, b) is not None]
    table.add_column("metric")
    for base in bases:
        table.add_column(f"continuous ÷ {base}", justify="right")
    for key, label in RATIO_KEYS.items():
        table.add_row(label, *(f"{ratios(rows, b)[key]:.2f}x" for b in bases))
    return table


def target_line(rows: list[dict]) -> str:
    """Is continuous >= TARGET_SPEEDUP x static in tokens/s? With the step ratio: what a step of fixed cost gives."""
    r = ratios(rows, "static")
    if r is None:
        return "continuous vs static: not both measured"
    verdict = "met" if r["tokens_per_s"] >= TARGET_SPEEDUP else "[bold]not met[/bold]"
    return (
        f"continuous ÷ static: {r['tokens_per_s']:.2f}x tokens/s, {r['tokens_per_cpu_s']:.2f}x tokens per CPU-second "
        f"(target >= {TARGET_SPEEDUP:g}x tokens/s: {verdict}); static takes {1 / r['steps']:.2f}x the steps, "
        "the gain if a step cost the same at any batch size (as on a GPU)"
    )


def save_throughput_figure(rows: list[dict], figures_dir: str | Path) -> Path:
    from pagedlab import viz

    return viz.save_figure(plot_throughput(rows), Path(figures_dir) / "05_throughput.png")


def plot_throughput(rows: list[dict]) -> Figure:
    """Two panels, one bar per system: output tokens per second, and normalized latency (ms per output token)."""
    from pagedlab import viz

    colours = {
        "static": viz.RESERVED,
        "continuous": viz.USED,
        "continuous-recompute": viz.PREFILL,
        "continuous-swap": viz.CACHED,
        HF_SYSTEM: viz.FREE,
    }
    names = [r["system"] for r in rows]
    bar_colours = [colours.get(n, viz.SHARED) for n in names]
    fig, (tps_ax, lat_ax) = viz.plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (
        (tps_ax, "tokens_per_s", 1, "{:.0f}", "output tokens / s"),
        (lat_ax, "normalized_latency_s", 1000, "{:.1f}", "ms / output token"),
    )
    for ax, key, unit, fmt, label in panels:
        values = [unit * r[key] for r in rows]
        ax.bar(names, values, color=bar_colours, edgecolor="black", linewidth=0.5)
        for x, v in enumerate(values):
            ax.text(x, v, fmt.format(v), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=20)
    tps_ax.set_title("throughput (higher is better)")
    lat_ax.set_title("normalized latency (lower is better)")
    r0 = rows[0]
    fig.suptitle(
        f"{r0['workload']}-like stream x {r0['length_scale']:g}, {r0['num_requests']} requests at t=0, "
        f"max_num_seqs {r0['max_num_seqs']}, bundled model on CPU ({r0['torch_threads']} thread)"
    )
    fig.tight_layout()
    return fig
