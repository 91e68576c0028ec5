"""Stage 4: the radix tree index (kv/radix.py): a tree of cached blocks that evicts leaves first, in a pool and in the
stage-4 manager, beside the hash chain's flat map."""

import pytest

from pagedlab import SamplingParams
from pagedlab.kv.block_pool import FreeKVCacheBlockQueue, KVCacheBlock
from pagedlab.kv.eviction import FIFOQueue, LRUQueue
from pagedlab.kv.hashing import HashChainIndex
from pagedlab.kv.prefix import CachingBlockPool, PrefixCachingKVCacheManager
from pagedlab.kv.radix import RadixIndex
from pagedlab.request import Request

pytestmark = pytest.mark.stage4


def test_a_block_hangs_under_its_parent_and_an_orphan_is_refused():
    index = RadixIndex()
    a, b, c, d = (KVCacheBlock(i) for i in range(4))
    assert index.insert(a, "h0") and index.insert(b, "h1", "h0") and index.get("h1") is b
    assert not index.insert(c, "h1", "h0"), "this prefix is cached already"
    assert not index.insert(d, "h9", "h8"), "its parent is not cached: no lookup could reach it"
    assert c.block_hash is None and d.block_hash is None and len(index) == 2
    assert index.children == {None: {"h0"}, "h0": {"h1"}, "h1": set()}
    index.check_invariants([a, b, c, d])
    index.evict(a)  # not a leaf: its subtree goes with it (only when the policy had nothing else to give)
    assert len(index) == 0 and a.block_hash is None and b.block_hash is None
    index.check_invariants([a, b, c, d])


def test_it_needs_a_free_queue_that_can_keep_a_block():
    with pytest.raises(ValueError, match="prefix_index: a radix tree evicts leaves first"):
        CachingBlockPool(4, RadixIndex(), FreeKVCacheBlockQueue)


def chain(pool, *names):
    """Compute a prompt of len(names) blocks (each under the one before), cache it, free it last block first."""
    blocks = pool.allocate(len(names))
    for i, (block, name) in enumerate(zip(blocks, names)):
        pool.index.insert(block, name, names[i - 1] if i else None)
    pool.free(reversed(blocks))
    return blocks


@pytest.mark.parametrize(("index", "victims"), [(HashChainIndex, ["a", "b"]), (RadixIndex, ["c", "b"])])
def test_fifo_strands_a_chains_tail_a_tree_does_not(index, victims):
    # a -> b -> c cached in that order, then d: FIFO takes the oldest block, a, first. The hash chain evicts a and
    # b: c stays cached, unreachable (no lookup gets past a). The tree keeps a and b while they have children: it
    # evicts the leaf c, then b (a leaf now), and a and d stay reachable.
    pool = CachingBlockPool(4, index(), FIFOQueue)
    chain(pool, "a", "b", "c")
    chain(pool, "d")
    taken = pool.allocate(2)
    cached = {n for n in "abcd" if pool.index.get(n) is not None}
    assert cached == set("abcd") - set(victims)  # the hash chain: c without a, which no lookup reaches
    pool.free(taken)
    pool.check_invariants()


def test_lru_takes_leaves_first_anyway_and_a_parent_follows_its_last_child():
    # LRU frees a prompt last block first, so its tail is the least recent: the head of the queue is a leaf
    pool = CachingBlockPool(4, RadixIndex(), LRUQueue)
    chain(pool, "a", "b", "c")
    chain(pool, "d")
    assert [b.block_hash for b in pool.free_block_queue.get_all_free_blocks()] == ["c", "b", "a", "d"]
    pool.allocate(3)  # c, then b (a leaf once c went), then a
    assert len(pool.index) == 1 and pool.index.get("d") is not None
    pool.check_invariants()


def req(rid, tokens):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4), 64)


def serve(kv, prompts) -> list[int]:
    """Admit each prompt alone (as max_num_seqs=1 would), fill it, free it: the tokens it found cached."""
    hits = []
    for i, tokens in enumerate(prompts):
        r = req(str(i), tokens)
        r.num_computed_tokens = kv.lookup_prefix(r)
        hits.append(r.num_computed_tokens)
        n = r.num_tokens - r.num_computed_tokens
        assert kv.allocate_slots(r, n) is not None
        r.num_computed_tokens += n
        kv.check_invariants()
        kv.free(r)
    return hits


def test_the_stage4_manager_runs_with_the_tree_and_finds_the_same_prefixes():
    """The preset's parts: the same manager over a radix index; under LRU, the hits of the hash chain."""
    system, other = list(range(1, 13)), list(range(40, 52))
    prompts = [system + [20 + i] * 5 for i in range(4)] + [other + [30] * 6, system + [20] * 5, other + [31] * 3]
    results = []
    for index in (HashChainIndex, RadixIndex):
        kv = PrefixCachingKVCacheManager(10, 4, 64, prefix_index=index, eviction=LRUQueue)
        results.append(serve(kv, prompts))
    assert results[0] == results[1]
    assert results[0][1] == 12 and results[0][6] == 12, "the shared 12-token beginnings hit"
