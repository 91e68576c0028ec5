"""Stage 2: the block pool: physical KV blocks and the free-block queue threaded through them.

Builds on: nothing (pure Python).
Read with: chapters/02-paged-blocks.md.

The free-block queue is a doubly linked list whose links live inside the
blocks themselves (vLLM's FreeKVCacheBlockQueue), between two sentinels:

    head <-> [b3] <-> [b7] <-> [b0] <-> tail
             ^ popleft (allocate)      ^ append (free a cached block)
             ^ prepend (free a block with no cached prefix: reused first, as vLLM's)

popleft, append and remove-from-the-middle are all O(1). A plain deque could
not remove from the middle, and stage 4 needs exactly that: a cached block
that gets a hit must leave the free queue wherever it is.

Invariant: a block is in the free queue iff its ref_cnt == 0.
vLLM: vllm/v1/core/block_pool.py, vllm/v1/core/kv_cache_utils.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pagedlab.errors import InvariantError, check


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints, without floats: the blocks that hold a tokens, b to a block."""
    return -(-a // b)


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One physical block of block_size KV slots (the tensors live in the runner; this is the metadata)."""

    block_id: int  # index into the KV tensors' first dimension
    ref_cnt: int = 0  # block tables holding this block; 0 = free
    block_hash: object | None = None  # set when the block is full and cached (stage 4)
    prev_free_block: KVCacheBlock | None = None  # free-queue link (None when not queued)
    next_free_block: KVCacheBlock | None = None  # free-queue link (None when not queued)

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt})"

    def __deepcopy__(self, memo: dict) -> KVCacheBlock:
        """A copy of a queued block is a copy of its whole queue, made in a loop: copying link by link would
        recurse once per block and overflow Python's stack on a pool of a few hundred blocks (the notebooks'
        lookahead copies the scheduler with its pool)."""
        first = self
        while first.prev_free_block is not None:
            first = first.prev_free_block
        chain, block = [], first
        while block is not None:
            chain.append(block)
            block = block.next_free_block
        for b in chain:
            if id(b) not in memo:
                memo[id(b)] = KVCacheBlock(b.block_id, b.ref_cnt, b.block_hash)  # a hash is immutable: shared
        for b in chain:
            c = memo[id(b)]
            c.prev_free_block = memo[id(b.prev_free_block)] if b.prev_free_block is not None else None
            c.next_free_block = memo[id(b.next_free_block)] if b.next_free_block is not None else None
        return memo[id(self)]


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks with sentinel head and tail; the head is allocated first."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.num_free_blocks = len(blocks)
        self.head = KVCacheBlock(-1)  # sentinel
        self.tail = KVCacheBlock(-1)  # sentinel
        chain = [self.head, *blocks, self.tail]
        for left, right in zip(chain, chain[1:]):
            left.next_free_block, right.prev_free_block = right, left

    # BEGIN SOLUTION
    # TASK free-queue (20 pts): the free-block queue: O(1) popleft, append and remove through the blocks' own links.
    def popleft(self) -> KVCacheBlock:
        """Unlink and return the block at the head (the next to allocate), its links left None.

        Raises ValueError("No free blocks available") (exactly vLLM's message) when the queue is empty."""
        block = self.head.next_free_block
        if block is self.tail:
            raise ValueError("No free blocks available")  # vLLM's message
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it is in the queue, in O(1); its prev and next links become None and
        num_free_blocks drops by one. Raises InvariantError if the block is not in the queue (a link is None)."""
        if block.prev_free_block is None or block.next_free_block is None:
            raise InvariantError(f"{block} is not in the free queue")
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail (it will be allocated last); num_free_blocks grows by one. Raises InvariantError
        if the block is already in a queue (a link is set)."""
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise InvariantError(f"{block} is already in the free queue")
        last = self.tail.prev_free_block
        last.next_free_block, block.prev_free_block = block, last
        block.next_free_block, self.tail.prev_free_block = self.tail, block
        self.num_free_blocks += 1

    # END SOLUTION

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool")  # vLLM's message
        return [self.popleft() for _ in range(n)]

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put `blocks` at the head, in their order (blocks[0] is allocated next): vLLM's prepend_n."""
        for block in reversed(blocks):  # the last goes in first, so the first ends at the head
            if block.prev_free_block is not None or block.next_free_block is not None:
                raise InvariantError(f"{block} is already in the free queue")
            first = self.head.next_free_block
            self.head.next_free_block, block.prev_free_block = block, self.head
            block.next_free_block, first.prev_free_block = first, block
            self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head to tail (for tests and drawings)."""
        out, block = [], self.head.next_free_block
        while block is not self.tail:
            out.append(block)
            block = block.next_free_block
        return out


class BlockPool:
    """All physical blocks. Invariants: free queue == {blocks with ref_cnt 0} less the null block;
    used + free == num_usable (every block but the null block)."""

    def __init__(self, num_blocks: int, free_queue: type = None):
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # the order free blocks are reused in: least recently freed first (a caching pool's eviction policy)
        self.free_block_queue = (free_queue or FreeKVCacheBlockQueue)(self.blocks)
        self.null_block: KVCacheBlock | None = None

    def take_null_block(self) -> KVCacheBlock:
        """Block 0 out of the free queue for good, as vLLM's null_block: a placeholder in block tables for
        blocks a sliding window dropped. It is never allocated nor freed, and never read. Taken once: the groups of
        a hybrid model (kv/hybrid.py) share the pool and its one null block."""
        if self.null_block is None:
            self.null_block = self.free_block_queue.popleft()
        return self.null_block

    @property
    def num_free(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def num_usable(self) -> int:
        """Blocks requests can hold: all but the null block (vLLM's pool always takes one and counts
        num_gpu_blocks - 1; here only a sliding window takes it)."""
        return self.num_blocks - (self.null_block is not None)

    @property
    def num_used(self) -> int:
        """Blocks some request holds (the null block is nobody's)."""
        return self.num_usable - self.num_free

    @property
    def usage(self) -> float:
        """Share of the usable blocks held, 0..1: exactly 0 when idle, null block or not (vLLM's get_usage)."""
        return 1 - self.num_free / self.num_usable if self.num_usable else 0.0

    # BEGIN SOLUTION
    # TASK pool-allocate-free (20 pts): allocate blocks from the free queue's head and free them back at ref_cnt 0:
    # a block without a cached hash to the head (reused first), one with a hash to the tail (kept longest).
    def allocate(self, n: int) -> list[KVCacheBlock]:
        """Take n blocks from the head of the free queue, in queue order, each with ref_cnt 1 (n = 0: []).

        Raises ValueError(f"Cannot get {n} free blocks from the pool") (vLLM's message, as popleft_n raises it)
        when fewer than n are free, taking none; InvariantError if a queued block's ref_cnt was not 0."""
        blocks = self.free_block_queue.popleft_n(n)
        for block in blocks:
            if block.ref_cnt != 0:
                raise InvariantError(f"{block} was in the free queue")
            block.ref_cnt = 1
        return blocks

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the order given (`blocks` in the order they should be reused). A
        block that reaches ref_cnt 0 and holds no cached prefix goes to the queue's head, in that order: nothing is
        lost by reusing it at once, and it is the block most recently written (vLLM reuses such blocks first). One
        that holds a cached prefix goes to the tail, so that the cache keeps it as long as it can (least recently
        used evicted first). A block whose ref_cnt is already 0 raises InvariantError with "freed twice" in its
        message (the blocks before it stay freed)."""
        reuse_first, reuse_last = [], []
        try:
            for block in blocks:
                if block.ref_cnt <= 0:
                    raise InvariantError(f"{block} freed twice")
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    (reuse_first if block.block_hash is None else reuse_last).append(block)
        finally:  # even when one raised: a block already at ref_cnt 0 must be in the queue, or it leaks
            self.free_block_queue.prepend_n(reuse_first)
            self.free_block_queue.append_n(reuse_last)

    # END SOLUTION

    def check_invariants(self) -> None:
        queued = self.free_block_queue.get_all_free_blocks()
        check(len(queued) == len(set(map(id, queued))) == self.num_free, "free queue is corrupt")
        check(
            {b.block_id for b in queued}
            == {b.block_id for b in self.blocks if b.ref_cnt == 0 and b is not self.null_block},
            "a block is in the free queue iff ref_cnt == 0 (the null block never is)",
        )
        check(all(b.ref_cnt >= 0 for b in self.blocks), "negative ref_cnt")
