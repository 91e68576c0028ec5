"""Stage 4: the eviction policies (kv/eviction.py) as free queues: their order by hand, their invariants at random."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import FreeKVCacheBlockQueue, KVCacheBlock
from pagedlab.kv.eviction import (
    EVICTION_POLICIES,
    BeladyQueue,
    FIFOQueue,
    LFUQueue,
    LRUQueue,
    NextUse,
    SLRUQueue,
)
from pagedlab.kv.hashing import HashChainIndex
from pagedlab.kv.prefix import CachingBlockPool

pytestmark = pytest.mark.stage4
KEYED = (FIFOQueue, LFUQueue, SLRUQueue)


def ids(blocks):
    return [b.block_id for b in blocks]


def cache(pool, *names):
    """Compute one block per name (allocated from the pool), cache it under that name and free it: block ids."""
    out = []
    for name in names:
        (block,) = pool.allocate(1)
        pool.index.insert(block, name)
        pool.free([block])
        out.append(block.block_id)
    return out


def hit(pool, name, times=1):
    """A request that hits `name`'s block and frees it again."""
    for _ in range(times):
        block = pool.index.get(name)
        pool.touch([block])
        pool.free([block])


def evicted_next(pool) -> str:
    """The hash the next allocation evicts."""
    (block,) = pool.free_block_queue.popleft_n(1)
    name = block.block_hash
    pool.free_block_queue.append(block)
    return name


@pytest.mark.parametrize(("policy", "victim"), [(LRUQueue, "b"), (FIFOQueue, "a"), (LFUQueue, "b"), (SLRUQueue, "b")])
def test_a_hit_saves_a_block_from_all_but_fifo(policy, victim):
    # a, b, c cached in that order; then a request hits a. LRU: b is now least recently freed. FIFO: a came first,
    # hit or not. LFU: a was used twice, b and c once, b freed earlier. SLRU: a is protected, b the oldest on probation.
    pool = CachingBlockPool(3, HashChainIndex(), policy)
    assert cache(pool, "a", "b", "c") == [0, 1, 2]
    hit(pool, "a")
    assert evicted_next(pool) == victim
    pool.check_invariants()


@pytest.mark.parametrize(("policy", "victim"), [(LRUQueue, "a"), (FIFOQueue, "a"), (LFUQueue, "b"), (SLRUQueue, "a")])
def test_lfu_remembers_old_popularity_and_slru_lets_it_go(policy, victim):
    # a is used 5 times, long ago; then b, c, d twice each. LFU keeps a (5 uses) and evicts b. SLRU protects at most
    # 80 % of 4 blocks = 3: when d is protected, a (the oldest protected) is demoted, and goes first.
    pool = CachingBlockPool(4, HashChainIndex(), policy)
    cache(pool, "a")
    hit(pool, "a", 4)
    for name in "bcd":
        cache(pool, name)
        hit(pool, name)
    assert evicted_next(pool) == victim


@pytest.mark.parametrize("policy", [LRUQueue, *KEYED])
def test_a_block_without_a_hash_is_reused_before_any_cached_one(policy):
    pool = CachingBlockPool(4, HashChainIndex(), policy)
    cache(pool, "a", "b")
    taken = pool.allocate(2)
    pool.free(taken)  # no hash: an answer's blocks, say; the engine's own queue reuses them first, as vLLM's does
    got = pool.free_block_queue.popleft_n(2)
    assert all(b.block_hash is None for b in got) and set(ids(got)) == set(ids(taken))


def test_min_evicts_the_furthest_next_use_and_the_deeper_block_on_a_tie():
    # requests [x, y], [z], [x, y], [w], replayed as NextUse sees them arrive
    future = NextUse([("x", "y"), ("z",), ("x", "y"), ("w",)])
    pool = CachingBlockPool(3, HashChainIndex(), BeladyQueue.for_future(future))
    future.advance()  # request 0
    blocks = pool.allocate(2)
    pool.index.insert(blocks[0], "x"), pool.index.insert(blocks[1], "y", "x")
    pool.free(reversed(blocks))
    assert future.next_use("x") == future.next_use("y") == 2
    future.advance()  # request 1
    cache(pool, "z")
    assert future.next_use("z") == NextUse.NEVER
    assert evicted_next(pool) == "z"  # x and y are needed by request 2, z never again
    future.advance()  # request 2 hits x and y: now none of the three is used again
    hit(pool, "x"), hit(pool, "y")
    assert future.next_use("x") == NextUse.NEVER
    # all tie on the future: the deeper y first, then z and x in the order they were freed
    assert [b.block_hash for b in pool.free_block_queue.get_all_free_blocks()] == ["y", "z", "x"]


