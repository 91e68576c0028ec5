"""The null block (a sliding window's placeholder, block 0) is neither used nor free: an idle pool reads 0 % used
and may reset its prefix cache, as vLLM's pool does with its own null block."""

import pytest

from pagedlab import SamplingParams
from pagedlab.kv.block_pool import BlockPool
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.request import Request


def req(rid, tokens):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4), 4)


def free_queue(kv):
    return [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()]


@pytest.mark.stage2
def test_the_null_block_counts_neither_as_used_nor_as_free():
    # 8 blocks, block 0 taken as the null block: 7 to hand out; all of them held is 100 %, none is 0 %.
    pool = BlockPool(8)
    assert pool.take_null_block().block_id == 0
    assert (pool.num_usable, pool.num_used, pool.num_free, pool.usage) == (7, 0, 7, 0.0)
    blocks = pool.allocate(7)
    assert [b.block_id for b in blocks] == [1, 2, 3, 4, 5, 6, 7]
    assert (pool.num_used, pool.usage) == (7, 1.0)
    pool.free(blocks[:3])
    assert (pool.num_used, pool.usage) == (4, 1 - 3 / 7)
    pool.free(blocks[3:])
    assert (pool.num_used, pool.usage, pool.null_block.ref_cnt) == (0, 0.0, 0)
    pool.check_invariants()


@pytest.mark.stage2
def test_without_a_window_every_block_is_usable():
    pool = BlockPool(8)
    assert (pool.num_usable, pool.usage) == (8, 0.0)
    pool.allocate(2)
    assert pool.usage == 0.25


@pytest.mark.stage2
def test_an_idle_paged_manager_with_a_window_reads_empty():
    kv = PagedKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64, sliding_window=4)
    a = req("a", range(9))
    assert kv.allocate_slots(a, 9) == [1, 2, 3]
    assert (kv.num_used_blocks, kv.usage, kv.reset_prefix_cache()) == (3, 1 - 4 / 7, False)  # 4 of 7 free
    kv.free(a)
    assert (kv.num_used_blocks, kv.usage, kv.reset_prefix_cache()) == (0, 0.0, True)


@pytest.mark.stage4
def test_reset_prefix_cache_succeeds_once_every_request_has_gone():
    # a's two full blocks (1, 2) are cached; while a runs the reset is refused, after it the cache is emptied.
    kv = PrefixCachingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64, sliding_window=4)
    a = req("a", range(9))
    assert kv.allocate_slots(a, 9) == [1, 2, 3]
    a.num_computed_tokens = 9
    assert sorted(b.block_id for b in kv.pool.cached_block_hash_to_block.values()) == [1, 2]
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    assert free_queue(kv) == [3, 4, 5, 6, 7, 2, 1] and kv.usage == 0.0  # 3 (not full, no hash) to the head
    assert kv.reset_prefix_cache() is True
    assert kv.pool.cached_block_hash_to_block == {} and all(b.block_hash is None for b in kv.pool.blocks)
    b = req("b", range(9))
    assert kv.lookup_prefix(b) == 0  # nothing left to hit
    kv.check_invariants()
