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

Shapes: T new tokens, N decodes cut into NT tiles of block_size context positions, H, KVH, D as in base.py.
"""

from __future__ import annotations

import torch

from pagedlab.attention.base import causal_attention, repeat_kv
from pagedlab.attention.metadata import AttentionMetadata, DecodePlan


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
            if meta.decode_plan is None:  # the first layer plans the gather; the others reuse it
                meta.decode_plan = self.plan_decode(meta)
            tokens = meta.decode_plan.tokens
            out.index_copy_(0, tokens, self._decode(q.index_select(0, tokens), k_flat, v_flat, meta.decode_plan))
        qsl = meta.query_start_loc_cpu
        for b in meta.prefill_rows_cpu:  # a prefill chunk: its queries over its whole context, causally
            positions = torch.arange(meta.seq_lens_cpu[b], device=q.device)
            slots = self.context_slots(meta, torch.full_like(positions, b), positions)
            kk = repeat_kv(k_flat.index_select(0, slots), self.num_queries_per_kv)  # [n, H, D]
            vv = repeat_kv(v_flat.index_select(0, slots), self.num_queries_per_kv)
            out[qsl[b] : qsl[b + 1]] = causal_attention(q[qsl[b] : qsl[b + 1]], kk, vv, self.scale)
        return out

    def plan_decode(self, meta: AttentionMetadata) -> DecodePlan:
        """Where every decode's context lives, worked out once per step (every layer reads the same slots).

        A decode's context is cut into tiles of block_size positions (at stage 2 a tile is exactly one
        block of its block table). The tail of a request's last tile, past its seq_len, still lies in
        the request's own last block (or region), so it is a valid index; whatever it holds, a -inf
        bias keeps it out of the softmax.
        """
        rows, bs, kvh = meta.decode_rows, meta.block_size, self.kv_cache.shape[-2]
        dev = rows.device
        lens = meta.seq_lens.index_select(0, rows)  # [N]
        tiles_per_req = torch.div(lens + bs - 1, bs, rounding_mode="floor")  # [N]
        owner = torch.repeat_interleave(torch.arange(len(rows), device=dev), tiles_per_req)  # [NT] whose tile
        first = (torch.cumsum(tiles_per_req, 0) - tiles_per_req).index_select(0, owner)  # [NT] owner's first tile
        positions = (torch.arange(len(owner), device=dev) - first)[:, None] * bs + torch.arange(bs, device=dev)
        padding = positions >= lens.index_select(0, owner)[:, None]  # [NT, bs] past the owner's seq_len
        slots = self.context_slots(meta, rows.index_select(0, owner).repeat_interleave(bs), positions.reshape(-1))
        # The cache viewed as rows of D values: KV head h of slot s is row s * KVH + h. Gathering in
        # (tile, KV head, position) order gives [NT*KVH, bs, D], ready for a batched matmul.
        head = torch.arange(kvh, device=dev)
        kv_rows = (slots.view(-1, 1, bs) * kvh + head[None, :, None]).reshape(-1)  # [NT*KVH*bs]
        bias = torch.zeros(len(owner), 1, 1, bs, device=dev).masked_fill_(padding[:, None, None, :], float("-inf"))
        tokens = meta.query_start_loc.index_select(0, rows)  # the one query token of each decode
        return DecodePlan(tokens, owner, kv_rows, bias.expand(-1, kvh, 1, bs).reshape(-1, 1, bs))

    def _decode(self, q, k_flat, v_flat, plan: DecodePlan) -> torch.Tensor:
        """All decodes at once, tile by tile, then one softmax per request over its tiles (in float32).

        Like the paged kernels (stage 6): each tile of block_size keys gets its scores and its share of
        the output with one batched matmul; the tiles of a request are then merged with segment
        reductions (scatter_reduce_ amax for the max, index_add_ for the sums), as V2's reduce merges
        partitions. Nothing is padded beyond the last tile, and query head h reads KV head h // G
        (G = H / KVH) without a copy per query head. q [N, H, D] -> [N, H, D].
        """
        n, h, d = q.shape
        kvh, owner = k_flat.shape[1], plan.owner
        nt, g, bs = len(owner), h // kvh, plan.bias.shape[-1]
        k = k_flat.view(-1, d).index_select(0, plan.kv_rows).view(nt * kvh, bs, d).float()
        v = v_flat.view(-1, d).index_select(0, plan.kv_rows).view(nt * kvh, bs, d).float()
        qt = q.float().index_select(0, owner).view(nt * kvh, g, d)  # each tile's copy of its query
        s = torch.baddbmm(plan.bias, qt, k.transpose(1, 2), alpha=self.scale)  # [NT*KVH, G, bs]
        tile_max = s.view(nt, kvh, g, bs).amax(dim=-1)  # [NT, KVH, G]
        m = torch.full((n, kvh, g), float("-inf"), device=q.device)
        m.scatter_reduce_(0, owner[:, None, None].expand_as(tile_max), tile_max, "amax")  # each request's max
        p = torch.exp(s.view(nt, kvh, g, bs) - m.index_select(0, owner)[..., None])  # [NT, KVH, G, bs]
        denom = torch.zeros_like(m).index_add_(0, owner, p.sum(dim=-1))  # [N, KVH, G]
        pv = torch.bmm(p.view(nt * kvh, g, bs), v).view(nt, kvh, g, d)  # each tile's unnormalized output
        acc = torch.zeros(n, kvh, g, d, device=q.device).index_add_(0, owner, pv)
        return (acc / denom[..., None]).view(n, h, d).to(q.dtype)
