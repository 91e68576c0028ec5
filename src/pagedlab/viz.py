"""Stage 1: drawings of the engine's trace, shared by notebooks and `pagedlab figures`.

Builds on: stats.py (`StepTrace`, recorded by `LLM(..., record_trace=True)` into `llm.engine.trace`).
Read with: chapters/01-contiguous-static.md, chapters/02-paged-blocks.md (block tables, pool occupancy),
chapters/04-prefix-caching.md (cache hits and cached-but-free blocks),
chapters/05-continuous-batching.md (schedules, tokens per step, preemption, the CPU swap pool).

Every drawing in every chapter uses one palette, so a colour means one thing throughout:

    FREE      a slot (or block) no request holds
    USED      a slot holding a computed token's K/V
    RESERVED  a slot a request holds that holds no token (not yet, or never)
    SHARED    a block held by several requests (ref_cnt > 1, stage 3)
    CACHED    a free block that still keeps its hash for reuse (stage 4)

A batch timeline adds the request states PREFILL, DECODE, WAITING and FINISHED; a stage-5 schedule adds
PREEMPTED (K/V dropped, to be recomputed) and SWAPPED (K/V in the CPU swap pool).
The functions only read the trace (and `cached_block_ids`, a stage-4 pool; `swapped_block_ids`, a stage-5
KV manager): they work for every stage that records one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from pagedlab.stats import StepTrace


def _use_agg_without_display() -> None:
    """Scripts and CI on a headless Linux draw off-screen; a notebook keeps its inline backend."""
    headless = sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if headless and "MPLBACKEND" not in os.environ and "ipykernel" not in sys.modules:
        matplotlib.use("Agg")


_use_agg_without_display()

# Slot and block states (Okabe-Ito colours: distinguishable with the common colour-vision deficiencies).
FREE = "#dddddd"
USED = "#0072b2"
RESERVED = "#e69f00"
SHARED = "#cc79a7"
CACHED = "#009e73"
# Request states in a batch timeline.
PREFILL = "#d55e00"
DECODE = USED
WAITING = "#f0e442"
FINISHED = FREE
# Stage 5: a preempted request, its K/V dropped (recompute) or moved to the CPU swap pool (swap).
PREEMPTED = "#000000"
SWAPPED = "#56b4e9"
_REQUEST_COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000", "#8c6d31")


def request_colour(index: int) -> str:
    """The colour of the index-th request (by first appearance), cycling through eight."""
    return _REQUEST_COLOURS[index % len(_REQUEST_COLOURS)]


def request_order(trace: list[StepTrace]) -> list[str]:
    """Request ids in order of first appearance (waiting or running), so every plot lists them alike."""
    seen: dict[str, None] = {}
    for step in trace:
        seen.update(dict.fromkeys(step.running + step.waiting))
    return list(seen)


def peak_slots(trace: list[StepTrace]) -> dict[str, tuple[int, int]]:
    """request_id -> (most slots it ever filled with tokens, most slots it ever held)."""
    peaks: dict[str, tuple[int, int]] = {}
    for step in trace:
        for rid, held in step.kv_held.items():
            used, most = peaks.get(rid, (0, 0))
            peaks[rid] = (max(used, step.kv_used.get(rid, 0)), max(most, held))
    return peaks


def used_share(trace: list[StepTrace]) -> float:
    """Share of held KV slots that hold a token, summed over steps (1.0 = nothing held in vain)."""
    held = sum(sum(step.kv_held.values()) for step in trace)
    return sum(sum(step.kv_used.values()) for step in trace) / held if held else 0.0


def plot_reserved_vs_used(trace: list[StepTrace], title: str | None = None) -> Figure:
    """Each request at its peak: the slots it filled and the slots it held for nothing (`title`: first line).

    Why: a contiguous cache reserves max_model_len slots per request at admission,
    so the orange part is memory no other request could use (stage 2 removes it).
    """
    peaks = peak_slots(trace)
    ids = [rid for rid in request_order(trace) if rid in peaks]
    used = [peaks[rid][0] for rid in ids]
    unused = [peaks[rid][1] - peaks[rid][0] for rid in ids]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(ids))
    ax.bar(x, used, color=USED, label="used (holds a token)")
    ax.bar(x, unused, bottom=used, color=RESERVED, label="reserved but unused")
    for i, (u, r) in enumerate(zip(used, unused)):
        ax.text(i, u + r, f"{u / (u + r):.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, ids)
    for i, label in enumerate(ax.get_xticklabels()):
        label.set_color(request_colour(i))
    ax.set_ylim(0, 1.25 * max((u + r for u, r in zip(used, unused)), default=1))
    ax.set(xlabel="request id", ylabel="KV slots at the request's peak")
    title = title or "Reserved vs used KV slots per request"
    ax.set_title(f"{title}\n{used_share(trace):.1%} of held slots hold tokens (summed over steps)", fontsize=10)
    ax.legend(loc="upper right", ncols=2, fontsize=8)
    fig.tight_layout()
    return fig


def plot_kv_over_steps(
    trace: list[StepTrace], num_kv_blocks: int, block_size: int, mark_preemptions: bool = False, ax=None
) -> Figure:
    """The whole pool, step by step: slots holding tokens, held in vain, and free.

    Stage 5, optional: `mark_preemptions` draws a PREEMPTED line at each step that preempted someone
    (see `preemption_events`); `ax` draws into that axes instead of a figure of its own.
    Why: the gap between the blue and orange tops is the waste; free slots while
    requests wait are the cost of static batching (stage 5 removes that); at stage 5
    the pool runs full and preemption is what keeps it from overflowing.
    """
    steps = [step.step for step in trace]
    used = np.array([sum(step.kv_used.values()) for step in trace])
    held = np.array([sum(step.kv_held.values()) for step in trace])
    capacity = num_kv_blocks * block_size
    fig, ax = plt.subplots(figsize=(8, 3.5)) if ax is None else (ax.figure, ax)
    # step="mid": each step is a flat band of width 1 centred on its number
    ax.fill_between(steps, 0, used, step="mid", color=USED, label="used (holds a token)")
    ax.fill_between(steps, used, held, step="mid", color=RESERVED, label="reserved but unused")
    ax.fill_between(steps, held, capacity, step="mid", color=FREE, label="free")
    ax.axhline(capacity, color="black", linewidth=1, linestyle="--", label=f"capacity ({num_kv_blocks} blocks)")
    if mark_preemptions:
        preempted = sorted({step for step, _ in preemption_events(trace)})
        if preempted:
            ax.vlines(preempted, 0, capacity, color=PREEMPTED, linewidth=1.5, label="a preemption")
    ax.set(xlabel="engine step", ylabel="KV slots", xlim=(steps[0] - 0.5, steps[-1] + 0.5), ylim=(0, 1.2 * capacity))
    ax.set_title(
        f"KV pool per step: on average {held.mean() / capacity:.0%} held, {used.mean() / capacity:.1%} holds tokens"
    )
    ax.legend(loc="upper right", ncols=len(ax.get_legend_handles_labels()[0]), fontsize=8)
    fig.tight_layout()
    return fig


def _request_states(rid: str, trace: list[StepTrace]) -> list[str | None]:
    """Per step: "prefill" (more than one token fed), "decode", "waiting", "finished" or None (not there)."""
    states: list[str | None] = []
    done = False
    for step in trace:
        if rid in step.scheduled:
            states.append("prefill" if step.scheduled[rid] > 1 else "decode")
        elif rid in step.waiting:
            states.append("waiting")
        else:
            states.append("finished" if done else None)
        done = done or rid in step.finished
    return states


def _spans(states: list[str | None], steps: list[int]) -> dict[str, list[tuple[int, int]]]:
    """Runs of equal states as (start step, length) pairs, as `broken_barh` wants them."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for i, state in enumerate(states):
        if state is None:
            continue
        runs = spans.setdefault(state, [])
        if i and states[i - 1] == state:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((steps[i] - 0.5, 1))  # centred on the step number
    return spans


