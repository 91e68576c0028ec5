"""Benchmarks: the table and the figure of `pagedlab bench sharing`, drawn from its rows.

Builds on: bench/sharing.py (the rows and its modes), rich, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/03-copy-on-write.md.

    tables()["runs"]   one line per (workload, mode, width): blocks saved, the paper's beside ours, the run's size
    tables()["saved"]  one line per (mode, width): each workload's saving beside the paper's (chapter 3's)
    draw_sharing       grouped bars like the paper's Fig. 15, one panel per mode (parallel sampling, beam search)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.sharing import MODES
from pagedlab.bench.tables import Column, Table, left, pct

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WORKLOADS = {"sharegpt": "ShareGPT-like", "alpaca": "Alpaca-like"}


def _saved_lines(rows: list[dict]) -> list[dict]:
    """One line per (mode, width): each workload's saving and the paper's."""
    by = {(r["workload"], r["mode"], r["width"]): r for r in rows}
    lines = []
    for mode, width in dict.fromkeys((r["mode"], r["width"]) for r in rows):
        line = {"mode": mode, "width": width}
        for w in dict.fromkeys(r["workload"] for r in rows):
            line |= {f"{w} saved": by[(w, mode, width)]["saved"], f"{w} paper": by[(w, mode, width)]["paper_saved"]}
        lines.append(line)
    return lines


def _saved_table(rows: list[dict]) -> Table:
    columns = [left("mode", lambda r: "parallel sampling" if r["mode"] == "parallel" else "beam search"),
               Column("width", lambda r: str(r["width"]))]  # fmt: skip
    for w in dict.fromkeys(r["workload"] for r in rows):
        columns.append(Column(f"{WORKLOADS[w]}: saved", lambda r, w=w: pct(r[f"{w} saved"])))
        columns.append(Column(f"{WORKLOADS[w]}: paper", lambda r, w=w: pct(r[f"{w} paper"])))
    title = "KV blocks saved by sharing (vLLM paper Fig. 15), ours beside the paper's"
    return Table(tuple(columns), _saved_lines, title)


RUNS = Table(
    (
        left("workload", lambda r: r["workload"]),
        left("mode", lambda r: r["mode"]),
        Column("width", lambda r: str(r["width"])),
        Column("requests", lambda r: str(r["num_requests"])),
        Column("in / out", lambda r: f"{r['mean_prompt_len']:.0f} / {r['mean_output_len']:.0f}"),
        Column("max len", lambda r: str(r["max_model_len"])),
        Column("block", lambda r: str(r["block_size"])),
        Column("steps", lambda r: str(r["steps"])),
        Column("saved", lambda r: pct(r["saved"])),
        Column("paper", lambda r: pct(r["paper_saved"])),
        Column("time", lambda r: f"{r['seconds']:.1f} s"),
    ),
    title="KV blocks saved by sharing: saved = 1 - Σ used / Σ needed over all steps",
)


def tables(rows: list[dict]) -> dict[str, Table]:
    return {"saved": _saved_table(rows), "runs": RUNS}


def report(console, rows: list[dict]) -> None:
    console.print(RUNS.rich(rows))
    console.print(_caption(rows))
    console.print(_saved_table(rows).rich(rows))


def _caption(rows: list[dict]) -> str:
    seqs = sorted({r["max_num_seqs"] for r in rows})
    return (
        "used: physical KV blocks held; needed: the same block tables without sharing. Stage 3 (static batches, "
        f"max_num_seqs {', '.join(map(str, seqs))}), the bundled model, real prompts from its corpus.\n"
        "in / out: mean prompt / output tokens; max len: prompt + output clipped to it (ShareGPT-like: capped "
        "for CPU time, so its outputs are much shorter than ShareGPT's 338). Paper: OPT-13B; "
        "ShareGPT values are the ends of §6.3's ranges (widths 2 and 6)."
    )


def draw_sharing(rows: list[dict]) -> Figure:
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
