"""Stage 3: the exercises of chapter 3 (copy-on-write), and the runs that answer them.

Builds on: llm.py (a stage-3 engine), kv/cow.py (fork, copy-on-write, worst_case_blocks), kv/paged.py (stage 2's
worst case), sched/sharing.py (a beam search's worst case), lessons/exercises/core.py.
Read with: chapters/03-copy-on-write.md (Exercises, Solutions).
"""

from __future__ import annotations

import functools

from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.lessons.exercises.core import Exercise
from pagedlab.llm import LLM
from pagedlab.sampling_params import BeamSearchParams, SamplingParams

NOTEBOOK_POOL = dict(block_size=4, num_kv_blocks=16, max_num_seqs=8)  # notebook 03's engine


def _sampled(n: int) -> SamplingParams:
    return SamplingParams(n=n, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)


def _fork_run(prompt_len: int) -> dict:
    """An n=4 request with a prompt of `prompt_len` token ids, two steps in: the leader's prefill, the fork."""
    engine = LLM(stage=3, record_trace=True, **dict(NOTEBOOK_POOL, num_kv_blocks=32)).engine  # 16 are too few
    engine.add_request("A", list(range(3, 3 + prompt_len)), _sampled(4))
    engine.step()
    engine.step()
    tables = [set(engine.kv_manager.get_block_ids(r)) for r in engine.scheduler.running]
    first, second = engine.trace[0], engine.trace[1]
    return {"prefill": first.scheduled["0_A"], "shared": set.intersection(*tables), "copies": len(second.copies)}


@functools.cache
def copies_by_hand() -> dict:
    return {f"{key}_{p}": value for p in (11, 13) for key, value in _fork_run(p).items()}


class WholeChildren(CowKVCacheManager):
    """Stage 3's pool, admitting as stage 2 did: every child's worst case counted whole."""

    worst_case_blocks = PagedKVCacheManager.worst_case_blocks


def _groups_admitted(kv_class=None) -> int:
    engine = LLM(stage=3, **NOTEBOOK_POOL).engine
    if kv_class is not None:
        engine.kv_manager = engine.scheduler.kv = kv_class.from_config(engine.config)
    for i in range(4):
        engine.add_request(f"R{i}", "ROMEO:", _sampled(3))
    engine.step()
    return len({r.group_id for r in engine.scheduler.running})


@functools.cache
def admission_by_hand() -> dict:
    engine = LLM(stage=3, **NOTEBOOK_POOL).engine
    engine.add_request("R", "ROMEO:", _sampled(3))
    engine.add_beam_request("b", "ROMEO:", BeamSearchParams(beam_width=3, max_tokens=6))
    kv, sharing = engine.kv_manager, engine.scheduler.sharing
    group = [r for r in engine.scheduler.waiting if r.group_id == "R"]
    beams = [r for r in engine.scheduler.waiting if r.group_id == "b"]  # the search's first beam
    return {
        "group_blocks": kv.worst_case_blocks(group),
        "groups_admitted": _groups_admitted(),
        "groups_if_whole": _groups_admitted(WholeChildren),
        "beam_blocks": kv.worst_case_blocks(sharing.worst_case(beams)),
    }


_FORK = (
    "The leader feeds every prompt token but the last; each child then feeds that last one itself.",
    "Right after the fork every child holds the leader's table; a full block is never written again.",
    "A child copies a block only when it writes into one that someone else still holds; the last holder writes "
    "in place.",
)

EXERCISES = [
    Exercise(
        "03.1",
        "Copies by hand",
        copies_by_hand,
        parts=("prefill_11", "shared_11", "copies_11", "prefill_13", "shared_13", "copies_13"),
        form='{"prefill_11": tokens, "shared_11": {block ids}, "copies_11": n, "prefill_13": ..., ...}',
        hints={"": _FORK + ("Does the last prompt token open a new block, or land in a partly filled one?",)},
        graded="fork and copy-on-write counted exactly; any prompt length or n gives a new question",
        explain="A prompt whose last token lands in a partly filled block costs n - 1 copies; one that opens a new "
        "block costs none.",
        code="sched/sharing.py PromptSharing, kv/cow.py CowKVCacheManager.allocate_slots",
    ),
    Exercise("03.2", "Blocks saved after the fork", solution=True),
    Exercise("03.3", "Break the order", solution=True),
    Exercise(
        "03.4",
        "Admission by hand",
        admission_by_hand,
        parts=("group_blocks", "groups_admitted", "groups_if_whole", "beam_blocks"),
        form='{"group_blocks": n, "groups_admitted": n, "groups_if_whole": n, "beam_blocks": n}',
        hints={
            "group_blocks": (
                "A group of k costs shared + k * (max_blocks - shared): the shared blocks are the "
                "prompt's full ones, (p - 1) // block_size.",
                "max_blocks = cdiv(prompt + max_tokens - 1, block_size).",
            ),
            "groups_admitted": (
                "Groups are admitted whole, in order, while their worst cases fit the pool and "
                "their children fit max_num_seqs.",
            ),
            "groups_if_whole": ("Counted whole, a group costs k * max_blocks.",),
            "beam_blocks": (
                "A beam search is reserved as beam_width copies of its first beam, sharing the prompt's "
                "full blocks as the children of n > 1 do.",
            ),
        },
        graded="what sharing lets static admission promise, on four numbers; vary n, the pool or max_tokens",
        explain="Sharing the full prompt blocks lowers each group's promise, but seats (max_num_seqs) bound the "
        "batch too.",
        code="kv/cow.py worst_case_blocks, sched/sharing.py PromptSharing.worst_case, kv/paged.py can_admit",
    ),
    Exercise("03.5", "Fork one call too late", solution=True),
    Exercise("03.6", "Read vLLM", solution=True),
]
