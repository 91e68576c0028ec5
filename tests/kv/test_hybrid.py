"""kv/hybrid.py: one manager per KV cache group over one pool, coordinated as vLLM's HybridKVCacheCoordinator."""

from __future__ import annotations

import pytest

from pagedlab.errors import InvariantError
from pagedlab.kv.cache_groups import KVCacheGroup, kv_cache_groups
from pagedlab.kv.hybrid import HybridKVCacheManager
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.kv.swap import SwappingKVCacheManager
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams

GROUPS = kv_cache_groups((8, None, 8, None))  # sliding (0, 2), full (1, 3)


def req(rid: str, n: int, max_tokens: int = 4, first: int = 3) -> Request:
    return Request(rid, list(range(first, first + n)), SamplingParams(max_tokens=max_tokens), max_tokens, ())


def feed(kv, request: Request, n: int):
    new = kv.allocate_slots(request, n)
    if new is not None:
        request.num_computed_tokens += n
    return new


def test_block_0_is_the_null_block_and_every_group_takes_from_one_pool():
    kv = HybridKVCacheManager(PagedKVCacheManager, GROUPS, 16, 4, 64)
    a = req("a", 10)
    assert feed(kv, a, 10) == ([1, 2, 3], [4, 5, 6])  # sliding first, in the groups' order
    assert kv.null_block.block_id == 0 and kv.pool.num_free == 15 - 6
    assert all(m.pool.shared is kv.pool for m in kv.managers)
    kv.check_invariants()


def test_allocation_is_all_or_none():
    """Room for one group's blocks but not both: None, and no group took anything."""
    kv = HybridKVCacheManager(PagedKVCacheManager, GROUPS, 8, 4, 64)  # 7 usable blocks
    a = req("a", 12)
    assert feed(kv, a, 12) == ([1, 2, 3], [4, 5, 6])
    b = req("b", 4)
    assert kv.allocate_slots(b, 4) is None and kv.get_block_ids(b) == ([], [])
    assert kv.pool.num_free == 1
    kv.check_invariants()


def test_the_window_frees_into_the_pool_both_groups_use():
    """At 16 computed tokens the sliding group frees blocks 1 and 2 (tokens 0-7) before it counts: freed with no
    cached prefix to the head of the queue, it takes them back at once; the full group takes the next two."""
    kv = HybridKVCacheManager(PagedKVCacheManager, GROUPS, 11, 4, 64)  # 10 usable
    a = req("a", 24)
    assert feed(kv, a, 16) == ([1, 2, 3, 4], [5, 6, 7, 8])
    assert feed(kv, a, 8) == ([2, 1], [9, 10])
    assert kv.get_block_ids(a) == ([0, 0, 3, 4, 2, 1], [5, 6, 7, 8, 9, 10]) and kv.pool.num_free == 0
    kv.check_invariants()


def test_a_step_that_does_not_fit_still_frees_what_the_window_passed():
    """As vLLM's allocate_slots (remove_skipped_blocks comes first, "even if we cannot schedule this request"):
    one block short, nothing is allocated, yet the blocks behind the window are back in the pool."""
    kv = HybridKVCacheManager(PagedKVCacheManager, GROUPS, 10, 4, 64)  # 9 usable
    a = req("a", 24)
    feed(kv, a, 16)
    assert kv.allocate_slots(a, 8) is None
    assert kv.get_block_ids(a) == ([0, 0, 3, 4], [5, 6, 7, 8]) and kv.pool.num_free == 3
    kv.check_invariants()


def test_a_groups_cached_prefix_is_its_own():
    """The same prompt caches a block per group under one hash, kept apart by the group's key; a request hits in
    every group or in none."""
    kv = HybridKVCacheManager(PrefixCachingKVCacheManager, kv_cache_groups((None, 8)), 32, 4, 64)
    a = req("a", 17)
    assert kv.take_hits(a, kv.get_computed_blocks(a)) == 0
    feed(kv, a, 17)
    full, window = kv.get_block_ids(a)
    kv.free(a)
    keys = set(kv.pool.index.cached_block_hash_to_block)
    assert {g for g, _ in keys} == {0, 1} and len(keys) == 8  # 4 full blocks in each group
    b = req("b", 17)
    hits = kv.get_computed_blocks(b)
    assert [b.block_id for b in hits[0]] == full[:4]
    assert [b.block_id for b in hits[1]] == [0, 0] + window[2:4]  # the window needs only its last 2 blocks
    assert kv.take_hits(b, hits) == 16 and kv.prefix_cache_hits == 16
    kv.check_invariants()


