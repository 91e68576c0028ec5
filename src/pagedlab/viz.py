"""Stage 1: drawings of the engine's trace, shared by notebooks and `pagedlab figures`.

Builds on: stats.py (`StepTrace`, recorded by `LLM(..., record_trace=True)` into `llm.engine.trace`).
Read with: chapters/01-contiguous-static.md.

Every drawing in every chapter uses one palette, so a colour means one thing throughout:

    FREE      a slot (or block) no request holds
    USED      a slot holding a computed token's K/V
    RESERVED  a slot a request holds that holds no token (not yet, or never)
    SHARED    a block held by several requests (ref_cnt > 1, stage 3)
    CACHED    a free block that still keeps its hash for reuse (stage 4)

A batch timeline adds the request states PREFILL, DECODE, WAITING and FINISHED.
The functions only read the trace: they work for every stage that records one.
"""

from __future__ import annotations

import os
import sys

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

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


def plot_kv_over_steps(trace: list[StepTrace], num_kv_blocks: int, block_size: int) -> Figure:
    """The whole pool, step by step: slots holding tokens, held in vain, and free.

    Why: the gap between the blue and orange tops is the waste; free slots while
    requests wait are the cost of static batching (stage 5 removes that).
    """
    steps = [step.step for step in trace]
    used = np.array([sum(step.kv_used.values()) for step in trace])
    held = np.array([sum(step.kv_held.values()) for step in trace])
    capacity = num_kv_blocks * block_size
    fig, ax = plt.subplots(figsize=(8, 3.5))
    # step="mid": each step is a flat band of width 1 centred on its number
    ax.fill_between(steps, 0, used, step="mid", color=USED, label="used (holds a token)")
    ax.fill_between(steps, used, held, step="mid", color=RESERVED, label="reserved but unused")
    ax.fill_between(steps, held, capacity, step="mid", color=FREE, label="free")
    ax.axhline(capacity, color="black", linewidth=1, linestyle="--", label=f"capacity ({num_kv_blocks} blocks)")
    ax.set(xlabel="engine step", ylabel="KV slots", xlim=(steps[0] - 0.5, steps[-1] + 0.5), ylim=(0, 1.2 * capacity))
    ax.set_title(
        f"KV pool per step: on average {held.mean() / capacity:.0%} held, {used.mean() / capacity:.1%} holds tokens"
    )
    ax.legend(loc="upper right", ncols=4, fontsize=8)
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
