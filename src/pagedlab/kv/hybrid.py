"""Stages 2-5, hybrid models: one KV manager per KV cache group over one shared pool, and a coordinator over them.

Builds on: kv/cache_groups.py (which layers form a group), the stage's own manager (kv/paged.py .. kv/swap.py),
kv/window.py (what a windowed group frees), kv/hashing.py (block hashes).
Read with: chapters/02-paged-blocks.md (Hybrid models: one table per group), chapters/97-architecture.md.

A hybrid model (gpt-oss, Gemma 3, Qwen2 with `layer_types`) has full-attention layers that read every block and
sliding-window layers that never read a block behind their window again. One block table per request cannot serve
both, so each KV cache group gets its own table, kept by its own manager, and every manager takes blocks from the
same pool (vLLM's HybridKVCacheCoordinator over one SingleTypeKVCacheManager per group):

    request A, 21 tokens, block_size 4, window 8:
        group 0 (full, layers 1 3)      [5] [2] [9] [4] [7] [3]        every block kept
        group 1 (sliding-8, layers 0 2) [0] [0] [0] [6] [8] [1]        behind the window: the null block (0)
    one pool: blocks 1-9 are each in exactly one group's table; a block holds its group's layers' K/V

The coordinator makes the groups act as one manager, as vLLM's does:
- allocate_slots counts every group's new blocks first and allocates only if all of them fit (all or none);
- a prefix-cache hit is the longest prefix every group can serve: the full groups' longest run of cached blocks
  from the start, then each window's run of cached blocks that ends there (find_longest_cache_hit, a fixed point);
- a group's cached prefixes are its own: the shared index is keyed by (group, block hash), vLLM's
  BlockHashWithGroupId, since the same tokens have a different block, with other layers' K/V, in each group;
- admission and the scheduler's checks add up the groups' blocks; freeing, forking, copy-on-write and swapping go
  to every group.

vLLM v0.33.0: vllm/v1/core/kv_cache_coordinator.py (HybridKVCacheCoordinator), vllm/v1/core/kv_cache_utils.py
(BlockHashWithGroupId), vllm/v1/core/single_type_kv_cache_manager.py (FullAttentionManager, SlidingWindowManager).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pagedlab.errors import InvariantError, check
from pagedlab.kv.block_pool import BlockPool, KVCacheBlock, cdiv
from pagedlab.kv.cache_groups import KVCacheGroup
from pagedlab.kv.hashing import update_block_hashes
from pagedlab.kv.swap import SwapPool
from pagedlab.request import Request


class GroupIndex:
    """One group's view of the shared prefix index: its hashes are keyed (group, block hash)."""

    def __init__(self, index, group: int):
        self.index, self.group = index, group

    def get(self, block_hash) -> KVCacheBlock | None:
        return self.index.get((self.group, block_hash))

    def insert(self, block: KVCacheBlock, block_hash, parent=None) -> bool:
        return self.index.insert(block, (self.group, block_hash), None if parent is None else (self.group, parent))

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy and pickle look for these before the instance has its fields
            raise AttributeError(name)
        return getattr(self.index, name)  # evict, reset, blocks, len: the shared index's


class GroupPool:
    """One group's view of the shared pool: the same blocks, free queue and null block; its own index view."""

    def __init__(self, pool: BlockPool, group: int):
        self.shared = pool
        if hasattr(pool, "index"):
            self.index = GroupIndex(pool.index, group)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # (as GroupIndex's)
            raise AttributeError(name)
        return getattr(self.shared, name)  # allocate, free, touch, num_free, take_null_block, ...


class GroupSwapPool(SwapPool):
    """One group's CPU blocks: SwapPool's allocate and free over the shared pool's very list of free ids (the
    runner's one CPU cache), each group holding its own. (Its own check_invariants would see only its share: the
    coordinator checks them all together.)"""

    def __init__(self, shared: SwapPool):
        self.num_blocks, self.free_ids = shared.num_blocks, shared.free_ids  # the same list, not a copy
        self.held: dict[str, list[int]] = {}  # request_id -> this group's CPU blocks, in table order


