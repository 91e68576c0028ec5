"""Stage 4: the prefix index on its own (kv/hashing.py: HashChainIndex), and a pool built with another index or eviction
policy, as a preset would name it."""

import pytest

from pagedlab import SamplingParams
from pagedlab.kv.block_pool import FreeKVCacheBlockQueue, KVCacheBlock
from pagedlab.kv.hashing import HashChainIndex, hash_block_tokens, make_none_hash
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.request import Request

pytestmark = pytest.mark.stage4
NONE = make_none_hash(0)


@pytest.mark.task("prefix-index")
def test_insert_get_and_evict():
    index = HashChainIndex()
    a, b = KVCacheBlock(1), KVCacheBlock(2)
    h = hash_block_tokens(NONE, (0, 1, 2, 3))
    assert index.get(h) is None
    assert index.insert(a, h) and a.block_hash == h and index.get(h) is a
    assert not index.insert(b, h), "a second block with the same prefix stays uncached"
    assert b.block_hash is None and index.get(h) is a and len(index) == 1
    index.check_invariants([a, b])
    index.evict(a)
    assert a.block_hash is None and index.get(h) is None and len(index) == 0
    index.evict(a)  # an uncached block: nothing to forget
    index.check_invariants([a, b])


@pytest.mark.task("prefix-index")
def test_reset_forgets_every_hash():
    index = HashChainIndex()
    blocks = [KVCacheBlock(i) for i in range(3)]
    parent = NONE
    for i, block in enumerate(blocks):
        parent = hash_block_tokens(parent, (i,))
        index.insert(block, parent)
    index.reset()
    assert len(index) == 0 and all(b.block_hash is None for b in blocks)


class MostRecentlyFreedFirst(FreeKVCacheBlockQueue):
    """Another eviction policy: reuse the block freed last (a stack), the opposite of LRU."""

    def popleft(self) -> KVCacheBlock:
        block = self.get_all_free_blocks()[-1]
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        return [self.popleft() for _ in range(n)]


class CountingIndex(HashChainIndex):
    """Another index: the same map, counting what is asked of it."""

    def __init__(self):
        super().__init__()
        self.asked = {"get": 0, "insert": 0, "evict": 0}

    def get(self, block_hash):
        self.asked["get"] += 1
        return super().get(block_hash)

    def insert(self, block, block_hash, parent=None):
        self.asked["insert"] += 1
        return super().insert(block, block_hash, parent)

    def evict(self, block):
        self.asked["evict"] += 1
        super().evict(block)


def req(rid, tokens):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4), 4)


def admit(kv, r):
    r.num_computed_tokens = kv.lookup_prefix(r)
    n = r.num_tokens - r.num_computed_tokens
    assert kv.allocate_slots(r, n) is not None
    r.num_computed_tokens += n


def test_the_manager_takes_its_index_and_eviction_policy_as_parts():
    """What a preset's kv_parts do: the pool asks the given index, and the given free queue picks the victim."""
    kv = PrefixCachingKVCacheManager(
        num_kv_blocks=8, block_size=4, max_model_len=64, prefix_index=CountingIndex, eviction=MostRecentlyFreedFirst
    )
    a = req("a", range(10))  # blocks 7, 6, 5 (the stack pops from the tail); 7 and 6 full and cached
    admit(kv, a)
    assert kv.get_block_ids(a) == [7, 6, 5]
    assert kv.pool.index.asked["insert"] == 2
    kv.free(a)  # tail first: 5, 6, 7 pushed; the stack reuses 7 (a's first block) first
    x = req("x", range(100, 104))
    admit(kv, x)
    assert kv.get_block_ids(x) == [7], "the eviction policy chose the most recently freed block"
    assert kv.pool.blocks[7].block_hash != hash_block_tokens(NONE, (0, 1, 2, 3))
    assert kv.lookup_prefix(req("again", range(10))) == 0, "a's first block was evicted, so its chain misses"
    assert kv.pool.index.asked["get"] > 0 and kv.pool.index.asked["evict"] > 0
    kv.check_invariants()
