"""Benchmarks: the tables and the figure of `pagedlab bench throughput`, drawn from its rows.

Builds on: bench/throughput.py (the rows, its system names and target), rich, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/05-continuous-batching.md.

One line is printed before the runs (start_line: what runs, and roughly how long it takes), then
its tables and lines, and one figure is drawn:

    TABLES["systems"]    one line per system: speed and latency of its best run, steps (chapter 5's)
    TABLES["ratios"]     continuous ÷ static, metric by metric (chapter 5's)
    TABLES["steps"]      one line per system: its pool, preemptions, steps, time per step, what a step held
    TABLES["baselines"]  continuous ÷ each baseline (static, hf-generate), metric by metric
    target_line          continuous ÷ static against TARGET_SPEEDUP, in words, and what bounds the ratio
    draw_throughput      tokens/s and normalized latency, one bar per system
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.common import rough_duration
from pagedlab.bench.runs import hf_available
from pagedlab.bench.tables import Column, Table, cell, left, times
from pagedlab.bench.throughput import HF_SYSTEM, LENGTH_SCALE, NUM_REQUESTS, PAPER, REPEATS, TARGET_SPEEDUP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seconds of one run of each system at the defaults on a quiet 2-core CPU, for the estimate printed at the start.
RUN_SECONDS = {"static": 9, "continuous": 4.5, "continuous-recompute": 11, "continuous-swap": 11, HF_SYSTEM: 14}
SETUP_SECONDS = 25  # warm-up, loading the Hugging Face model, the priority table


def start_line(options: dict) -> str:
    """What the bench is about to do and roughly how long it takes."""
    repeats, num_requests = options.get("repeats", REPEATS), options.get("num_requests", NUM_REQUESTS)
    systems = options.get("systems") or [s for s in RUN_SECONDS if s != HF_SYSTEM or hf_available()]
    seconds = estimated_seconds(systems, repeats, num_requests, options.get("length_scale", LENGTH_SCALE))
    return (
        f"throughput: {len(systems)} systems x {repeats} round{'s' if repeats > 1 else ''}, taking turns, on "
        f"{num_requests} requests: "
        f"{rough_duration(seconds)} on a quiet 2-core CPU, longer on a busy one (--repeats N sets the rounds)"
    )


def estimated_seconds(systems, repeats: int, num_requests: int, length_scale: float) -> float:
    """Roughly how long the bench takes on a quiet 2-core CPU: a run's cost grows with the stream's output tokens."""
    size = num_requests * length_scale / (NUM_REQUESTS * LENGTH_SCALE)
    return SETUP_SECONDS + repeats * size * sum(RUN_SECONDS[s] for s in systems)


RATIO_KEYS = {  # metric -> label; continuous ÷ a baseline
    "tokens_per_s": "tokens/s, best runs (wall)",
    "tokens_per_s_median": "tokens/s, median runs (wall)",
    "tokens_per_cpu_s": "tokens per CPU-second, best runs",
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


SYSTEM_NAMES = {
    "static": "static (stage 4)",
    "continuous": "continuous (stage 5)",
    "continuous-recompute": "continuous, recompute",
    "continuous-swap": "continuous, swap",
    HF_SYSTEM: "Hugging Face `generate`",
}


def _title(rows: list[dict]) -> str:
    r0, n = rows[0], rows[0]["num_requests"]
    return (
        f"Throughput, {r0['workload']}-like lengths x {r0['length_scale']:g} ({n} requests, prompt "
        f"{r0['prompt_tokens'] / n:.0f} + output {r0['output_tokens'] / n:.0f} tokens on average), all queued at t=0, "
        f"max_num_seqs {r0['max_num_seqs']}, block {r0['block_size']}, CPU, torch threads {r0['torch_threads']}, "
        f"best of {r0['repeats']} rounds"
    )


def _static_ratios(rows: list[dict]) -> list[dict]:
    """Continuous vs static, metric by metric: one line each (none unless both were measured)."""
    r, by = ratios(rows, "static"), {row["system"]: row for row in rows}
    if r is None:
        return []
    step = lambda name: by[name]["total_s"] / by[name]["steps"]  # noqa: E731
    return [
        {"metric": "tokens/s, best runs", "ratio": f"{times(r['tokens_per_s'])} higher"},
        {"metric": "tokens/s, median runs", "ratio": f"{times(r['tokens_per_s_median'])} higher"},
        {"metric": "tokens per CPU-second", "ratio": f"{times(r['tokens_per_cpu_s'])} higher"},
        {"metric": "steps", "ratio": f"{times(1 / r['steps'])} fewer"},
        {"metric": "time per step", "ratio": f"{times(step('continuous') / step('static'))} longer"},
        {"metric": "normalized latency", "ratio": f"{times(1 / r['normalized_latency_s'])} lower"},
        {"metric": "time to first token", "ratio": f"{times(1 / r['ttft_s'])} lower"},
    ]


def _baseline_lines(rows: list[dict]) -> list[dict]:
    bases = [b for b in ("static", HF_SYSTEM) if ratios(rows, b) is not None]
    return [{"metric": label, **{b: ratios(rows, b)[key] for b in bases}} for key, label in RATIO_KEYS.items()]


TABLES = {
    "systems": Table(
        (
            left("system", lambda r: SYSTEM_NAMES[r["system"]]),
            Column("KV blocks", lambda r: cell(r["num_kv_blocks"], "{}")),
            Column("tokens/s", lambda r: f"{r['tokens_per_s']:.0f}"),
            Column("slowest run", lambda r: f"{r['tokens_per_s_worst']:.0f}"),
            Column("per CPU-second", lambda r: f"{r['tokens_per_cpu_s']:.0f}"),
            Column("normalized latency", lambda r: f"{1000 * r['normalized_latency_s']:.0f} ms/token"),
            Column("time to first token", lambda r: f"{r['ttft_s']:.1f} s"),
            Column("steps", lambda r: str(r["steps"])),
            Column("tokens per step", lambda r: f"{r['tokens_per_step']:.1f}"),
            Column("time per step", lambda r: f"{1000 * r['total_s'] / r['steps']:.1f} ms"),
            Column("preemptions", lambda r: cell(r["preemptions"], "{}")),
        ),
        title=_title,
        caption="tokens/s: output tokens per second of the fastest run; slowest: over all runs; per CPU-second: "
        "this process's CPU time (other programs on the cores do not count), least-CPU run",
    ),
    "ratios": Table(
        (left("continuous vs static", lambda r: r["metric"]), Column("ratio", lambda r: r["ratio"])),
        _static_ratios,
        "continuous ÷ static",
    ),
    "steps": Table(
        (
            left("system", lambda r: r["system"]),
            Column("KV blocks", lambda r: cell(r["num_kv_blocks"], "{}")),
            Column("preempt", lambda r: cell(r["preemptions"], "{}")),
            Column("steps", lambda r: str(r["steps"])),
            Column("ms/step", lambda r: f"{1000 * r['total_s'] / r['steps']:.1f}"),
            Column("batch", lambda r: f"{r['tokens_per_step']:.1f}"),
            Column("ctx×", lambda r: cell(r["context_padding"], "{:.2f}")),
            Column("model", lambda r: cell(r["forward_share"] and 100 * r["forward_share"], "{:.0f}%")),
            Column("same", lambda r: cell(r["same_tokens_as_static"] and 100 * r["same_tokens_as_static"], "{:.0f}%")),
        ),
        title="Where the steps went (the fastest run)",
        caption="batch: output tokens per step; ctx×: context slots a decode attention padded to each batch's longest "
        "would read ÷ those needed (ours reads tiles); model: share of step time in forward + sampling; same: "
        "requests whose tokens equal static's",
    ),
}


def baselines_table(rows: list[dict]) -> Table:
    """Continuous ÷ each baseline measured (static, hf-generate), metric by metric."""
    bases = [b for b in ("static", HF_SYSTEM) if ratios(rows, b) is not None]
    columns = [left("metric", lambda r: r["metric"])]
    columns += [Column(f"continuous ÷ {b}", lambda r, b=b: f"{r[b]:.2f}x") for b in bases]
    return Table(tuple(columns), _baseline_lines, "continuous ÷ baseline (speeds: higher is better; latencies: lower)")


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES | {"baselines": baselines_table(rows)}


def report(console, rows: list[dict], priority_table: bool = True) -> None:
    """The tables, the target in words, latency by priority class (a run of its own), the paper's claim."""
    from pagedlab.bench.priority import priority_section

    for name in ("systems", "steps", "baselines"):
        console.print(tables(rows)[name].rich(rows))
    console.print(target_line(rows))
    if priority_table:
        console.print(priority_section(rows[0]))
    console.print(f"[dim]{PAPER}[/dim]")


