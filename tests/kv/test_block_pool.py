"""Stage 2: the block pool and its free-block queue, with exact block ids and queue order."""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagedlab.kv.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock

pytestmark = pytest.mark.stage2


def ids(blocks):
    return [b.block_id for b in blocks]


@pytest.mark.task("free-queue")
def test_queue_pops_from_the_head_and_appends_at_the_tail():
    blocks = [KVCacheBlock(i) for i in range(4)]
    q = FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3]
    assert q.popleft().block_id == 0
    q.append(blocks[0])
    assert ids(q.get_all_free_blocks()) == [1, 2, 3, 0]


@pytest.mark.task("free-queue")
def test_remove_from_the_middle_keeps_the_links():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[2])
    assert ids(q.get_all_free_blocks()) == [0, 1, 3, 4] and q.num_free_blocks == 4
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    q.remove(blocks[4])  # the last one
    q.remove(blocks[0])  # the first one
    assert ids(q.get_all_free_blocks()) == [1, 3]
    assert ids(q.popleft_n(2)) == [1, 3] and q.num_free_blocks == 0
    with pytest.raises(ValueError, match="^No free blocks available$"):  # vLLM's message
        q.popleft()


@pytest.mark.task("pool-allocate-free")
def test_pool_story_allocate_free_reuse():
    # 6 blocks. A takes 2, B takes 3; A frees; C takes 3: the queue hands out A's blocks first (no cached prefix:
    # freed to the head, as vLLM's prepend_n), then 5.
    pool = BlockPool(6)
    a = pool.allocate(2)
    b = pool.allocate(3)
    assert ids(a) == [0, 1] and ids(b) == [2, 3, 4] and pool.num_free == 1
    pool.free(reversed(a))  # freed tail first: 1 then 0, both to the head, in that order
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [1, 0, 5]
    c = pool.allocate(3)
    assert ids(c) == [1, 0, 5] and all(blk.ref_cnt == 1 for blk in c)
    assert pool.usage == 1.0
    pool.check_invariants()


@pytest.mark.task("pool-allocate-free")
def test_a_block_returns_to_the_queue_only_at_ref_cnt_zero():
    pool = BlockPool(3)
    (blk,) = pool.allocate(1)
    blk.ref_cnt += 1  # a second holder (stage 3 does this with fork)
    pool.free([blk])
    assert blk.ref_cnt == 1 and pool.num_free == 2
    pool.free([blk])
    assert blk.ref_cnt == 0 and pool.num_free == 3
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free([blk])


@pytest.mark.task("pool-allocate-free")
def test_asking_for_too_many_blocks():
    with pytest.raises(ValueError, match="^Cannot get 4 free blocks from the pool$"):  # vLLM's message
        BlockPool(3).allocate(4)


class PoolMachine(RuleBasedStateMachine):
    """Random programs of allocate / free never leak or double-free a block."""

    @initialize(num_blocks=st.integers(1, 16))
    def setup(self, num_blocks):
        self.pool = BlockPool(num_blocks)
        self.held: list[list[KVCacheBlock]] = []

    @rule(n=st.integers(0, 6))
    def allocate(self, n):
        if n <= self.pool.num_free:
            self.held.append(self.pool.allocate(n))

    @rule(i=st.integers(0, 20))
    def free(self, i):
        if self.held:
            self.pool.free(self.held.pop(i % len(self.held)))

    @invariant()
    def consistent(self):
        if hasattr(self, "pool"):
            self.pool.check_invariants()
            used = sum(len(h) for h in self.held)
            assert used + self.pool.num_free == self.pool.num_blocks

    def teardown(self):
        if hasattr(self, "pool"):
            for h in self.held:
                self.pool.free(h)
            assert self.pool.num_free == self.pool.num_blocks


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.pytestmark = [pytest.mark.task("free-queue"), pytest.mark.task("pool-allocate-free")]
