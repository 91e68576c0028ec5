"""Benchmarks: the tables, the targets and the figure of `pagedlab bench real`, drawn from its rows.

Builds on: bench/real.py (the rows, its system names, budgets and targets), rich, matplotlib through viz.
Read with: chapters/97-architecture.md (Benchmarks), chapters/07-real-model.md.

One line before the runs (start_line: what runs, and roughly how long), then:

    TABLES["systems"]  at the default budget, one line per system: tokens/s, the batch it actually ran (mean and
                       largest), time to first token (median, 99th percentile), the same tokens as hf-generate
                       (chapter 7's)
    TABLES["budgets"]  tokens/s of each system at each budget, and the batch continuous batching ran
    TABLES["profile"]  the decode step at batch 8 and 32 beside its matmuls and its attention alone
    target_lines       pagedlab-continuous ÷ hf-generate and ÷ hf-generate-batch at the default budget against
                       TARGETS, and the step against its matmuls, each in words with what bounds it

A ratio of tokens/s splits exactly as (tokens a step) x (steps a second): continuous ÷ another = (its own tokens
per step ÷ theirs) x (their step time ÷ its own). The first factor is what the same memory buys (a bigger batch,
no row computed after its answer ended), the second what a step costs.
    draw_real          tokens/s against KV budget, one line per system (the paper's Fig. 12 at our scale), and the
                       decode step split into matmuls, attention and the rest
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.common import rough_duration
from pagedlab.bench.real import (
    CONTINUOUS,
    DEFAULT_BUDGET,
    HF,
    HF_BATCH,
    KV_BUDGETS,
    MODEL,
    NUM_REQUESTS,
    PROFILE,
    REPEATS,
    STATIC,
    SYSTEMS,
    TARGETS,
)
from pagedlab.bench.tables import Column, Table, cell, left
from pagedlab.config import format_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STEP_TARGET = 1.2  # a decode step at most this many times its matmuls alone
# Seconds of one run of each system at the default budget on a quiet 2-core CPU (16 requests), for the estimate.
RUN_SECONDS = {CONTINUOUS: 27, STATIC: 45, HF: 68, HF_BATCH: 36}  # 32 requests, a run at each budget, on average
SETUP_SECONDS = 60  # loading the model four times per dtype, warm-ups, the step profile (783 s in all, quiet)


def start_line(options: dict) -> str:
    """What the bench is about to do and roughly how long it takes."""
    repeats, budgets = options.get("repeats", REPEATS), options.get("kv_budgets", KV_BUDGETS)
    dtypes, scale = options.get("dtypes", ("float32",)), options.get("num_requests", NUM_REQUESTS) / NUM_REQUESTS
    runs = sum(repeats if b == DEFAULT_BUDGET or len(budgets) == 1 else 1 for b in budgets)
    seconds = len(dtypes) * (SETUP_SECONDS + runs * scale * sum(RUN_SECONDS.values()))
    sizes = ", ".join(format_bytes(b) for b in budgets)
    rounds = f"{repeats} round{'s' * (repeats != 1)}"
    return (
        f"real: {len(SYSTEMS)} systems at KV budgets {sizes} ({', '.join(dtypes)}), taking turns ({rounds} at "
        f"the default {format_bytes(DEFAULT_BUDGET)}), on {options.get('num_requests', NUM_REQUESTS)} chat requests "
        f"to {options.get('model', MODEL)}, then the step profile: {rough_duration(seconds)} on a quiet 2-core CPU, "
        "longer on a busy one"
    )


def _systems(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["system"] != PROFILE]


def _default(rows: list[dict]) -> list[dict]:
    """The rows the targets are read at: the default budget, or the one budget that ran."""
    systems = _systems(rows)
    budgets = {r["kv_budget_bytes"] for r in systems}
    at = DEFAULT_BUDGET if DEFAULT_BUDGET in budgets else min(budgets, default=None)
    return [r for r in systems if r["kv_budget_bytes"] == at]


def _batch(r: dict) -> str:
    if r["mean_running"] is None:
        return "–"
    return f"{r['mean_running']:.1f} (max {r['max_running']})"


def _same(r: dict) -> str:
    differing = r["requests_differing_from_hf"]
    return "–" if differing is None else f"{r['num_requests'] - differing}/{r['num_requests']}"


def _speed(r: dict) -> str:
    return "error" if r["error"] else f"{r['tokens_per_s']:.1f}"


def _title(rows: list[dict]) -> str:
    r0 = _default(rows)[0]
    return (
        f"{r0['model']} on a CPU, {r0['dtype']}, KV budget {format_bytes(r0['kv_budget_bytes'])}: "
        f"{r0['num_requests'] or '?'} chat requests at t=0, answers of ShareGPT-like lengths, greedy, best of "
        f"{r0['runs']} rounds"
    )


TABLES = {
    "systems": Table(
        (
            left("system", lambda r: r["system"]),
            Column("tokens/s", _speed),
            Column("slowest run", lambda r: cell(r["tokens_per_s_worst"], "{:.1f}")),
            Column("batch it ran", _batch),
            Column("own tokens / step", lambda r: cell(r["tokens_per_step"], "{:.1f}")),
            Column("first token p50", lambda r: cell(r["ttft_p50_s"], "{:.1f} s")),
            Column("first token p99", lambda r: cell(r["ttft_p99_s"], "{:.1f} s")),
            Column("same tokens as hf-generate", _same),
            Column("continuous ÷ this", lambda r: cell(r["continuous_vs_this"], "{:.2f}×")),
        ),
        lines=_default,
        title=_title,
        caption="batch it ran: requests computed per step, mean (and largest); own tokens / step: output tokens ÷ "
        "steps (a row whose answer has ended counts for nothing); tokens/s: of the fastest run",
    ),
    "budgets": Table(
        (
            left("KV budget", lambda r: format_bytes(r["kv_budget_bytes"])),
            left("dtype", lambda r: r["dtype"]),
            left("system", lambda r: r["system"]),
            Column("tokens/s", _speed),
            Column("batch it ran", _batch),
            Column("first token p50", lambda r: cell(r["ttft_p50_s"], "{:.1f} s")),
            Column("continuous ÷ this", lambda r: cell(r["continuous_vs_this"], "{:.2f}×")),
        ),
        lines=_systems,
        title="Every budget: the same KV bytes for every system",
    ),
    "profile": Table(
        (
            Column("batch", lambda r: f"{r['batch']}"),
            left("dtype", lambda r: r["dtype"]),
            Column("context", lambda r: f"{r['context_mean']:.0f}"),
            Column("decode step", lambda r: f"{r['decode_step_ms']:.0f} ms"),
            Column("matmuls alone", lambda r: f"{r['matmul_step_ms']:.0f} ms"),
            Column("attention alone", lambda r: f"{r['attention_step_ms']:.0f} ms"),
            Column("step ÷ matmuls", lambda r: f"{r['step_vs_matmul']:.2f}×"),
            Column(
                "(matmuls + attention) ÷ matmuls",
                lambda r: f"{(r['matmul_step_ms'] + r['attention_step_ms']) / r['matmul_step_ms']:.2f}×",
            ),
            Column("KV read", lambda r: f"{r['kv_read_mb']:.0f} MB"),
            Column("weights read", lambda r: f"{r['weights_mb']:.0f} MB"),
        ),
        lines=lambda rows: [r for r in rows if r["system"] == PROFILE],
        title="One decode step and its parts, each timed alone (context: mean tokens per request)",
    ),
}


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES


def report(console, rows: list[dict]) -> None:
    for table in TABLES.values():
        if table.lines(rows):
            console.print(table.rich(rows))
    for line in target_lines(rows):
        console.print(line)


def target_lines(rows: list[dict]) -> list[str]:
    """Each target in words (met or not on this run) with what bounds it, and whether the work was the same."""
    at = {r["system"]: r for r in _default(rows)}
    cont = at.get(CONTINUOUS)
    lines = []
    if cont is None or not cont["tokens_per_s"]:
        lines.append(f"{CONTINUOUS} did not run: no target to check")
    else:
        lines += [_target_line(cont, base, at.get(base)) for base in TARGETS]
        lines.append(same_tokens_line(_systems(rows)))
    lines += [_step_line(r) for r in rows if r["system"] == PROFILE]
    return lines


def _target_line(cont: dict, base: str, row: dict | None) -> str:
    budget = format_bytes(cont["kv_budget_bytes"])
    if row is None or row["error"] or not row["tokens_per_s"]:
        why = row["error"] if row and row["error"] else "not measured"
        return f"{CONTINUOUS} vs {base}: no ratio at {budget}, {base} has no speed on this run ({why})"
    ratio, target = cont["tokens_per_s"] / row["tokens_per_s"], TARGETS[base]
    verdict = "meets" if ratio >= target else "is below"
    head = f"{CONTINUOUS} ÷ {base} at {budget}: {ratio:.2f}x tokens/s, which {verdict} the {target:g}x target"
    head += " on this run."
    if cont["tokens_per_step"] and row["tokens_per_step"]:
        batch = cont["tokens_per_step"] / row["tokens_per_step"]
        head += (
            f" What bounds it: the same bytes gave {CONTINUOUS} {cont['tokens_per_step']:.1f} of a request's own "
            f"tokens a step against {row['tokens_per_step']:.1f} for {base} ({batch:.2f}x; it ran "
            f"{_batch(cont)} requests a step, {base} {_batch(row)}), and its steps were {ratio / batch:.2f}x as fast."
        )
    return head + f" {WHY.get(base, '')}"


WHY = {
    HF: f"{HF} must hold every row's padded worst case for its whole batch, so the budget holds few rows, and a row "
    "whose answer has ended is still computed until its batch's longest ends.",
    HF_BATCH: f"{HF_BATCH} pages its cache as pagedlab does (here in pages of 16 tokens), so the same bytes hold about "
    "as many requests: what differs is the cost of its steps.",
}


def _step_line(r: dict) -> str:
    verdict = "meets" if r["step_vs_matmul"] <= STEP_TARGET else "is above"
    floor = (r["matmul_step_ms"] + r["attention_step_ms"]) / r["matmul_step_ms"]
    return (
        f"decode step at batch {r['batch']} ({r['dtype']}): {r['decode_step_ms']:.0f} ms, {r['step_vs_matmul']:.2f}x "
        f"its matmuls alone ({r['matmul_step_ms']:.0f} ms), which {verdict} the {STEP_TARGET:g}x target on this run. "
        f"The attention alone takes {r['attention_step_ms']:.0f} ms: it reads {r['kv_read_mb']:.0f} MB of K and V "
        f"(batch x {r['context_mean']:.0f} tokens of context) where the matmuls read {r['weights_mb']:.0f} MB of "
        f"weights, so matmuls + attention alone are already {floor:.2f}x; norms, RoPE, sampling and Python add the "
        f"remaining {r['decode_step_ms'] - r['matmul_step_ms'] - r['attention_step_ms']:.0f} ms."
    )


def same_tokens_line(rows: list[dict]) -> str:
    """Whether every system made hf-generate's tokens at every budget: if not, the speeds compare different work."""
    checked = [r for r in rows if r["same_tokens_as_hf"] is not None]
    if not checked:
        return f"same tokens: not checked ({HF} did not run)"
    differing = [
        f"{r['system']} at {format_bytes(r['kv_budget_bytes'])} ({r['requests_differing_from_hf']})"
        for r in checked
        if not r["same_tokens_as_hf"]
    ]
    if not differing:
        return f"same tokens: every system made {HF}'s tokens for every request, at every budget"
    return (
        f"same tokens: NOT for every request; requests that differ from {HF}'s: {', '.join(differing)}; a near tie "
        "in the logits may tell float orders apart, but these speeds compare partly different work"
    )


