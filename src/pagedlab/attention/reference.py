"""Stage 1: the torch reference attention: store each new token's K/V at its slot, then attend request by request.

Builds on: attention/base.py (the cache layout, `causal_attention`), attention/metadata.py.
Read with: chapters/01-contiguous-static.md, chapters/02-paged-blocks.md.

Every cached backend does two things per layer:

    store   cache[slot_mapping[t]] = k[t], v[t]          for each new token t (vLLM's reshape_and_cache)
    attend  for each request b of the step:
                slots = context_slots(b, 0 .. seq_len - 1)   where its whole context lives in the cache
                out[b's new tokens] = causal_attention(q[b's new tokens], cache[slots])

`context_slots` is the one thing that knows the memory layout: a contiguous
region at stage 1 (attention/contiguous.py), the block table at stage 2
(attention/paged.py). This class is written to be obviously right, not fast:
attention/tiled.py is the same arithmetic for a whole batch of decodes at once,
and is tested against this one.

Shapes: T new tokens, S context slots of one request, H, KVH, D as in attention/base.py.
"""

from __future__ import annotations

import torch

from pagedlab.attention.base import LayerWindows, causal_attention, repeat_kv, window_start
from pagedlab.attention.metadata import AttentionMetadata


def store_kv(k_cache, v_cache, k, v, slot_mapping) -> None:
    """Write k, v [T, KVH, D] into the caches at `slot_mapping` [T] (vLLM's reshape_and_cache)."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))  # [slots, KVH, D]
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


class ReferenceAttention(LayerWindows):
    """Torch reference attention over the paged-layout cache; a subclass says where a context lives."""

    name = "torch"

    def __init__(self, kv_cache: torch.Tensor, num_queries_per_kv: int, head_dim: int):
        self.kv_cache = kv_cache  # [layers, 2, num_kv_blocks, block_size, KVH, D]
        self.num_queries_per_kv = num_queries_per_kv
        self.scale = head_dim**-0.5

    def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slot of context position positions[i] of request rows[i] (stage 1: a region; stage 2: a table)."""
        raise NotImplementedError

    def prepare(self, meta: AttentionMetadata) -> None:
        pass  # nothing to plan: every layer gathers its own slots

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache[layer_idx]
        store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        out = torch.empty_like(q)  # [T, H, D]
        k_flat, v_flat = k_cache.view(-1, *k.shape[1:]), v_cache.view(-1, *v.shape[1:])
        self.attend(out, q, k_flat, v_flat, meta, range(meta.num_reqs), self.window(layer_idx))
        return out

    def attend(self, out, q, k_flat, v_flat, meta: AttentionMetadata, rows, window: int | None = None) -> None:
        """Each request of `rows`: its new tokens' queries over its context, causally; with a sliding window,
        only the positions some query can see are gathered (from window_start on)."""
        qsl = meta.query_start_loc_cpu
        for b in rows:
            seq_len, num_q = meta.seq_lens_cpu[b], qsl[b + 1] - qsl[b]
            start = window_start(seq_len, seq_len - num_q, window)
            positions = torch.arange(start, seq_len, device=q.device)
            slots = self.context_slots(meta, torch.full_like(positions, b), positions)  # [S]
            kk = repeat_kv(k_flat.index_select(0, slots), self.num_queries_per_kv)  # [S, H, D]
            vv = repeat_kv(v_flat.index_select(0, slots), self.num_queries_per_kv)
            out[qsl[b] : qsl[b + 1]] = causal_attention(q[qsl[b] : qsl[b + 1]], kk, vv, self.scale, window)
