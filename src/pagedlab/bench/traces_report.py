"""Benchmarks: the tables and the figure of `pagedlab bench traces`, drawn from its rows.

Builds on: bench/traces.py (the rows: one per replay), bench/tables.py, matplotlib through viz.
Read with: chapters/04-prefix-caching.md (Real traffic), chapters/97-architecture.md (Benchmarks).

    TABLES["conversation"], ["synthetic"]   hit ratio per pool size: each policy, the optimum (MIN), the ceiling
    TABLES["dead"]                          dead weight: cached blocks no lookup can reach, per policy and index
    TABLES["radix"]                         the radix index beside the hash chain's, under LRU and FIFO
    TABLES["tier"]                          a pool alone, with a host tier as large, and twice as large alone
    draw_traces                             per trace: hit ratio vs pool size, dead weight, the tier
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.bench.tables import Column, Table, pct
from pagedlab.bench.traces import POLICIES, RADIX_POLICIES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CHAIN, RADIX = "hash-chain", "radix"


def find(rows: list[dict], trace: str, policy: str, pool, index: str = CHAIN, tier: int = 0) -> dict | None:
    """The row of one replay, or None if the sweep did not run it."""
    for r in rows:
        if (r["trace"], r["policy"], r["index"], r["pool_blocks"], r["tier_blocks"]) == (trace, policy, index, pool,
                                                                                          tier):  # fmt: skip
            return r
    return None


def pools(rows: list[dict], trace: str) -> list[int]:
    return sorted({r["pool_blocks"] for r in rows if r["trace"] == trace and r["pool_blocks"] is not None})


def traces(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["trace"] for r in rows))


def _hit(row: dict | None) -> str:
    return "–" if row is None else pct(row["hit_ratio"])


def _pool_lines(rows: list[dict], trace: str) -> list[dict]:
    """One line per pool size: every policy's replay (hash chain, no tier), and the infinite ceiling."""
    ceiling = find(rows, trace, "infinite", None)
    return [
        {"pool": p, "ceiling": ceiling, **{policy: find(rows, trace, policy, p) for policy in POLICIES}}
        for p in pools(rows, trace)
    ]


def _pool_columns() -> tuple[Column, ...]:
    return (
        Column("pool (blocks)", lambda line: f"{line['pool']:,}"),
        Column("tokens", lambda line: f"{line['pool'] * 512 / 1e6:.1f} M"),
        *(Column(policy.upper(), lambda line, p=policy: _hit(line[p])) for policy in POLICIES),
        Column("∞ (ceiling)", lambda line: _hit(line["ceiling"])),
    )


def _trace_table(trace: str) -> Table:
    return Table(
        _pool_columns(),
        lambda rows: _pool_lines(rows, trace),
        f"{trace} trace: prompt blocks served from the cache (hash-chain index, no tier)",
        "MIN: Belady's optimum, from the trace's future; ∞: a pool that never evicts",
    )


def _tier_lines(rows: list[dict]) -> list[dict]:
    """Pool P alone, P with a host tier of P, and 2P alone (the same bytes as P + tier), where the first two ran."""
    lines = []
    for t in traces(rows):
        for p in pools(rows, t):
            alone, tiered = find(rows, t, "lru", p), find(rows, t, "lru", p, tier=p)
            if alone and tiered:
                lines.append(
                    {"trace": t, "pool": p, "alone": alone, "tiered": tiered, "double": find(rows, t, "lru", 2 * p)}
                )
    return lines


def _by_pool(rows: list[dict]) -> list[dict]:
    """One line per pool size of the sweep (the tables below put the traces side by side)."""
    sizes = sorted({r["pool_blocks"] for r in rows if r["pool_blocks"] is not None})
    return [{"pool": p, "rows": rows} for p in sizes]


def _cell(line: dict, trace: str, policy: str, index: str = CHAIN, tier: bool = False, field: str = "hit_ratio"):
    """One replay's number at this line's pool size, formatted; – where the sweep did not run it."""
    r = find(line["rows"], trace, policy, line["pool"], index, line["pool"] if tier else 0)
    if r is None:
        return "–"
    return f"{r[field]:.1f}" if field == "dead_blocks_mean" else pct(r[field])


