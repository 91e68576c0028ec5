"""Stage 1: where a request's context lives in a contiguous KV cache: one region, reserved whole.

Builds on: attention/reference.py (store by slot, attend request by request).
Read with: chapters/01-contiguous-static.md.

The cache of every layer is one tensor [num_kv_blocks, block_size, KVH, D]
(the layout every later stage keeps). At stage 1 a request's context is one
contiguous run of slots that starts at its region, so

    slot of position p = region_start + p          region_start = block_table[b, 0] * block_size

and that is all this backend adds to the reference. Stage 2 overrides the same
method, `context_slots`, to look each position up through the block table.
"""

from __future__ import annotations

import torch

from pagedlab.attention.metadata import AttentionMetadata
from pagedlab.attention.reference import ReferenceAttention


class ContiguousAttention(ReferenceAttention):
    """Torch reference attention; a request's context slots are region_start + 0 .. seq_len - 1."""

    def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slot of context position positions[i] of request rows[i]: its region's start + position."""
        region_start = meta.block_table[rows, 0].long() * meta.block_size
        return region_start + positions
