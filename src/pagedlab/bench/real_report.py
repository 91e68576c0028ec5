"""Benchmarks: the table, the targets and the figure of `pagedlab bench real`, drawn from its rows.

Builds on: bench/real.py (the rows, its system names and targets), rich, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/07-real-model.md.

One line before the runs (start_line: what runs, and roughly how long), then:

    TABLES["systems"]  one line per system: best and slowest tokens/s, first-token time, steps, step cost, seats
                       (chapter 7's)
    TABLES["detail"]   the same systems: latency, the model's share of a step, threads, same tokens as hf-generate
    target_lines       pagedlab-continuous ÷ hf-generate, ÷ hf-generate-batch, ÷ the roofline, against TARGETS,
                       in words, with what bounds each ratio; and whether every system made the same tokens

A ratio of two systems that count their steps splits exactly: tokens/s = busy seats x batch ÷ step time,
so continuous ÷ another = (its busy seats ÷ theirs) x (their step time ÷ its own).
    draw_real          tokens/s, one bar per system, the matmul roofline as a line across
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.common import rough_duration
from pagedlab.bench.real import (
    CONTINUOUS,
    HF,
    HF_BATCH,
    MODEL,
    NUM_REQUESTS,
    REPEATS,
    ROOFLINE,
    STATIC,
    SYSTEMS,
    TARGETS,
)
from pagedlab.bench.tables import Column, Table, cell, left

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seconds of one run of each system at the defaults on a quiet 2-core CPU, for the estimate printed at the start.
RUN_SECONDS = {CONTINUOUS: 18, STATIC: 21, HF: 30, HF_BATCH: 26, ROOFLINE: 1}
SETUP_SECONDS = 20  # loading the model four times (two engines, two transformers instances), warm-ups


def start_line(options: dict) -> str:
    """What the bench is about to do and roughly how long it takes."""
    repeats, num_requests = options.get("repeats", REPEATS), options.get("num_requests", NUM_REQUESTS)
    seconds = SETUP_SECONDS + repeats * num_requests / NUM_REQUESTS * sum(RUN_SECONDS.values())
    return (
        f"real: {len(SYSTEMS)} systems x {repeats} round{'s' if repeats > 1 else ''}, taking turns, on "
        f"{num_requests} chat requests to {options.get('model', MODEL)}: "
        f"{rough_duration(seconds)} on a quiet 2-core CPU, longer on a busy one (--repeats N sets the rounds)"
    )


def _title(rows: list[dict]) -> str:
    r0 = next(r for r in rows if r["num_requests"]) if any(r["num_requests"] for r in rows) else rows[0]
    return (
        f"{r0['model']} on a CPU: {r0['num_requests'] or '?'} chat requests (prompt "
        f"{r0['prompt_tokens'] / max(1, r0['num_requests'] or 1):.0f} tokens on average, max_tokens "
        f"{r0['output_lens'][0]}-{r0['output_lens'][1]}), all queued at t=0, greedy, batch {r0['batch']}, "
        f"best of {r0['repeats']} rounds"
    )


def _same(r: dict) -> str:
    differing = r["requests_differing_from_hf"]
    return "–" if differing is None else f"{r['num_requests'] - differing}/{r['num_requests']}"


TABLES = {
    "systems": Table(
        (
            left("system", lambda r: r["system"]),
            Column("tokens/s", lambda r: f"{r['tokens_per_s']:.1f}"),
            Column("slowest run", lambda r: f"{r['tokens_per_s_worst']:.1f}"),
            Column("time to first token", lambda r: cell(r["ttft_s"], "{:.1f} s")),
            Column("steps", lambda r: cell(r["steps"], "{}")),
            Column("time per step", lambda r: cell(r["step_ms"], "{:.0f} ms")),
            Column("decode step", lambda r: cell(r["decode_step_ms"], "{:.0f} ms")),
            Column("seats busy", lambda r: cell(r["seat_use"] and 100 * r["seat_use"], "{:.0f}%")),
            Column("continuous ÷ this", lambda r: f"{r['continuous_vs_this']:.2f}×"),
        ),
        title=_title,
        caption="tokens/s: output tokens per second of the fastest run (roofline: batch ÷ its matmul-only step); "
        "seats busy: output tokens ÷ (steps x batch)",
    ),
    "detail": Table(
        (
            left("system", lambda r: r["system"] + (" (error)" if r["error"] else "")),
            Column("latency", lambda r: cell(r["latency_s"], "{:.1f} s")),
            Column("model", lambda r: cell(r["forward_share"] and 100 * r["forward_share"], "{:.0f}%")),
            Column("threads", lambda r: cell(r["threads"], "{}")),
            Column("same tokens as hf-generate", _same),
        ),
        title="The same runs: mean latency, the model's share of step time, torch threads, the same work",
    ),
}


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES


def report(console, rows: list[dict]) -> None:
    for table in TABLES.values():
        console.print(table.rich(rows))
    for line in target_lines(rows):
        console.print(line)


def target_lines(rows: list[dict]) -> list[str]:
    """Each target in words (met or not on this run), what bounds the ratio, and whether the work was the same."""
    by = {r["system"]: r for r in rows}
    cont = by.get(CONTINUOUS)
    if cont is None or not cont["tokens_per_s"]:
        return [f"{CONTINUOUS} did not run: no target to check"]
    lines = [_target_line(cont, base, by.get(base), by.get(ROOFLINE)) for base in TARGETS]
    return [*lines, same_tokens_line(rows)]


def _target_line(cont: dict, base: str, row: dict | None, roof: dict | None) -> str:
    if row is None or row["error"] or not row["tokens_per_s"]:
        why = row["error"] if row and row["error"] else "not measured"
        return f"{CONTINUOUS} vs {base}: no ratio, {base} has no speed on this run ({why})"
    ratio, target = cont["tokens_per_s"] / row["tokens_per_s"], TARGETS[base]
    verdict = "meets" if ratio >= target else "is below"
    if base == ROOFLINE:
        head = f"{CONTINUOUS} reaches {ratio:.0%} of the matmul roofline ({row['tokens_per_s']:.0f} tok/s at batch "
        head += f"{row['batch']}), which {verdict} the {target:.0%} target on this run. "
        return head + "What bounds it: " + _bound_roofline(cont, row)
    medians = cont["tokens_per_s_median"] / row["tokens_per_s_median"]
    head = f"{CONTINUOUS} ÷ {base}: {ratio:.2f}x tokens/s (best runs; {medians:.2f}x by the medians), which "
    head += f"{verdict} the {target:g}x target on this run. What bounds it: " + _bound_seats(cont, row)
    if roof and roof["tokens_per_s"] and target * row["tokens_per_s"] > roof["tokens_per_s"]:
        head += (
            f" {target:g}x {base} would be {target * row['tokens_per_s']:.0f} tok/s, above the matmul roofline "
            f"({roof['tokens_per_s']:.0f}): out of any system's reach on this CPU."
        )
    return head


SEAT_WHY = {
    HF: f"A seat of {HF} idles from its request's end until its batch's longest ends, and its row is still computed",
    HF_BATCH: f"Like {CONTINUOUS}, {HF_BATCH} refills a seat when its request ends: what differs is what a step costs",
}


def _bound_seats(cont: dict, row: dict) -> str:
    """tokens/s = seats busy x batch ÷ step time, so a ratio is a seat ratio times a step-cost ratio."""
    if row["seat_use"] is None or cont["seat_use"] is None:
        return f"{row['wall_s']:.1f} s against {cont['wall_s']:.1f} s for the same tokens; no steps to compare."
    seats, steps = cont["seat_use"] / row["seat_use"], row["step_ms"] / cont["step_ms"]
    text = (
        f"tokens/s = busy seats x batch ÷ step time, so the ratio is {seats:.2f}x from seats ({row['system']} keeps "
        f"{row['seat_use']:.0%} of its seats busy with a request's own tokens, {CONTINUOUS} {cont['seat_use']:.0%}) "
        f"times {steps:.2f}x from step cost ({row['step_ms']:.0f} against {cont['step_ms']:.0f} ms a step on average)"
    )
    if row["decode_step_ms"] is not None and cont["decode_step_ms"] is not None:
        text += f"; a full-batch decode step: {row['decode_step_ms']:.0f} against {cont['decode_step_ms']:.0f} ms"
    return text + f". {SEAT_WHY.get(row['system'], '')}."


def _bound_roofline(cont: dict, roof: dict) -> str:
    parts = []
    if cont["decode_step_ms"] is not None:
        share = roof["step_ms"] / cont["decode_step_ms"]
        parts.append(
            f"its full-batch decode steps take {cont['decode_step_ms']:.0f} ms (median) against {roof['step_ms']:.0f} "
            f"ms for their matmuls alone, {share:.0%} of the roofline while it decodes (attention, norms, RoPE, "
            f"sampling, and the {1 - cont['forward_share']:.0%} of step time outside the model make up the rest)"
        )
    prompt = cont["prompt_tokens"] / cont["num_generated_tokens"]
    parts.append(
        f"its steps that prefill the stream's {cont['prompt_tokens']} prompt tokens ({prompt:.1f}x its output, which "
        f"a decode-only roofline does not count) take {cont['prefill_s']:.1f} s of its {cont['wall_s']:.1f} s"
    )
    parts.append(f"{1 - cont['seat_use']:.0%} of its seat-steps are empty (the stream's last requests run alone)")
    return "; ".join(parts) + "."


def same_tokens_line(rows: list[dict]) -> str:
    """Whether every system that generated made hf-generate's tokens: if not, the speeds compare different work."""
    checked = [r for r in rows if r["same_tokens_as_hf"] is not None]
    if not checked:
        return f"same tokens: not checked ({HF} did not run)"
    differing = [f"{r['system']} ({r['requests_differing_from_hf']})" for r in checked if not r["same_tokens_as_hf"]]
    if not differing:
        return f"same tokens: {', '.join(r['system'] for r in checked)} made {HF}'s tokens for every request"
    return (
        f"same tokens: NOT for every request; requests that differ from {HF}'s: {', '.join(differing)}; a near tie "
        "in the logits may tell float orders apart, but these speeds compare partly different work"
    )


