"""Stage 4: the exercises of chapter 4 (prefix caching), and the runs that answer them.

Builds on: llm.py (a traced stage-4 engine), lessons/stage4.py (the figures' run), engine/stats.py (StepTrace:
block tables, the free queue and the block hashes of every step), lessons/exercises/core.py.
Read with: chapters/04-prefix-caching.md (Exercises, Solutions).
"""

from __future__ import annotations

import functools

from pagedlab.lessons.exercises.core import Exercise
from pagedlab.lessons.stage4 import STAGE4_POOL, STAGE4_PROMPTS
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams

NEW_D = "ROMEO:\nBut soft, what light"  # exercise 4.1: D sends all of C's prompt, and more
PROMPT_40 = "ROMEO:\nBut soft, what light through yon"  # exercise 4.2: 40 tokens with <bos>


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _full_blocks_without_hash(step, block_size: int) -> set[str]:
    """Requests holding a full block that has no hash: a block computed under a hash some other block holds."""
    return {
        rid
        for rid, table in step.block_tables.items()
        if any(step.block_hashes[b] is None for b in table[: step.kv_used[rid] // block_size])
    }


@functools.cache
def step_by_hand() -> dict:
    llm = LLM(stage=4, record_trace=True, **STAGE4_POOL)
    for rid, prompt in dict(STAGE4_PROMPTS, D=NEW_D).items():
        llm.engine.add_request(rid, prompt, _greedy(3))
    for _ in range(4):
        llm.engine.step()
    before, step = llm.engine.trace[2], llm.engine.trace[3]
    registered = {b for b, h in enumerate(step.block_hashes) if h is not None and h != before.block_hashes[b]}
    return {
        "fed": dict(step.scheduled),
        "table_C": step.block_tables["C"],
        "table_D": step.block_tables["D"],
        "free_queue": step.free_queue,
        "registered": registered,
        "duplicates": _full_blocks_without_hash(step, STAGE4_POOL["block_size"]),
    }


@functools.cache
def duplicates_in_a_batch() -> dict:
    llm = LLM(stage=4, block_size=4, max_num_seqs=4, record_trace=True)
    llm.generate([PROMPT_40] * 8, _greedy(4), use_tqdm=False)
    trace, first = llm.engine.trace, {}
    for step in trace:
        for rid, n in step.scheduled.items():
            first.setdefault(rid, n)  # a static batch feeds a request's whole prefill (less its hits) first
    batch = {rid for rid in trace[0].running}
    last = [step for step in trace if set(step.running) <= batch][-1]
    return {
        "computed_1": sum(n for rid, n in first.items() if rid in batch),
        "computed_2": sum(n for rid, n in first.items() if rid not in batch),
        "hashed": sum(h is not None for h in last.block_hashes),
        "with_duplicates": sum(last.kv_used[rid] // 4 for rid in batch),
    }


EXERCISES = [
    Exercise(
        "04.1",
        "A step by hand",
        step_by_hand,
        parts=("fed", "table_C", "table_D", "free_queue", "registered", "duplicates"),
        form='{"fed": {"C": n, "D": n}, "table_C": [...], "table_D": [...], "free_queue": [...], '
        '"registered": {block ids}, "duplicates": {request ids}}',
        hints={
            "fed": (
                "Both are admitted in one batch, each looked up before anything of the step is allocated.",
                "A lookup finds full blocks cached when the batch starts, stopping at the first miss.",
            ),
            "table_C": ("Hits first, at their cached ids; then new blocks from the head of the free queue.",),
            "table_D": (
                "Hits first; C's fifth block is registered only when C allocates it, after D's lookup.",
                "New blocks come from the head of the free queue, after C has taken its own.",
            ),
            "free_queue": (
                "The queue after step 3 is in the walk-through; hits leave it wherever they are, new "
                "blocks leave its head.",
            ),
            "registered": (
                "allocate_slots registers each block the step fills completely, unless a block already "
                "holds its hash (one block per hash).",
            ),
            "duplicates": (
                "Two requests computed the same block in one step: only the first one allocated keeps the hash.",
            ),
        },
        graded="lookup, allocation, registration and eviction in one step, all exact; any new prompt gives a new one",
        explain="D looked up before C registered its fifth block, so D computed it again: a duplicate nobody can hit.",
        code="kv/prefix.py get_computed_blocks, allocate_slots, _cache_full_blocks; kv/block_pool.py",
    ),
    Exercise(
        "04.2",
        "Duplicates in the first batch",
        duplicates_in_a_batch,
        parts=("computed_1", "computed_2", "hashed", "with_duplicates"),
        form='{"computed_1": tokens, "computed_2": tokens, "hashed": blocks, "with_duplicates": blocks}',
        hints={
            "computed_1": ("A static batch's requests are looked up before any of them has computed a block.",),
            "computed_2": (
                "A lookup serves at most (prompt - 1) // block_size blocks: the last prompt token is "
                "always computed, for its logits.",
            ),
            "hashed": (
                "One block per hash: a block computed under a hash that another block holds stays unnamed.",
                "Outputs fill blocks too, but only what is fed gets K/V: the last sampled token never is.",
            ),
            "with_duplicates": ("Count every full block each request of the first batch computed.",),
        },
        graded="what a cache can serve within and across static batches; vary the prompt length or block size",
        explain="The first batch computes everything four times and names each block once; the second hits all "
        "but the last block's worth.",
        code="kv/prefix.py get_computed_blocks, kv/block_pool.py CachingBlockPool",
    ),
    Exercise("04.3", "A weak hash", solution=True),
    Exercise(
        "04.4",
        "Head-first freeing",
        solution=True,
        graded="a one-method subclass, its effect on eviction measured, and stranded blocks explained",
    ),
    Exercise("04.5", "Hits within a batch", solution=True),
    Exercise("04.6", "Read vLLM", solution=True),
    Exercise(
        "04.7",
        "A policy of your own",
        solution=True,
        graded="a policy as a key and two hooks, placed between LRU and MIN on both traces, and explained",
    ),
    Exercise("04.8", "Requests in flight", solution=True),
]
