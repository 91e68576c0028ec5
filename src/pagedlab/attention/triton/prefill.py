"""Stage 6: paged prefill attention in Triton: a chunk of new queries over a paged prefix + themselves.

Builds on: attention/triton/decode.py (the same online softmax), attention/triton/store.py.
Read with: chapters/06-triton-kernel.md.

Motivation. With chunked prefill (stage 5) and prefix caching (stage 4) a
prefill is no longer "a prompt from position 0": it is a chunk of new tokens
at positions [ctx, ctx + q_len) whose keys are the whole paged context
[0, ctx + q_len) -- cached blocks, earlier chunks and the chunk itself, all
already written by store_kv. One kernel serves every such step:

    one program per (request b, query head h, tile of BLOCK_M query tokens):
        q_pos = seq_len - q_len + [tile rows]          # absolute positions of these queries
        lo = max(0, min(q_pos) - window + 1) if window else 0   # the tile's first visible key
        for each tile of BLOCK_N key positions lo <= p <= max(q_pos), from the tile holding lo:
            slot = block_table[b, p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
            S    = Q @ K[slot]^T * scale, masked where p > q_pos (causal), p >= seq_len
                   or p <= q_pos - window (outside the row's sliding window)
            online softmax update of (m, l, acc) per query row
        out[rows] = acc / l

A sliding window W > 0 lets the query at position i see only keys j with i - W < j <= i (W keys, itself
included: Hugging Face's `kv_idx > q_idx - sliding_window`); keys before a tile's first window are never loaded.

Shapes: Q [BLOCK_M, D] tiles of q [T, H, D]; caches [num_blocks, block_size, KVH, D].
vLLM: vllm/v1/attention/ops/prefix_prefill.py (context_attention_fwd; one folder up in older releases),
and the FlashAttention varlen kernel with a block table that vLLM v1 uses on GPUs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedlab.errors import check


@triton.jit(do_not_specialize=["window"])  # one compiled kernel serves every window
def paged_prefill_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_ptr,
    rows_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_cb,
    stride_ct,
    stride_ch,
    scale,
    window,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)  # which prefill request
    h = tl.program_id(1)  # which query head
    tile = tl.program_id(2)  # which BLOCK_M queries of it
    b = tl.load(rows_ptr + i)
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    if tile * BLOCK_M < q_len:
        # Phase 1: this tile's queries and their absolute positions.
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_m < q_len
        mask_d = offs_d < HEAD_DIM
        q_pos = seq_len - q_len + offs_m  # [BLOCK_M]
        q_rows = (q_start + offs_m) * stride_qt + h * stride_qh
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        kvh = h // QUERIES_PER_KV
        last = tl.minimum(seq_len, seq_len - q_len + (tile + 1) * BLOCK_M)  # keys past the tile are masked
        # keys before the window of the tile's first query are never loaded (0 without a window)
        window_start = tl.where(window > 0, tl.maximum(seq_len - q_len + tile * BLOCK_M - window + 1, 0), 0)
        # Phase 2: walk the paged context through the block table, one BLOCK_N tile at a time, from the tile
        # holding window_start.
        for start in range(window_start - window_start % BLOCK_N, last, BLOCK_N):
            # BEGIN SOLUTION
            # TASK prefill-tile (30 pts, launcher=paged_prefill): one tile of keys for a tile of queries: gather K/V
            # through the block table, mask causally, and update each query row's online softmax.
            offs_n = start + tl.arange(0, BLOCK_N)
            mask_n = (offs_n >= window_start) & (offs_n < last)
            block = tl.load(block_table_ptr + b * stride_bt + offs_n // BLOCK_SIZE, mask=mask_n, other=0)
            rows = block.to(tl.int64) * stride_cb + (offs_n % BLOCK_SIZE) * stride_ct + kvh * stride_ch
            kv_mask = mask_n[:, None] & mask_d[None, :]
            k = tl.load(k_cache_ptr + rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_M, BLOCK_N]
            causal = (offs_n[None, :] <= q_pos[:, None]) & mask_n[None, :]
            in_window = (offs_n[None, :] > q_pos[:, None] - window) | (window == 0)  # each row's own window
            causal = causal & in_window
            s = tl.where(causal, s, -float("inf"))
            # Phase 3: online softmax, one row per query (fully masked rows keep m_i = -inf).
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            v = tl.load(v_cache_ptr + rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            m_i = m_new
            # END SOLUTION
        # Phase 4: normalize and write this tile's rows.
        # padding rows past q_len can lie past every key of their window (l_i = 0); they are not stored, but stay
        # finite; every real row sees at least itself, so l_i > 0 there and this is the plain acc / l_i.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_rows = (q_start + offs_m) * stride_ot + h * stride_oh
        tl.store(
            out_ptr + o_rows[:, None] + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_d[None, :],
        )


def paged_prefill(
    out,
    q,
    k_cache,
    v_cache,
    block_table,
    seq_lens,
    query_start_loc,
    rows,
    scale,
    *,
    max_query_len: int,
    block_m: int = 16,
    block_n: int = 16,
    window: int = 0,
):
    """Checked launcher. q/out [T, H, D]; caches [num_blocks, block_size, KVH, D]; block_table [B, MB];
    seq_lens [B]; query_start_loc [B + 1]; rows [N]: the requests to run (query length > 1).
    window W > 0: sliding-window attention, the query at position i sees keys i - W < j <= i (W keys, itself
    included, as Hugging Face's sliding_window); block-table entries wholly before every window are never read."""
    _, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    check(num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads")
    check(head_dim >= 16 and block_m >= 16 and block_n >= 16, "tl.dot needs tiles of at least 16")
    contiguous = k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(2) == 1 and out.stride(2) == 1
    check(contiguous, "caches must be contiguous, and q and out contiguous along the head dim")
    window = window or 0  # None (a layer without a window, as the backends say it) is 0
    check(window >= 0, "window must be >= 0 (0: no sliding window)")
    n = rows.numel()
    if n == 0:
        return
    grid = (n, num_heads, triton.cdiv(max_query_len, block_m))
    strides = (q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0), *k_cache.stride()[:3])
    paged_prefill_kernel[grid](
        out, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, rows, *strides, scale, window,
        QUERIES_PER_KV=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_SIZE=block_size,
    )  # fmt: skip