def draw_real(rows: list[dict]) -> Figure:
    """One bar per system (its fastest run, a line down to its slowest), the roofline and its target as lines."""
    from pagedlab import viz

    colours = {CONTINUOUS: viz.USED, STATIC: viz.RESERVED, HF: viz.FREE, HF_BATCH: viz.CACHED}
    systems = [r for r in rows if r["system"] != ROOFLINE]
    names, values = [r["system"] for r in systems], [r["tokens_per_s"] or 0.0 for r in systems]
    fig, ax = viz.plt.subplots(figsize=(8, 4.4))
    ax.bar(names, values, color=[colours.get(n, viz.SHARED) for n in names], edgecolor="black", linewidth=0.5)
    for x, r in enumerate(systems):
        label = "error" if r["error"] else f"{r['tokens_per_s']:.1f}"
        ax.text(x, values[x], label, ha="center", va="bottom", fontsize=8)
        if r["tokens_per_s_worst"] is not None:
            ax.vlines(x, r["tokens_per_s_worst"], r["tokens_per_s"], color="black", linewidth=1.5)
    roof = next((r for r in rows if r["system"] == ROOFLINE and r["tokens_per_s"]), None)
    if roof is not None:
        ax.axhline(roof["tokens_per_s"], color="black", linewidth=1.2, label=f"matmul roofline, batch {roof['batch']}")
        share = TARGETS[ROOFLINE]
        half = f"{share:.0%} of it: {CONTINUOUS}'s target"
        ax.axhline(share * roof["tokens_per_s"], color="black", linestyle="--", linewidth=0.8, label=half)
        ax.set_ylim(0, 1.25 * max(roof["tokens_per_s"], *values))  # room for the legend above the roofline
        ax.legend(loc="upper right", fontsize=8)
    ax.set_ylabel("output tokens / s")
    ax.tick_params(axis="x", labelrotation=15)
    r0 = rows[0]
    ax.set_title(
        f"{r0['model']}, {r0['num_requests']} chat requests at t=0, batch {r0['batch']}, CPU, "
        f"{r0['threads']} thread; best of {r0['repeats']} rounds, line: down to the slowest",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