_STATE_COLOURS = {"prefill": PREFILL, "decode": DECODE, "waiting": WAITING, "finished": FINISHED}


def plot_batch_timeline(trace: list[StepTrace]) -> Figure:
    """A Gantt chart, requests x steps, coloured by what each request did in each step.

    Why: under static batching a short request finishes early and its seat stays
    empty (grey) while the others still wait (yellow) for the whole batch to end.
    """
    ids, steps = request_order(trace), [step.step for step in trace]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * len(ids)))
    for row, rid in enumerate(ids):
        for state, runs in _spans(_request_states(rid, trace), steps).items():
            ax.broken_barh(runs, (row - 0.4, 0.8), facecolors=_STATE_COLOURS[state])
    ax.set_yticks(range(len(ids)), ids)
    for i, label in enumerate(ax.get_yticklabels()):
        label.set_color(request_colour(i))
    ax.invert_yaxis()
    ax.set(xlabel="engine step", ylabel="request id")
    ax.set_title("Batch timeline", loc="left")
    handles = [Patch(color=c, label=s) for s, c in _STATE_COLOURS.items()]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1, 1), ncols=4, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_pool(step: StepTrace, num_kv_blocks: int, block_size: int, blocks_per_row: int = 64) -> Figure:
    """Every slot of the pool in one step, as it ran: used, reserved but unused, or free.

    One row holds `blocks_per_row` blocks; each request is labelled at its first block.
    Why: seeing a 1024-slot region with a dozen tokens in it is the whole argument of stage 2.
    """
    grid = np.zeros(num_kv_blocks * block_size)  # 0 free, 1 reserved, 2 used
    for rid, blocks in step.block_tables.items():
        slots = (np.array(blocks)[:, None] * block_size + np.arange(block_size)).ravel()  # logical order
        grid[slots] = 1
        grid[slots[: step.kv_used.get(rid, 0)]] = 2
    row_len = blocks_per_row * block_size
    rows = -(-grid.size // row_len)
    grid = np.concatenate([grid, np.full(rows * row_len - grid.size, np.nan)]).reshape(rows, row_len)
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.45 * rows))
    ax.imshow(grid, cmap=ListedColormap([FREE, RESERVED, USED]), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    for rid, blocks in step.block_tables.items():
        row, col = divmod(blocks[0] * block_size, row_len)
        ax.text(col + row_len / 100, row, f"req {rid}", va="center", fontsize=8)
    ax.set_yticks(range(rows), [f"block {r * blocks_per_row}" for r in range(rows)], fontsize=8)
    ax.set(xlabel=f"slot within the row ({blocks_per_row} blocks x {block_size} slots)")
    ax.set_title(f"KV pool in step {step.step}", loc="left")
    handles = [Patch(color=c, label=s) for s, c in (("used", USED), ("reserved but unused", RESERVED), ("free", FREE))]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1, 1), ncols=3, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


