"""Stage 4: eviction policies: the order in which free cached blocks are reused, siblings of the LRU free queue.

Builds on: kv/block_pool.py (FreeKVCacheBlockQueue: the engine's LRU order), kv/prefix.py (the caching pool).
Read with: chapters/04-prefix-caching.md (Real traffic).

The caching pool takes a block to reuse from its free queue (`popleft`), and a
cached block taken that way is evicted. So the free queue's order *is* the
eviction policy, and a policy is a free queue: the same methods (popleft,
popleft_n, append, append_n, prepend_n, remove, get_all_free_blocks,
num_free_blocks), one rule for which cached block goes first:

    lru    least recently freed: the engine's own queue (vLLM's order)
    fifo   cached earliest, whatever its hits since
    lfu    used by the fewest requests since it was computed; least recently freed among equals
    slru   segmented LRU: a block used by a second request is protected (at most 80 % of the pool) and
           evicted only after every probationary one, so a burst of one-off prompts cannot flush it
    min    Belady's optimum: the block whose next use is furthest away; it reads the future (a trace)

Every policy reuses a block with no cached prefix (an answer's blocks) before
any cached block, most recently freed first, as vLLM does: the pool prepends
such blocks (BlockPool.free), and the keyed policies (all but LRU, which is the
engine's own queue) keep them ahead of every cached one.

An index may ask the queue to `keep` a block for now: a tree of blocks
(kv/radix.py) keeps a block whose children are cached, so that eviction takes
leaves first. It hears of each block taken for reuse at once (`on_take`), so
that the next pop of the same allocation sees the parent as the leaf it now
is. A kept block is parked (still free, still counted) until the index
`unpark`s it, when its last cached child has gone.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import FreeKVCacheBlockQueue, KVCacheBlock

OUT, PLAIN, KEYED, PARKED = 0, 1, 2, 3  # where a block is: not free; free without a hash; in the heap; parked


class LRUQueue(FreeKVCacheBlockQueue):
    """The engine's LRU free queue, which can also skip the blocks an index asks it to keep (leaves first).
    With nothing kept it pops exactly what FreeKVCacheBlockQueue pops (tests/kv/test_eviction.py)."""

    def __init__(self, blocks: list[KVCacheBlock]):
        super().__init__(blocks)
        self.keep: Callable[[KVCacheBlock], bool] | None = None  # set by an index that evicts leaves first
        self.on_take: Callable[[KVCacheBlock], None] | None = None  # told of each block taken, at once

    def popleft(self) -> KVCacheBlock:
        if self.keep is None:
            return super().popleft()
        block = self.head.next_free_block
        while block is not self.tail and block.block_hash is not None and self.keep(block):
            block = block.next_free_block  # a parent whose children are cached: the next one
        if block is self.tail:
            block = self.head.next_free_block  # nothing but kept blocks: the index drops this one's subtree
        self.remove(block)  # (raises on an empty queue, as the base class's popleft)
        if self.on_take is not None:
            self.on_take(block)
        return block

    def unpark(self, block: KVCacheBlock) -> None:
        """Nothing is parked: a kept block stays where it is in the list."""


class KeyedFreeQueue:
    """Free blocks in a policy's order: blocks with no cached prefix first (the most recently freed first), then
    cached blocks by `key` (the smallest first), in a heap with lazy deletion. Invariant: num_free_blocks counts
    the blocks with ref_cnt 0, each in exactly one of the plain dict, the heap (one live entry) or the parked."""

    def __init__(self, blocks: list[KVCacheBlock]):
        size = max((b.block_id for b in blocks), default=-1) + 1
        self._where = [OUT] * size  # block_id -> OUT, PLAIN, KEYED or PARKED
        self._ticket = [-1] * size  # block_id -> the sequence number of its live heap entry
        self._key: list = [None] * size  # block_id -> its key while it is in the heap or parked
        self._plain: dict[KVCacheBlock, None] = {}  # free blocks without a hash, in the order freed
        self._heap: list[tuple] = []  # (key, seq, block), stale entries included
        self._parked: dict[KVCacheBlock, None] = {}  # free cached blocks an index keeps for now
        self._seq = 0  # heap entries' tie-break and ticket
        self.clock = 0  # counts frees and reuses: the policies' notion of time
        self.num_free_blocks = 0
        self.keep: Callable[[KVCacheBlock], bool] | None = None  # set by an index that evicts leaves first
        self.on_take: Callable[[KVCacheBlock], None] | None = None  # told of each block taken, at once
        self.prepend_n(blocks)  # block 0 first, as FreeKVCacheBlockQueue

    def key(self, block: KVCacheBlock):
        """The policy: the sort key of a cached block that has just been freed (the smallest is reused first)."""
        raise NotImplementedError

    def taken(self, block: KVCacheBlock) -> None:
        """The policy's hook: `block` leaves the free queue to be reused for other tokens."""

    def left(self, block: KVCacheBlock) -> None:
        """The policy's hook: `block` left the free queue, taken back by a cache hit (`remove`)."""

    def append(self, block: KVCacheBlock) -> None:
        """A freed block: a cached one takes its place by key, another goes to the plain blocks."""
        if self._where[block.block_id] != OUT:
            raise InvariantError(f"{block} is already in the free queue")
        self.num_free_blocks += 1
        if block.block_hash is None:
            self._plain[block] = None
            self._where[block.block_id] = PLAIN
        else:
            self._push(block, self.key(block))
        self.clock += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Blocks to reuse first, blocks[0] next (vLLM's prepend_n: blocks that hold no cached prefix)."""
        for block in reversed(blocks):
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        if self._plain:
            block = self._plain.popitem()[0]  # the most recently freed plain block
        else:
            block = self._pop_keyed()
        self._where[block.block_id] = OUT
        self.num_free_blocks -= 1
        self.taken(block)
        self.clock += 1
        if self.on_take is not None:
            self.on_take(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool")  # vLLM's message
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Take `block` out wherever it is (a cache hit on a free block)."""
        where = self._where[block.block_id]
        if where == OUT:
            raise InvariantError(f"{block} is not in the free queue")
        if where == PLAIN:
            del self._plain[block]
        elif where == PARKED:
            del self._parked[block]
        self._ticket[block.block_id] = -1  # its heap entry, if any, is stale now
        self._where[block.block_id] = OUT
        self.num_free_blocks -= 1
        self.left(block)

    def unpark(self, block: KVCacheBlock) -> None:
        """The index no longer keeps `block` (its last cached child went): back into the heap with its key."""
        if self._where[block.block_id] == PARKED:
            del self._parked[block]
            self._push(block, self._key[block.block_id])

    def rekey(self, block: KVCacheBlock, key) -> None:
        """Move a free cached block to another place in the order (SLRU's demotion)."""
        if self._where[block.block_id] == KEYED:
            self._push(block, key)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """In the order they would be reused (for tests and drawings)."""
        live = sorted(e for e in self._heap if self._ticket[e[2].block_id] == e[1])
        return [*reversed(self._plain), *(e[2] for e in live), *self._parked]

    def _push(self, block: KVCacheBlock, key) -> None:
        self._seq += 1
        self._key[block.block_id], self._ticket[block.block_id] = key, self._seq
        self._where[block.block_id] = KEYED
        heapq.heappush(self._heap, (key, self._seq, block))

    def _pop_keyed(self) -> KVCacheBlock:
        """The cached block with the smallest key that the index does not keep."""
        heap, ticket, keep = self._heap, self._ticket, self.keep
        while heap:
            _, seq, block = heapq.heappop(heap)
            if ticket[block.block_id] != seq:
                continue  # stale: the block left, or was pushed again with another key
            ticket[block.block_id] = -1
            if keep is not None and keep(block):
                self._parked[block] = None  # a parent of cached blocks: the index unparks it later
                self._where[block.block_id] = PARKED
                continue
            return block
        if self._parked:
            return self._parked.popitem()[0]  # only kept blocks are free: the index drops this one's subtree
        raise ValueError("No free blocks available")  # vLLM's message


class FIFOQueue(KeyedFreeQueue):
    """First in, first out: the block cached earliest goes first, however often it was hit since."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self._born = [0] * (max((b.block_id for b in blocks), default=-1) + 1)  # block_id -> when it was taken
        super().__init__(blocks)

    def key(self, block: KVCacheBlock):
        return self._born[block.block_id]

    def taken(self, block: KVCacheBlock) -> None:
        self._born[block.block_id] = self.clock


class LFUQueue(KeyedFreeQueue):
    """Least frequently used: the block used by the fewest requests since it was computed goes first; among
    equals, the least recently freed. A block's count starts again when it is reused for other tokens."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self._uses = [0] * (max((b.block_id for b in blocks), default=-1) + 1)  # block_id -> requests since taken
        super().__init__(blocks)

    def key(self, block: KVCacheBlock):
        self._uses[block.block_id] += 1  # a request that used it has just freed it
        return (self._uses[block.block_id], self.clock)

    def taken(self, block: KVCacheBlock) -> None:
        self._uses[block.block_id] = 0


class SLRUQueue(LFUQueue):
    """Segmented LRU: a block freed by a second request since it was computed is protected; every probationary
    block goes before any protected one, each segment least recently freed first. The protected segment holds at
    most PROTECTED of the pool; beyond that its least recent block is demoted to the probationary segment."""

    PROTECTED = 0.8  # the protected segment's share of the pool, as SLRU usually sets it

    def __init__(self, blocks: list[KVCacheBlock]):
        self._protected: OrderedDict[KVCacheBlock, None] = OrderedDict()  # free protected blocks, oldest first
        self.protected_cap = max(1, int(self.PROTECTED * len(blocks)))
        super().__init__(blocks)

    def key(self, block: KVCacheBlock):
        uses, _ = super().key(block)
        if uses < 2:
            return (0, self.clock)  # probation: used by one request so far
        self._protected[block] = None
        if len(self._protected) > self.protected_cap:
            oldest = self._protected.popitem(last=False)[0]
            self.rekey(oldest, (0, self.clock))  # demoted: the newest probationary block
        return (1, self.clock)

    def left(self, block: KVCacheBlock) -> None:
        self._protected.pop(block, None)

    def taken(self, block: KVCacheBlock) -> None:
        super().taken(block)
        self._protected.pop(block, None)


class NextUse:
    """The future of a trace, for Belady's MIN. `advance()` as each request arrives, in order; `key[h]` is then
    (-the index of the next request that uses hash h, -h's depth in the prompt) for every hash seen so far, the
    MIN order's sort key (the furthest next use first; among equals, the deeper block)."""

    NEVER = 1 << 62  # later than any request

    def __init__(self, requests: Sequence[Sequence]):
        self.requests = requests  # each request's block hashes, in arrival order
        self.after: list[list[int]] = [[]] * len(requests)  # request i -> the next use of each of its hashes
        seen: dict = {}  # hash -> the first request after the one being read that uses it
        for i in range(len(requests) - 1, -1, -1):
            self.after[i] = [seen.get(h, self.NEVER) for h in requests[i]]
            for h in requests[i]:
                seen[h] = i
        self.key: dict = {}  # block hash -> its sort key, as of the last request that arrived
        self.now = -1  # the index of the request that arrived last

    def advance(self) -> None:
        """The next request arrives: its hashes' next uses move on."""
        self.now += 1
        key = self.key
        for depth, (h, after) in enumerate(zip(self.requests[self.now], self.after[self.now])):
            key[h] = (-after, -depth)

    def next_use(self, block_hash) -> int:
        """The index of the next request that uses `block_hash` (NEVER if none will)."""
        return -self.key.get(block_hash, (-self.NEVER, 0))[0]


class BeladyQueue(KeyedFreeQueue):
    """Belady's MIN, the offline optimum: the cached block whose next use is furthest away goes first; among
    equals, the deeper one (a block's parent is used whenever it is, so the parent outlives it). It needs
    `future`: bind one with `BeladyQueue.for_future(future)`."""

    def __init__(self, blocks: list[KVCacheBlock], future: NextUse):
        self.future = future  # the trace's future, advanced by whoever replays it
        super().__init__(blocks)

    @classmethod
    def for_future(cls, future: NextUse):
        """A free-queue factory for a pool, as the preset's `eviction` part: (blocks) -> queue."""
        return partial(cls, future=future)

    def key(self, block: KVCacheBlock):
        return self.future.key.get(block.block_hash, (-NextUse.NEVER, 0))


# The policies by name: each a free-queue class for the pool (min needs a future: see replay_policy).
EVICTION_POLICIES: dict[str, type] = {
    "lru": LRUQueue,
    "fifo": FIFOQueue,
    "lfu": LFUQueue,
    "slru": SLRUQueue,
    "min": BeladyQueue,
}
