"""Stage 1: the contiguous KV manager, told as small stories with exact block ids."""

import pytest

from pagedlab import SamplingParams
from pagedlab.kv.contiguous import ContiguousKVCacheManager
from pagedlab.request import Request

pytestmark = [pytest.mark.stage1, pytest.mark.task("contiguous-reservation")]


def req(rid: str, prompt_len: int = 3) -> Request:
    return Request(rid, list(range(prompt_len)), SamplingParams(), max_tokens=4)


def test_regions_are_reserved_whole_and_first_fit():
    # block_size 4, max_model_len 8 -> a region is 2 blocks; 9 blocks hold 4 regions (one block left over).
    kv = ContiguousKVCacheManager(num_kv_blocks=9, block_size=4, max_model_len=8)
    assert (kv.region_size, kv.num_regions) == (2, 4)
    a, b, c = req("a"), req("b"), req("c")
    assert kv.allocate_slots(a, 3) == [0, 1]  # the whole region, though 3 tokens need 1 block
    assert kv.allocate_slots(b, 3) == [2, 3]
    assert kv.allocate_slots(a, 1) == []  # already reserved: nothing new
    assert kv.slots_held(a) == 8 and kv.num_used_blocks == 4
    kv.free(a)
    assert kv.allocate_slots(c, 2) == [0, 1]  # first fit reuses the lowest free region
    kv.check_invariants()


def test_pool_runs_out_of_regions():
    kv = ContiguousKVCacheManager(num_kv_blocks=4, block_size=4, max_model_len=8)
    assert kv.can_admit([req("a"), req("b")], running=[])
    assert not kv.can_admit([req("a"), req("b"), req("c")], running=[])
    assert not kv.can_admit([req("b")], running=[req("a"), req("x")])  # admitted, regions not yet taken
    assert not kv.can_ever_admit([req("a"), req("b"), req("c")])
    kv.allocate_slots(req("a"), 1)
    kv.allocate_slots(req("b"), 1)
    assert kv.allocate_slots(req("c"), 1) is None


def test_free_is_idempotent_and_everything_returns():
    kv = ContiguousKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=8)
    reqs = [req(str(i)) for i in range(4)]
    for r in reqs:
        kv.allocate_slots(r, 1)
    for r in reqs + reqs:  # freeing twice must not free a region twice
        kv.free(r)
    kv.check_invariants()
    assert kv.num_free_blocks == 8 and sorted(kv.free_regions) == [0, 1, 2, 3]


def test_outgrowing_a_region_is_a_bug():
    kv = ContiguousKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=8)
    a = req("a")
    kv.allocate_slots(a, 3)
    a.num_computed_tokens = 8
    with pytest.raises(AssertionError, match="outgrew"):
        kv.allocate_slots(a, 1)
