"""Stage 1: the one palette of every drawing, the request colours and order, and helpers the drawings share.

Builds on: engine/stats.py (`StepTrace`, recorded by `LLM(..., record_trace=True)` into `llm.engine.trace`).
Read with: chapters/01-contiguous-static.md.

Every drawing in every chapter uses one palette, so a colour means one thing throughout:

    FREE      a slot (or block) no request holds
    USED      a slot holding a computed token's K/V
    RESERVED  a slot a request holds that holds no token (not yet, or never)
    SHARED    a block held by several requests (ref_cnt > 1, stage 3)
    CACHED    a free block that still keeps its hash for reuse (stage 4)

A batch timeline adds the request states PREFILL, DECODE, WAITING and FINISHED; a stage-5 schedule adds
PREEMPTED (K/V dropped, to be recomputed) and SWAPPED (K/V in the CPU swap pool).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import matplotlib
from matplotlib.colors import to_rgba

from pagedlab.engine.stats import StepTrace


def _use_agg_without_display() -> None:
    """Scripts and CI on a headless Linux draw off-screen; a notebook keeps its inline backend."""
    headless = sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if headless and "MPLBACKEND" not in os.environ and "ipykernel" not in sys.modules:
        matplotlib.use("Agg")


_use_agg_without_display()


def save_figure(fig, path: str | Path, dpi: int = 120, tight: bool = True) -> Path:
    """Write a matplotlib figure as a PNG (its folder made if needed; margins trimmed when `tight`) and close it.
    Every figure of figures/, a lesson's or a bench's, is written here."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return path


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
# Requests get colours of their own (Paul Tol's "muted" scheme, also safe for colour-vision deficiencies), none of
# them a state's above: a request drawn in a colour is never mistaken for "shared", "cached" or "preempted".
_REQUEST_COLOURS = ("#332288", "#ddcc77", "#882255", "#88ccee", "#999933", "#cc6677", "#117733", "#aa4499")
STATE_COLOURS = (FREE, USED, RESERVED, SHARED, CACHED, PREFILL, WAITING, PREEMPTED, SWAPPED)


def request_colour(index: int) -> str:
    """The colour of the index-th request (by first appearance), cycling through eight, none of them a state's."""
    return _REQUEST_COLOURS[index % len(_REQUEST_COLOURS)]


def request_order(trace: list[StepTrace]) -> list[str]:
    """Request ids in order of first appearance (waiting or running), so every plot lists them alike."""
    seen: dict[str, None] = {}
    for step in trace:
        seen.update(dict.fromkeys(step.running + step.waiting))
    return list(seen)


def _text_colour(background: str) -> str:
    """Black on light colours, white on dark ones (relative luminance, ITU-R BT.709 weights)."""
    r, g, b, _ = to_rgba(background)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


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
