"""Stage 6: the Triton kernels drawn: which program reads which blocks (V1, V2), and their parity with torch.

Builds on: viz/palette.py (the colours); what it draws is measured by lessons/kernels.py.
Read with: chapters/06-triton-kernel.md.

`draw_decode_programs(plan)` draws one decode step as the launcher set it up. No number in it is typed by hand:
a LaunchPlan (lessons/kernels.py, `launch_plan`) holds the case's block table and seq_lens, the grids and
constexprs recorded from a dry launch of `paged_decode`, and `use_v1`'s choice:

    V1   programs (i, h)    block_table[0]       k_cache, 10 blocks of 16 slots
         [0,3] ---------->  [ 4 ][ 3 ][ 6 ]  ->  blk 4 (p 0-15)  blk 3 (p 16-31)  blk 6 (p 32-36, 37-47 masked)
    V2   programs (i, h, part): | part 0 | part 1 | part 2 |  -> (m_p, l_p, out_p)  -> reduce (i, h) -> out

`draw_parity(rows)` plots the max |error| of every parity case (lessons/kernels.py, `parity_rows`) against its
tolerance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from pagedlab.viz.palette import CACHED, FREE, RESERVED, USED, _text_colour, request_colour

if TYPE_CHECKING:
    from pagedlab.lessons.kernels import LaunchPlan

FS, FS_SMALL = 9.5, 8.5  # the drawing's text: readable at the chapters' width


# --- drawing helpers ------------------------------------------------------------------------------------------


def _box(ax, x, y, w, h, colour, text="", alpha=1.0, edge="white", lw=1.0, size=FS) -> None:
    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, alpha=alpha, edgecolor="none", zorder=2))
    ax.add_patch(Rectangle((x, y), w, h, facecolor="none", edgecolor=edge, linewidth=lw, zorder=3))
    if text:
        ink = _text_colour(colour) if alpha > 0.5 else "black"
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=ink, zorder=4)


def _arrow(ax, start, end, colour="black", rad=0.0, lw=1.2) -> None:
    style = dict(arrowstyle="-|>", color=colour, lw=lw, shrinkA=0, shrinkB=0, connectionstyle=f"arc3,rad={rad}")
    ax.annotate("", xy=end, xytext=start, arrowprops=style, zorder=1)


def _bracket(ax, x0, x1, y, text, colour="black") -> None:
    """A bracket over [x0, x1] at height y, `text` above its middle."""
    ax.plot([x0, x0, x1, x1], [y - 0.12, y, y, y - 0.12], color=colour, lw=1.0)
    ax.text((x0 + x1) / 2, y + 0.08, text, ha="center", va="bottom", fontsize=FS, color=colour)


def _slot_state(plan: LaunchPlan, b: int, j: int, s: int) -> str:
    """Slot s of request b's j-th block: 'read' (p < seq_len), 'masked' (the rest of its last block: the tile
    loads it with mask_n false) or 'unread' (a table entry past the context, never loaded)."""
    p, start = j * plan.const("BLOCK_SIZE") + s, j * plan.const("BLOCK_SIZE")
    return "read" if p < plan.seq_lens[b] else "masked" if start < plan.seq_lens[b] else "unread"


def _slot_cell(ax, x, y, w, h, colour, state) -> None:
    alpha = {"read": 1.0, "masked": 0.3, "unread": 0.15}[state]
    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, alpha=alpha, edgecolor="none", zorder=2))
    if state == "masked":
        ax.add_patch(Rectangle((x, y), w, h, facecolor="none", edgecolor="black", lw=0, hatch="////", zorder=2))


def _bare(ax, width: float, bottom: float, top: float) -> None:
    ax.set_xlim(0, width)
    ax.set_ylim(bottom, top)
    ax.axis("off")


# --- V1 -------------------------------------------------------------------------------------------------------

ROW_Y = 4.9  # the bottom of the first request's row, in both panels' grids and V1's table
ROW_STEP = 1.0  # one request per row, downwards
CELL = 0.8  # a program's (or a table entry's) height
POOL_Y = 8.0  # the bottom of V1's pool of physical blocks
V1_Y, V2_Y = (1.0, 9.9), (0.8, 8.1)  # each panel's data rows, bottom to top


def _program_grid(ax, plan: LaunchPlan, focus: tuple[int, int], x0: float) -> float:
    """V1's grid, a cell per (i, h): returns the x of its right edge."""
    num_reqs, num_heads = plan.v1.grid
    qpk = plan.const("QUERIES_PER_KV")
    for i in range(num_reqs):
        y = ROW_Y - i * ROW_STEP
        ax.text(x0 - 0.15, y + CELL / 2, f"i={i}", ha="right", va="center", fontsize=FS)
        for h in range(num_heads):
            lw, edge = (2.5, "black") if (i, h) == focus else (1.0, "white")
            _box(ax, x0 + h * 0.9, y, CELL, CELL, request_colour(i), f"{i},{h}", edge=edge, lw=lw, size=FS_SMALL)
    for h in range(num_heads):
        ax.text(x0 + h * 0.9 + CELL / 2, ROW_Y + 0.95, f"h={h}", ha="center", fontsize=FS)
        ax.text(x0 + h * 0.9 + CELL / 2, ROW_Y - num_reqs * ROW_STEP + 0.6, str(h // qpk), ha="center", fontsize=FS)
    bottom = ROW_Y - num_reqs * ROW_STEP + 0.6
    ax.text(x0 - 0.15, bottom, f"KV head h // {qpk}:", ha="right", fontsize=FS)
    ax.text(x0 - 1.0, ROW_Y + 1.45, f"grid = {plan.v1.grid}: program_id(0) = i, program_id(1) = h", fontsize=FS)
    return x0 + num_heads * 0.9 - 0.1


def _block_table(ax, plan: LaunchPlan, focus_b: int, x0: float, cw: float) -> list[float]:
    """Every row of block_table, entries past the context pale; returns the x centre of each of its columns."""
    width = len(plan.block_table[0])
    for b, row in enumerate(plan.block_table):
        y = ROW_Y - b * ROW_STEP
        for j, block in enumerate(row):
            read = _slot_state(plan, b, j, 0) != "unread"
            edge, lw = ("black", 2.0) if b == focus_b and read else ("white", 1.0)
            colour, alpha = request_colour(b), 1.0 if read else 0.2
            _box(ax, x0 + j * cw, y, cw - 0.05, CELL, colour, str(block), alpha=alpha, edge=edge, lw=lw)
        ax.text(x0 + width * cw + 0.2, y + CELL / 2, f"seq_lens[{b}] = {plan.seq_lens[b]}", va="center", fontsize=FS)
    below = ROW_Y - (len(plan.block_table) - 1) * ROW_STEP - 0.3
    for j in range(width):
        ax.text(x0 + j * cw + cw / 2, below, str(j), ha="center", fontsize=FS)
    size = f"[B={len(plan.block_table)}, MB={width}]"
    ax.text(x0, below - 0.45, f"block_table {size}, column = logical block j (pale: never read)", fontsize=FS)
    return [x0 + j * cw + cw / 2 for j in range(width)]


def _pool(ax, plan: LaunchPlan, x0: float, y: float, pw: float) -> list[float]:
    """The physical blocks, slot by slot in their request's colour; returns each block's x centre."""
    bs, owner = plan.const("BLOCK_SIZE"), {}
    for b, row in enumerate(plan.block_table):
        owner.update({block: (b, j) for j, block in enumerate(row)})
    centres = []
    for block in range(plan.num_blocks):
        x = x0 + block * (pw + 0.15)
        for s in range(bs):
            if block in owner:
                b, j = owner[block]
                _slot_cell(ax, x + s * pw / bs, y, pw / bs, 0.9, request_colour(b), _slot_state(plan, b, j, s))
            else:  # no table holds it: solid grey
                _slot_cell(ax, x + s * pw / bs, y, pw / bs, 0.9, FREE, "read")
        ax.add_patch(Rectangle((x, y), pw, 0.9, facecolor="none", edgecolor="black", lw=0.8, zorder=3))
        ax.text(x + pw / 2, y + 1.0, str(block), ha="center", va="bottom", fontsize=FS)
        centres.append(x + pw / 2)
    what = f"BLOCK_SIZE = {bs} slots; a slot holds KVH x D = {plan.num_kv_heads} x {plan.head_dim} numbers"
    ax.text(x0, y + 1.45, f"k_cache (and v_cache): {plan.num_blocks} physical blocks of {what}", fontsize=FS)
    return centres


def _walk_lines(plan: LaunchPlan, focus: tuple[int, int]) -> list[str]:
    """Program `focus`'s loop, tile by tile, as the chapter writes it."""
    (b, h), bs, bn, qpk = focus, plan.const("BLOCK_SIZE"), plan.const("BLOCK_N"), plan.const("QUERIES_PER_KV")
    n, row = plan.seq_lens[b], plan.block_table[b]
    lines = [f"program (i={b}, h={h}): seq_len = {n}", f"  reads KV head h // {qpk} = {h // qpk}"]
    for k, start in enumerate(range(0, n, bn)):
        first, end = start // bs, min(-(-min(start + bn, n) // bs), len(row))  # the table entries it loads
        if end - first == 1:
            lines.append(f"tile {k}: p {start}-{start + bn - 1} -> block_table[{b}][{first}] = {row[first]}")
        else:
            ids = ", ".join(map(str, row[first:end][:4])) + (", ..." if end - first > 4 else "")
            lines.append(f"tile {k}: p {start}-{start + bn - 1} -> blocks [{ids}]")
        if start + bn > n:
            lines.append(f"  mask_n: p >= {n} load 0, score -inf")
    return [*lines, f"out[t, {h}, :] = acc / l"]


def _table_to_pool(ax, plan: LaunchPlan, b: int, columns: list[float], blocks: list[float], cw: float) -> None:
    """An arrow from each table entry request b's program loads to its physical block, labelled with its tile."""
    bs, bn, n = plan.const("BLOCK_SIZE"), plan.const("BLOCK_N"), plan.seq_lens[b]
    top, pool = ROW_Y + CELL, POOL_Y
    for j, block in enumerate(plan.block_table[b][: -(-n // bs)]):  # the loop stops at seq_len
        _arrow(ax, (columns[j], top), (blocks[block], pool), request_colour(b), lw=1.5)
        if bs >= bn:  # whole tiles within one block: say which on the arrow, near its block (arrows cross lower)
            first, last = j * bs // bn, (min((j + 1) * bs, n) - 1) // bn
            tiles = f"tile {first}" if first == last else f"tiles {first}-{last}"
            label = f"{tiles}\np {j * bs}-{min((j + 1) * bs, n) - 1}"
            at = (0.25 * columns[j] + 0.75 * blocks[block], top + 0.75 * (pool - top))
            ax.text(*at, label, ha="center", va="center", fontsize=FS_SMALL, bbox=dict(fc="white", ec="none", pad=0.5))
    if bs < bn:  # several blocks a tile: bracket each tile over the row instead
        for k, start in enumerate(range(0, n, bn)):
            left = columns[0] - cw / 2
            x0, x1 = left + start // bs * cw, left + -(-min(start + bn, n) // bs) * cw  # whole entries
            _bracket(ax, x0 + 0.05, x1 - 0.05, top + 0.3, f"tile {k}")


def _draw_v1(ax, plan: LaunchPlan, focus: tuple[int, int]) -> None:
    _bare(ax, 25, *V1_Y)
    b = focus[0]
    right = _program_grid(ax, plan, focus, x0=2.3)
    cw = min(1.9, 7.0 / len(plan.block_table[0]))
    columns = _block_table(ax, plan, b, 7.0, cw)
    _arrow(ax, (right + 0.1, ROW_Y - b * ROW_STEP + CELL / 2), (6.9, ROW_Y - b * ROW_STEP + CELL / 2))
    blocks = _pool(ax, plan, 0.6, POOL_Y, min(2.0, 23.5 / plan.num_blocks - 0.15))
    _table_to_pool(ax, plan, b, columns, blocks, cw)
    ax.text(16.8, ROW_Y + CELL, "\n".join(_walk_lines(plan, focus)), va="top", fontsize=FS - 0.5, family="monospace")
    handles = [
        Patch(facecolor=request_colour(b), label="read: p < seq_lens[b]"),
        Patch(facecolor=request_colour(b), alpha=0.3, hatch="////", label="masked: p >= seq_len (its last block)"),
        Patch(facecolor=request_colour(b), alpha=0.15, label="in block_table, never read"),
        Patch(facecolor=FREE, label="no request's block"),
    ]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, -0.02), ncols=4, fontsize=FS, frameon=False)
    title = "V1  paged_decode_v1_kernel: one program per (request i, query head h) walks its block_table row, "
    ax.set_title(title + f"BLOCK_N = {plan.const('BLOCK_N')} positions a tile", loc="left", fontsize=10)


# --- V2 -------------------------------------------------------------------------------------------------------


def _v2_grid(ax, plan: LaunchPlan, focus: tuple[int, int], x0: float) -> None:
    """V2's programs of head focus[1], a cell per (i, part): grey where the partition holds no context."""
    num_reqs, num_heads, parts = plan.v2.grid
    for i in range(num_reqs):
        y = ROW_Y - i * ROW_STEP
        ax.text(x0 - 0.15, y + CELL / 2, f"i={i}", ha="right", va="center", fontsize=FS)
        for p in range(parts):
            live = p < plan.active_parts(i)
            lw, edge = (2.5, "black") if i == focus[0] and live else (1.0, "white")
            colour, text = (request_colour(i), f"{i},{focus[1]},{p}") if live else (FREE, "-")
            _box(ax, x0 + p * 0.9, y, CELL, CELL, colour, text, edge=edge, lw=lw, size=FS_SMALL - 0.5)
    for p in range(parts):
        ax.text(x0 + p * 0.9 + CELL / 2, ROW_Y + 0.95, f"part={p}", ha="center", fontsize=FS_SMALL)
    idle = num_heads * sum(parts - plan.active_parts(i) for i in range(num_reqs))
    ax.text(x0 - 1.0, ROW_Y + 1.45, f"grid = {plan.v2.grid}; head h = {focus[1]} drawn", fontsize=FS)
    note = f"program_id(2) = part\ngrey: part * PARTITION_SIZE >= seq_len,\nreturns at once ({idle} of "
    ax.text(
        x0 - 1.0, ROW_Y - num_reqs * ROW_STEP + 0.2, note + f"{num_reqs * num_heads * parts})", va="top", fontsize=FS
    )


def _partitions(ax, plan: LaunchPlan, focus: tuple[int, int], x0: float, strip_y: float) -> None:
    """Request focus[0]'s positions cut into partitions; under each, its program, its scratch entry and the reduce."""
    (b, h), ps, parts = focus, plan.const("PARTITION_SIZE"), plan.v2.grid[2]
    n, unit = plan.seq_lens[b], 10.5 / (parts * ps)  # unit: the width of one position
    for p in range(parts * ps):
        _slot_cell(ax, x0 + p * unit, strip_y, unit, 0.5, request_colour(b), "read" if p < n else "masked")
    ax.add_patch(Rectangle((x0, strip_y), parts * ps * unit, 0.5, fc="none", ec="black", lw=0.8, zorder=3))
    ax.text(x0, strip_y + 1.2, f"request {b}'s positions p, seq_len = {n}, PARTITION_SIZE = {ps}", fontsize=FS)
    reduce_x = x0 + 5.25  # where the arrows into the reduce meet
    for p in range(parts):
        left, mid = x0 + p * ps * unit, x0 + (p + 0.5) * ps * unit
        live = p * ps < n
        label = f"part {p}: p {p * ps}-{min((p + 1) * ps, n) - 1}" if live else f"part {p}: empty"
        _bracket(ax, left + 0.05, left + ps * unit - 0.05, strip_y + 0.65, label, "black" if live else "grey")
        if not live:
            continue  # its programs return at once
        _arrow(ax, (mid, strip_y), (mid, 5.35))
        _box(ax, mid - 1.3, 4.6, 2.6, 0.75, request_colour(b), f"program ({b}, {h}, {p})")
        _arrow(ax, (mid, 4.6), (mid, 3.85))
        _box(ax, mid - 1.3, 3.1, 2.6, 0.75, "white", f"m_{p}, l_{p}, out_{p}", edge="black")
        _arrow(ax, (mid, 3.1), (reduce_x, 1.95))
    _box(ax, reduce_x - 3.5, 1.2, 7.0, 0.75, "black", f"paged_decode_reduce_kernel, program ({b}, {h})")
    _arrow(ax, (reduce_x + 3.5, 1.575), (reduce_x + 4.35, 1.575))
    ax.text(reduce_x + 4.45, 1.575, f"out[t, {h}, :]", va="center", fontsize=FS)


def _draw_v2(ax, plan: LaunchPlan, focus: tuple[int, int]) -> None:
    _bare(ax, 25, *V2_Y)
    _v2_grid(ax, plan, focus, x0=2.3)
    strip_y = 6.5  # the bottom of the positions strip
    _partitions(ax, plan, focus, 7.0, strip_y)
    tmp, stats, _ = plan.v2.shapes[:3]  # the launcher's scratch, its first three arguments: tmp_out, max, sum
    lines = [
        "scratch, fp32, one entry per program:",
        f"  max_ptr, sum_ptr {list(stats)}",
        f"  tmp_out_ptr      {list(tmp)}",
        "  [N, H, P] and [N, H, P, BLOCK_D]",
        "",
        f"reduce, grid = {plan.reduce.grid}:",
        "  M   = max_p m_p",
        "  w_p = l_p * exp(m_p - M)",
        "  out = sum_p w_p * out_p / sum_p w_p",
    ]
    ax.text(18.3, strip_y + 0.5, "\n".join(lines), va="top", fontsize=FS - 0.5, family="monospace")
    title = "V2  paged_decode_v2_kernel: one program per (request i, query head h, partition part), then a reduce"
    ax.set_title(title, loc="left", fontsize=10)


def draw_decode_programs(plan: LaunchPlan, focus: tuple[int, int] | None = None) -> Figure:
    """How paged_decode maps one decode step onto programs (a LaunchPlan): V1 on top, V2 below.

    `focus` is the program whose walk is drawn (default: request 0, the last query head, so GQA shows). Every
    number comes from the plan: the case's block table and seq_lens, the grids and constexprs of a dry launch of
    each version, and use_v1's choice, named in the title.
    """
    focus = focus or (0, plan.v1.grid[1] - 1)
    ratios = [V1_Y[1] - V1_Y[0], V2_Y[1] - V2_Y[0]]  # one data unit is as tall in both panels
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12.5, 9.6), gridspec_kw=dict(height_ratios=ratios))
    fig.subplots_adjust(left=0.01, right=0.99, top=0.9, bottom=0.01, hspace=0.1)
    _draw_v1(top, plan, focus)
    _draw_v2(bottom, plan, focus)
    lens, ps, num_heads = plan.seq_lens, plan.const("PARTITION_SIZE"), plan.v1.grid[1]
    picked = "V1" if plan.picks_v1 else "V2"
    first = f"One decode step of {len(lens)} requests, seq_lens = {lens}, H = {num_heads} query heads over KVH = "
    first += f"{plan.num_kv_heads}, BLOCK_SIZE = {plan.const('BLOCK_SIZE')}"
    second = f"use_v1(max_seq_len={max(lens)}, num_reqs={len(lens)}, num_heads={num_heads}, partition_size={ps}) is "
    fig.suptitle(f"{first}\n{second}{plan.picks_v1}: paged_decode runs {picked} for it", fontsize=11.5, y=0.985)
    return fig


# --- parity ---------------------------------------------------------------------------------------------------


DTYPE_COLOURS = {"float32": USED, "float16": RESERVED, "bfloat16": CACHED}
HEAD_MARKERS = {None: "s", "2/2": "o", "4/1": "^"}
EXACT_AT = 1e-9  # where a bit-exact case (error 0) sits on the log axis, below a dotted line


def _group(row: dict) -> str:
    return f"{row['kernel']} {row['version']}" if row["version"] else row["kernel"]


def _plot_group(ax, rows: list[dict], x: float) -> float:
    """One kernel's markers from x on, fp32 first; its worst error per dtype above them. Returns the group's centre."""
    order = list(DTYPE_COLOURS)
    rows = sorted(rows, key=lambda r: (order.index(r["dtype"]), r["block_size"], r["heads"] or ""))
    for k, r in enumerate(rows):
        colour, err = DTYPE_COLOURS[r["dtype"]], max(r["max_abs_err"], EXACT_AT)
        face = colour if r["block_size"] > 1 else "white"
        ax.plot(x + k, err, HEAD_MARKERS[r["heads"]], ms=8, mec=colour, mfc=face, mew=1.6, ls="none")
    centre = x + (len(rows) - 1) / 2
    worst = {
        d: max(r["max_abs_err"] for r in rows if r["dtype"] == d) for d in order if any(r["dtype"] == d for r in rows)
    }
    if not any(worst.values()):
        text = "all exactly 0\n(tol 0: torch.equal)"
    else:
        text = "\n".join(f"{d}: worst {w:.1e}" for d, w in worst.items())
    ax.text(centre, 1.5e-2, text, ha="center", va="bottom", fontsize=8.5)
    return centre


def draw_parity(rows: list[dict], title: str | None = None) -> Figure:
    """The max |error| of every parity case (lessons/kernels.py's rows) on a log axis, grouped by kernel, with
    each dtype's tolerance as a line. Colour: dtype; marker: heads (H/KVH; a square for store_kv); hollow: blocks
    of 1."""
    fig, ax = plt.subplots(figsize=(10, 5))
    fig.subplots_adjust(left=0.08, right=0.8, top=0.9, bottom=0.1)
    x, ticks = 0.0, []
    for group in dict.fromkeys(_group(r) for r in rows):  # the rows' own order
        mine = [r for r in rows if _group(r) == group]
        ticks.append((_plot_group(ax, mine, x), group))
        x += len(mine) + 1.5
    for dtype, tol in sorted({(r["dtype"], r["tol"]) for r in rows if r["tol"]}):
        ax.axhline(tol, color=DTYPE_COLOURS[dtype], ls="--", lw=1.2)
        ax.text(x - 1.6, tol * 1.25, f"{dtype} tolerance {tol:.0e}", fontsize=8.5, ha="right")
    ax.axhline(EXACT_AT * 3, color="dimgray", ls=":", lw=1.0)
    ax.set_yscale("log")
    ax.set_ylim(EXACT_AT / 2.5, 1.5e-1)
    ax.set_yticks([EXACT_AT] + [10.0**e for e in range(-8, 0)], ["0"] + [f"1e{e}" for e in range(-8, 0)], fontsize=8.5)
    ax.minorticks_off()
    ax.set_xlim(-1.0, x - 1.0)
    ax.set_xticks([t for t, _ in ticks], [g for _, g in ticks], fontsize=9.5)
    ax.set_ylabel("max |error| vs the fp32 torch reference", fontsize=9)
    ax.grid(axis="y", color=FREE, lw=0.6)
    ax.legend(handles=_parity_legend(rows), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)
    where = rows[0].get("device", "") if rows else ""
    ax.set_title(title or f"The Triton kernels vs torch, {len(rows)} cases ({where})", fontsize=10.5)
    return fig


def _parity_legend(rows: list[dict]) -> list:
    handles = [Patch(facecolor=c, label=d) for d, c in DTYPE_COLOURS.items() if any(r["dtype"] == d for r in rows)]
    for heads in [h for h in ("2/2", "4/1") if any(r["heads"] == h for r in rows)]:
        handles.append(Line2D([], [], marker=HEAD_MARKERS[heads], color="dimgray", ls="none", label=f"H/KVH {heads}"))
    if any(r["heads"] is None for r in rows):
        handles.append(Line2D([], [], marker="s", color="dimgray", ls="none", label="store_kv (KVH 2)"))
    sizes = {r["block_size"] for r in rows}
    if len(sizes) > 1:  # the fill tells them apart
        handles.append(Line2D([], [], marker="o", mfc="dimgray", mec="dimgray", ls="none", label="filled: blocks > 1"))
        handles.append(Line2D([], [], marker="o", mfc="white", mec="dimgray", ls="none", label="hollow: blocks of 1"))
    return handles