COLOURS = {CONTINUOUS: "USED", STATIC: "RESERVED", HF: "SHARED", HF_BATCH: "CACHED"}  # viz palette names


def draw_real(rows: list[dict]) -> Figure:
    """Left: tokens/s against the KV budget, one line per system. Right: the decode step split into parts."""
    from pagedlab import viz

    fig, (ax, prof) = viz.plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    _draw_sweep(ax, _systems(rows), viz)
    _draw_profile(prof, [r for r in rows if r["system"] == PROFILE], viz)
    fig.tight_layout()
    return fig


def _draw_sweep(ax, rows: list[dict], viz) -> None:
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for name in SYSTEMS:
            points = sorted((r["kv_budget_bytes"] / 2**20, r["tokens_per_s"]) for r in rows
                            if r["system"] == name and r["dtype"] == dtype and r["tokens_per_s"])  # fmt: skip
            if points:
                style = "-" if dtype == "float32" else "--"
                label = name if dtype == "float32" else f"{name} ({dtype})"
                ax.plot(*zip(*points), style, marker="o", color=getattr(viz, COLOURS[name]), label=label,
                        markeredgecolor="black", linewidth=1.5)  # fmt: skip
    ax.axvline(DEFAULT_BUDGET / 2**20, color="black", linestyle=":", linewidth=0.8, label="default budget")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV cache budget (MiB), the same for every system")
    ax.set_ylabel("output tokens / s")
    ax.legend(fontsize=8)
    r0 = rows[0] if rows else {"model": MODEL, "num_requests": None}
    ax.set_title(f"{r0['model']}, {r0['num_requests']} chat requests at t=0, CPU, 1 thread", fontsize=9)


def _draw_profile(ax, rows: list[dict], viz) -> None:
    labels = [f"batch {r['batch']}\n{r['dtype']}" for r in rows]
    matmul = [r["matmul_step_ms"] for r in rows]
    attention = [r["attention_step_ms"] for r in rows]
    rest = [max(0.0, r["decode_step_ms"] - m - a) for r, m, a in zip(rows, matmul, attention)]
    ax.bar(labels, matmul, color=viz.USED, edgecolor="black", linewidth=0.5, label="matmuls alone")
    ax.bar(labels, attention, bottom=matmul, color=viz.CACHED, edgecolor="black", linewidth=0.5, label="attention")
    tops = [m + a for m, a in zip(matmul, attention)]
    ax.bar(labels, rest, bottom=tops, color=viz.FREE, edgecolor="black", linewidth=0.5, label="the rest")
    for x, r in enumerate(rows):
        ax.text(x, r["decode_step_ms"], f"{r['step_vs_matmul']:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per decode step")
    ax.set_title("one decode step: its parts, each timed alone", fontsize=9)
    ax.legend(fontsize=8)
