"""Stage 4: a host tier for cached blocks: a second, bounded pool that keeps what the GPU pool evicts.

Builds on: kv/prefix.py (the caching pool whose evictions it receives).
Read with: chapters/04-prefix-caching.md (Real traffic).

When the pool evicts a cached block, its K/V could be copied to host memory
instead of being lost (demoted). A later request whose prefix reaches that
block finds it there, and it is copied back into a fresh GPU block
(promoted) instead of being computed again: a hit that costs a transfer.

    GPU pool   [h0][h1][  ][h5]     evict h1 -> demote      host tier  [h7][h1]   (LRU; the oldest dropped)
    request    h0 h1 h2             h0: GPU hit; h1: tier hit, promoted; h2: miss, computed

The tier is exclusive: a hash is in the GPU index or in the tier, never both.
This file keeps the tier's bookkeeping (which hashes, in which order); the
bytes it stands for would live in host memory, and moving them is what
vLLM's offloading connector and SGLang's HiCache do. It is not the swap pool
of stage 5 (kv/swap.py), which holds a preempted request's blocks, cached or
not, until that request resumes.
vLLM: vllm/v1/kv_offload/ (the CPU offloading connector); SGLang: python/sglang/srt/mem_cache/hiradix_cache.py.
"""

from __future__ import annotations

from collections import OrderedDict


class HostTier:
    """Block hashes demoted from the GPU pool, least recently demoted first. Invariant: at most num_blocks."""

    def __init__(self, num_blocks: int):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"tier_blocks must be an integer >= 0, got {num_blocks!r}")
        self.num_blocks = num_blocks  # capacity, in blocks of the GPU pool's size
        self._hashes: OrderedDict = OrderedDict()  # block hash -> None, oldest first
        self.num_dropped = 0  # demoted hashes the tier had no room for in the end

    def demote(self, block_hash) -> None:
        """The GPU pool evicted this cached block: keep it here, dropping the oldest beyond capacity."""
        if not self.num_blocks:
            return
        self._hashes[block_hash] = None
        if len(self._hashes) > self.num_blocks:
            self._hashes.popitem(last=False)
            self.num_dropped += 1

    def promote(self, block_hash) -> bool:
        """A lookup reached this hash: True (and it leaves the tier for a GPU block) if the tier holds it."""
        return self._hashes.pop(block_hash, False) is None

    def forget(self, block_hash) -> None:
        """The pool caches this hash again (computed anew): the tier's copy is not needed."""
        self._hashes.pop(block_hash, None)

    def __contains__(self, block_hash) -> bool:
        return block_hash in self._hashes

    def __len__(self) -> int:
        return len(self._hashes)
