"""Stage 2: the exercises of chapter 2 (paged KV blocks), and the runs that answer them.

Builds on: llm.py (a stage-2 engine), kv/paged.py (admission), worker/runner.py (the slot mapping),
attention/base.py (pagedlab's KV layout), lessons/exercises/core.py.
Read with: chapters/02-paged-blocks.md (Exercises, Solutions).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from pagedlab.attention.base import allocate_kv_cache
from pagedlab.kv.paged import PagedKVCacheManager, cdiv
from pagedlab.lessons.exercises.core import Exercise
from pagedlab.lessons.hybrid import grow, hit_tokens
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams

# The chapter's walk-through (and notebook 02's): prompts of 7, 8, 8, 6 and 8 tokens.
WALK_PROMPTS = {"A": "ROMEO:", "B": "JULIET:", "C": "HAMLET:", "D": "IAGO:", "E": "PORTIA:"}
WALK_MAX_TOKENS = {"A": 6, "B": 3, "C": 5, "D": 4, "E": 2}
SPEAKERS = ("ROMEO:", "JULIET:", "KING RICHARD III:", "HAMLET:", "First Citizen:", "MENENIUS:", "LADY MACBETH:",
            "GLOUCESTER:", "BRUTUS:", "ISABELLA:", "DUKE VINCENTIO:", "PETRUCHIO:", "KATHARINA:", "LEONTES:",
            "PROSPERO:", "MIRANDA:")  # fmt: skip


@functools.cache
def tables_by_hand() -> dict:
    llm = LLM(stage=2, block_size=4, num_kv_blocks=16, max_num_seqs=8, record_trace=True)
    engine, kv = llm.engine, llm.engine.kv_manager
    for rid, prompt in WALK_PROMPTS.items():
        params = SamplingParams(max_tokens=WALK_MAX_TOKENS[rid], temperature=0.0, ignore_eos=True)
        engine.add_request(rid, prompt, params)
    out = {}
    for step in (1, 2, 3):
        engine.step()
        if step == 1:
            out["admitted"] = set(engine.trace[0].running)
        out[f"tables_{step}"] = {rid: [b.block_id for b in blocks] for rid, blocks in kv.req_to_blocks.items()}
        out[f"free_{step}"] = [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()]
    return out


@functools.cache
def slots() -> dict:
    runner = LLM(stage=2, block_size=16).engine.runner
    table, positions = np.array([[12, 3, 40, 7]], dtype=np.int32), np.arange(64)
    every = runner.slot_mapping(table, np.zeros(64, dtype=np.int64), positions).tolist()
    return {"slots": [every[p] for p in (0, 15, 16, 47, 50)], "position": every.index(114)}


class PromptOnlyAdmission(PagedKVCacheManager):
    """Exercise 2.3's manager: admit on the prompt's blocks alone, promising nothing for the outputs."""

    def can_admit(self, group, running) -> bool:
        return sum(cdiv(r.num_prompt_tokens, self.block_size) for r in group) <= self.pool.num_free


@functools.cache
def promised_not_held() -> int:
    llm = LLM(stage=2, num_kv_blocks=256, block_size=16, max_num_seqs=64)
    engine = llm.engine
    engine.kv_manager = engine.scheduler.kv = PromptOnlyAdmission.from_config(engine.config)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    for i, prompt in enumerate(SPEAKERS * 4):
        engine.add_request(str(i), prompt, params)
    engine.step()
    return len(engine.scheduler.running)


@functools.cache
def coalescing() -> dict:
    """Chunk j = 0 of head 0, one 16-byte read per token of a block: where each starts, and the 32-byte sectors."""
    kvh, d, bs, dtype = 8, 128, 16, torch.float16
    item = torch.finfo(dtype).bits // 8
    x = 16 // item  # vLLM's split: 16 bytes of one key per chunk
    vllm_keys = torch.empty(1, kvh, d // x, bs, x, dtype=dtype)  # [num_blocks, KVH, D / x, block_size, x]
    ours = allocate_kv_cache(1, 1, bs, kvh, d, dtype, "cpu")[0, 0]  # [num_blocks, block_size, KVH, D]
    out = {
        "vllm_offsets": [t * vllm_keys.stride(3) * item for t in range(bs)],
        "pagedlab_offsets": [t * ours.stride(1) * item for t in range(bs)],
    }
    for name in ("vllm", "pagedlab"):
        out[f"{name}_sectors"] = len({b // 32 for start in out[f"{name}_offsets"] for b in (start, start + 15)})
    return out


@functools.cache
def two_tables() -> dict:
    """Exercise 2.7: request A's table in each group after its third and fourth chunks (lessons/hybrid.py)."""
    tables = grow([8, 8, 8, 6])
    return {"sliding_3": tables[2][0], "full_3": tables[2][1], "sliding_4": tables[3][0], "full_4": tables[3][1]}


