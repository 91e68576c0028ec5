"""Stage 6: the Triton attention backend: store_kv, then paged decode (V1/V2) or paged prefill.

Builds on: attention/triton/store.py, attention/triton/decode.py, attention/triton/prefill.py.
Read with: chapters/06-triton-kernel.md.

The engine imports this module only when `attention_backend="triton"`, so
Triton is needed only there. On a CPU it runs under Triton's interpreter
(TRITON_INTERPRET=1, set before Triton is first imported), slowly but
exactly, which is how the tests check it.
"""

from __future__ import annotations

import torch

from pagedlab.attention.base import LayerWindows
from pagedlab.attention.metadata import AttentionMetadata
from pagedlab.attention.triton.decode import DEFAULT_PARTITION_SIZE, paged_decode
from pagedlab.attention.triton.prefill import paged_prefill
from pagedlab.attention.triton.store import store_kv


class TritonAttention(LayerWindows):
    """Same contract as the torch backends; reads K/V in place through the block table."""

    name = "triton"

    def __init__(
        self,
        kv_cache: torch.Tensor,
        num_queries_per_kv: int,
        head_dim: int,
        partition_size: int = DEFAULT_PARTITION_SIZE,
    ):
        if head_dim < 16:  # the prefill kernel's tl.dot needs tiles of at least 16 along D
            raise ValueError(
                f"attention_backend: 'triton' needs head_dim >= 16, and this model's is {head_dim}; "
                "choose attention_backend='torch'"
            )
        self.kv_cache = kv_cache  # [layers, 2, num_kv_blocks, block_size, KVH, D]
        self.num_queries_per_kv = num_queries_per_kv
        self.scale = head_dim**-0.5
        self.partition_size = partition_size  # V2's partition; lower it to exercise V2 on short contexts
        self.versions_run: set[str] = set()  # which decode kernels ran ("v1", "v2"), for tests and benches

    def prepare(self, meta: AttentionMetadata) -> None:
        pass  # the kernels read the block table in place: nothing to plan

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache[layer_idx]
        store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        out = torch.empty_like(q)
        block_table = meta.block_table.contiguous()
        window = self.window(layer_idx) or 0  # the kernels never load a key before it (0: no window)
        if meta.decode_rows_cpu:
            version = paged_decode(
                out,
                q,
                k_cache,
                v_cache,
                block_table,
                meta.seq_lens,
                meta.decode_rows,
                meta.query_start_loc[meta.decode_rows],
                self.scale,
                max_seq_len=meta.max_seq_len,
                partition_size=self.partition_size,
                window=window,
            )
            self.versions_run.add(version)
        if meta.prefill_rows_cpu:
            paged_prefill(
                out,
                q,
                k_cache,
                v_cache,
                block_table,
                meta.seq_lens,
                meta.query_start_loc,
                meta.prefill_rows,
                self.scale,
                max_query_len=meta.max_query_len,
                window=window,
            )
        return out
