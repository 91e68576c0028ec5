"""Stage 2: block tables and the pool of physical blocks they point into, in one step of the trace.

Builds on: viz/palette.py (the colours), engine/stats.py (`StepTrace.block_tables`, `kv_used`); optionally
kv/prefix.py (stage 4: `cached_block_ids`, `prefix_hit_blocks`) and kv/swap.py (stage 5: `swapped_block_ids`).
Read with: chapters/02-paged-blocks.md, chapters/04-prefix-caching.md (cache hits and cached-but-free blocks),
chapters/05-continuous-batching.md (the CPU swap pool).

`plot_block_tables` draws, for block_size 8 and 4 pool columns (arrows for req 0 only):

    Block tables in step 7              Block pool: 5 of 8 blocks held
             0    1    2
    req 0  [ 3 ][ 0 ][ 5 ]  5/8         [ 0 ][ 1 ][ 2 ][ 3 ]
    req 1  [ 1 ][ 4 ]       2/8         [ 4 ][ 5 ][ 6 ][ 7 ]

Each cell is one block: solid for the slots that hold tokens, pale for the rest.
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Patch, Rectangle

from pagedlab.engine.stats import StepTrace
from pagedlab.viz.palette import CACHED, FREE, SHARED, SWAPPED, _text_colour, request_colour


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

    Left: a row per request, a cell per logical block, labelled with the physical block id. Right: every physical
    block, coloured by the request holding it (SHARED, hatched, if several; FREE if none). A block is solid for the
    slots that hold tokens and pale for the rest, so the last block of each request shows its internal fragmentation;
    "5/8" beside the row counts the last block's used slots. `order` fixes the request colours (default: the table's
    order); arrows go from the logical to the physical blocks of the requests in `arrows_for` (default: the first).
    Stage 4 (prefix caching), both optional: `hits` maps a request to how many leading blocks of its table were
    prefix-cache hits (outlined in black and marked "hit", see `prefix_hit_blocks`); `cached` lists the blocks that
    carry a block hash (see `cached_block_ids`): those no table holds are drawn in CACHED colour, free but still
    findable by their hash. Stage 5 (swap), optional: with `num_swap_blocks` > 0 a second lane under the pool draws
    the CPU swap pool; the blocks in `swapped` (request_id -> its CPU blocks, see `swapped_block_ids`) are in
    SWAPPED colour and labelled with the request whose K/V they keep while it waits.
    Why: a request's blocks need not be adjacent or in order; its block table is all that ties them.
    """
    ids, swapped = list(step.block_tables), swapped or {}
    colour = {rid: request_colour((order or ids).index(rid)) for rid in ids}
    fig, (left, right), widest, rows = _tables_and_pool_axes(step, num_kv_blocks, pool_columns, num_swap_blocks)
    cells = _draw_tables(left, step, ids, colour, block_size, widest, rows)
    owners = _draw_pool(right, step, ids, colour, block_size, num_kv_blocks, pool_columns, set(cached))
    hit_blocks = _mark_hits(left, right, step, hits or {}, pool_columns)
    if num_swap_blocks:  # one blank row between the pool and the swap lane
        _draw_swap_pool(right, swapped, num_swap_blocks, pool_columns, top=-(-num_kv_blocks // pool_columns) + 1)
    _draw_arrows(fig, (left, cells), right, step, ids[:1] if arrows_for is None else arrows_for, pool_columns)
    handles = _block_legend(owners, set(cached), hit_blocks, bool(swapped))
    _title_and_legend(fig, (left, right), f"{len(owners)} of {num_kv_blocks} blocks held", step, handles)
    return fig


def _tables_and_pool_axes(step: StepTrace, num_kv_blocks: int, columns: int, num_swap_blocks: int) -> tuple:
    """A figure with the tables' axes (left) and the pool's (right), both as tall as the taller of the two.

    Returns (figure, (left, right), the longest table in blocks, the rows each axes spans).
    """
    widest = max((len(blocks) for blocks in step.block_tables.values()), default=1)
    pool_rows = -(-num_kv_blocks // columns)
    swap_rows = -(-num_swap_blocks // columns)
    rows = max(len(step.block_tables), pool_rows + (swap_rows + 1 if swap_rows else 0))
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(1.2 + 0.45 * (widest + 2 + columns), 1.4 + 0.45 * rows),
        gridspec_kw={"width_ratios": [widest + 2, columns]},
    )
    return fig, (left, right), widest, rows


def _draw_arrows(fig, tables: tuple, pool_ax, step: StepTrace, rids: list[str], columns: int) -> None:
    """An arrow from each logical block of the requests `rids` to its physical block; `tables`: (axes, cells)."""
    tables_ax, cells = tables
    for rid in rids:
        for i, block_id in enumerate(step.block_tables[rid]):
            y, x = divmod(block_id, columns)
            _arrow(fig, (tables_ax, cells[rid][i]), (pool_ax, (x, y)), f"arrow:{rid}:{i}")


def _title_and_legend(fig, axes: tuple, pool_held: str, step: StepTrace, handles: list) -> None:
    """Titles over the tables and the pool (`pool_held`: "5 of 16 blocks held"), the legend under both."""
    left, right = axes
    left.set_title(f"Block tables in step {step.step}", loc="left", fontsize=10)
    right.set_title(f"Block pool: {pool_held}", loc="left", fontsize=10)
    fig.legend(handles=handles, loc="lower right", ncols=max(2, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))


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


# --- the inputs of plot_block_tables' optional stage-4 and stage-5 arguments -------------------------------


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
