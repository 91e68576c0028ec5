"""Stage 5: a continuous batching schedule: request states, the Gantt chart, tokens per step, preemptions.

Builds on: viz/palette.py (the colours, `request_order`, `_spans`), engine/stats.py (`StepTrace`),
sched/continuous.py (what the trace records: chunks, preemption by recompute or swap).
Read with: chapters/05-continuous-batching.md.

`schedule_states` reads each request's state per step from the trace alone; the plots draw those states.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pagedlab.engine.stats import StepTrace
from pagedlab.viz.palette import (
    DECODE,
    FINISHED,
    PREEMPTED,
    PREFILL,
    SWAPPED,
    WAITING,
    _spans,
    request_colour,
    request_order,
)


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
