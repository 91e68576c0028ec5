"""Stage 1: the KV cache step by step: slots filled vs held, the pool's slots and blocks, the batch timeline.

Builds on: viz/palette.py (the colours, `request_order`), engine/stats.py (`StepTrace`), viz/schedule.py
(`preemption_events`, for the stage-5 marks in `plot_kv_over_steps`).
Read with: chapters/01-contiguous-static.md, chapters/02-paged-blocks.md (pool occupancy).

The functions only read the trace: they work for every stage that records one.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pagedlab.engine.stats import StepTrace
from pagedlab.viz.palette import (
    DECODE,
    FINISHED,
    FREE,
    PREEMPTED,
    PREFILL,
    RESERVED,
    USED,
    WAITING,
    _spans,
    request_colour,
    request_order,
)
from pagedlab.viz.schedule import preemption_events


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


# --- stage 2: blocks held per step ---------------------------------------------------------------------


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
    held = _stack_blocks_held(blocks_ax, trace, x)
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
        f"{held.mean() / num_kv_blocks:.0%} of the pool held",
        loc="left",
        fontsize=10,
    )
    if own_figure:
        blocks_ax.figure.tight_layout()
    return blocks_ax.figure


def _stack_blocks_held(ax, trace: list[StepTrace], x: np.ndarray) -> np.ndarray:
    """One band per request (in request order) of the blocks it holds, stacked; returns the blocks held per step."""
    bottom = np.zeros(len(trace))
    for i, rid in enumerate(request_order(trace)):
        held = np.array([len(step.block_tables.get(rid, ())) for step in trace])
        if held.any():
            top = bottom + held
            ax.fill_between(x, np.repeat(bottom, 2), np.repeat(top, 2), color=request_colour(i), linewidth=0)
            bottom = top
    return bottom