def test_lru_queue_pops_what_the_engines_queue_pops():
    # the same program on both: LRUQueue with nothing kept is FreeKVCacheBlockQueue
    a, b = [KVCacheBlock(i) for i in range(6)], [KVCacheBlock(i) for i in range(6)]
    qa, qb = FreeKVCacheBlockQueue(a), LRUQueue(b)
    for q, blocks in ((qa, a), (qb, b)):
        taken = q.popleft_n(4)
        q.append(taken[2]), q.append(taken[0])
        q.remove(blocks[5])
        q.append(blocks[5])
    assert ids(qa.get_all_free_blocks()) == ids(qb.get_all_free_blocks()) == [4, 2, 0, 5]


@pytest.mark.parametrize("policy", KEYED)
def test_a_keyed_queue_refuses_what_the_linked_list_refuses(policy):
    blocks = [KVCacheBlock(i) for i in range(2)]
    q = policy(blocks)
    with pytest.raises(InvariantError, match="already in the free queue"):
        q.append(blocks[0])
    assert ids(q.popleft_n(2)) == [0, 1]
    with pytest.raises(InvariantError, match="not in the free queue"):
        q.remove(blocks[0])
    with pytest.raises(ValueError, match="^No free blocks available$"):
        q.popleft()
    with pytest.raises(ValueError, match="Cannot get 1 free blocks"):
        q.popleft_n(1)


@pytest.mark.parametrize("policy", KEYED)
def test_a_kept_block_is_parked_until_unparked(policy):
    pool = CachingBlockPool(3, HashChainIndex(), policy)
    cache(pool, "a", "b", "c")
    q = pool.free_block_queue
    q.keep = lambda block: block.block_hash == "a"  # a would go first under every policy here: kept
    first = q.popleft()
    assert first.block_hash == "b" and q.num_free_blocks == 2
    assert ids(q.get_all_free_blocks()) == [2, 0]  # a, parked, is still free, and last
    q.unpark(pool.blocks[0])  # its place by its key again: first
    assert ids(q.get_all_free_blocks()) == [0, 2]
    q.append(first)
    pool.check_invariants()


@st.composite
def programs(draw):
    return draw(st.lists(st.tuples(st.sampled_from("aftrk"), st.integers(0, 7)), max_size=60))


@pytest.mark.parametrize("name", sorted(EVICTION_POLICIES))
@given(program=programs())
def test_every_policy_keeps_the_pools_invariants(name, program):
    """Random allocate / cache / free / touch / keep: the free queue stays exactly the blocks with ref_cnt 0."""
    future = NextUse([tuple(range(8))] * 4)
    future.advance()
    policy = BeladyQueue.for_future(future) if name == "min" else EVICTION_POLICIES[name]
    pool = CachingBlockPool(8, HashChainIndex(), policy)
    held = []
    for op, arg in program:
        if op == "a" and pool.num_free:
            held += pool.allocate(1)
        elif op == "f" and held:
            pool.free([held.pop(arg % len(held))])
        elif op == "r" and held and held[arg % len(held)].block_hash is None:
            pool.index.insert(held[arg % len(held)], arg)  # cached under a name (once per name)
        elif op == "t" and (block := pool.index.get(arg)) is not None:
            pool.touch([block])
            held.append(block)
        elif op == "k":
            pool.free_block_queue.keep = (lambda b, k=arg: b.block_id == k) if arg % 2 else None
        pool.check_invariants()
    pool.free(held)
    pool.check_invariants()
    assert pool.num_free == 8
