"""Benchmarks: the Markdown tables the chapters quote, rendered from a bench's committed JSON rows.

Builds on: the rows of bench/memory.py, sharing.py, prefix.py, throughput.py (ratios: bench/throughput_report.py).
Read with: chapters/97-architecture.md (Benchmarks); tests/test_figures_match_chapters.py.

A chapter quotes a bench through a marked table, the marker naming the JSON and the table:

    <!-- from figures/05_throughput.json: systems -->
    | system | KV blocks | tokens/s | ... |      must equal CHAPTER_TABLES["05_throughput"]["systems"](rows)

and may discuss the numbers in a marked paragraph, whose measured numbers (those with a decimal
point, a % or a ×) must all appear in one of that JSON's tables:

    <!-- numbers from figures/05_throughput.json -->
    In the same memory, ... serves 2.22× the tokens per second ...

After `pagedlab figures --rerun-benches`, the test prints each table that changed, ready to paste.
"""

from __future__ import annotations

from collections.abc import Callable

WORKLOADS = {"sharegpt": "ShareGPT-like", "alpaca": "Alpaca-like"}
MEMORY_SYSTEMS = {"contiguous-max": "Max", "contiguous-pow2": "Pow2", "contiguous-oracle": "Oracle", "paged": "paged"}
THROUGHPUT_SYSTEMS = {
    "static": "static (stage 4)",
    "continuous": "continuous (stage 5)",
    "continuous-recompute": "continuous, recompute",
    "continuous-swap": "continuous, swap",
    "hf-generate": "Hugging Face `generate`",
}
PAPER_BLOCK_SIZE = 16  # the memory bench's figure shows paged at vLLM's default block


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: a header row, a rule, one line per row."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def times(x: float) -> str:
    return f"{x:.2f}×"


# --- chapter 2: figures/02_memory.json ------------------------------------------------------------------------------


def memory_systems(rows: list[dict]) -> str:
    """Where the pool goes, per workload and system (paged at block 16, as in the figure)."""
    header = ["workload", "system", "token states", "reservation", "internal", "external", "paper", "batch"]
    body = []
    for r in rows:
        if r["block_size"] not in (None, PAPER_BLOCK_SIZE):
            continue
        shares = [pct(r[k]) for k in ("token_states", "reservation", "internal_fragmentation")]
        cells = [WORKLOADS[r["workload"]], MEMORY_SYSTEMS[r["system"]], *shares, pct(r["external_fragmentation"])]
        body.append([*cells, pct(r["paper_token_states"]), f"{r['mean_batched_requests']:.1f}"])
    return markdown(header, body)


def memory_block_sizes(rows: list[dict]) -> str:
    """Paged: token states by block size, one line per workload."""
    sizes = list(dict.fromkeys(r["block_size"] for r in rows if r["system"] == "paged"))
    body = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        by = {r["block_size"]: r for r in rows if r["system"] == "paged" and r["workload"] == workload}
        body.append([WORKLOADS[workload], *(pct(by[b]["token_states"]) for b in sizes)])
    return markdown(["token states, paged, block of", *map(str, sizes)], body)


# --- chapter 3: figures/03_sharing.json -----------------------------------------------------------------------------


def sharing_saved(rows: list[dict]) -> str:
    """Blocks saved per mode and width, each workload's beside the paper's."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    by = {(r["workload"], r["mode"], r["width"]): r for r in rows}
    header = ["mode", "width"] + [f"{WORKLOADS[w]}{part}" for w in workloads for part in (": saved", ": paper")]
    body = []
    for mode, width in dict.fromkeys((r["mode"], r["width"]) for r in rows):
        cells = [pct(by[(w, mode, width)][k]) for w in workloads for k in ("saved", "paper_saved")]
        body.append(["parallel sampling" if mode == "parallel" else "beam search", str(width), *cells])
    return markdown(header, body)


# --- chapter 4: figures/04_prefix.json ------------------------------------------------------------------------------


def prefix_runs(rows: list[dict]) -> str:
    """One line per run: prompt tokens, those computed, hit rate, mean TTFT, requests/s."""
    header = ["workload", "caching", "prompt tokens", "computed", "hit rate", "mean TTFT", "requests/s", "CPU time"]
    body = [
        [
            f"{r['workload']} ({r['num_prefix_tokens']}-token prefix)",
            "on" if r["caching"] else "off",
            str(r["prompt_tokens"]),
            str(r["computed_prefill_tokens"]),
            pct(r["hit_rate"]),
            f"{r['ttft_s']:.2f} s",
            f"{r['requests_per_s']:.1f}",
            f"{r['cpu_s']:.2f} s",
        ]
        for r in rows
    ]
    return markdown(header, body)


def prefix_gains(rows: list[dict]) -> str:
    """Caching on ÷ off per workload, the paper's throughput gain beside ours."""
    header = ["caching on vs off", "prefill computed", "mean TTFT", "requests/s", "per CPU-second", "paper"]
    body = [
        [
            r["workload"],
            pct(r["computed_ratio"]),
            f"{times(r['ttft_speedup'])} lower",
            f"{times(r['throughput_gain'])} higher",
            f"{times(r['cpu_gain'])} higher",
            f"{times(r['paper_throughput_gain'])} higher",
        ]
        for r in rows
        if r["caching"]
    ]
    return markdown(header, body)


# --- chapter 5: figures/05_throughput.json --------------------------------------------------------------------------