def _dead_others(line: dict, trace: str) -> str:
    """The most dead weight among the policies that never evict a block before its descendants (one at a time)."""
    got = [find(line["rows"], trace, p, line["pool"]) for p in POLICIES if p != "fifo"]
    got = [r["dead_blocks_mean"] for r in got if r]
    return f"{max(got):.1f}" if got else "–"


def _double(line: dict, trace: str) -> str:
    """A pool of twice the size alone: the same bytes as the pool and its tier."""
    return _hit(find(line["rows"], trace, "lru", 2 * line["pool"]))


POOL = Column("pool (blocks)", lambda line: f"{line['pool']:,}")
TRACE_NAMES = ("conversation", "synthetic")


def _per_trace(columns) -> tuple[Column, ...]:
    """(header, cell(line, trace)) for each trace: the columns of both traces, conversation first."""
    return tuple(Column(f"{t}: {h}", lambda line, t=t, c=c: c(line, t)) for t in TRACE_NAMES for h, c in columns)


TABLES = {
    "conversation": _trace_table("conversation"),
    "synthetic": _trace_table("synthetic"),
    "dead": Table(
        (
            POOL,
            *_per_trace(
                (
                    ("LRU LFU SLRU MIN", _dead_others),
                    ("FIFO", lambda line, t: _cell(line, t, "fifo", field="dead_blocks_mean")),
                    ("FIFO, radix", lambda line, t: _cell(line, t, "fifo", RADIX, field="dead_blocks_mean")),
                )
            ),
        ),  # fmt: skip
        _by_pool,
        "Dead weight: cached blocks whose ancestor was evicted (no lookup reaches them), mean over arrivals",
        "LRU LFU SLRU MIN: the largest of the four; hash-chain index unless named radix",
    ),
    "radix": Table(
        (
            POOL,
            *_per_trace(
                tuple(
                    (f"{p.upper()}, {name}", lambda line, t, p=p, index=index: _cell(line, t, p, index))
                    for p in RADIX_POLICIES
                    for index, name in ((CHAIN, "chain"), (RADIX, "radix"))
                )
            ),
        ),  # fmt: skip
        _by_pool,
        "The radix index beside the hash chain's: hit ratio",
    ),
    "tier": Table(
        (
            POOL,
            *_per_trace(
                (
                    ("P alone", lambda line, t: _cell(line, t, "lru")),
                    ("P + tier P", lambda line, t: _cell(line, t, "lru", tier=True)),
                    ("net", lambda line, t: _cell(line, t, "lru", tier=True, field="saved_ratio")),
                    ("2P alone", _double),
                )
            ),
        ),  # fmt: skip
        _by_pool,
        "LRU with a host tier as large as the pool P: hit ratio; 2P alone holds the same bytes in the pool",
        "net: pool hits, plus tier hits less the transfer (a promoted block costs 0.2 of computing it)",
    ),
}


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES


def report(console, rows: list[dict]) -> None:
    for table in TABLES.values():
        if table.body(rows):
            console.print(table.rich(rows))
    for t in traces(rows):
        ceiling = find(rows, t, "infinite", None)
        if ceiling is not None:
            console.print(
                f"traces: {t}: a pool that never evicts serves {pct(ceiling['hit_ratio'])} of "
                f"{ceiling['prompt_blocks']:,} prompt blocks, as the trace's README counts"
            )


def draw_traces(rows: list[dict]) -> Figure:
    """One row of panels per trace: hit ratio vs pool size (every policy, MIN, the ceiling), dead weight, the tier."""
    from pagedlab import viz

    names = traces(rows)
    fig, axes = viz.plt.subplots(len(names), 3, figsize=(15, 4.2 * len(names)), squeeze=False)
    for (hits_ax, dead_ax, tier_ax), trace in zip(axes, names):
        _plot_hits(hits_ax, rows, trace)
        _plot_dead(dead_ax, rows, trace)
        _plot_tier(tier_ax, rows, trace)
    concurrency = max(r["concurrency"] for r in rows)
    flight = "one at a time" if concurrency == 1 else f"up to {concurrency} in flight"
    fig.suptitle(f"Mooncake traces replayed through the stage-4 prefix cache, blocks of 512 tokens, {flight}")
    fig.tight_layout()
    return fig


