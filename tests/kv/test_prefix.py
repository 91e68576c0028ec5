"""Stage 4: chained block hashes, cache hits, touch, and LRU eviction (tail of a chain first)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab import SamplingParams
from pagedlab.kv.hashing import hash_block_tokens, make_none_hash
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.request import Request

pytestmark = pytest.mark.stage4
NONE = make_none_hash(0)


def req(rid, tokens, salt=None):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4), 4, cache_salt=salt)


def admit(kv, r):
    """What the scheduler does: look up the cache, then allocate the rest of the prompt."""
    r.num_computed_tokens = kv.lookup_prefix(r)
    n = r.num_tokens - r.num_computed_tokens
    assert kv.allocate_slots(r, n) is not None
    r.num_computed_tokens += n


def free_queue(kv):
    return [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()]


def test_hashes_chain_through_parents():  # hash_block_tokens is given: no task's test
    h0 = hash_block_tokens(NONE, (0, 1, 2, 3))
    h1 = hash_block_tokens(h0, (4, 5, 6, 7))
    assert h1 != hash_block_tokens(NONE, (4, 5, 6, 7)), "the same tokens after another prefix hash differently"
    assert h0 == hash_block_tokens(NONE, [0, 1, 2, 3]) and len(h0) == 32
    assert make_none_hash(1) != NONE


@pytest.mark.task("caching-pool")
@pytest.mark.task("prefix-index")
def test_full_blocks_are_cached_kept_after_free_and_hit_later():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64)
    a = req("a", range(10))  # blocks: [0 1 2 3] [4 5 6 7] [8 9 _ _]
    admit(kv, a)
    h0 = hash_block_tokens(NONE, (0, 1, 2, 3))
    h1 = hash_block_tokens(h0, (4, 5, 6, 7))
    assert kv.get_block_ids(a) == [0, 1, 2]
    assert kv.pool.cached_block_hash_to_block == {h0: kv.pool.blocks[0], h1: kv.pool.blocks[1]}
    kv.free(a)  # tail first: 2 (not full: no hash) to the head, reused first; 1, 0 to the back with their hashes
    assert free_queue(kv) == [2, 3, 4, 5, 6, 7, 1, 0]
    assert kv.pool.num_cached_free == 2
    b = req("b", [0, 1, 2, 3, 4, 5, 6, 7, 42, 43, 44])
    assert kv.lookup_prefix(b) == 8  # both cached blocks hit
    assert kv.get_block_ids(b) == [0, 1] and free_queue(kv) == [2, 3, 4, 5, 6, 7]  # touched out of the queue
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (10 + 11, 8)  # tokens looked up, tokens hit
    kv.check_invariants()


@pytest.mark.task("lookup")
def test_the_lookup_stops_at_the_first_missing_block():
    """A hole in a cached chain ends the hit: block 2's K/V were computed after block 1's tokens, and a block
    table cannot skip a block. (A later block can outlive an earlier one in the cache: a hit on it moves it
    to the tail of the free queue, behind the earlier one.)"""
    kv = PrefixCachingKVCacheManager(num_kv_blocks=5, block_size=4, max_model_len=64)
    a = req("a", range(13))  # blocks 0, 1, 2 full and cached; block 3 holds token 12
    admit(kv, a)
    kv.free(a)  # block 3 (no hash) to the head, the cached 2, 1, 0 to the tail
    assert free_queue(kv) == [3, 4, 2, 1, 0]
    kv.pool.touch([kv.pool.blocks[2]])  # as a hit would: block 2 leaves the queue ...
    kv.pool.free([kv.pool.blocks[2]])  # ... and comes back at the tail
    assert free_queue(kv) == [3, 4, 1, 0, 2]
    kv.pool.allocate(3)  # blocks 3, 4 and 1 are reused for other tokens: block 1's hash is evicted
    assert kv.pool.blocks[2].block_hash is not None and kv.pool.blocks[1].block_hash is None
    b = req("b", range(13))
    assert [blk.block_id for blk in kv.get_computed_blocks(b)] == [0]  # not [0, 2]
    assert kv.lookup_prefix(b) == 4


@pytest.mark.task("lookup")
def test_a_full_hit_still_leaves_the_last_token_to_compute():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64)
    admit(kv, req("a", range(9)))
    exact = req("b", range(8))  # two full blocks, both cached: only the first may be used
    assert kv.lookup_prefix(exact) == 4
    one_more = req("c", range(9))
    assert kv.lookup_prefix(one_more) == 8  # 8 of 9 cached: the last token is computed for its logits


@pytest.mark.task("caching-pool")
@pytest.mark.task("prefix-index")
def test_eviction_takes_the_tail_of_a_chain_first():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64)
    a = req("a", range(10))
    admit(kv, a)
    kv.free(a)  # queue [2 3 4 5 6 7 1 0], with 1 and 0 cached (2, never full, went to the head)
    x = req("x", range(100, 128))  # 28 tokens = 7 blocks: takes 2 3 4 5 6 7, then 1 (evicted)
    admit(kv, x)
    assert kv.get_block_ids(x) == [2, 3, 4, 5, 6, 7, 1]
    assert kv.pool.blocks[1].block_hash != hash_block_tokens(hash_block_tokens(NONE, (0, 1, 2, 3)), (4, 5, 6, 7))
    assert kv.lookup_prefix(req("again", range(10))) == 4  # the head of the chain is still cached
    kv.check_invariants()


@pytest.mark.task("block-hashing")
def test_salted_requests_do_not_share():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=16, block_size=4, max_model_len=64)
    admit(kv, req("a", range(10), salt="tenant-a"))
    assert kv.lookup_prefix(req("b", range(10), salt="tenant-b")) == 0
    assert kv.lookup_prefix(req("c", range(10))) == 0
    assert kv.lookup_prefix(req("d", range(10), salt="tenant-a")) == 8


@pytest.mark.task("caching-pool")
@pytest.mark.task("prefix-index")
def test_the_same_block_computed_twice_in_one_step_is_cached_once():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64)
    a, b = req("a", range(6)), req("b", range(6))
    for r in (a, b):  # both admitted before either computes: no hits, both compute block [0 1 2 3]
        r.num_computed_tokens = kv.lookup_prefix(r)
    kv.allocate_slots(a, 6)
    kv.allocate_slots(b, 6)
    assert kv.get_block_ids(a) == [0, 1] and kv.get_block_ids(b) == [2, 3]
    assert kv.pool.blocks[0].block_hash is not None and kv.pool.blocks[2].block_hash is None
    kv.check_invariants()


@pytest.mark.task("lookup")
def test_disabled_caching_never_hits():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64, enable_caching=False)
    admit(kv, req("a", range(10)))
    assert kv.lookup_prefix(req("b", range(10))) == 0 and not kv.pool.cached_block_hash_to_block


@pytest.mark.task("caching-pool")
@pytest.mark.task("lookup")
@given(
    programs=st.lists(
        st.tuples(
            st.sampled_from(["add", "grow", "free"]),
            st.integers(0, 7),
            st.lists(st.integers(0, 2), min_size=1, max_size=14),
        ),
        max_size=30,
    ),
    block_size=st.sampled_from([1, 2, 4]),
)
def test_random_programs_keep_the_cache_consistent(programs, block_size):
    kv = PrefixCachingKVCacheManager(num_kv_blocks=12, block_size=block_size, max_model_len=256)
    live: list[Request] = []
    content: dict[int, dict[int, int]] = {}  # block id -> {offset: token} as written
    chunks: dict = {}  # block hash -> the tokens it names
    made = 0

    def write(r, start, end):
        table = kv.get_block_ids(r)
        for p in range(start, end):
            content.setdefault(table[p // block_size], {})[p % block_size] = r.all_token_ids[p]

    for op, i, tokens in programs:
        if op == "add":
            r = req(f"r{made}", tokens)
            made += 1
            r.num_computed_tokens = kv.lookup_prefix(r)
            start = r.num_computed_tokens
            if kv.allocate_slots(r, r.num_tokens - start) is None:
                kv.free(r)
                continue
            write(r, start, r.num_tokens)
            r.num_computed_tokens = r.num_tokens
            live.append(r)
        elif op == "grow" and live:
            r = live[i % len(live)]
            r.all_token_ids.append(tokens[0])
            if kv.allocate_slots(r, 1) is not None:
                write(r, r.num_computed_tokens, r.num_tokens)
                r.num_computed_tokens += 1
            else:
                r.all_token_ids.pop()
        elif op == "free" and live:
            kv.free(live.pop(i % len(live)))
        for r in live:
            for k, h in enumerate(r.block_hashes):
                chunks[h] = r.all_token_ids[k * block_size : (k + 1) * block_size]
        kv.check_invariants()
        assert kv.num_used_blocks + kv.num_free_blocks == 12
        for h, block in kv.pool.cached_block_hash_to_block.items():  # no hash names changed content
            assert [content[block.block_id][o] for o in range(block_size)] == chunks[h]
    for r in live:
        kv.free(r)
    kv.check_invariants()
    assert kv.num_free_blocks == 12
