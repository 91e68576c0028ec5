"""Stage 5: preemption by swapping: a victim's blocks are copied to a CPU pool instead of dropped.

Builds on: kv/prefix.py (the stage-4 manager; everything else is unchanged).
Read with: chapters/05-continuous-batching.md.

    swap_out(victim):  GPU table [7 3 9]  --copy-->  CPU blocks [0 1 2];  GPU blocks freed
    swap_in(victim):   CPU blocks [0 1 2] --copy-->  new GPU blocks [4 8 5]; table rewritten; CPU blocks freed

The request keeps num_computed_tokens, so it resumes exactly where it stopped
instead of recomputing its prompt and outputs. The copies travel in the
scheduler output (`swap_out`, `swap_in`) and the runner applies each step's
copies as batched index ops before the forward pass.

Decisions (vLLM v0 made similar ones):
- shared blocks (forks) are copied out like private ones: the CPU copy is the
  victim's own snapshot; the other holders keep the GPU block, and after swap-in
  the victim's blocks are private (sharing is not restored);
- prefix-cached blocks stay cached on the GPU when the victim lets go of them;
  after swap-in its full blocks are offered to the cache again (duplicates are ignored);
- if the CPU pool cannot hold the whole victim, the scheduler falls back to recompute.
vLLM v0.10.2: vllm/core/scheduler.py (_preempt_by_swap), vllm/core/block_manager.py (swap_out, swap_in);
vLLM v1 dropped swapping (see chapters/05-continuous-batching.md).
"""

from __future__ import annotations

from pagedlab.errors import InvariantError, check
from pagedlab.kv.block_pool import cdiv
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.request import Request


class SwapPool:
    """CPU blocks. Invariant: free + held == num_blocks; each held block belongs to one request."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free_ids = list(range(num_blocks - 1, -1, -1))  # a stack: the lowest id is reused first
        self.held: dict[str, list[int]] = {}  # request_id -> its CPU blocks, in table order

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def allocate(self, request_id: str, n: int) -> list[int]:
        if n > self.num_free:
            raise InvariantError(f"{request_id} asks for {n} CPU blocks, {self.num_free} free: check num_free first")
        ids = [self.free_ids.pop() for _ in range(n)]
        self.held[request_id] = ids
        return ids

    def free(self, request_id: str) -> list[int]:
        ids = self.held.pop(request_id, [])
        self.free_ids.extend(reversed(ids))
        return ids

    def check_invariants(self) -> None:
        held = [b for ids in self.held.values() for b in ids]
        check(len(held) == len(set(held)) and not set(held) & set(self.free_ids), "a CPU block is held twice")
        check(len(held) + len(self.free_ids) == self.num_blocks, "a CPU block leaked")


class SwappingKVCacheManager(PrefixCachingKVCacheManager):
    """The stage-4 manager plus a CPU swap pool."""

    def __init__(self, num_kv_blocks: int, block_size: int, max_model_len: int, num_swap_blocks: int = 0, **kw):
        super().__init__(num_kv_blocks, block_size, max_model_len, **kw)
        self.swap_pool = SwapPool(num_swap_blocks)
        self.swapped_nulls: dict[str, int] = {}  # request_id -> leading null-block entries of its swapped table

    @classmethod
    def from_config(cls, config, **extra) -> SwappingKVCacheManager:
        return super().from_config(config, num_swap_blocks=config.num_swap_blocks, **extra)

    def is_swapped(self, request: Request) -> bool:
        return request.request_id in self.swap_pool.held

    # BEGIN SOLUTION
    # TASK swap (25 pts): swap a preempted request's blocks out to the CPU pool and back into new GPU blocks.
    def can_swap_out(self, group: list[Request]) -> bool:
        """True if the CPU pool has a free block for every GPU block the group's tables hold (each table counted)."""
        held = sum(len(list(self.window.held(self.req_to_blocks.get(r.request_id, ())))) for r in group)
        return held <= self.swap_pool.num_free

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Copy the request's blocks to newly allocated CPU blocks (swap_pool.allocate) and free its GPU blocks as
        free() does, keeping num_computed_tokens. Returns [(gpu block, cpu block)] in table order; a block
        copied-on-write this step (still empty) is copied out from its source."""
        # A block copied-on-write this very step is still empty: copy out its source instead.
        uncopied = {c.dst: c.src for c in self.pending_copies if c.request_id == request.request_id}
        table = self.req_to_blocks.get(request.request_id, [])
        nulls = 0  # leading entries a sliding window dropped (they stay dropped)
        while nulls < len(table) and table[nulls] is self.window.null_block:
            nulls += 1
        self.swapped_nulls[request.request_id] = nulls
        gpu = [uncopied.get(b, b) for b in self.get_block_ids(request)[nulls:]]
        cpu = self.swap_pool.allocate(request.request_id, len(gpu))
        num_computed = request.num_computed_tokens
        super().free(request)  # GPU references dropped, shared and cached blocks handled as usual
        request.num_computed_tokens = num_computed  # the K/V is kept, on the CPU
        return list(zip(gpu, cpu))

    def blocks_to_swap_in(self, request: Request, num_new_tokens: int) -> int:
        """The free GPU blocks that swapping the request back in and feeding num_new_tokens more will take."""
        nulls = self.swapped_nulls.get(request.request_id, 0)
        return cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - nulls

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Free the request's CPU blocks and copy them into newly allocated GPU blocks, which become its table (its
        full blocks are offered to the cache again at its next allocation). Returns [(cpu block, gpu block)]."""
        cpu = self.swap_pool.free(request.request_id)
        blocks = self.pool.allocate(len(cpu))
        nulls = self.swapped_nulls.pop(request.request_id, 0)
        self.req_to_blocks[request.request_id] = [self.window.null_block] * nulls + blocks
        self.num_cached_blocks[request.request_id] = 0  # re-offered to the cache on the next allocation
        return [(c, b.block_id) for c, b in zip(cpu, blocks)]

    # END SOLUTION

    def free(self, request: Request) -> None:
        self.swap_pool.free(request.request_id)  # a request that ends while swapped out
        self.swapped_nulls.pop(request.request_id, None)
        super().free(request)

    def check_invariants(self) -> None:
        super().check_invariants()
        self.swap_pool.check_invariants()
