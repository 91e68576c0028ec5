"""Stage 2: the torch paged-attention reference: gather each request's K/V through its block table.

Builds on: attention/contiguous.py (and through it attention/reference.py: store by slot, attend).
Read with: chapters/02-paged-blocks.md.

Stage 1 found context position p of a request at region_start + p. With
paging the same position lives at

    block_table[p // block_size] * block_size + p % block_size

so this backend overrides exactly one method, `context_slots`. Everything
else (store by slot, the per-request softmax) is the reference's. The gather
copies each request's context out of the cache: simple and correct, and the
cost that stage 6's kernel avoids by reading blocks in place.
vLLM: the CUDA kernels in csrc/attention/ read the same block table in place.
"""

from __future__ import annotations

import torch

from pagedlab.attention.contiguous import ContiguousAttention
from pagedlab.attention.metadata import AttentionMetadata, metadata_for


class PagedAttention(ContiguousAttention):
    """Torch reference attention over a paged KV cache."""

    name = "torch"

    # BEGIN SOLUTION
    # TASK paged-gather (20 pts): paged gather: the cache slot of every context position, through the block table.
    def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slot of context position p = positions[i] of request rows[i]:
        block_table[row, p // block_size] * block_size + p % block_size. Returns an int64 tensor [S]."""
        bs = meta.block_size
        physical = meta.block_table[rows, positions // bs].long()  # [S]
        return physical * bs + positions % bs

    # END SOLUTION


def paged_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, window=None) -> torch.Tensor:
    """The torch reference for paged attention, in float32 on the CPU: the new queries q[qsl[b] : qsl[b + 1]] of
    each request over its first seq_lens[b] positions, gathered through its row of the block table by
    PagedAttention's own context_slots (seeing only the last `window` keys of each query when given).

    The Triton kernels, the tiled decode and the kernel bench are all checked against this one function, so
    "correct" means one thing. q [T, H, D]; k_cache, v_cache [num_blocks, block_size, KVH, D]."""
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    meta = metadata_for(list(query_start_loc), list(seq_lens), block_table.cpu(), block_size)
    reference = PagedAttention(None, q.shape[1] // kv_heads, q.shape[2])
    k_flat = k_cache.reshape(-1, kv_heads, k_cache.shape[3]).float().cpu()  # [slots, KVH, D]
    v_flat = v_cache.reshape(-1, kv_heads, v_cache.shape[3]).float().cpu()
    out = torch.empty(q.shape, dtype=torch.float32)
    reference.attend(out, q.float().cpu(), k_flat, v_flat, meta, range(meta.num_reqs), window or None)
    return out
