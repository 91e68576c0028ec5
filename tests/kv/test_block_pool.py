"""Stage 2: the block pool and its free-block queue, with exact block ids and queue order."""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagedlab.errors import InvariantError
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


def test_a_double_free_in_one_call_raises_and_leaks_nothing():
    """free() queues the blocks that reached ref_cnt 0 together (uncached to the head, cached to the tail); one that
    raises half-way must still leave every block it had freed in the queue."""
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    with pytest.raises(InvariantError, match="freed twice"):
        pool.free([a, b, a])
    assert a.ref_cnt == b.ref_cnt == 0 and pool.num_free == 4
    assert [x.block_id for x in pool.free_block_queue.get_all_free_blocks()] == [0, 1, 2, 3]
    pool.check_invariants()


def test_a_deep_copy_of_a_big_pool_keeps_its_queue_and_does_not_recurse_per_block():
    """The notebooks' lookahead (lessons/predict.py `ahead`) deep-copies the scheduler with its pool: copying the
    free queue link by link recursed once per block and overflowed Python's stack at a few hundred blocks."""
    import copy

    pool = BlockPool(5000)
    taken = pool.allocate(3)
    pool.free(taken[1:2])  # one freed to the head: the queue is not in id order
    twin = copy.deepcopy(pool)
    order = [b.block_id for b in twin.free_block_queue.get_all_free_blocks()]
    assert order == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] and order[0] == taken[1].block_id
    assert all(
        a is not b and a.block_id == b.block_id and a.ref_cnt == b.ref_cnt for a, b in zip(twin.blocks, pool.blocks)
    )
    assert twin.free_block_queue.get_all_free_blocks()[0] is twin.blocks[taken[1].block_id]  # one object per block
    twin.allocate(10)
    assert pool.num_free == 4998 and twin.num_free == 4988  # the copies are independent
