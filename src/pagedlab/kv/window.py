"""Stage 2: a sliding window's part of the KV cache: which blocks no query can see any more, and the null block.

Builds on: kv/block_pool.py (the pool the null block is taken from, the blocks freed back to it).
Read with: chapters/02-paged-blocks.md (Sliding windows).

A model whose every layer attends to its last W tokens only (Mistral, some
Qwen2 configs) never reads a block wholly behind the window again, so the KV
manager frees it at once and puts the null block in its place in the table
(vLLM's SlidingWindowManager and null_block): the table keeps its length, so
entry i still means tokens i*block_size .., and the null block is never
allocated, freed or read.

    window 8, block_size 4, 14 tokens computed:   the next query sees keys 7 .. 14
    table [5] [2] [9] [4]   ->   [null] [2] [9] [4]     block 5 (tokens 0-3) is freed

A KV manager holds a SlidingWindow, or NoWindow when the model has none; both
answer the same questions, so the managers never ask whether there is a window.
"""

from __future__ import annotations

from collections.abc import Iterable

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import BlockPool, KVCacheBlock, cdiv


class NoWindow:
    """Every block stays in reach: nothing is skipped, there is no null block."""

    null_block: KVCacheBlock | None = None

    def free_skipped(self, blocks: list[KVCacheBlock], num_computed_tokens: int) -> None:
        pass  # (allocate_slots' first call, for every request at every step: nothing to do)

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        return 0

    def held(self, blocks: Iterable[KVCacheBlock]) -> Iterable[KVCacheBlock]:
        """The blocks of a table that a request holds (all of them)."""
        return blocks

    def skip_hits(self, hits: list[KVCacheBlock]) -> list[KVCacheBlock]:
        """Prefix-cache hits as the request's table starts (all of them)."""
        return hits

    def max_blocks_held(self, max_step_tokens: int, max_model_len: int) -> int | None:
        """The most blocks a request can ever hold at once: no bound but its length (None)."""
        return None

    def check_invariants(self) -> None:
        pass


class SlidingWindow(NoWindow):
    """Every layer's window of `window` tokens. Invariant: the null block is never allocated, freed or held, and
    a table's null entries come first (they are the blocks behind the window)."""

    def __init__(self, window: int, block_size: int, pool: BlockPool):
        self.window = window  # tokens: a query sees itself and the window - 1 before it
        self.block_size = block_size
        self.pool = pool
        self.null_block = pool.take_null_block()  # block 0, out of the free queue for good

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks no query from position `num_computed_tokens` on can see: it sees keys from
        num_computed_tokens - W + 1 on (vLLM's get_num_skipped_tokens, in whole blocks)."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    def free_skipped(self, blocks: list[KVCacheBlock], num_computed_tokens: int) -> None:
        """Free the table's blocks that lie wholly before every query's window from now on (vLLM's
        remove_skipped_blocks); the freed entries become the null block, tail first."""
        freed = []
        for i in range(min(self.num_skipped_blocks(num_computed_tokens), len(blocks)) - 1, -1, -1):
            if blocks[i] is self.null_block:
                break  # everything before it went in an earlier step
            freed.append(blocks[i])
            blocks[i] = self.null_block
        self.pool.free(freed)  # a caching pool (stage 4) keeps them cached

    def held(self, blocks: Iterable[KVCacheBlock]) -> list[KVCacheBlock]:
        return [b for b in blocks if b is not self.null_block]

    def skip_hits(self, hits: list[KVCacheBlock]) -> list[KVCacheBlock]:
        """`hits` with those that will lie behind the window replaced by the null block: the request starts at
        len(hits) * block_size computed tokens, and free_skipped would free them at once. Left as they are, they
        are never touched (no ref_cnt, no move in the free queue) nor counted as blocks to take; their tokens
        still count as computed (vLLM's SlidingWindowManager.find_longest_cache_hit)."""
        skipped = self.num_skipped_blocks(len(hits) * self.block_size)
        return [self.null_block] * skipped + hits[skipped:] if skipped else hits

    def max_blocks_held(self, max_step_tokens: int, max_model_len: int) -> int:
        """The window's last W - 1 tokens plus one step's new tokens, never more than max_model_len, and one block
        more since the window need not start at a block's start (vLLM's SlidingWindowSpec
        .max_admission_blocks_per_request): blocks behind the window are freed before each step allocates."""
        return cdiv(min(self.window - 1 + max_step_tokens, max_model_len), self.block_size) + 1

    def check_invariants(self) -> None:
        if self.null_block.ref_cnt != 0:
            raise InvariantError(f"the null block {self.null_block} was allocated")


def make_window(sliding_window: int, block_size: int, pool: BlockPool) -> NoWindow:
    """A SlidingWindow of that many tokens, or NoWindow for 0 (full attention)."""
    return SlidingWindow(sliding_window, block_size, pool) if sliding_window else NoWindow()
