"""Stage 5: swapping a preempted request's blocks out to the CPU pool and back, with exact block ids."""

import pytest

from pagedlab import SamplingParams
from pagedlab.kv.swap import SwappingKVCacheManager
from pagedlab.request import Request

pytestmark = [pytest.mark.stage5, pytest.mark.task("swap")]


def req(rid, prompt_len=10, first=0):
    return Request(rid, list(range(first, first + prompt_len)), SamplingParams(max_tokens=4), 4)


def admit(kv, r):
    r.num_computed_tokens = kv.lookup_prefix(r)
    kv.allocate_slots(r, r.num_tokens - r.num_computed_tokens)
    r.num_computed_tokens = r.num_tokens


def test_swap_out_then_in_with_exact_ids():
    kv = SwappingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64, num_swap_blocks=4)
    a, b = req("a"), req("b", first=100)
    admit(kv, a)  # [0 1 2]
    admit(kv, b)  # [3 4 5]
    assert kv.swap_out(b) == [(3, 0), (4, 1), (5, 2)]  # GPU block -> CPU block
    assert b.num_computed_tokens == 10, "swapping keeps the progress"
    assert kv.get_block_ids(b) == [] and kv.swap_pool.held == {"b": [0, 1, 2]} and kv.num_free_blocks == 5
    assert kv.is_swapped(b) and not kv.can_swap_out([a, a])  # 6 blocks do not fit in the 1 CPU block left
    c = req("c", 4, first=200)
    # b's freed blocks: 5 (not full, no hash) went to the free queue's head, the cached 4 and 3 to its tail
    admit(kv, c)  # takes block 5, the head
    assert kv.get_block_ids(c) == [5]
    assert kv.swap_in(b) == [(0, 6), (1, 7), (2, 4)]  # CPU block -> new GPU block
    assert kv.get_block_ids(b) == [6, 7, 4]
    assert kv.swap_pool.num_free == 4
    kv.check_invariants()


def test_a_swapped_request_that_is_aborted_frees_its_cpu_blocks():
    kv = SwappingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64, num_swap_blocks=4)
    a = req("a")
    admit(kv, a)
    kv.swap_out(a)
    kv.free(a)
    assert kv.swap_pool.num_free == 4 and kv.num_free_blocks == 8
    kv.check_invariants()


def test_swapping_out_a_forked_request_keeps_the_other_holders_blocks():
    kv = SwappingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64, num_swap_blocks=4)
    parent = req("p", 8)
    admit(kv, parent)  # [0 1]
    child = req("c", 8)
    child.num_computed_tokens = 8
    kv.fork(parent, child)
    assert kv.swap_out(child) == [(0, 0), (1, 1)]
    assert [b.ref_cnt for b in kv.pool.blocks[:2]] == [1, 1]  # the parent still holds them
    assert kv.swap_in(child) == [(0, 2), (1, 3)]  # back as private blocks: sharing is not restored
    kv.check_invariants()


def test_a_block_copied_on_write_this_step_is_swapped_out_from_its_source():
    kv = SwappingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64, num_swap_blocks=4)
    parent = req("p", 6)
    admit(kv, parent)  # [0 1], block 1 half full
    child = req("c", 6)
    child.num_computed_tokens = 6
    kv.fork(parent, child)
    kv.allocate_slots(child, 1)  # CoW: 1 -> 2, not yet applied by the runner
    assert [(c.src, c.dst) for c in kv.pending_copies] == [(1, 2)]
    assert kv.swap_out(child) == [(0, 0), (1, 1)]  # block 2 is still empty: copy out block 1
    assert kv.pending_copies == []
