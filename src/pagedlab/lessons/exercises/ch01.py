"""Stage 1: the exercises of chapter 1 (contiguous KV, static batching), and the runs that answer them.

Builds on: llm.py (the engine, stage 1 and stage 5), kv/contiguous.py (regions), lessons/exercises/core.py.
Read with: chapters/01-contiguous-static.md (Exercises, Solutions).
"""

from __future__ import annotations

import functools

from pagedlab.lessons.exercises.core import Exercise
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams

# The chapter's walk-through: A, B, C, D with prompts of 7, 8, 8 and 6 tokens (with <bos>).
WALK_PROMPTS = {"A": "ROMEO:", "B": "JULIET:", "C": "HAMLET:", "D": "IAGO:"}
WALK_MAX_TOKENS = {"A": 3, "B": 6, "C": 2, "D": 2}
WALK_POOL = dict(block_size=4, max_model_len=16, num_kv_blocks=12, max_num_seqs=3)


@functools.cache
def regions() -> dict[str, int]:
    llm = LLM(stage=1, num_kv_blocks=1000)
    kv, cfg = llm.engine.kv_manager, llm.engine.config
    unused = cfg.num_kv_blocks - kv.num_regions * kv.region_size
    return {"R": kv.region_size, "running": min(kv.num_regions, cfg.max_num_seqs), "unused": unused}


def walk_trace(stage: int) -> list:
    """The chapter's A/B/C/D run at `stage`, to the end: one StepTrace per step."""
    llm = LLM(stage=stage, record_trace=True, **WALK_POOL)
    for rid, prompt in WALK_PROMPTS.items():
        params = SamplingParams(max_tokens=WALK_MAX_TOKENS[rid], temperature=0.0, ignore_eos=True)
        llm.engine.add_request(rid, prompt, params)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    return llm.engine.trace


@functools.cache
def head_of_line() -> dict[str, int]:
    waits = sum("D" in step.waiting for step in walk_trace(1))
    finish = next(step.step for step in walk_trace(5) if "D" in step.finished)  # continuous batching: any free seat
    return {"waits": waits, "finishes": finish}


EXERCISES = [
    Exercise(
        "01.1",
        "Regions by hand",
        regions,
        parts=("R", "running", "unused"),
        form='{"R": ..., "running": ..., "unused": ...}',
        hints={
            "R": ("A region holds one max_model_len request: ceil(max_model_len / block_size) blocks.",),
            "running": (
                "The pool holds num_kv_blocks // R whole regions, one request each, and never more requests than "
                "max_num_seqs (its default is in config.py).",
            ),
            "unused": ("The blocks after the last whole region belong to no region: num_kv_blocks % R.",),
        },
        graded="arithmetic of regions from the config; vary the pool and max_model_len for a fresh question",
        explain="Worst-case reservation: the pool is cut into whole regions, whatever the requests' lengths.",
        code="kv/contiguous.py ContiguousKVCacheManager (region_size, num_regions)",
    ),
    Exercise(
        "01.2",
        "Head-of-line blocking, measured",
        head_of_line,
        parts=("waits", "finishes"),
        form='{"waits": steps D waits, "finishes": the step D would finish in}',
        hints={
            "waits": (
                "A static batch admits nobody until its last request has finished: which request of A, B, C runs "
                "longest, and in which step does it sample its last token?",
            ),
            "finishes": (
                "C samples its last token in step 2; with continuous batching its seat is free from the next step.",
                "D's prompt goes in one prefill step, which samples D's first token; each further token is a decode.",
            ),
        },
        graded="reading a trace step by step; a new max_tokens for B or D gives a new answer",
        explain="D waits for B, the batch's longest request; continuous batching (stage 5) admits it as soon as a "
        "seat is free.",
        code="sched/static.py StaticScheduler.schedule, sched/continuous.py ContinuousScheduler._schedule_waiting",
    ),
    Exercise(
        "01.3",
        "Pow2 and Oracle reservations",
        solution=True,
        graded="a KV manager of one's own, measured; external fragmentation explained (vary the workload)",
    ),
    Exercise("01.4", "Why the mask matters", solution=True),
    Exercise("01.5", "Find a near tie", solution=True),
    Exercise("01.6", "Read vLLM", solution=True),
]