def throughput_systems(rows: list[dict]) -> str:
    """One line per system: its best run's speed and latency, and the slowest run's speed."""
    header = ["system", "KV blocks", "tokens/s", "slowest run", "per CPU-second", "normalized latency"]
    header += ["time to first token", "steps", "tokens per step", "time per step", "preemptions"]
    body = []
    for r in rows:
        cells = [THROUGHPUT_SYSTEMS[r["system"]], "–" if r["num_kv_blocks"] is None else str(r["num_kv_blocks"])]
        cells += [f"{r[k]:.0f}" for k in ("tokens_per_s", "tokens_per_s_worst", "tokens_per_cpu_s")]
        cells += [f"{1000 * r['normalized_latency_s']:.0f} ms/token", f"{r['ttft_s']:.1f} s", str(r["steps"])]
        cells += [f"{r['tokens_per_step']:.1f}", f"{1000 * r['total_s'] / r['steps']:.1f} ms"]
        body.append([*cells, "–" if r["preemptions"] is None else str(r["preemptions"])])
    return markdown(header, body)


def throughput_ratios(rows: list[dict]) -> str:
    """Continuous vs static, metric by metric (from the best runs unless said otherwise)."""
    from pagedlab.bench.throughput_report import ratios

    r, by = ratios(rows, "static"), {row["system"]: row for row in rows}
    step_cost = (by["continuous"]["total_s"] / by["continuous"]["steps"]) / (
        by["static"]["total_s"] / by["static"]["steps"]
    )
    body = [
        ["tokens/s, best runs", f"{times(r['tokens_per_s'])} higher"],
        ["tokens/s, median runs", f"{times(r['tokens_per_s_median'])} higher"],
        ["tokens per CPU-second", f"{times(r['tokens_per_cpu_s'])} higher"],
        ["steps", f"{times(1 / r['steps'])} fewer"],
        ["time per step", f"{times(step_cost)} longer"],
        ["normalized latency", f"{times(1 / r['normalized_latency_s'])} lower"],
        ["time to first token", f"{times(1 / r['ttft_s'])} lower"],
    ]
    return markdown(["continuous vs static", "ratio"], body)


# --- chapter 7: figures/07_real.json -------------------------------------------------------------------------------


def _cell(value, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def real_systems(rows: list[dict]) -> str:
    """One line per system: best and slowest tokens/s, first-token time, steps, step cost, seats in use."""
    header = ["system", "tokens/s", "slowest run", "time to first token", "steps", "time per step"]
    header += ["decode step", "seats busy", "continuous ÷ this"]
    body = []
    for r in rows:
        cells = [r["system"], f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s_worst']:.1f}"]
        cells += [_cell(r["ttft_s"], "{:.1f} s"), _cell(r["steps"], "{}"), _cell(r["step_ms"], "{:.0f} ms")]
        cells += [_cell(r["decode_step_ms"], "{:.0f} ms"), _cell(r["seat_use"] and 100 * r["seat_use"], "{:.0f}%")]
        body.append([*cells, f"{r['continuous_vs_this']:.2f}×"])
    return markdown(header, body)


# figure stem -> table name -> rows -> the Markdown table a chapter quotes
def serve_rates(rows: list[dict]) -> str:
    """One line per (rate, system): throughput, normalized latency, TTFT and ITL percentiles."""
    out = []
    for r in sorted(rows, key=lambda r: (r["request_rate"], r["system"] != "static")):
        latency = f"{r['normalized_latency_s'] * 1e3:.1f} ms"
        ttft = f"{r['ttft_p50_s'] * 1e3:.0f} / {r['ttft_p99_s'] * 1e3:.0f} ms"
        itl = f"{r['itl_p50_s'] * 1e3:.1f} / {r['itl_p99_s'] * 1e3:.1f} ms"
        out.append([f"{r['request_rate']:g}", r["system"], f"{r['tokens_per_s']:.0f}", latency, ttft, itl])
    header = ["requests/s", "system", "tokens/s", "normalized latency", "TTFT p50 / p99", "ITL p50 / p99"]
    return markdown(header, out)


def serve_ratios(rows: list[dict]) -> str:
    """Continuous ÷ static at each rate: tokens/s, and static ÷ continuous normalized latency and TTFT p50."""
    by = {(r["system"], r["request_rate"]): r for r in rows}
    out = []
    for rate in sorted({r["request_rate"] for r in rows}):
        s, c = by[("static", rate)], by[("continuous", rate)]
        out.append([
            f"{rate:g}", times(c["tokens_per_s"] / s["tokens_per_s"]),
            times(s["normalized_latency_s"] / c["normalized_latency_s"]), times(s["ttft_p50_s"] / c["ttft_p50_s"]),
        ])  # fmt: skip
    header = ["requests/s", "tokens/s, continuous ÷ static", "normalized latency, static ÷ continuous",
              "TTFT p50, static ÷ continuous"]  # fmt: skip
    return markdown(header, out)


CHAPTER_TABLES: dict[str, dict[str, Callable[[list[dict]], str]]] = {
    "02_memory": {"systems": memory_systems, "block sizes": memory_block_sizes},
    "03_sharing": {"saved": sharing_saved},
    "04_prefix": {"runs": prefix_runs, "gains": prefix_gains},
    "05_throughput": {"systems": throughput_systems, "ratios": throughput_ratios},
    "07_real": {"systems": real_systems},
    "08_serve": {"rates": serve_rates, "ratios": serve_ratios},
}
