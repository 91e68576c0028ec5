"""Stage 1: the torch reference attention over a contiguous KV cache.

Builds on: attention/base.py, attention/metadata.py.
Read with: chapters/01-contiguous-static.md.

The cache of every layer is one tensor [num_kv_blocks, block_size, KVH, D]
(the same layout every later stage uses). Each step the backend
  1. stores the new tokens' K and V at their slots (one index_copy_ per tensor), then
  2. attends each request's queries over the slots of its context.
At stage 1 a request's context is one contiguous run of slots that starts at
its region: slot = region_start + position. Stage 2 overrides `context_slots`
to look each position up through the block table instead.

Shapes: T new tokens, B requests, L = max context length, H, KVH, D as in base.py.
"""

from __future__ import annotations

import torch

from pagedlab.attention.base import causal_attention, repeat_kv
from pagedlab.attention.metadata import AttentionMetadata


def allocate_kv_cache(num_layers, num_kv_blocks, block_size, num_kv_heads, head_dim, dtype, device) -> torch.Tensor:
    """One tensor for the whole cache, [layers, 2 (k, v), num_kv_blocks, block_size, KVH, D].

    kv_cache[layer] unpacks into that layer's (k, v); a block copy or swap of
    every layer at once is one indexing op on dimension 2.
    """
    shape = (num_layers, 2, num_kv_blocks, block_size, num_kv_heads, head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


def store_kv(k_cache, v_cache, k, v, slot_mapping) -> None:
    """Write k, v [T, KVH, D] into the caches at `slot_mapping` [T] (vLLM's reshape_and_cache)."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))  # [slots, KVH, D]
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


class ContiguousAttention:
    """Torch reference attention; a request's context slots are region_start + 0 .. seq_len - 1."""

    name = "torch"

    def __init__(self, kv_cache: torch.Tensor, num_queries_per_kv: int, head_dim: int):
        self.kv_cache = kv_cache
        self.num_queries_per_kv = num_queries_per_kv
        self.scale = head_dim**-0.5

    def context_slots(self, meta: AttentionMetadata) -> torch.Tensor:
        """[B, L] cache slot of every context position of every request (past seq_len: don't care)."""
        region_start = meta.block_table[:, 0].long() * meta.block_size  # [B]
        positions = torch.arange(meta.max_seq_len, device=region_start.device)  # [L]
        return region_start[:, None] + positions[None, :]

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache[layer_idx]
        store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        slots = self.context_slots(meta)  # [B, L]
        keys = k_cache.view(-1, *k.shape[1:])[slots]  # [B, L, KVH, D]
        values = v_cache.view(-1, *v.shape[1:])[slots]  # [B, L, KVH, D]
        return self._attend(q, keys, values, meta)

    def _attend(self, q, keys, values, meta: AttentionMetadata) -> torch.Tensor:
        """Decodes (one query each) in one batched op; prefill chunks one request at a time."""
        out = torch.empty_like(q)
        qsl = meta.query_start_loc_cpu
        if meta.decode_rows_cpu:
            rows = meta.decode_rows
            tokens = meta.query_start_loc[rows]  # the one query token of each decode
            out[tokens] = self._decode(q[tokens], keys[rows], values[rows], meta.seq_lens[rows])
        for b in meta.prefill_rows_cpu:
            n = meta.seq_lens_cpu[b]
            kk = repeat_kv(keys[b, :n], self.num_queries_per_kv)  # [n, H, D]
            vv = repeat_kv(values[b, :n], self.num_queries_per_kv)
            out[qsl[b] : qsl[b + 1]] = causal_attention(q[qsl[b] : qsl[b + 1]], kk, vv, self.scale)
        return out

    def _decode(self, q, keys, values, seq_lens) -> torch.Tensor:
        """q [N, H, D] over keys/values [N, L, KVH, D], each row masked to its seq_len -> [N, H, D]."""
        kk = repeat_kv(keys, self.num_queries_per_kv).float()  # [N, L, H, D]
        vv = repeat_kv(values, self.num_queries_per_kv).float()
        scores = torch.einsum("nhd,nlhd->nhl", q.float(), kk) * self.scale  # [N, H, L]
        past_end = torch.arange(kk.shape[1], device=q.device)[None, :] >= seq_lens[:, None]  # [N, L]
        scores = scores.masked_fill(past_end[:, None, :], float("-inf"))
        return torch.einsum("nhl,nlhd->nhd", scores.softmax(dim=-1), vv).to(q.dtype)
