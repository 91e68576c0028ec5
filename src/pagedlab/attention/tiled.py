"""Stage 5: the tiled decode: every decode of a step in a few batched ops, instead of one request at a time.

Builds on: attention/paged.py (context_slots through the block table), attention/reference.py (prefills).
Read with: chapters/05-continuous-batching.md (where the time went), chapters/06-triton-kernel.md.

A labelled optimisation of the reference, with the same numbers: a step with
N decodes runs the reference loop N times per layer, each a handful of small
torch ops, and on a CPU that per-op overhead, not arithmetic, is the cost.
Here every decode's context is cut into tiles of block_size positions (a tile
is one block of its table) and all tiles of all decodes are scored together,
as the paged kernels of stage 6 do:

    prepare (once per step)   plan_decode: each tile's cache rows, owner, and a -inf bias past seq_len
    forward (every layer)     gather K, V by the plan -> [NT*KVH, bs, D]; scores with one baddbmm;
                              per-request max and sums with segment reductions; one bmm for the output

Prefill chunks still take the reference path. tests/attention/ checks this
class against the reference on mixed batches; the stage-5 preset and the
benches choose it, stages 1-4 read the reference.

Shapes: T new tokens, N decodes cut into NT tiles of block_size context positions, H, KVH, D as in base.py.
"""

from __future__ import annotations

import torch

from pagedlab.attention.metadata import AttentionMetadata, TiledDecodePlan
from pagedlab.attention.paged import PagedAttention
from pagedlab.attention.reference import store_kv


class TiledPagedAttention(PagedAttention):
    """PagedAttention with every decode of a step computed together, tile by tile (same results)."""

    def prepare(self, meta: AttentionMetadata) -> None:
        """The decodes' gather is the same in every layer of one window: plan it once per step and window."""
        windows = list(dict.fromkeys(self.windows)) if self.windows else [None]
        meta.decode_plans = {w: self.plan_decode(meta, w) for w in windows} if meta.decode_rows_cpu else {}
        meta.decode_plan = meta.decode_plans.get(windows[0])

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache[layer_idx]
        store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        k_flat, v_flat = k_cache.view(-1, *k.shape[1:]), v_cache.view(-1, *v.shape[1:])  # [slots, KVH, D]
        window = self.window(layer_idx)
        plan = meta.decode_plans.get(window) if meta.decode_plans else meta.decode_plan
        if plan is not None and not meta.prefill_rows_cpu:  # only decodes: token i is decode i, nothing to scatter
            return self._decode(q, k_flat, v_flat, plan)
        out = torch.empty_like(q)
        if plan is not None:
            out.index_copy_(0, plan.tokens, self._decode(q.index_select(0, plan.tokens), k_flat, v_flat, plan))
        self.attend(out, q, k_flat, v_flat, meta, meta.prefill_rows_cpu, window)  # prefill chunks: the reference path
        return out

    def plan_decode(self, meta: AttentionMetadata, window: int | None = None) -> TiledDecodePlan:
        """Where every decode's context lives, worked out once per step (every layer reads the same slots).

        A decode's context is cut into tiles of block_size positions (at stage 2 a tile is exactly one
        block of its block table). The tail of a request's last tile, past its seq_len, still lies in
        the request's own last block (or region), so it is a valid index; whatever it holds, a -inf
        bias keeps it out of the softmax. With a sliding window W the tiles start at the one holding
        position seq_len - W (the blocks before it may be freed), and its head gets the -inf bias too.
        """
        rows, bs, kvh = meta.decode_rows, meta.block_size, self.kv_cache.shape[-2]
        dev = rows.device
        lens = meta.seq_lens.index_select(0, rows)  # [N]
        low = torch.zeros_like(lens) if window is None else (lens - window).clamp(min=0)  # [N] first visible
        first_tile = torch.div(low, bs, rounding_mode="floor")  # [N]
        tiles_per_req = torch.div(lens + bs - 1, bs, rounding_mode="floor") - first_tile  # [N]
        owner = torch.repeat_interleave(torch.arange(len(rows), device=dev), tiles_per_req)  # [NT] whose tile
        first = (torch.cumsum(tiles_per_req, 0) - tiles_per_req).index_select(0, owner)  # [NT] owner's first tile
        tile = torch.arange(len(owner), device=dev) - first + first_tile.index_select(0, owner)  # [NT] which tile
        positions = tile[:, None] * bs + torch.arange(bs, device=dev)  # [NT, bs]
        padding = positions >= lens.index_select(0, owner)[:, None]  # [NT, bs] past the owner's seq_len
        padding |= positions < low.index_select(0, owner)[:, None]  # before its window
        slots = self.context_slots(meta, rows.index_select(0, owner).repeat_interleave(bs), positions.reshape(-1))
        # The cache viewed as rows of D values: KV head h of slot s is row s * KVH + h. Gathering in
        # (tile, KV head, position) order gives [NT*KVH, bs, D], ready for a batched matmul.
        head = torch.arange(kvh, device=dev)
        kv_rows = (slots.view(-1, 1, bs) * kvh + head[None, :, None]).reshape(-1)  # [NT*KVH*bs]
        bias = torch.zeros(len(owner), 1, 1, bs, device=dev).masked_fill_(padding[:, None, None, :], float("-inf"))
        tokens = meta.query_start_loc.index_select(0, rows)  # the one query token of each decode
        return TiledDecodePlan(tokens, owner, kv_rows, bias.expand(-1, kvh, 1, bs).reshape(-1, 1, bs))

    def _decode(self, q, k_flat, v_flat, plan: TiledDecodePlan) -> torch.Tensor:
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
