"""Stage 4: automatic prefix caching: full blocks stay findable by hash, even after they are freed.

Builds on: kv/cow.py (sharing, fork, CoW), kv/block_pool.py (free queue), kv/hashing.py (hashes, the index).
Read with: chapters/04-prefix-caching.md.

A block that becomes full is registered under its chained hash. When its
last holder frees it, it goes back to the free queue *keeping* its hash: it
is free (evictable) and cached at once. A later request whose prompt starts
with the same blocks finds them by hash and `touch`es them (ref_cnt + 1,
out of the free queue) instead of recomputing them:

    free queue:  head <-> [b4 | hash] <-> [b9] <-> [b2 | hash] <-> tail
                 allocation pops the head and evicts its hash; a hit on b2 removes it from the middle

Freed tail-first, a request's last blocks sit nearer the head than its
first ones, so the LRU order evicts the tail of a chain before its head,
which keeps the shared beginnings of prompts cached longest.
vLLM: vllm/v1/core/block_pool.py (cached_block_hash_to_block, touch, cache_full_blocks),
vllm/v1/core/kv_cache_manager.py (get_computed_blocks).
"""

from __future__ import annotations

from collections.abc import Iterable

from pagedlab.kv.block_pool import BlockPool, KVCacheBlock, cdiv
from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.kv.hashing import HashChainIndex, make_none_hash, update_block_hashes
from pagedlab.request import Request


