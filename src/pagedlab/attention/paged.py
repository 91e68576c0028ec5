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
from pagedlab.attention.metadata import AttentionMetadata


class PagedAttention(ContiguousAttention):
    """Torch reference attention over a paged KV cache."""

    name = "torch"

    # BEGIN SOLUTION
    # TASK paged-gather (20 pts): paged gather: the cache slot of every context position, through the block table.
    def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slot of context position p = positions[i] of request rows[i]:
        block_table[row, p // block_size] * block_size + p % block_size."""
        bs = meta.block_size
        physical = meta.block_table[rows, positions // bs].long()  # [S]
        return physical * bs + positions % bs

    # END SOLUTION