def target_line(rows: list[dict]) -> str:
    """Continuous ÷ static in tokens/s against TARGET_SPEEDUP, in words, and what bounds the ratio."""
    r = ratios(rows, "static")
    if r is None:
        return "continuous vs static: not both measured"
    wall, steps = r["tokens_per_s"], 1 / r["steps"]
    verdict = "meets" if wall >= TARGET_SPEEDUP else "is below"
    return (
        f"continuous ÷ static: {wall:.2f}x tokens/s (best runs; {r['tokens_per_s_median']:.2f}x by the medians, "
        f"{r['tokens_per_cpu_s']:.2f}x per CPU-second), which {verdict} the {TARGET_SPEEDUP:g}x target on this run. "
        f"What bounds it: static takes {steps:.2f}x the steps, but on a CPU a step's cost grows with the tokens and "
        "contexts in its batch, so fewer, fuller steps do not pay off 1:1; on a GPU, where a decode step costs about "
        f"the same at any batch size, the step ratio ({steps:.2f}x) is the bound."
    )


def draw_throughput(rows: list[dict]) -> Figure:
    """Two panels, one bar per system (its fastest run): output tokens per second, with a line down to its slowest
    run, and normalized latency (ms per output token)."""
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
    worst = [r["tokens_per_s_worst"] for r in rows]  # a line from the slowest run up to the bar (the fastest)
    tps_ax.vlines(range(len(rows)), worst, [r["tokens_per_s"] for r in rows], color="black", linewidth=1.5)
    r = ratios(rows, "static")
    gain = "" if r is None else f": continuous ÷ static {r['tokens_per_s']:.2f}x"
    tps_ax.set_title(f"throughput (higher is better){gain}")
    lat_ax.set_title("normalized latency (lower is better)")
    r0 = rows[0]
    fig.suptitle(
        f"{r0['workload']}-like stream x {r0['length_scale']:g}, {r0['num_requests']} requests at t=0, "
        f"max_num_seqs {r0['max_num_seqs']}, bundled model on CPU ({r0['torch_threads']} thread); "
        f"best of {r0['repeats']} rounds, line: down to the slowest"
    )
    fig.tight_layout()
    return fig
