"""Stage 6: paged cases for the kernels: a random paged cache, the torch reference, every impl as a call over it.

Builds on: attention/paged.py (paged_reference), attention/triton/decode.py, attention/triton/prefill.py,
attention/tiled.py (the torch path).
Read with: chapters/06-triton-kernel.md; used by lessons/kernels.py, bench/kernel.py and the kernel tests.

A case is B requests of L tokens each in a paged cache whose block tables are
a shuffled draw of the pool (one block is left out, so no table covers the
pool in order):

    block_table  [B, ceil(L / block_size)]     request 0: [5, 2, 6]   request 1: [0, 4, 3]
    kv_cache     [1 layer, 2, num_blocks, block_size, KVH, D]

`reference` is the one torch reference (attention/paged.py, paged_reference)
over the case: every impl is checked against it. `decode_impls` and `prefill_impl` wrap each impl
as a call of no arguments over the same cache and queries, so that the bench
times them alike. The Triton kernels are imported inside those calls' makers,
after the bench has chosen between a GPU and the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadShape:
    """The attention shape of one layer, and the paging around it."""

    num_heads: int  # H query heads
    num_kv_heads: int  # KVH key/value heads (GQA: H // KVH queries share one)
    head_dim: int  # D
    block_size: int  # tokens per KV block
    partition_size: int  # V2's partition, in tokens


@dataclass
class PagedCase:
    """Random K/V for B requests of L tokens each, in a paged cache with shuffled block tables."""

    kv_cache: torch.Tensor  # [1 layer, 2, num_blocks, block_size, KVH, D]
    block_table: torch.Tensor  # [B, ceil(L / block_size)] int32
    context_len: int  # L, the same for every request
    shape: HeadShape

    @property
    def k_cache(self) -> torch.Tensor:
        return self.kv_cache[0, 0]  # [num_blocks, block_size, KVH, D]

    @property
    def v_cache(self) -> torch.Tensor:
        return self.kv_cache[0, 1]

    def slots(self) -> torch.Tensor:
        """[B, L] the cache slot of every context position."""
        bs = self.shape.block_size
        pos = torch.arange(self.context_len, device=self.block_table.device)
        return self.block_table[:, pos // bs].long() * bs + pos % bs

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous K and V, [B, L, KVH, D] each: the copy the torch reference makes every step."""
        s, slots = self.shape, self.slots()
        k = self.k_cache.reshape(-1, s.num_kv_heads, s.head_dim)  # [slots, KVH, D]
        v = self.v_cache.reshape(-1, s.num_kv_heads, s.head_dim)
        return k[slots], v[slots]


def make_case(batch: int, context_len: int, shape: HeadShape, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    per = -(-context_len // shape.block_size)
    num_blocks = batch * per + 1  # one block nobody uses: tables never cover the whole pool in order
    size = (1, 2, num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    kv = torch.randn(size, generator=g, device=device).to(dtype)
    perm = torch.randperm(num_blocks, generator=g, device=device)[: batch * per]
    return PagedCase(kv, perm.view(batch, per).to(torch.int32), context_len, shape)


def reference(case: PagedCase, q: torch.Tensor, q_len: int, seq_lens: list[int] | None = None) -> torch.Tensor:
    """fp32 attention of each request's last q_len positions over its context (seq_lens[b] tokens, default L):
    attention/paged.py's paged_reference over the case, [B * q_len, H, D]."""
    from pagedlab.attention.paged import paged_reference

    lens = seq_lens or [case.context_len] * case.block_table.shape[0]
    qsl = [b * q_len for b in range(len(lens) + 1)]
    return paged_reference(q, case.k_cache, case.v_cache, case.block_table, lens, qsl).to(q.device)


def decode_metadata(case: PagedCase):
    """The runner's metadata for one decode step of every request (the last position is the new token)."""
    from pagedlab.attention.metadata import metadata_for

    b = case.block_table.shape[0]
    slots = case.slots()[:, -1]  # [B] the slot of each request's last position
    return metadata_for(list(range(b + 1)), [case.context_len] * b, case.block_table, case.shape.block_size, slots)


def decode_impls(case: PagedCase, q: torch.Tensor) -> dict:
    """impl name -> a no-argument function returning [B, H, D], all over the same cache and queries."""
    import torch.nn.functional as F

    from pagedlab.attention.tiled import TiledPagedAttention
    from pagedlab.attention.triton.decode import paged_decode

    s, meta, ctx = case.shape, decode_metadata(case), case.context_len
    scale, rows = s.head_dim**-0.5, meta.decode_rows
    torch_attn = TiledPagedAttention(case.kv_cache, s.num_heads // s.num_kv_heads, s.head_dim)
    torch_attn.prepare(meta)  # once per step in the engine, shared by every layer: not part of a layer's time
    # forward() stores the new token first: give it the K/V already in its slot, so the cache stays as it is
    k_new = case.k_cache.reshape(-1, s.num_kv_heads, s.head_dim)[meta.slot_mapping]
    v_new = case.v_cache.reshape(-1, s.num_kv_heads, s.head_dim)[meta.slot_mapping]
    keys, values = (t.transpose(1, 2).contiguous() for t in case.gather())  # [B, KVH, L, D]

    def triton(version):
        def run():
            out = torch.empty_like(q)
            kv = (case.k_cache, case.v_cache, case.block_table, meta.seq_lens)
            ps = s.partition_size
            paged_decode(out, q, *kv, rows, rows, scale, max_seq_len=ctx, partition_size=ps, version=version)
            return out

        return run

    def sdpa():
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, enable_gqa=True)  # [B, H, 1, D]
        return out[:, :, 0]

    return {
        "torch": lambda: torch_attn.forward(0, q, k_new, v_new, meta),
        "triton-v1": triton("v1"),
        "triton-v2": triton("v2"),
        "sdpa": sdpa,
    }


def prefill_impl(case: PagedCase, q: torch.Tensor, chunk: int):
    """paged_prefill of a chunk of `chunk` new queries at the end of each request's context."""
    from pagedlab.attention.triton.prefill import paged_prefill

    b, dev, s = case.block_table.shape[0], q.device, case.shape
    qsl = torch.arange(b + 1, device=dev) * chunk
    seq_lens = torch.full((b,), case.context_len, dtype=torch.int64, device=dev)

    rows, kv = torch.arange(b, device=dev), (case.k_cache, case.v_cache, case.block_table)

    def run():
        out = torch.empty_like(q)
        paged_prefill(out, q, *kv, seq_lens, qsl, rows, s.head_dim**-0.5, max_query_len=chunk)
        return out

    return run