class CachingBlockPool(BlockPool):
    """A pool whose free blocks keep their cached prefix until they are reused. Invariant: the prefix index
    maps exactly the blocks whose block_hash is set (kv/hashing.py)."""

    def __init__(self, num_blocks: int, index=None, free_queue: type | None = None):
        super().__init__(num_blocks, free_queue)  # the free queue's order is the eviction policy
        self.index = HashChainIndex() if index is None else index  # block hash -> the block holding that prefix
        self.index.attach(self.free_block_queue)  # an index may constrain the order (kv/radix.py: leaves first)

    @property
    def cached_block_hash_to_block(self) -> dict:
        """Every cached prefix: block hash -> its block (vLLM's name)."""
        return self.index.cached_block_hash_to_block

    # BEGIN SOLUTION
    # TASK caching-pool (15 pts): the cache's block pool: a hit takes its block back from the free queue, and a block
    # reused for other tokens loses its cached prefix.
    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A cache hit on each block: ref_cnt + 1; a block that was free (ref_cnt 0) first leaves the free queue
        from wherever it is."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """As BlockPool.allocate (the free queue's head, ref_cnt 1, the same errors); each block taken also loses
        its cached prefix (the index evicts it)."""
        blocks = super().allocate(n)
        for block in blocks:
            self.index.evict(block)  # reused for other tokens: its prefix is gone
        return blocks

    # END SOLUTION

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (vLLM's BlockPool.reset_prefix_cache); refused (False) while a block is held,
        since a running request's table points at cached blocks and later requests would still hit them. The
        null block is never free and never held: it does not count (vLLM: num_used_blocks != 1)."""
        if self.num_used:
            return False
        self.index.reset()
        return True

    @property
    def num_cached_free(self) -> int:
        return sum(1 for b in self.index.blocks() if b.ref_cnt == 0)

    def check_invariants(self) -> None:
        super().check_invariants()
        self.index.check_invariants(self.blocks)


class PrefixCachingKVCacheManager(CowKVCacheManager):
    """Stage 3's manager over a caching pool. Counts prefix-cache queries and hits in tokens."""

    def __init__(
        self,
        num_kv_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = True,
        hash_seed: int = 0,
        hash_algo: str = "sha256",
        sliding_window: int = 0,
        prefix_index: type = HashChainIndex,
        eviction: type | None = None,
        pool: CachingBlockPool | None = None,
    ):
        # the preset's parts (stages.py), read by make_pool as the base class builds the pool
        self.prefix_index, self.eviction = prefix_index, eviction
        super().__init__(num_kv_blocks, block_size, max_model_len, sliding_window, pool)
        self.enable_caching = enable_caching
        self.none_hash = make_none_hash(hash_seed)
        self.hash_algo = hash_algo
        self.num_cached_blocks: dict[str, int] = {}  # request_id -> leading blocks already registered
        self.__next_allocate_slots = super().allocate_slots  # bound once, as in kv/cow.py

    @classmethod
    def from_config(cls, config, **extra) -> PrefixCachingKVCacheManager:
        """`extra`: a subclass's own arguments (stage 5 adds its swap pool)."""
        return cls(
            config.num_kv_blocks,
            config.block_size,
            config.max_model_len,
            enable_caching=config.enable_prefix_caching,
            hash_seed=config.seed,
            sliding_window=config.sliding_window,
            **extra,
        )

    def make_pool(self, num_kv_blocks: int) -> CachingBlockPool:
        return CachingBlockPool(num_kv_blocks, self.prefix_index(), self.eviction)

    # BEGIN SOLUTION
    # TASK lookup (40 pts): lookup: the longest run of cached full blocks, leaving at least the last token to compute.
    def get_computed_blocks(self, request: Request) -> list[KVCacheBlock]:
        """The blocks of the request's longest cached prefix, in order: its block hashes brought up to date
        (update_block_hashes), then looked up in the index one by one up to the first miss, at most
        (num_tokens - 1) // block_size of them (the last token is always computed: its logits are needed).
        [] when caching is off. (A sliding window's: self.window.skip_hits(hits).)"""
        if not self.enable_caching:
            return []
        update_block_hashes(request, self.block_size, self.none_hash, self.hash_algo)
        limit = (request.num_tokens - 1) // self.block_size  # the last token's logits are needed
        hits = []
        for block_hash in request.block_hashes[:limit]:
            block = self.pool.index.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return self.window.skip_hits(hits)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (the pool's reset_prefix_cache): False, with nothing forgotten, while any block
        is held."""
        return self.pool.reset_prefix_cache()

    def lookup_prefix(self, request: Request) -> int:
        """Start a request's table with its cached prefix; returns the tokens that need no compute."""
        return self.take_hits(request, self.get_computed_blocks(request))

    def take_hits(self, request: Request, hits: list[KVCacheBlock]) -> int:
        """Start the request's table with `hits` (touching them) and note them as already cached; when caching is on,
        count the query (prefix_cache_queries += num_tokens, prefix_cache_hits += hit tokens). Returns the hit
        tokens, len(hits) * block_size."""
        self.pool.touch(self.window.held(hits))
        self.req_to_blocks[request.request_id] = list(hits)
        self.num_cached_blocks[request.request_id] = len(hits)
        if self.enable_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(hits) * self.block_size
        return len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """As stage 3's (the same return); then, when caching is on and the step fills blocks, each newly full
        block of the table is registered under its hash (_cache_full_blocks)."""
        new_blocks = self.__next_allocate_slots(request, num_new_tokens)  # super().allocate_slots
        if new_blocks is not None and self.enable_caching:
            num_full = (request.num_computed_tokens + num_new_tokens) // self.block_size
            if num_full > self.num_cached_blocks.get(request.request_id, 0):  # this step fills a block
                self._cache_full_blocks(request, num_full)
        return new_blocks

    def _cache_full_blocks(self, request: Request, num_full: int) -> None:
        """Register the blocks this step fills (their K/V is written by this step's forward pass)."""
        update_block_hashes(request, self.block_size, self.none_hash, self.hash_algo)
        blocks = self.req_to_blocks[request.request_id]
        for i in range(self.num_cached_blocks.get(request.request_id, 0), num_full):
            if blocks[i] is not self.window.null_block:  # a block a window dropped was cached when it filled
                parent = request.block_hashes[i - 1] if i else None  # a tree of blocks hangs it there
                self.pool.index.insert(blocks[i], request.block_hashes[i], parent)
        self.num_cached_blocks[request.request_id] = num_full

    # END SOLUTION

    def can_admit(self, group: list[Request], running: list[Request]) -> bool:
        """Worst case minus cache hits; a hit on a free cached block still takes it off the free queue."""
        hits_of = {r.request_id: self.get_computed_blocks(r) for r in group}
        return self.admission_need(group, running, hits_of) <= self.pool.num_free

    def admission_need(self, group: list[Request], running: list[Request], hits_of: dict | None = None) -> int:
        """As stage 2's, less each member's prefix-cache hits (`hits_of`: request id -> its hits), plus the free
        cached blocks those hits revive. A hit behind a window (the null block) needs no block at all: one entry
        per group, as worst_case_blocks counts a group's shared prompt blocks once."""
        hits = {}
        for r in group:
            for i, b in enumerate((hits_of or {}).get(r.request_id, ())):
                hits[(r.group_id, i) if b is self.window.null_block else id(b)] = b
        need = self.worst_case_blocks(group) - len(hits)
        revived = sum(1 for b in self.window.held(hits.values()) if b.ref_cnt == 0)
        return need + revived + self.promised_blocks(running)

    def blocks_to_admit(self, request: Request, hits: list[KVCacheBlock], num_new_tokens: int, cap=None) -> int:
        """Free blocks admitting `request` would take: new blocks, plus free cached hits it revives (a hit
        behind a window is the null block: none taken, as vLLM's get_num_blocks_to_allocate). `cap`: the most
        blocks its table can hold at once (a sliding window's max_blocks_held), or None."""
        hit_tokens = len(hits) * self.block_size
        needed = cdiv(hit_tokens + num_new_tokens, self.block_size)
        new = max((needed if cap is None else min(needed, cap)) - len(hits), 0)
        return new + sum(1 for b in self.window.held(hits) if b.ref_cnt == 0)

    def admission_blocks(self, request: Request, hits: list, num_new: int, whole: int, max_step_tokens: int) -> int:
        """Free blocks admitting `request` takes, as vLLM's allocate_slots checks them: its first chunk of `num_new`
        tokens, and blocks for its `whole` current length (scheduler_reserve_full_isl; a window caps how many it
        ever holds), whichever is more."""
        cap = self.window.max_blocks_held(max_step_tokens, self.max_model_len)
        return max(self.blocks_to_admit(request, hits, num_new), self.blocks_to_admit(request, hits, whole, cap))

    def fork(self, parent: Request, child: Request) -> None:
        super().fork(parent, child)
        self.num_cached_blocks[child.request_id] = self.num_cached_blocks.get(parent.request_id, 0)

    def free(self, request: Request) -> None:
        self.num_cached_blocks.pop(request.request_id, None)
        super().free(request)
