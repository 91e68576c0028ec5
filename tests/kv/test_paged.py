"""Stage 2: the paged KV manager: on-demand blocks, slot mapping, static admission, no leaks."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab import SamplingParams
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.request import Request

pytestmark = [pytest.mark.stage2, pytest.mark.task("allocate-slots")]


def req(rid, prompt_len=5, max_tokens=4):
    return Request(rid, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), max_tokens)


def grow(kv, r, n):
    """Schedule n new tokens for r and pretend the model computed them."""
    new = kv.allocate_slots(r, n)
    if new is not None:
        r.num_computed_tokens += n
    return new


def test_blocks_come_one_at_a_time_as_tokens_arrive():
    # block_size 4, 8 blocks. A's 5-token prompt takes 2 blocks; decodes fill block 1, then need a third.
    kv = PagedKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=32)
    a, b = req("a"), req("b", prompt_len=3)
    assert grow(kv, a, 5) == [0, 1]
    assert grow(kv, b, 3) == [2]
    assert grow(kv, a, 1) == []  # token 5 -> block 1, slot 1
    assert grow(kv, a, 1) == []
    assert grow(kv, a, 1) == []  # token 7 fills block 1
    assert grow(kv, a, 1) == [3]  # token 8 opens a new block
    assert kv.get_block_ids(a) == [0, 1, 3] and kv.slots_held(a) == 12
    kv.free(a)
    # freed tail first, each to the head (nothing is cached before stage 4), so the queue is [3 1 0 4 5 6 7]
    assert [blk.block_id for blk in kv.pool.free_block_queue.get_all_free_blocks()] == [3, 1, 0, 4, 5, 6, 7]
    kv.check_invariants()


def test_none_when_the_pool_is_short():
    kv = PagedKVCacheManager(num_kv_blocks=2, block_size=4, max_model_len=32)
    a = req("a", prompt_len=8)
    assert grow(kv, a, 8) == [0, 1]
    assert kv.allocate_slots(a, 1) is None
    assert kv.get_block_ids(a) == [0, 1], "a failed allocation changes nothing"


def test_static_admission_counts_what_running_requests_may_still_claim():
    kv = PagedKVCacheManager(num_kv_blocks=6, block_size=4, max_model_len=32)
    a = req("a", prompt_len=5, max_tokens=8)  # worst case 12 KV tokens -> 3 blocks
    assert kv.max_blocks(a) == 3
    grow(kv, a, 5)  # holds 2, may still claim 1
    b = req("b", prompt_len=4, max_tokens=5)  # worst case 8 -> 2 blocks
    c = req("c", prompt_len=6, max_tokens=8)  # worst case 13 -> 4 blocks
    assert kv.can_admit([b], running=[a])  # 2 <= 4 free - 1 promised
    assert not kv.can_admit([c], running=[a])  # 4 > 3
    assert not kv.can_ever_admit([req("x", 20, 10)])


@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    program=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), max_size=40),
)
def test_random_programs_keep_every_invariant(block_size, program):
    kv = PagedKVCacheManager(num_kv_blocks=12, block_size=block_size, max_model_len=256)
    live = {i: req(str(i)) for i in range(4)}
    for who, n in program:
        r = live[who]
        if n == 0:  # free (again: freeing an unknown request is a no-op)
            kv.free(r)
            live[who] = r = req(f"{who}'", 5)
        else:
            before = kv.get_block_ids(r)
            new = grow(kv, r, n)
            after = kv.get_block_ids(r)
            assert after == before + (new or [])
            assert len(after) * block_size >= r.num_computed_tokens
        kv.check_invariants()
        assert kv.num_used_blocks + kv.num_free_blocks == 12
    for r in live.values():
        kv.free(r)
    kv.check_invariants()
    assert kv.num_free_blocks == 12


def test_allocate_slots_returns_only_what_it_appended():
    # What the scheduler forwards to the runner (new_block_ids): the blocks this call added, in table order.
    kv = PagedKVCacheManager(num_kv_blocks=8, block_size=2, max_model_len=32)
    a = req("a", prompt_len=3)
    assert grow(kv, a, 3) == [0, 1]
    assert grow(kv, a, 1) == []  # token 3 fits block 1
    assert grow(kv, a, 1) == [2]  # token 4 opens block 2
    kv.free(a)
    b = req("a", prompt_len=1)  # the same id again starts from scratch
    assert grow(kv, b, 1) == [2] and kv.get_block_ids(b) == [2]  # the queue's head: a's last block, freed first