class SwapView:
    """Every group's CPU blocks per request, for drawings (viz): read only."""

    def __init__(self, groups: Sequence[GroupSwapPool], shared: SwapPool):
        self.groups, self.num_blocks = groups, shared.num_blocks
        self.shared = shared

    @property
    def num_free(self) -> int:
        return self.shared.num_free

    @property
    def held(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for g in self.groups:
            for rid, ids in g.held.items():
                out.setdefault(rid, []).extend(ids)
        return out


class HybridKVCacheManager:
    """The stage's manager once per KV cache group, over one pool. Block ids travel as one list per group (a tuple,
    as vLLM's get_block_ids). Invariant: every held block's ref_cnt equals the tables of all groups holding it."""

    def __init__(self, manager_cls: type, groups: Sequence[KVCacheGroup], num_kv_blocks: int, block_size: int,
                 max_model_len: int, num_swap_blocks: int = 0, **parts):  # fmt: skip
        if len(groups) < 2:
            raise ValueError("kv_cache_groups: a hybrid KV cache has two groups or more (one is a plain manager)")
        self.groups = tuple(groups)
        self.block_size, self.num_kv_blocks, self.max_model_len = block_size, num_kv_blocks, max_model_len
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        extra = {"num_swap_blocks": num_swap_blocks} if hasattr(manager_cls, "swap_out") else {}
        # Group 0's manager builds the pool as the stage builds it (a caching pool, its eviction order), then hands it
        # to all: block 0 becomes the null block, as vLLM's pool always has it, and each group sees the pool through a
        # GroupPool (the same blocks and free queue, its own keys in the prefix index).
        first = manager_cls(num_kv_blocks, block_size, max_model_len, sliding_window=self.groups[0].window or 0,
                            **extra, **parts)  # fmt: skip
        self.pool = first.pool
        self.pool.take_null_block()
        first.pool = GroupPool(self.pool, 0)
        self.managers = [first]
        for g, group in enumerate(self.groups[1:], start=1):
            self.managers.append(manager_cls(num_kv_blocks, block_size, max_model_len, sliding_window=group.window or 0,
                                             pool=GroupPool(self.pool, g), **extra, **parts))  # fmt: skip
        self.enable_caching = getattr(self.managers[0], "enable_caching", False)
        if extra:
            self.shared_swap = SwapPool(num_swap_blocks)
            for m in self.managers:
                m.swap_pool = GroupSwapPool(self.shared_swap)
            self.swap_pool = SwapView([m.swap_pool for m in self.managers], self.shared_swap)

    @classmethod
    def for_config(cls, manager_cls: type, groups, config, **parts) -> HybridKVCacheManager:
        """The stage's manager class for each group of `config` (stages.make_kv_manager)."""
        kw = {}
        if hasattr(manager_cls, "get_computed_blocks"):
            kw = {"enable_caching": config.enable_prefix_caching, "hash_seed": config.seed}
        return cls(manager_cls, groups, config.num_kv_blocks, config.block_size, config.max_model_len,
                   config.num_swap_blocks, **kw, **parts)  # fmt: skip

    @property
    def null_block(self) -> KVCacheBlock:
        return self.pool.null_block

    # -- tables ------------------------------------------------------------------------------------------------

    def get_block_ids(self, request: Request) -> tuple[list[int], ...]:
        """The request's table in each group (empty lists for a request without one)."""
        return tuple(m.get_block_ids(request) for m in self.managers)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> tuple[list[int], ...] | None:
        """Every group's blocks for `num_new_tokens` more, or None with nothing allocated when they do not all fit
        (vLLM's coordinator: remove_skipped_blocks, then get_num_blocks_to_allocate summed, then each group).
        Returns the ids each group appended, or () when none did."""
        rid = request.request_id
        for m in self.managers:  # blocks that fell behind a window go back first: they count as free
            table = m.req_to_blocks.get(rid)
            if table:
                m.window.free_skipped(table, request.num_computed_tokens)
        needed = sum(m.blocks_needed(request, num_new_tokens) for m in self.managers)
        if needed > self.pool.num_free:
            return None
        new = tuple(m.allocate_slots(request, num_new_tokens) for m in self.managers)
        if any(ids is None for ids in new):
            raise InvariantError(f"{rid}: a group found no room although every group's blocks were counted")
        return new if any(new) else ()

    def free(self, request: Request) -> None:
        for m in self.managers:
            m.free(request)

    def fork(self, parent: Request, child: Request) -> None:
        for m in self.managers:
            m.fork(parent, child)

    def take_block_copies(self) -> list:
        return [replace(c, group=g) for g, m in enumerate(self.managers) for c in m.take_block_copies()]

    # -- prefix cache ------------------------------------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], ...]:
        """Each group's hits for the longest prefix every group can serve (vLLM's find_longest_cache_hit, a fixed
        point): a full group's hit is its own manager's (its cached blocks from the first, up to a miss, the last
        token left to compute); within the shortest of those, each window's longest run of cached blocks covering
        its last window - 1 tokens (entries before the run are the null block: no query will read them). A shorter
        answer from any kind shortens the candidate, and every kind is asked again, until none shortens it."""
        if not self.enable_caching:
            return tuple([] for _ in self.managers)
        kinds: dict[int | None, list] = {}  # window -> its groups' managers (vLLM's attention groups)
        for group, m in zip(self.groups, self.managers):
            kinds.setdefault(group.window, []).append(m)
        # each full group's own lookup (it brings the request's block hashes up to date): a prefix of cached blocks,
        # so the blocks every full group serves are the shortest one's length of each
        full = {id(m): m.get_computed_blocks(request) for m in kinds.get(None, ())}
        update_block_hashes(request, self.block_size, self.managers[0].none_hash, self.managers[0].hash_algo)
        length = (request.num_tokens - 1) // self.block_size  # the last token's logits are needed
        hits: dict[int, list] = {}
        while True:
            candidate = length
            for window, ms in kinds.items():
                if window is None:
                    candidate = min([candidate] + [len(full[id(m)]) for m in ms])
                    found = [full[id(m)][:candidate] for m in ms]
                else:
                    found = self._window_hit(ms, request.block_hashes, candidate, window)
                    candidate = min(candidate, len(found[0]))
                for m, blocks in zip(ms, found):
                    hits[id(m)] = blocks
            if candidate >= length:
                break
            length = candidate
        return tuple(hits[id(m)][:length] for m in self.managers)

    def _window_hit(self, ms, hashes, max_blocks: int, window: int) -> list[list[KVCacheBlock]]:
        """A window of W tokens: scanning back from max_blocks, the first run of cdiv(W - 1, block_size) blocks
        cached in every one of these groups; the hit ends with that run and the null block stands for everything
        before it. With no such run, the run of cached blocks from the first, however short (vLLM's
        SlidingWindowManager.find_longest_cache_hit)."""
        null = self.pool.null_block
        run_needed = cdiv(window - 1, self.block_size)
        found = [[null] * max_blocks for _ in ms]
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            blocks = [m.pool.index.get(hashes[i]) for m in ms]
            if any(b is None for b in blocks):
                run = 0
                continue
            for out, b in zip(found, blocks):
                out[i] = b
            run += 1
            if run >= run_needed:
                return [out[: i + run] for out in found]
        return [out[:run] for out in found]

    def num_hit_tokens(self, hits: tuple[list, ...]) -> int:
        """Every group's hits cover the same tokens; no hits may come as [] (a follower waiting for its fork)."""
        return len(hits[0]) * self.block_size if hits else 0

    def take_hits(self, request: Request, hits: tuple[list, ...]) -> int:
        """Start every group's table with its hits; counts the query once (not once per group)."""
        for m, blocks in zip(self.managers, hits or [[] for _ in self.managers]):
            m.take_hits(request, blocks)
        if self.enable_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += self.num_hit_tokens(hits)
        return self.num_hit_tokens(hits)

    def lookup_prefix(self, request: Request) -> int:
        if not hasattr(self.managers[0], "take_hits"):
            return 0  # no prefix cache before stage 4
        return self.take_hits(request, self.get_computed_blocks(request))

    def reset_prefix_cache(self) -> bool:
        if hasattr(self.pool, "reset_prefix_cache"):
            return self.pool.reset_prefix_cache()
        return self.num_used_blocks == 0

    # -- admission ---------------------------------------------------------------------------------------------

    def admission_blocks(self, request: Request, hits, num_new: int, whole: int, max_step_tokens: int) -> int:
        """vLLM's two checks, each summed over the groups: the first chunk's blocks, and the whole length's (each
        window capping its own); the larger must be free."""
        chunk = whole_blocks = 0
        for m, blocks in zip(self.managers, hits):
            cap = m.window.max_blocks_held(max_step_tokens, self.max_model_len)
            chunk += m.blocks_to_admit(request, blocks, num_new)
            whole_blocks += m.blocks_to_admit(request, blocks, whole, cap)
        return max(chunk, whole_blocks)

    def can_admit(self, group: list[Request], running: list[Request]) -> bool:
        """Static admission (stages 2-4): every group's worst case, less the hits of the coordinated lookup."""
        if hasattr(self.managers[0], "get_computed_blocks"):
            hits = {r.request_id: self.get_computed_blocks(r) for r in group}
        else:
            hits = {}
        need = 0
        for g, m in enumerate(self.managers):
            need += m.admission_need(group, running, {rid: h[g] for rid, h in hits.items()})
        return need <= self.pool.num_free

    def can_ever_admit(self, group: list[Request]) -> bool:
        return sum(m.max_blocks(r) for m in self.managers for r in group) <= self.pool.num_usable

    def max_blocks(self, request: Request) -> int:
        return sum(m.max_blocks(request) for m in self.managers)

    def worst_case_blocks(self, requests: list[Request]) -> int:
        return sum(m.worst_case_blocks(requests) for m in self.managers)

    # -- preemption by swapping (stage 5) ------------------------------------------------------------------------

    def is_swapped(self, request: Request) -> bool:
        # stages 2-4's managers never swap, and have no is_swapped (a recorded step asks every stage)
        return any(m.is_swapped(request) for m in self.managers if hasattr(m, "is_swapped"))

    def can_swap_out(self, group: list[Request]) -> bool:
        held = sum(len(m.window.held(m.req_to_blocks.get(r.request_id, ()))) for m in self.managers for r in group)
        return held <= self.shared_swap.num_free

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Every group's blocks out (a block id names the same block of the pool in every group's layers)."""
        return [pair for m in self.managers for pair in m.swap_out(request)]

    def blocks_to_swap_in(self, request: Request, num_new_tokens: int) -> int:
        return sum(m.blocks_to_swap_in(request, num_new_tokens) for m in self.managers)

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        return [pair for m in self.managers for pair in m.swap_in(request)]

    # -- counts ------------------------------------------------------------------------------------------------

    def slots_held(self, request: Request) -> int:
        return sum(m.slots_held(request) for m in self.managers)

    def num_table_blocks(self) -> int:
        return sum(m.num_table_blocks() for m in self.managers)

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return self.pool.usage

    def check_invariants(self) -> None:
        """The pool's; each block is in one group's tables at a time, and its ref_cnt equals the tables holding it;
        the null block unheld; the CPU blocks each held once."""
        self.pool.check_invariants()
        holders: dict[int, int] = {}
        owner: dict[int, int] = {}  # block id -> the group whose tables hold it
        for g, m in enumerate(self.managers):
            m.window.check_invariants()
            for blocks in m.req_to_blocks.values():
                for b in blocks:
                    if b is not self.pool.null_block:
                        holders[b.block_id] = holders.get(b.block_id, 0) + 1
                        if owner.setdefault(b.block_id, g) != g:
                            raise InvariantError(f"{b} is in the tables of groups {owner[b.block_id]} and {g}")
        for b in self.pool.blocks:
            if b is not self.pool.null_block and b.ref_cnt != holders.get(b.block_id, 0):
                raise InvariantError(f"{b} is held by {holders.get(b.block_id, 0)} tables of all groups")
        if hasattr(self, "shared_swap"):
            held = [b for m in self.managers for ids in m.swap_pool.held.values() for b in ids]
            free = self.shared_swap.free_ids
            check(len(held) == len(set(held)) and not set(held) & set(free), "a CPU block is held twice")
            check(len(held) + len(free) == self.shared_swap.num_blocks, "a CPU block leaked")


def one_table(kv_manager, block_ids) -> list[int]:
    """A request's table to draw or tell as one row: a plain manager's as it is; a hybrid model's, the table of its
    first full-attention group (the group that keeps every block, where a prefix hit reads as the blocks it names)."""
    if not isinstance(block_ids, tuple):
        return block_ids
    groups = kv_manager.groups
    full = next((g for g, group in enumerate(groups) if group.window is None), 0)
    return block_ids[full]
