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

Every name is imported when first asked for (PEP 562), and so is its module: `pagedlab.viz.trace`, the trace
format, loads no matplotlib, which is what lets the live lab build traces in a browser tab (lessons/lab.py).
"""

from __future__ import annotations

import importlib

_WHERE = {  # public name -> its module under pagedlab.viz
    "CACHED": "palette",
    "DECODE": "palette",
    "FINISHED": "palette",
    "FREE": "palette",
    "PREEMPTED": "palette",
    "PREFILL": "palette",
    "RESERVED": "palette",
    "SHARED": "palette",
    "SWAPPED": "palette",
    "USED": "palette",
    "WAITING": "palette",
    "cached_block_ids": "blocks",
    "peak_slots": "kv",
    "plot_batch_timeline": "kv",
    "plot_block_tables": "blocks",
    "plot_kv_over_steps": "kv",
    "plot_pool": "kv",
    "plot_pool_occupancy": "kv",
    "plot_reserved_vs_used": "kv",
    "plot_schedule_gantt": "schedule",
    "plot_tokens_per_step": "schedule",
    "preemption_events": "schedule",
    "prefix_hit_blocks": "blocks",
    "prompt_lens_of": "schedule",
    "request_colour": "palette",
    "request_order": "palette",
    "samples_in": "schedule",
    "save_figure": "palette",
    "schedule_states": "schedule",
    "swapped_block_ids": "blocks",
    "tokens_per_step": "schedule",
    "used_share": "kv",
}
__all__ = ["step_through", *sorted(_WHERE)]


def step_through(llm_or_trace, compare=None, height: int = 1050):
    """The step-through page of a run, inline in a notebook (viz/page.py): an LLM run with record_trace=True,
    or its viz.trace dict; `compare`: a second run shown side by side under one slider."""
    from pagedlab.viz.page import step_through as show

    return show(llm_or_trace, compare=compare, height=height)


def __getattr__(name: str):
    if name == "plt":  # viz.plt: the bench figures draw with it
        value = importlib.import_module("matplotlib.pyplot")
    elif name in _WHERE:
        value = getattr(importlib.import_module(f"pagedlab.viz.{_WHERE[name]}"), name)
    else:
        raise AttributeError(f"module 'pagedlab.viz' has no attribute {name!r}")
    globals()[name] = value  # once found, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE) | {"plt"})
