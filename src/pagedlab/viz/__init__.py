"""Stage 1: one namespace for every drawing of the engine's trace, shared by notebooks and `pagedlab figures`.

Builds on: viz/palette.py (the colours), viz/kv.py (the KV cache step by step), viz/blocks.py (block tables and
the pool, stages 2-5), viz/schedule.py (continuous batching schedules, stage 5).
Read with: chapters/01-contiguous-static.md, chapters/02-paged-blocks.md (block tables, pool occupancy),
chapters/04-prefix-caching.md (cache hits and cached-but-free blocks),
chapters/05-continuous-batching.md (schedules, tokens per step, preemption, the CPU swap pool).

Use it as `from pagedlab import viz; viz.plot_block_tables(...)`: every public name of the modules below is here.
One palette (viz/palette.py) gives each block state one colour in every chapter: FREE, USED, RESERVED,
SHARED (ref_cnt > 1), CACHED (free, keeps its hash). The functions only read the trace (and
`cached_block_ids`, a stage-4 pool; `swapped_block_ids`, a stage-5 KV manager): they work for every stage
that records one.
"""

import matplotlib.pyplot as plt  # noqa: F401  (viz.plt: the bench figures draw with it)

from pagedlab.viz.blocks import (
    cached_block_ids,
    plot_block_tables,
    prefix_hit_blocks,
    swapped_block_ids,
)
from pagedlab.viz.kv import (
    peak_slots,
    plot_batch_timeline,
    plot_kv_over_steps,
    plot_pool,
    plot_pool_occupancy,
    plot_reserved_vs_used,
    used_share,
)
from pagedlab.viz.palette import (
    CACHED,
    DECODE,
    FINISHED,
    FREE,
    PREEMPTED,
    PREFILL,
    RESERVED,
    SHARED,
    SWAPPED,
    USED,
    WAITING,
    request_colour,
    request_order,
    save_figure,
)
from pagedlab.viz.schedule import (
    plot_schedule_gantt,
    plot_tokens_per_step,
    preemption_events,
    prompt_lens_of,
    samples_in,
    schedule_states,
    tokens_per_step,
)


def step_through(llm_or_trace, compare=None, height: int = 1050):
    """The step-through page of a run, inline in a notebook (viz/page.py): an LLM run with record_trace=True,
    or its viz.trace dict; `compare`: a second run shown side by side under one slider."""
    from pagedlab.viz.page import step_through as show

    return show(llm_or_trace, compare=compare, height=height)


__all__ = [
    "step_through",
    "CACHED",
    "DECODE",
    "FINISHED",
    "FREE",
    "PREEMPTED",
    "PREFILL",
    "RESERVED",
    "SHARED",
    "SWAPPED",
    "USED",
    "WAITING",
    "cached_block_ids",
    "peak_slots",
    "plot_batch_timeline",
    "plot_block_tables",
    "plot_kv_over_steps",
    "plot_pool",
    "plot_pool_occupancy",
    "plot_reserved_vs_used",
    "plot_schedule_gantt",
    "plot_tokens_per_step",
    "preemption_events",
    "prefix_hit_blocks",
    "prompt_lens_of",
    "request_colour",
    "request_order",
    "samples_in",
    "save_figure",
    "schedule_states",
    "swapped_block_ids",
    "tokens_per_step",
    "used_share",
]
