"""Stage 1: one recorded step drawn in 80 columns of a terminal: `pagedlab demo`'s frame, and `serve --live`'s.

Builds on: engine/stats.py (StepTrace), engine/events.py (what changed in a step).
Read with: README.md, chapters/05-continuous-batching.md.

A frame is drawn from the recorded step alone (and the text each request had
by then), so `--step` can go back through the steps already run:

    step 6 · stage 5 (continuous) · 2/10 finished
    waiting 6 7 8 9 · running 0 2 3 5 · seats 4/6
    KV pool ███████████████████████████░  23/24 blocks · fed 20 tokens: 16 prefill, 4 decode
     id prompt       phase        KV used/held       blocks          text so far
      5 First Citi…  prefill +16  ████████░ 72/80    2-3,8-9,14-15…  ⏎Second Cit
    what changed
      admitted 5 (refill: 4 finished in step 5)
      prefix-cache hit 5: 2-3,8-9,14-15,19 (56 tokens not recomputed)
      ...

In the waiting queue a preempted request is marked * (its K/V dropped, to
be recomputed) or ~ (its K/V in the CPU swap pool).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pagedlab.engine.events import StepEvent, block_list, step_events
from pagedlab.engine.stats import StepTrace

PREEMPTED_MARK = "*"  # stage 5: preempted, its K/V dropped (recompute)
SWAPPED_MARK = "~"  # stage 5: preempted, its K/V in the CPU swap pool
TEXT_CHARS = 16  # the tail of each request's text shown in a frame
PROMPT_CHARS = 11


def render_frame(trace: Sequence[StepTrace], index: int, config, prompts: dict[str, str], texts: dict[str, str]):
    """Step trace[index] as a rich renderable of at most 80 columns."""
    t = trace[index]
    done = sum(len(s.finished) for s in trace[: index + 1])
    header = Text(f"step {t.step} · stage {config.stage} ({config.stage_name}) · {done}/{len(prompts)} finished")
    header.stylize("bold")
    return Group(
        header,
        queue_line(t, config),
        pool_line(t, config),
        request_table(t, prompts, texts),
        changes(step_events(trace, index, config)),
    )


def queue_line(t: StepTrace, config) -> Text:
    return Text.assemble(
        ("waiting ", "bold"),
        waiting_labels(t) or "-",
        " · ",
        ("running ", "bold"),
        " ".join(t.running) or "-",
        f" · seats {len(t.running)}/{config.max_num_seqs}",
    )


def waiting_labels(t: StepTrace) -> str:
    """The waiting queue as ids; a preempted request is marked * (K/V dropped) or ~ (swapped out)."""
    swapped, preempted = set(t.swapped), set(t.were_preempted)
    return " ".join(
        rid + (SWAPPED_MARK if rid in swapped else PREEMPTED_MARK if rid in preempted else "") for rid in t.waiting
    )


def pool_size(t: StepTrace, config) -> int:
    """Blocks requests can hold: the pool, less a sliding window's null block (never free and never held, so
    `used` could never reach num_kv_blocks); stage 1 has regions, no pool and no null block."""
    return config.num_kv_blocks - (t.free_queue is not None and config.sliding_window > 0)


def pool_line(t: StepTrace, config) -> Text:
    used, total = t.num_used_blocks, pool_size(t, config)
    fed = sum(t.scheduled.values())
    prefill = sum(t.scheduled[rid] for rid in t.prefills)
    return Text.assemble(
        ("KV pool ", "bold"),
        bar(used / total, width=20),
        f" {used}/{total} blocks",
        f" · fed {fed} = {prefill} prefill + {fed - prefill} decode",
    )


def request_table(t: StepTrace, prompts: dict[str, str], texts: dict[str, str]) -> Table:
    """One row per request holding KV this step; a finished one says so."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    table.add_column("id", justify="right", no_wrap=True)
    for name in ("prompt", "phase", "KV used/held", "blocks"):
        table.add_column(name, no_wrap=True)
    table.add_column("text so far", no_wrap=True, overflow="ellipsis", max_width=TEXT_CHARS + 1)
    for rid in t.running:
        n = t.scheduled.get(rid, 0)
        phase = "finished" if rid in t.finished else "prefill" if rid in t.prefills else "decode" if n else "waits"
        used, held = t.kv_used.get(rid, 0), t.kv_held.get(rid, 0)
        table.add_row(
            rid,
            Text(_cut(prompts.get(rid, "?").replace("\n", "⏎"), PROMPT_CHARS)),
            f"{phase} +{n}" if n else phase,
            bar(used / held if held else 0.0, width=8) + Text(f" {used}/{held}"),
            block_list(t.block_tables.get(rid, []), max_chars=14),
            Text(_tail(texts.get(rid, ""))),
        )
    return table


# Kinds told on one line for all the requests they concern (the rest get a line each, in event order).
GROUPED = {"finish": "finished", "preempt": "preempted", "admit": "admitted"}


def changes(events: list[StepEvent]) -> Group:
    return Group(Text("what changed", style="bold"), *change_lines(events))


def change_lines(events: list[StepEvent]) -> list[Text]:
    """What changed this step: finishes, preemptions (and why) and admissions, then the blocks that moved."""
    lines = []
    refills = {e.request_id: e.detail for e in events if e.kind == "refill"}
    for kind, label in GROUPED.items():
        of_kind = [e for e in events if e.kind == kind]
        if of_kind:
            lines.append(Text(f"  {label} " + ", ".join(_who(e, refills) for e in of_kind), _STYLES.get(kind, "")))
        if kind == "preempt" and of_kind:
            lines += [Text(f"    {part}", style="dim") for part in of_kind[0].detail.split("; ")]
    told = {*GROUPED, "refill"}  # a refill is told with its admission
    lines += [Text(f"  {e.text}", _STYLES.get(e.kind, "")) for e in events if e.kind not in told]
    return lines or [Text("  nothing but the decodes' next tokens", style="dim")]


def _who(e: StepEvent, refills: dict[str, str]) -> str:
    if e.kind == "finish":
        return f"{e.request_id} ({e.detail})"
    if e.kind == "admit" and e.request_id in refills:
        return f"{e.request_id} (refill: {refills[e.request_id]})"
    return e.request_id


_STYLES = {"preempt": "red", "swap_out": "red", "finish": "green", "hit": "magenta", "swap_in": "magenta"}


def bar(fraction: float, width: int = 16) -> Text:
    """█ for the used share, ░ for the rest; any use at all shows at least one █."""
    filled = min(width, round(fraction * width))
    if fraction > 0:
        filled = max(filled, 1)
    return Text.assemble(("█" * filled, "green"), ("░" * (width - filled), "grey50"))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _tail(text: str) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= TEXT_CHARS else "…" + text[-(TEXT_CHARS - 1) :]


# --- keys for --step ------------------------------------------------------------------------------