# --- stage 2: block tables and the block pool ---------------------------------------------------------


def _text_colour(background: str) -> str:
    """Black on light colours, white on dark ones (relative luminance, ITU-R BT.709 weights)."""
    r, g, b, _ = to_rgba(background)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def _block_cell(ax, x: float, y: float, colour: str, filled: float, label: str, gid: str, hatch=None) -> None:
    """One block as a unit square at (x, y): the share `filled` of its slots solid, the rest pale."""
    ax.add_patch(Rectangle((x, y), 1, 1, facecolor=colour, alpha=0.3, edgecolor="none"))
    ax.add_patch(Rectangle((x, y), filled, 1, facecolor=colour, edgecolor="none", hatch=hatch, gid=gid))
    ax.add_patch(Rectangle((x, y), 1, 1, facecolor="none", edgecolor="white", linewidth=1.5))
    ink = _text_colour(colour) if filled >= 0.5 else "black"
    ax.text(x + 0.5, y + 0.5, label, ha="center", va="center", fontsize=7, color=ink)


def _slots_in_blocks(num_tokens: int, num_blocks: int, block_size: int) -> list[int]:
    """Tokens held in each of a request's blocks, in logical order: [8, 8, 5] for 21 tokens of block_size 8."""
    return [min(block_size, max(0, num_tokens - i * block_size)) for i in range(num_blocks)]


