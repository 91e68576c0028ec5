"""Benchmarks: the table and the figure of `pagedlab bench sharing`, drawn from its rows.

Builds on: bench/sharing.py (the rows and its modes), rich, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/03-copy-on-write.md.

    sharing_table   one line per (workload, mode, width): blocks saved, the paper's beside ours
    03_sharing.png  grouped bars like the paper's Fig. 15, one panel per mode (parallel sampling, beam search)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pagedlab.bench.sharing import MODES

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.table import Table


def sharing_table(rows: list[dict]) -> Table:
    """A rich table of the rows, the paper's saving beside ours."""
    from rich.table import Table

    table = Table(
        title="KV blocks saved by sharing (vLLM paper Fig. 15): saved = 1 - Σ used / Σ needed over all steps",
        caption=_caption(rows),
    )
    columns = ("workload", "mode", "width", "requests", "in / out", "max len", "block", "steps", "saved", "paper")
    for col in (*columns, "time"):
        table.add_column(col, justify="left" if col in ("workload", "mode") else "right")
    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"
    for r in rows:
        lens = f"{r['mean_prompt_len']:.0f} / {r['mean_output_len']:.0f}"
        cells = [r["workload"], r["mode"], str(r["width"]), str(r["num_requests"]), lens, str(r["max_model_len"])]
        cells += [str(r["block_size"]), str(r["steps"]), pct(r["saved"]), pct(r["paper_saved"])]
        table.add_row(*cells, f"{r['seconds']:.1f} s")
    return table


def _caption(rows: list[dict]) -> str:
    seqs = sorted({r["max_num_seqs"] for r in rows})
    return (
        "used: physical KV blocks held; needed: the same block tables without sharing. Stage 3 (static batches, "
        f"max_num_seqs {', '.join(map(str, seqs))}), the bundled model, real prompts from its corpus.\n"
        "in / out: mean prompt / output tokens; max len: prompt + output clipped to it (ShareGPT-like: capped "
        "for CPU time, so its outputs are much shorter than ShareGPT's 338). Paper: OPT-13B; "
        "ShareGPT values are the ends of §6.3's ranges (widths 2 and 6)."
    )


def save_sharing_figure(rows: list[dict], figures_dir: str | Path) -> Path:
    from pagedlab import viz

    return viz.save_figure(plot_sharing(rows), Path(figures_dir) / "03_sharing.png")


def plot_sharing(rows: list[dict]) -> Figure:
    """Grouped bars like the paper's Fig. 15: saved (%) per width, ours beside the paper's, one panel per mode."""
    from matplotlib.patches import Patch

    from pagedlab import viz

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    colours = dict(zip(workloads, (viz.SHARED, viz.USED, viz.CACHED)))
    bars = [(w, source) for w in workloads for source in ("ours", "paper")]  # bar order within a width
    step = 0.8 / len(bars)
    fig, axes = viz.plt.subplots(1, len(MODES), figsize=(5 * len(MODES), 4.2), squeeze=False, sharey=True)
    for ax, mode in zip(axes[0], MODES):
        by_width = {(r["workload"], r["width"]): r for r in rows if r["mode"] == mode}
        widths = sorted({w for _, w in by_width})
        for i, (workload, source) in enumerate(bars):
            for x, width in enumerate(widths):
                row = by_width.get((workload, width))
                value = None if row is None else row["saved" if source == "ours" else "paper_saved"]
                if value is not None:
                    _bar(ax, x - 0.4 + (i + 0.5) * step, 100 * value, step, colours[workload], source == "paper")
        ax.set_xticks(range(len(widths)), [str(w) for w in widths])
        ax.set_xlabel("n (samples per request)" if mode == "parallel" else "beam width")
        ax.set_title("parallel sampling" if mode == "parallel" else "beam search")
    axes[0][0].set_ylabel("KV blocks saved by sharing (%)")
    handles = [
        Patch(facecolor="white", edgecolor=colours[w], hatch="///", label=f"{w}: paper")
        if source == "paper"
        else Patch(facecolor=colours[w], edgecolor=colours[w], label=f"{w}: ours")
        for w, source in bars
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, bbox_to_anchor=(0.5, -0.06))
    fig.suptitle("KV blocks saved by sharing (vLLM paper Fig. 15 at our scale): 1 - Σ used / Σ needed over all steps")
    fig.tight_layout()
    return fig


def _bar(ax, x: float, value: float, width: float, colour: str, paper: bool) -> None:
    """One bar: ours filled, the paper's hatched in the same colour; its value above it."""
    face, hatch = ("white", "///") if paper else (colour, None)
    ax.bar(x, value, width, color=face, edgecolor=colour, hatch=hatch, linewidth=1)
    ax.text(x, value + 0.8, f"{value:.0f}", ha="center", va="bottom", fontsize=7)