@functools.cache
def hybrid_hits() -> dict:
    """Exercise 2.8: the hit every group can serve, in tokens, for three caches."""
    return {
        "a": hit_tokens((0, 1, 2, 3, 4, 5), (0, 1, 2, 4, 5)),
        "b": hit_tokens((0, 1, 2, 3, 4, 5), (0, 1, 2, 5)),
        "c": hit_tokens((0, 1, 2, 3, 4, 5, 6), (5, 6)),
    }


_TABLES = ("A request holds cdiv(tokens with K/V, block_size) blocks: it takes one only when its last block is full.",
           "A missing block comes from the head of the free queue, requests in batch order.")  # fmt: skip
_FREE = ("A finished request frees its blocks last block first, each to the head of the queue (nothing is cached "
         "at stage 2): the last block it held is the first to be reused.",)  # fmt: skip

EXERCISES = [
    Exercise(
        "02.1",
        "Block tables by hand",
        tables_by_hand,
        parts=("admitted", "tables_1", "free_1", "tables_2", "free_2", "tables_3", "free_3"),
        form='{"admitted": {...}, "tables_1": {"A": [...], ...}, "free_1": [...], ..., "free_3": [...]}',
        hints={
            "admitted": (
                "Every worst case here is 3 blocks: cdiv(prompt + max_tokens - 1, block_size).",
                "Admission adds worst cases in arrival order while they fit in the pool.",
            ),
            "tables_1": ("Step 1 prefills every admitted prompt: cdiv(prompt, block_size) blocks each.",) + _TABLES,
            "tables_2": _TABLES + ("A request that finished in the step holds no table after it.",),
            "tables_3": _TABLES + ("A request that finished in the step holds no table after it.",),
            "free_1": ("What step 1 did not allocate stays in the queue in its first order.",),
            "free_2": _FREE + ("Which request reaches its max_tokens in step 2?",),
            "free_3": _FREE + ("Which request reaches its max_tokens in step 3?",),
        },
        graded="allocation, freeing and the free queue's order, exactly; any pool size or max_tokens gives a new one",
        explain="Blocks come from the queue's head and go back to it last block first, so the newest freed are "
        "reused first.",
        code="kv/paged.py allocate_slots and free, kv/block_pool.py BlockPool",
    ),
    Exercise(
        "02.2",
        "Slots",
        slots,
        parts=("slots", "position"),
        form='{"slots": [slots of positions 0, 15, 16, 47, 50], "position": the position in slot 114}',
        hints={
            "slots": ("slot = block_table[pos // block_size] * block_size + pos % block_size.",),
            "position": ("Which block of the table is 114 // block_size, and at which offset inside it?",),
        },
        graded="the slot formula both ways; a new table or block size gives a new question",
        explain="A position's slot goes through its logical block's entry of the table; the inverse reads the table.",
        code="worker/runner.py ModelRunner.slot_mapping",
    ),
    Exercise(
        "02.3",
        "Promised, not held",
        promised_not_held,
        form="the number of requests running after step 1",
        hints={
            "": (
                "Every prompt here needs one or two blocks of 16 at admission, and the pool has 256.",
                "Something other than blocks may cap a batch: look at the engine's max_num_seqs.",
            )
        },
        solution=True,
        graded="admission by prompt vs worst case, with a subclass and a failure to explain",
        explain="Prompts alone fit easily; the outputs then need blocks nobody promised.",
        code="kv/paged.py can_admit, sched/static.py StaticScheduler.schedule",
    ),
    Exercise("02.4", "A deque instead of links", solution=True),
    Exercise(
        "02.5",
        "Coalescing on paper",
        coalescing,
        parts=("vllm_offsets", "pagedlab_offsets", "vllm_sectors", "pagedlab_sectors"),
        form='{"vllm_offsets": [16 byte offsets], "pagedlab_offsets": [...], "vllm_sectors": n, "pagedlab_sectors": n}',
        hints={
            "vllm_offsets": (
                "In [KVH, D / x, block_size, x], chunk j of token t starts j * block_size * x + t * x "
                "elements into the head; an fp16 element is two bytes.",
            ),
            "pagedlab_offsets": ("In [block_size, KVH, D], token t's row starts t * KVH * D elements into the block.",),
            "vllm_sectors": ("Adjacent 16-byte reads share 32-byte sectors: count the distinct offset // 32.",),
            "pagedlab_sectors": ("Reads that lie far apart each touch a sector of their own.",),
        },
        graded="memory layout arithmetic with one right answer; vary D, KVH or the dtype",
        explain="vLLM's split layout puts the 16 tokens' chunks side by side, so one warp-wide load coalesces.",
        code="attention/base.py allocate_kv_cache; vLLM v0.10.2 csrc/attention/attention_kernels.cuh",
    ),
    Exercise("02.6", "Read vLLM", solution=True),
    Exercise(
        "02.7",
        "Two tables for one request",
        two_tables,
        parts=("sliding_3", "full_3", "sliding_4", "full_4"),
        form='{"sliding_3": [...], "full_3": [...], "sliding_4": [...], "full_4": [...]}',
        hints={
            "sliding_3": (
                "Before a chunk allocates, the sliding group frees every block wholly before its first query's "
                "window: (num_computed_tokens - W + 1) // block_size blocks, tail first, null block in their place.",
                "A freed block with no cached prefix goes to the head of the free queue: it is the next one taken.",
            ),
            "full_3": ("The full group never frees; groups allocate in their order, the sliding group first here.",),
            "sliding_4": ("The same rule again at 24 computed tokens; the table keeps its length.",),
            "full_4": ("cdiv(30, 4) entries, each a block of its own.",),
        },
        graded="the coordinator's allocation and a window's freeing, exactly; other chunks or windows give a new one",
        explain="Both groups take blocks from one pool; the sliding group gives back what its window passed and takes "
        "it again.",
        code="kv/hybrid.py HybridKVCacheManager.allocate_slots, kv/window.py SlidingWindow.free_skipped",
    ),
    Exercise(
        "02.8",
        "A hit every group serves",
        hybrid_hits,
        parts=("a", "b", "c"),
        form='{"a": tokens, "b": tokens, "c": tokens}',
        hints={
            "": (
                "The full group's hit is its cached blocks from the first, up to the first one missing.",
                "The window's group needs only cdiv(W - 1, block_size) cached blocks in a row, ending where the hit "
                "ends; scan back from the full group's length for the first such run.",
                "A shorter answer from one group shortens the hit for all: ask again until no group shortens it.",
            )
        },
        graded="vLLM's fixed point of per-group hits, with one right answer per cache",
        explain="A hit is a prefix every group can serve: the full layers need every block, a window only its last.",
        code="kv/hybrid.py HybridKVCacheManager.get_computed_blocks; vLLM kv_cache_coordinator.py",
    ),
]
