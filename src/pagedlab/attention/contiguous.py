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

Shapes: T new tokens, N decodes, S = their context tokens laid end to end, H, KVH, D as in base.py.
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

    def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slot of context position positions[i] of request rows[i]: its region's start + position."""
        region_start = meta.block_table[rows, 0].long() * meta.block_size
        return region_start + positions

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache[layer_idx]
        store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        k_flat = k_cache.view(-1, *k.shape[1:])  # [slots, KVH, D]
        v_flat = v_cache.view(-1, *v.shape[1:])
        out = torch.empty_like(q)
        if meta.decode_rows_cpu:
            tokens = meta.query_start_loc[meta.decode_rows]  # the one query token of each decode
            out[tokens] = self._decode(q[tokens], k_flat, v_flat, meta)
        qsl = meta.query_start_loc_cpu
        for b in meta.prefill_rows_cpu:  # a prefill chunk: its queries over its whole context, causally
            positions = torch.arange(meta.seq_lens_cpu[b], device=q.device)
            slots = self.context_slots(meta, torch.full_like(positions, b), positions)
            kk = repeat_kv(k_flat[slots], self.num_queries_per_kv)  # [n, H, D]
            vv = repeat_kv(v_flat[slots], self.num_queries_per_kv)
            out[qsl[b] : qsl[b + 1]] = causal_attention(q[qsl[b] : qsl[b + 1]], kk, vv, self.scale)
        return out

    def _decode(self, q, k_flat, v_flat, meta: AttentionMetadata) -> torch.Tensor:
        """All decodes at once, each over exactly its own context (no padding to the longest).

        The contexts are laid end to end (S tokens in all); `req` says whose each token is, and the
        softmax is taken per request with segment reductions (scatter_reduce_ amax, index_add_).
        q [N, H, D] -> [N, H, D]; query head h reads KV head h // G (G = H / KVH, no repeat_kv copy).
        """
        rows = meta.decode_rows
        lens = meta.seq_lens[rows]  # [N]
        n, kvh, d = len(rows), k_flat.shape[1], k_flat.shape[2]
        req = torch.repeat_interleave(torch.arange(n, device=q.device), lens)  # [S]
        positions = torch.arange(len(req), device=q.device) - (torch.cumsum(lens, 0) - lens)[req]  # [S]
        slots = self.context_slots(meta, rows[req], positions)  # [S]
        k, v = k_flat[slots].float(), v_flat[slots].float()  # [S, KVH, D]
        qg = q.float().view(n, kvh, -1, d)  # [N, KVH, G, D]
        s = torch.einsum("skgd,skd->skg", qg[req], k) * self.scale  # [S, KVH, G]
        m = torch.full_like(qg[..., 0], float("-inf")).scatter_reduce_(0, req[:, None, None].expand_as(s), s, "amax")
        p = torch.exp(s - m[req])
        denom = torch.zeros_like(m).index_add_(0, req, p)
        acc = torch.zeros_like(qg).index_add_(0, req, p[..., None] * v[:, :, None, :])  # [N, KVH, G, D]
        return (acc / denom[..., None]).reshape(q.shape).to(q.dtype)