def _bare(ax) -> None:
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def plot_block_tables(
    step: StepTrace,
    num_kv_blocks: int,
    block_size: int,
    order: list[str] | None = None,
    arrows_for: list[str] | None = None,
    pool_columns: int = 8,
    hits: dict[str, int] | None = None,
    cached: Iterable[int] = (),
    swapped: dict[str, list[int]] | None = None,
    num_swap_blocks: int = 0,
) -> Figure:
    """One step's block tables (left) and the pool of physical blocks they point into (right).

    Left: a row per request, a cell per logical block, labelled with the physical block id.
    Right: every physical block, coloured by the request holding it (SHARED, hatched, if several; FREE if none).
    A block is solid for the slots that hold tokens and pale for the rest, so the last block of each
    request shows its internal fragmentation; "5/8" beside the row counts the last block's used slots.
    `order` fixes the request colours (default: the table's order); arrows go from the logical to the
    physical blocks of the requests in `arrows_for` (default: the first request).
    Stage 4 (prefix caching), both optional: `hits` maps a request to how many leading blocks of its table
    were prefix-cache hits (outlined in black and marked "hit", see `prefix_hit_blocks`); `cached` lists the
    blocks that carry a block hash (see `cached_block_ids`): those no table holds are drawn in CACHED colour,
    free but still findable by their hash.
    Stage 5 (swap), optional: with `num_swap_blocks` > 0 a second lane under the pool draws the CPU swap pool;
    the blocks in `swapped` (request_id -> its CPU blocks, see `swapped_block_ids`) are in SWAPPED colour and
    labelled with the request whose K/V they keep while it waits.
    Why: a request's blocks need not be adjacent or in order; its block table is all that ties them.
    """
    ids, swapped = list(step.block_tables), swapped or {}
    order = order or ids
    colour = {rid: request_colour(order.index(rid)) for rid in ids}
    widest = max((len(blocks) for blocks in step.block_tables.values()), default=1)
    pool_rows = -(-num_kv_blocks // pool_columns)
    swap_rows = -(-num_swap_blocks // pool_columns)
    rows = max(len(ids), pool_rows + (swap_rows + 1 if swap_rows else 0))
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(1.2 + 0.45 * (widest + 2 + pool_columns), 1.4 + 0.45 * rows),
        gridspec_kw={"width_ratios": [widest + 2, pool_columns]},
    )
    cells = _draw_tables(left, step, ids, colour, block_size, widest, rows)
    owners = _draw_pool(right, step, ids, colour, block_size, num_kv_blocks, pool_columns, set(cached))
    hit_blocks = _mark_hits(left, right, step, hits or {}, pool_columns)
    if num_swap_blocks:
        _draw_swap_pool(right, swapped, num_swap_blocks, pool_columns, top=pool_rows + 1)
    for rid in ids[:1] if arrows_for is None else arrows_for:
        for i, block_id in enumerate(step.block_tables[rid]):
            y, x = divmod(block_id, pool_columns)
            _arrow(fig, (left, cells[rid][i]), (right, (x, y)), f"arrow:{rid}:{i}")
    left.set_title(f"Block tables in step {step.step}", loc="left", fontsize=10)
    right.set_title(f"Block pool: {len(owners)} of {num_kv_blocks} blocks held", loc="left", fontsize=10)
    handles = _block_legend(owners, set(cached), hit_blocks, bool(swapped))
    fig.legend(handles=handles, loc="lower right", ncols=max(2, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _block_legend(owners: dict[int, list[str]], cached: set[int], hit_blocks: set[int], swapped: bool) -> list:
    """Legend entries for the block states the picture shows."""
    handles = [Patch(color=FREE, label="free block")]
    if any(len(held_by) > 1 for held_by in owners.values()):
        handles.append(Patch(facecolor=SHARED, hatch="//", label="shared (ref_cnt > 1)"))
    if cached - owners.keys():
        handles.append(Patch(color=CACHED, label="cached, free (keeps its hash)"))
    if hit_blocks:
        handles.append(Patch(facecolor="none", edgecolor="black", linewidth=2, label="prefix-cache hit"))
    if swapped:
        handles.append(Patch(color=SWAPPED, label="CPU block holding a swapped-out request's K/V"))
    return handles


def _draw_swap_pool(ax, swapped: dict[str, list[int]], num_swap_blocks: int, columns: int, top: int) -> None:
    """The CPU swap pool as a lane of blocks from row `top` down: held blocks SWAPPED, labelled "id (request)"."""
    owner = {cpu: rid for rid, blocks in swapped.items() for cpu in blocks}
    for cpu in range(num_swap_blocks):
        y, x = divmod(cpu, columns)
        label = f"{cpu}\n({owner[cpu]})" if cpu in owner else str(cpu)
        _block_cell(ax, x, top + y, SWAPPED if cpu in owner else FREE, 1.0, label, f"cpu:{cpu}")
    held = "; ".join(f"req {rid}: {_id_ranges(blocks)}" for rid, blocks in swapped.items()) or "empty"
    ax.text(0, top - 0.15, f"CPU swap pool: {len(owner)} of {num_swap_blocks} blocks ({held})", fontsize=8)
    ax.set_ylim(top + -(-num_swap_blocks // columns), 0)


def _id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 7, 8] -> "0-2, 7-8": runs of consecutive ids."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _arrow(fig, source: tuple, target: tuple, gid: str) -> None:
    """An arrow from the centre of one unit cell to another: each end is (axes, (x, y) of the cell's corner)."""
    (ax_a, (xa, ya)), (ax_b, (xb, yb)) = source, target
    arrow = ConnectionPatch(
        (xa + 0.5, ya + 0.5),
        (xb + 0.5, yb + 0.5),
        ax_a.transData,
        ax_b.transData,
        arrowstyle="-|>",
        shrinkA=7,
        shrinkB=7,
        connectionstyle="arc3,rad=-0.2",
        color="black",
        linewidth=0.8,
    )
    arrow.set_gid(gid)
    fig.add_artist(arrow)


def _draw_tables(ax, step, ids, colour, block_size, widest, rows) -> dict[str, list[tuple[int, int]]]:
    """The block tables as rows of cells, top-aligned; returns request_id -> (x, y) of each logical block."""
    cells: dict[str, list[tuple[int, int]]] = {}
    for row, rid in enumerate(ids):
        blocks = step.block_tables[rid]
        per_block = _slots_in_blocks(step.kv_used.get(rid, 0), len(blocks), block_size)
        cells[rid] = [(i, row) for i in range(len(blocks))]
        for i, (block_id, used) in enumerate(zip(blocks, per_block)):
            _block_cell(ax, i, row, colour[rid], used / block_size, str(block_id), f"logical:{rid}:{i}")
        last = per_block[-1] if per_block else 0
        ax.text(len(blocks) + 0.1, row + 0.5, f"{last}/{block_size}", va="center", fontsize=8, color="dimgray")
    ax.set(xlim=(0, widest + 2), ylim=(rows, 0), aspect="equal")
    ax.set_xticks(np.arange(widest) + 0.5, range(widest), fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(np.arange(len(ids)) + 0.5, [f"req {rid}" for rid in ids], fontsize=8)
    for label, rid in zip(ax.get_yticklabels(), ids):
        label.set_color(colour[rid])
    ax.text(
        0,
        len(ids) + 0.3,
        f"columns: logical block index\ncells: physical block id\nn/{block_size}: slots used in the last block",
        va="top",
        fontsize=8,
        color="dimgray",
    )
    _bare(ax)
    return cells


def _draw_pool(ax, step, ids, colour, block_size, num_kv_blocks, columns, cached=frozenset()) -> dict[int, list[str]]:
    """The pool as a grid of physical blocks, `columns` per row; returns block_id -> the requests holding it.

    A block that no table holds is FREE, or CACHED if it is in `cached` (it still carries a block hash).
    """
    owners: dict[int, list[str]] = {}
    used: dict[int, int] = {}
    for rid in ids:
        blocks = step.block_tables[rid]
        for block_id, n in zip(blocks, _slots_in_blocks(step.kv_used.get(rid, 0), len(blocks), block_size)):
            owners.setdefault(block_id, []).append(rid)
            used[block_id] = max(used.get(block_id, 0), n)
    for block_id in range(num_kv_blocks):
        y, x = divmod(block_id, columns)
        held_by = owners.get(block_id, [])
        fill = SHARED if len(held_by) > 1 else colour[held_by[0]] if held_by else CACHED if block_id in cached else FREE
        filled = used.get(block_id, block_size) / block_size  # a free block is drawn solid
        hatch = "//" if len(held_by) > 1 else None
        _block_cell(ax, x, y, fill, filled, str(block_id), f"physical:{block_id}", hatch)
    ax.set(xlim=(0, columns), ylim=(-(-num_kv_blocks // columns), 0), aspect="equal", xticks=[], yticks=[])
    ax.set_xlabel(f"physical block id ({columns} per row); pale: slots not holding a token", fontsize=8)
    _bare(ax)
    return owners


def _mark_hits(left, right, step, hits: dict[str, int], columns: int) -> set[int]:
    """Outline the first hits[rid] logical blocks of each table, and the physical blocks they are; returns those."""
    marked: set[int] = set()
    for row, rid in enumerate(step.block_tables):
        for i, block_id in enumerate(step.block_tables[rid][: hits.get(rid, 0)]):
            _outline(left, i, row, f"hit:{rid}:{i}")
            left.text(i + 0.5, row + 0.9, "hit", ha="center", va="bottom", fontsize=5, color="black")
            marked.add(block_id)
    for block_id in marked:
        y, x = divmod(block_id, columns)
        _outline(right, x, y, f"hit:physical:{block_id}")
    return marked


def _outline(ax, x: float, y: float, gid: str) -> None:
    ax.add_patch(Rectangle((x + 0.06, y + 0.06), 0.88, 0.88, facecolor="none", edgecolor="black", lw=1.6, gid=gid))


def prefix_hit_blocks(trace: list[StepTrace], block_size: int) -> dict[str, int]:
    """request_id -> leading blocks of its table that were prefix-cache hits (stage 4), for `plot_block_tables`.

    Read from the trace: in a request's first scheduled step, the tokens it already had with K/V
    (kv_used minus the tokens fed) are the ones the prefix cache supplied. (A child of an n > 1 request
    forked from its leader also starts with computed tokens; those are shared, not hits, and not aligned.)
    """
    hits: dict[str, int] = {}
    for step in trace:
        for rid, fed in step.scheduled.items():
            if rid not in hits:
                hits[rid] = (step.kv_used.get(rid, fed) - fed) // block_size
    return hits


def swapped_block_ids(kv_manager) -> dict[str, list[int]]:
    """request_id -> the CPU blocks holding its K/V (stage 5's SwappingKVCacheManager): `swapped` for
    plot_block_tables. Take it right after `engine.step()`, like `cached_block_ids`."""
    return {rid: list(blocks) for rid, blocks in kv_manager.swap_pool.held.items()}


def cached_block_ids(pool) -> set[int]:
    """Ids of the blocks that carry a block hash now (stage 4's CachingBlockPool): `cached` for plot_block_tables.

    Take it right after `engine.step()`: a step registers and evicts hashes while scheduling, before its trace
    snapshot, and its update only frees blocks, so the set is the one the step's snapshot saw.
    """
    return {block.block_id for block in pool.cached_block_hash_to_block.values()}


def plot_pool_occupancy(
    trace: list[StepTrace], num_kv_blocks: int, axes: tuple | None = None, title: str | None = None
) -> Figure:
    """Blocks held per step, stacked by request, under the pool's capacity; below, how many requests run.

    `axes`: (blocks axis, running axis) to draw into; None makes a figure of its own.
    Why: at stage 1 each request arrives with a whole region and keeps it to the end (tall flat bands);
    at stage 2 a request takes one more block each time its last block fills (thin staircases), so the
    same pool carries more requests at once.
    """
    own_figure = axes is None
    if own_figure:
        _, axes = plt.subplots(2, 1, figsize=(8, 4.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    blocks_ax, running_ax = axes
    steps = [step.step for step in trace]
    x = np.repeat(steps, 2) + np.tile([-0.5, 0.5], len(steps))  # each step a flat band of width 1 around it
    bottom = np.zeros(len(trace))
    for i, rid in enumerate(request_order(trace)):
        held = np.array([len(step.block_tables.get(rid, ())) for step in trace])
        if held.any():
            top = bottom + held
            blocks_ax.fill_between(x, np.repeat(bottom, 2), np.repeat(top, 2), color=request_colour(i), linewidth=0)
            bottom = top
    blocks_ax.axhline(num_kv_blocks, color="black", linewidth=1, linestyle="--")
    blocks_ax.text(steps[0], num_kv_blocks, " capacity", va="bottom", fontsize=8)
    blocks_ax.set(ylabel="KV blocks held", ylim=(0, 1.15 * num_kv_blocks), xlim=(steps[0] - 0.5, steps[-1] + 0.5))
    running = np.array([len(step.running) for step in trace])
    running_ax.fill_between(x, 0, np.repeat(running, 2), color="dimgray", linewidth=0)
    running_ax.set(xlabel="engine step", ylabel="running", ylim=(0, 1.2 * max(running.max(), 1)))
    running_ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=3))
    head = f"{title}: " if title else ""
    blocks_ax.set_title(
        f"{head}{running.mean():.1f} requests running on average (at most {running.max()}), "
        f"{bottom.mean() / num_kv_blocks:.0%} of the pool held",
        loc="left",
        fontsize=10,
    )
    if own_figure:
        blocks_ax.figure.tight_layout()
    return blocks_ax.figure


# --- stage 5: continuous batching: request states, tokens per step, preemption ----------------------------


def preemption_events(trace: list[StepTrace]) -> list[tuple[int, str]]:
    """(step, request_id) for every preemption: the request ran in the step before and waits again now.

    The trace is taken after scheduling, so a request preempted while step k was scheduled is in
    step k's `waiting` (and in step k - 1's `running`).
    """
    events, before = [], set()
    for step in trace:
        events += [(step.step, rid) for rid in step.waiting if rid in before]
        before = set(step.running)
    return events


def samples_in(trace: list[StepTrace], prompt_lens: dict[str, int]) -> dict[str, list[bool]]:
    """request_id -> per step, did it sample a token (did its fed tokens reach its end)? For the requests in
    `prompt_lens` only.

    A request samples when computed + fed == its tokens so far; its tokens start at the prompt and grow
    by one each time it samples. Preemption by recompute drops K/V, not tokens, so the count carries over.
    """
    sampled: dict[str, list[bool]] = {}
    for rid, num_tokens in prompt_lens.items():
        flags = []
        for step in trace:
            samples = rid in step.scheduled and step.kv_used.get(rid) == num_tokens
            num_tokens += samples
            flags.append(samples)
        sampled[rid] = flags
    return sampled


def schedule_states(
    trace: list[StepTrace], prompt_lens: dict[str, int] | None = None, preemption_mode: str = "recompute"
) -> dict[str, list[str | None]]:
    """request_id -> its state in each step of the trace (None: not there yet, or gone and never seen).

    States: "waiting" (queued, never ran), "prefill" (fed more than one token, or fed tokens without reaching
    its end: a chunk), "decode" (fed one token and sampled), "idle" (holds KV, fed nothing: the budget ran
    out, or a child waiting for its leader's prefill), "preempted" (ran before, waits again with its K/V
    dropped), "swapped" (preempted with its K/V in the CPU swap pool), "finished".
    `prompt_lens` (request_id -> prompt tokens, e.g. from `prompt_lens_of(outputs)`) tells a one-token chunk
    from a decode; without it, "prefill" means more than one token. With preemption_mode="swap", a preempted
    request counts as swapped unless it came back with fewer computed tokens than it left with (the swap
    pool was full and it fell back to recompute; a recompute that hit every block looks like a swap, and
    costs as little).
    """
    sampled = samples_in(trace, prompt_lens or {})
    states = {}
    for rid in request_order(trace):
        states[rid] = _schedule_states_of(rid, trace, sampled.get(rid))
        if preemption_mode == "swap":
            _mark_swapped(rid, trace, states[rid])
    return states


def _schedule_states_of(rid: str, trace: list[StepTrace], sampled: list[bool] | None) -> list[str | None]:
    states: list[str | None] = []
    ran = done = False
    for i, step in enumerate(trace):
        if rid in step.scheduled:
            chunk = step.scheduled[rid] > 1 or (sampled is not None and not sampled[i])
            states.append("prefill" if chunk else "decode")
        elif rid in step.waiting:
            states.append("preempted" if ran else "waiting")
        elif rid in step.running:
            states.append("idle")
        else:
            states.append("finished" if done else None)
        ran = ran or rid in step.running
        done = done or rid in step.finished
    return states


def _mark_swapped(rid: str, trace: list[StepTrace], states: list[str | None]) -> None:
    """Turn each preempted stretch into "swapped" unless the request came back having lost K/V."""
    i = 0
    while i < len(states):
        if states[i] != "preempted":
            i += 1
            continue
        end = next((j for j in range(i, len(states)) if states[j] != "preempted"), len(states))
        left_with = trace[i - 1].kv_used.get(rid, 0)  # computed tokens when it was preempted
        back = trace[end] if end < len(states) and rid in trace[end].scheduled else None
        resumed_with = back.kv_used[rid] - back.scheduled[rid] if back else left_with
        if resumed_with >= left_with:
            states[i:end] = ["swapped"] * (end - i)
        i = end


def prompt_lens_of(outputs) -> dict[str, int]:
    """request_id -> prompt tokens, from `LLM.generate`'s RequestOutputs: the `prompt_lens` of the stage-5 plots."""
    return {out.request_id: len(out.prompt_token_ids) for out in outputs}


_SCHEDULE_COLOURS = {
    "waiting": WAITING,
    "prefill": PREFILL,
    "decode": DECODE,
    "preempted": PREEMPTED,
    "swapped": SWAPPED,
    "finished": FINISHED,
}


def plot_schedule_gantt(
    trace: list[StepTrace],
    prompt_lens: dict[str, int] | None = None,
    preemption_mode: str = "recompute",
    ax=None,
    title: str | None = None,
) -> Figure:
    """A Gantt chart, requests x steps, for continuous batching: who waits, prefills a chunk, decodes, is
    preempted (K/V dropped) or swapped out (K/V on the CPU), or has finished, in every step.

    A request that holds KV but was fed nothing in a step ("idle") is an empty outlined cell. States come
    from `schedule_states`; `prompt_lens` and `preemption_mode` as there. `ax`: draw into it (None: a figure
    of its own); `title`: the first line of the title.
    Why: under continuous batching a seat is refilled the step after it frees, prefill chunks share steps
    with decodes, and a request pushed out by a full pool waits (black) and comes back.
    """
    states, steps = schedule_states(trace, prompt_lens, preemption_mode), [step.step for step in trace]
    ids = list(states)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.3 + 0.35 * len(ids)))
    shown = _draw_schedule_rows(ax, states, steps)
    ax.set_yticks(range(len(ids)), ids)
    for i, label in enumerate(ax.get_yticklabels()):
        label.set_color(request_colour(i))
    ax.set(
        ylim=(len(ids) - 0.5, -0.5), xlim=(steps[0] - 0.5, steps[-1] + 0.5), xlabel="engine step", ylabel="request id"
    )
    num_preempted = len(preemption_events(trace))
    head = title or "Continuous batching schedule"
    ax.set_title(f"{head}: {len(steps)} steps, {num_preempted} preemptions", loc="left", fontsize=10, pad=20)
    handles = _schedule_legend(shown)
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1), ncols=len(handles), fontsize=7, frameon=False)
    ax.figure.tight_layout()
    return ax.figure


def _draw_schedule_rows(ax, states: dict[str, list[str | None]], steps: list[int]) -> set[str]:
    """One row of bars per request, a bar per run of equal states; returns the states drawn."""
    shown = set()
    for row, rid in enumerate(states):
        for state, runs in _spans(states[rid], steps).items():
            shown.add(state)
            if state == "idle":  # holds KV, fed nothing: an outline
                ax.broken_barh(runs, (row - 0.4, 0.8), facecolors="none", edgecolors=DECODE, linewidth=0.8)
            else:
                hatch = "////" if state == "swapped" else None
                ax.broken_barh(runs, (row - 0.4, 0.8), facecolors=_SCHEDULE_COLOURS[state], hatch=hatch)
    return shown


def _schedule_legend(shown: set[str]) -> list:
    handles = [
        Patch(facecolor=c, hatch="////" if s == "swapped" else None, label=_STATE_LABELS[s])
        for s, c in _SCHEDULE_COLOURS.items()
        if s in shown
    ]
    if "idle" in shown:
        handles.append(Patch(facecolor="none", edgecolor=DECODE, label=_STATE_LABELS["idle"]))
    return handles


_STATE_LABELS = {
    "waiting": "waiting",
    "prefill": "prefill chunk",
    "decode": "decode",
    "preempted": "preempted (K/V dropped)",
    "swapped": "swapped out (K/V on CPU)",
    "finished": "finished",
    "idle": "holds KV, no tokens",
}


def tokens_per_step(trace: list[StepTrace], prompt_lens: dict[str, int] | None = None) -> tuple[list[int], list[int]]:
    """(prefill tokens, decode tokens) fed in each step, split as in `schedule_states`."""
    states = schedule_states(trace, prompt_lens)
    prefill, decode = [], []
    for i, step in enumerate(trace):
        fed = [(n, states[rid][i]) for rid, n in step.scheduled.items()]
        prefill.append(sum(n for n, state in fed if state == "prefill"))
        decode.append(sum(n for n, state in fed if state == "decode"))
    return prefill, decode


def plot_tokens_per_step(
    trace: list[StepTrace], budget: int, prompt_lens: dict[str, int] | None = None, ax=None
) -> Figure:
    """Tokens fed per step, prefill chunks stacked on decodes, under the token budget (max_num_batched_tokens).

    Why: one budget serves both kinds of work. Decodes (one token per running request) go first; prefill
    chunks fill what is left, so a long prompt is spread over several steps instead of stalling the decodes.
    """
    prefill, decode = tokens_per_step(trace, prompt_lens)
    steps = [step.step for step in trace]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    ax.bar(steps, decode, width=1.0, color=DECODE, label="decode tokens", edgecolor="white", linewidth=0.3)
    ax.bar(steps, prefill, width=1.0, bottom=decode, color=PREFILL, label="prefill tokens", edgecolor="white", lw=0.3)
    ax.axhline(budget, color="black", linewidth=1, linestyle="--", label=f"max_num_batched_tokens = {budget}")
    ax.set(xlabel="engine step", ylabel="tokens fed", xlim=(steps[0] - 0.5, steps[-1] + 0.5), ylim=(0, 1.3 * budget))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    total = np.add(prefill, decode)
    full = int((total == budget).sum())
    ax.set_title(
        f"Tokens per step: {sum(prefill)} prefill + {sum(decode)} decode in {len(steps)} steps; "
        f"{total.mean() / budget:.0%} of the budget used on average, {full} steps full",
        loc="left",
        fontsize=10,
    )
    ax.legend(loc="upper right", ncols=3, fontsize=8)
    ax.figure.tight_layout()
    return ax.figure
