"""Stage 2: paged KV cache manager: per-request block tables, blocks allocated on demand.

Builds on: kv/block_pool.py, request.py.
Read with: chapters/02-paged-blocks.md.

A request's KV lives in fixed-size blocks scattered anywhere in the pool; its
block table maps logical block i (tokens i*block_size ..) to a physical block:

    request A, 21 tokens, block_size 8:   logical  0    1    2
                                          physical [5] [2] [9]   (slots 9*8+0 .. 9*8+4 used)
    slot of token t = block_table[t // block_size] * block_size + t % block_size

A new block is taken only when the last one is full, so at most
block_size - 1 slots per request are ever wasted (internal fragmentation),
and no request holds memory for tokens it has not produced yet.

Stage 2 still admits statically by worst case (`can_admit`), so the pool
never runs dry mid-batch; stage 5 replaces that with preemption.
vLLM: vllm/v1/core/kv_cache_manager.py, vllm/v1/core/single_type_kv_cache_manager.py.
"""

from __future__ import annotations

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import BlockPool, KVCacheBlock, cdiv
from pagedlab.kv.window import make_window
from pagedlab.request import Request


class PagedKVCacheManager:
    """Invariant: every block with ref_cnt > 0 appears in exactly ref_cnt block tables."""

    prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache (none before stage 4)
    prefix_cache_hits = 0  # of those, tokens found cached

    def __init__(
        self, num_kv_blocks: int, block_size: int, max_model_len: int, sliding_window: int = 0, pool: BlockPool = None
    ):
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.max_model_len = max_model_len
        # `pool`: a KV cache group's view of a pool the groups share (kv/hybrid.py); else its own
        self.pool = self.make_pool(num_kv_blocks) if pool is None else pool
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}  # request_id -> its block table
        self.window = make_window(sliding_window, block_size, self.pool)  # blocks out of reach (kv/window.py)

    def make_pool(self, num_kv_blocks: int) -> BlockPool:
        return BlockPool(num_kv_blocks)

    @classmethod
    def from_config(cls, config) -> PagedKVCacheManager:
        return cls(config.num_kv_blocks, config.block_size, config.max_model_len, config.sliding_window)

    # BEGIN SOLUTION
    # TASK allocate-slots (20 pts): on-demand allocation: give a request just enough blocks for its next tokens, or
    # None.
    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Grow the request's table (a new request starts an empty one) to ceil((num_computed_tokens +
        num_new_tokens) / block_size) blocks, taking the missing ones from the pool's head.

        Returns the ids of the blocks appended, in table order ([] when the last block still has room); None, with
        nothing changed, when the pool has fewer free blocks than that. (With a sliding window, first
        self.window.free_skipped(table, num_computed_tokens): no window in this stage's graded cases.)"""
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks is None:
            blocks = self.req_to_blocks[request.request_id] = []
        self.window.free_skipped(blocks, request.num_computed_tokens)  # (a sliding window's, if any)
        # ceil((computed + new) / block_size) blocks hold every token so far (cdiv, inlined: this runs for every
        # request at every step); most decode steps need none more
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(blocks)
        if needed <= 0:
            return []
        if needed > self.pool.num_free:
            return None
        new_blocks = self.pool.allocate(needed)
        blocks.extend(new_blocks)
        return [b.block_id for b in new_blocks]

    def free(self, request: Request) -> None:
        """Return the request's blocks to the pool tail first (its last block first: stage 4's eviction relies on
        that order) and forget its table; a request without a table is a no-op."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.pool.free(self.window.held(reversed(blocks)))

    # END SOLUTION

    @property
    def null_block(self) -> KVCacheBlock | None:
        """The block standing for entries a sliding window dropped (None without a window)."""
        return self.window.null_block

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Free blocks allocate_slots(request, num_new_tokens) takes, counted without taking them (a hybrid model's
        coordinator adds up its groups': kv/hybrid.py); a window's blocks behind it are freed first."""
        table = self.req_to_blocks.get(request.request_id, ())
        return max(cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(table), 0)

    def take_block_copies(self) -> list:
        return []  # nothing is shared before stage 3

    def lookup_prefix(self, request: Request) -> int:
        return 0  # no prefix cache before stage 4: every prompt token is computed

    def reset_prefix_cache(self) -> bool:
        """Nothing is cached before stage 4; as in vLLM, refused (False) while any block is in use."""
        return self.num_used_blocks == 0

    def max_blocks(self, request: Request) -> int:
        """Worst case: every token but the last sampled one gets K/V (the last is never fed back)."""
        return cdiv(request.max_num_tokens - 1, self.block_size)

    def worst_case_blocks(self, requests: list[Request]) -> int:
        """The most blocks `requests` can hold at once (stage 2: each its own worst case; stage 3 shares)."""
        return sum(self.max_blocks(r) for r in requests)

    def promised_blocks(self, running: list[Request]) -> int:
        """Blocks the running requests may still claim: their worst case minus the blocks they hold."""
        tables = [self.req_to_blocks.get(r.request_id, ()) for r in running]
        held = {b.block_id for blocks in tables for b in self.window.held(blocks)}
        return self.worst_case_blocks(running) - len(held)

    def can_admit(self, group: list[Request], running: list[Request]) -> bool:
        """Static admission: the group's worst case fits in what the running requests may still claim."""
        return self.admission_need(group, running) <= self.pool.num_free

    def admission_need(self, group: list[Request], running: list[Request], hits_of: dict | None = None) -> int:
        """Free blocks static admission asks for: the group's worst case plus what the running requests may still
        claim (`hits_of`: request id -> its prefix-cache hits, from stage 4 on)."""
        return self.worst_case_blocks(group) + self.promised_blocks(running)

    def num_hit_tokens(self, hits: list) -> int:
        """Tokens a list of prefix-cache hits covers."""
        return len(hits) * self.block_size

    def can_ever_admit(self, group: list[Request]) -> bool:
        """Even an empty pool could not hold it: each request's own worst case, sharing not counted (a
        group preempted by recompute at stage 5 may rebuild its children's prompts one by one)."""
        return sum(self.max_blocks(r) for r in group) <= self.pool.num_usable

    def get_block_ids(self, request: Request) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request.request_id, ())]

    def slots_held(self, request: Request) -> int:
        return len(list(self.window.held(self.req_to_blocks.get(request.request_id, ())))) * self.block_size

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds (the null block is nobody's)."""
        return self.pool.num_used

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return self.pool.usage

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        holders: dict[int, int] = {}
        for blocks in self.req_to_blocks.values():
            for b in self.window.held(blocks):
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
        self.window.check_invariants()
        for b in self.window.held(self.pool.blocks):
            if b.ref_cnt != holders.get(b.block_id, 0):
                raise InvariantError(f"{b} is held by {holders.get(b.block_id, 0)} tables")