STYLE = {  # policy -> (colour, line style); MIN in black, the optimum every policy is judged against
    "lru": ("#0072b2", "-"),
    "fifo": ("#e69f00", "-"),
    "lfu": ("#cc79a7", "-"),
    "slru": ("#009e73", "-"),
    "min": ("black", "--"),
}


def _log2_axis(ax, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([f"{s // 1024}K" if s >= 1024 else str(s) for s in sizes])
    ax.set_xlabel("pool (blocks of 512 tokens)")


def _plot_hits(ax, rows: list[dict], trace: str) -> None:
    sizes = pools(rows, trace)
    for policy, (colour, style) in STYLE.items():
        got = [(p, find(rows, trace, policy, p)) for p in sizes]
        got = [(p, r["hit_ratio"]) for p, r in got if r]
        if got:
            ax.plot(*zip(*got), style, color=colour, marker="o", markersize=3, label=policy.upper())
    radix = [(p, find(rows, trace, "fifo", p, RADIX)) for p in sizes]
    radix = [(p, r["hit_ratio"]) for p, r in radix if r]
    if radix:  # the tree turns FIFO's stranded blocks back into hits
        ax.plot(*zip(*radix), ":", color=STYLE["fifo"][0], marker="o", markersize=3, label="FIFO, radix")
    ceiling = find(rows, trace, "infinite", None)
    if ceiling:
        ax.axhline(ceiling["hit_ratio"], color="grey", linestyle=":", label=f"∞ {100 * ceiling['hit_ratio']:.1f} %")
    _log2_axis(ax, sizes)
    ax.set_ylim(0, 1.05 * max(r["hit_ratio"] for r in rows if r["trace"] == trace) + 0.01)
    ax.set_ylabel("prompt blocks hit")
    ax.set_title(f"{trace}: hit ratio vs pool size")
    ax.legend(frameon=False, fontsize=8)


def _plot_dead(ax, rows: list[dict], trace: str) -> None:
    sizes = pools(rows, trace)
    for (policy, index), (colour, style) in (
        *(((p, CHAIN), STYLE[p]) for p in POLICIES),
        (("fifo", RADIX), (STYLE["fifo"][0], ":")),
    ):
        got = [(p, find(rows, trace, policy, p, index)) for p in sizes]
        got = [(p, r["dead_blocks_mean"]) for p, r in got if r]
        if got:
            label = policy.upper() + (", radix" if index == RADIX else "")
            ax.plot(*zip(*got), style, color=colour, marker="o", markersize=3, label=label)
    _log2_axis(ax, sizes)
    ax.set_ylabel("dead blocks (mean)")
    ax.set_title(f"{trace}: cached but unreachable")
    ax.legend(frameon=False, fontsize=8)


def _plot_tier(ax, rows: list[dict], trace: str) -> None:
    lines = [line for line in _tier_lines(rows) if line["trace"] == trace]
    if not lines:
        ax.set_axis_off()
        return
    sizes = [line["pool"] for line in lines]
    ax.plot(sizes, [line["alone"]["hit_ratio"] for line in lines], "-o", color=STYLE["lru"][0], label="pool P alone")
    ax.plot(sizes, [line["tiered"]["hit_ratio"] for line in lines], "-o", color="#d55e00", label="P + host tier P")
    ax.plot(sizes, [line["tiered"]["saved_ratio"] for line in lines], ":", color="#d55e00", label="  net of transfers")
    doubled = [(line["pool"], line["double"]["hit_ratio"]) for line in lines if line["double"]]
    if doubled:  # on top, and marked: it all but coincides with P + tier P
        ax.plot(*zip(*doubled), "--x", color="black", markersize=6, zorder=3, label="2P alone (same bytes)")
    _log2_axis(ax, sizes)
    ax.set_xlabel("GPU pool P (blocks of 512 tokens)")
    ax.set_ylabel("prompt blocks hit")
    ax.set_title(f"{trace}: LRU with a host tier")
    ax.legend(frameon=False, fontsize=8)