def test_fork_and_copy_on_write_happen_in_every_group():
    kv = HybridKVCacheManager(PrefixCachingKVCacheManager, GROUPS, 32, 4, 64, enable_caching=False)
    parent, child = req("p", 6), req("c", 6)
    feed(kv, parent, 5)
    kv.fork(parent, child)
    child.num_computed_tokens = 5
    assert kv.get_block_ids(child) == kv.get_block_ids(parent)
    feed(kv, child, 1)  # writes into the shared second block of each group: a private copy in each
    copies = kv.take_block_copies()
    assert sorted(c.group for c in copies) == [0, 1] and all(c.index == 1 for c in copies)
    kv.check_invariants()


def test_swap_out_and_in_use_one_cpu_pool():
    kv = HybridKVCacheManager(SwappingKVCacheManager, GROUPS, 16, 4, 64, num_swap_blocks=6)
    a = req("a", 12)
    feed(kv, a, 12)
    assert kv.can_swap_out([a])
    out = kv.swap_out(a)
    assert [cpu for _, cpu in out] == [0, 1, 2, 3, 4, 5] and kv.is_swapped(a) and kv.num_used_blocks == 0
    assert kv.swap_pool.held == {"a": [0, 1, 2, 3, 4, 5]}
    back = kv.swap_in(a)
    assert [cpu for cpu, _ in back] == [0, 1, 2, 3, 4, 5] and not kv.is_swapped(a)
    assert kv.shared_swap.num_free == 6
    kv.check_invariants()


def test_the_door_counts_every_groups_whole_table():
    """A window's group counts its whole length at the door, as every stage's worst case does (chapter 2's ledger:
    vLLM would hold that group at its cap)."""
    kv = HybridKVCacheManager(PagedKVCacheManager, GROUPS, 16, 4, 64)
    assert kv.max_blocks(req("a", 20, max_tokens=9)) == 2 * 7
    assert kv.can_ever_admit([req("a", 20, max_tokens=9)]) and not kv.can_ever_admit([req("b", 28, max_tokens=5)])


def test_the_invariant_check_sees_a_block_held_twice_across_groups():
    kv = HybridKVCacheManager(PagedKVCacheManager, GROUPS, 16, 4, 64)
    a = req("a", 4)
    feed(kv, a, 4)
    sliding, full = kv.managers
    full.req_to_blocks["a"].append(sliding.req_to_blocks["a"][0])  # one block in both groups' tables
    with pytest.raises(InvariantError):
        kv.check_invariants()


def test_one_group_is_not_a_hybrid():
    with pytest.raises(ValueError, match="kv_cache_groups"):
        HybridKVCacheManager(PagedKVCacheManager, [KVCacheGroup(None, (0, 1), 2)], 16, 4, 64)


def test_a_deep_copy_is_a_whole_second_manager():
    """The notebooks' lookahead copies a scheduler with its KV manager: the groups' views copy with the pool they
    share (their forwarding once sent copy looking for __deepcopy__ into endless recursion)."""
    import copy

    kv = HybridKVCacheManager(SwappingKVCacheManager, GROUPS, 16, 4, 64, num_swap_blocks=4)
    a = req("a", 16)
    feed(kv, a, 10)
    twin = copy.deepcopy(kv)
    assert twin.get_block_ids(a) == kv.get_block_ids(a) and twin.pool is not kv.pool
    assert all(m.pool.shared is twin.pool for m in twin.managers)
    feed(twin, a, 6)
    assert kv.pool.num_free == 9 and twin.pool.num_free == 7
    twin.check_invariants()
    kv.check_invariants()
