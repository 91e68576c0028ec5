"""Stage 3: reference counting and copy-on-write: several block tables share one physical block.

Builds on: kv/paged.py (block tables), kv/block_pool.py (ref_cnt, free at zero).
Read with: chapters/03-copy-on-write.md.

`fork(parent, child)` gives the child the parent's block table; every block's
ref_cnt goes up by one and nothing is copied. The first time a request writes
into a block that someone else also holds, it gets a private copy first:

    before:  parent [7] [3]    child [7] [3]      ref_cnt: 7 -> 2, 3 -> 2
    child appends a token into block 3 (ref_cnt 2 > 1): copy-on-write
    after:   parent [7] [3]    child [7] [9]      copy 3 -> 9; ref_cnt: 7 -> 2, 3 -> 1, 9 -> 1

Only the block that receives a request's first new token can be shared and
partly filled: after a fork, tables cover exactly the computed tokens. Each
copy is a `BlockCopy` (whose table, which entry, from, to); the copies travel
in the scheduler output, and the runner applies them to every layer before the
forward pass and to its own copy of the table. vLLM v0 (read it at v0.10.2): vllm/core/block_manager.py,
vllm/core/block/cpu_gpu_block_allocator.py (copy-on-write), vllm/core/block/naive_block.py (all v0.10.2).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import cdiv
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.request import Request


@dataclass(slots=True)
class BlockCopy:
    """Copy-on-write: `dst` takes `src`'s K/V (every layer) before the forward pass reads it, and becomes
    entry `index` of `request_id`'s block table."""

    request_id: str  # whose table entry changes
    index: int  # the logical block: the table's last, the one the request writes into next
    src: int  # the shared block (other tables keep it)
    dst: int  # the request's private copy
    group: int = 0  # which of the request's tables: its KV cache group (kv/hybrid.py); a plain model has one


class CowKVCacheManager(PagedKVCacheManager):
    """Invariant (inherited check): a block's ref_cnt equals the number of block tables holding it."""

    def __init__(self, num_kv_blocks: int, block_size: int, max_model_len: int, sliding_window: int = 0, pool=None):
        super().__init__(num_kv_blocks, block_size, max_model_len, sliding_window, pool)
        self.pending_copies: list[BlockCopy] = []  # copy-on-write copies made since the scheduler last took them
        # super().allocate_slots, bound once: CPython 3.11 spends ~50 ns building super() at each call, and
        # allocate_slots runs for every request at every step (two levels of it were 10 % of a decode step in
        # `pagedlab bench scheduler`). The two underscores keep each class's own: Python stores it as
        # self._CowKVCacheManager__next_allocate_slots, so kv/prefix.py binds its next under another name.
        self.__next_allocate_slots = super().allocate_slots

    # BEGIN SOLUTION
    # TASK fork-cow (35 pts): fork (share every block, ref_cnt + 1) and copy-on-write before writing into a shared
    # block.
    def fork(self, parent: Request, child: Request) -> None:
        """Give `child` a table equal to `parent`'s (its own list), every block's ref_cnt + 1; nothing is copied.
        (A sliding window's null block is nobody's: self.window.held(blocks) are the ones to count.)"""
        blocks = self.req_to_blocks.get(parent.request_id, [])
        for block in self.window.held(blocks):  # (a sliding window's null block is nobody's)
            block.ref_cnt += 1
        self.req_to_blocks[child.request_id] = list(blocks)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """As stage 2's, but when the block receiving the request's first new token is shared (ref_cnt > 1), it
        is first replaced by a private copy (_copy_on_write), which needs one more free block: None, with nothing
        changed, if the pool cannot give that block and the new ones. Returns the ids appended to the table (the
        copy replaces an entry: it is not among them). InvariantError if the shared block is not the table's last."""
        blocks = self.req_to_blocks.get(request.request_id)
        first = request.num_computed_tokens // self.block_size  # the block receiving the first new token
        if blocks and first < len(blocks) and blocks[first].ref_cnt > 1:
            if first != len(blocks) - 1:
                raise InvariantError("only a table's last block can be shared and written")
            appended = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(blocks)
            if max(0, appended) + 1 > self.pool.num_free:
                return None
            self._copy_on_write(request, first)
        return self.__next_allocate_slots(request, num_new_tokens)  # super().allocate_slots (see __init__)

    def _copy_on_write(self, request: Request, index: int) -> None:
        """Entry `index` of the request's table becomes a newly allocated block, this table's reference to the old
        one is dropped, and BlockCopy(request_id, index, old id, new id) joins pending_copies."""
        blocks = self.req_to_blocks[request.request_id]
        old = blocks[index]
        (new,) = self.pool.allocate(1)
        self.pool.free([old])  # drops this table's reference only; the other holders keep it
        blocks[index] = new
        self.pending_copies.append(BlockCopy(request.request_id, index, old.block_id, new.block_id))

    # END SOLUTION

    def free(self, request: Request) -> None:
        """As stage 2; a copy into a block this request no longer holds is dropped too."""
        if self.pending_copies:
            self.pending_copies = [c for c in self.pending_copies if c.request_id != request.request_id]
        super().free(request)

    def worst_case_blocks(self, requests: list[Request]) -> int:
        """The children of one request (or the beams of one search) share their prompt's full blocks.

        The leader computes prompt[:-1] once and every child forks from it, so the (p - 1) // block_size
        full blocks stay shared for good; everything after them (the partly filled block, copied on
        write, and the outputs) may become private to each child. A group of k costs
        shared + k * (max_blocks - shared) blocks at most, not k * max_blocks.
        """
        groups: dict[str, list[Request]] = {}
        for r in requests:  # a beam search's worst case lists its first beam beam_width times
            groups.setdefault(r.group_id, []).append(r)
        total = 0
        for members in groups.values():
            shared = (members[0].num_prompt_tokens - 1) // self.block_size if len(members) > 1 else 0
            total += shared + sum(self.max_blocks(r) - shared for r in members)
        return total

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """As stage 2's, plus the private copy allocate_slots makes when the block receiving the first new token
        is shared."""
        table = self.req_to_blocks.get(request.request_id, ())
        first = request.num_computed_tokens // self.block_size
        copy = first < len(table) and table[first].ref_cnt > 1
        return super().blocks_needed(request, num_new_tokens) + copy

    def take_block_copies(self) -> list[BlockCopy]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def num_table_blocks(self) -> int:
        """Blocks the live requests would hold without sharing (each table counted whole)."""
        return sum(len(blocks) for blocks in self.req_to_blocks.values())
