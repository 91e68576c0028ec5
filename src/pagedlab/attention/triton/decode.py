"""Stage 6: paged decode attention in Triton, V1 (one pass) and V2 (partitions + a reduce).

Builds on: attention/paged.py (the torch reference gathers K/V into a copy first).
Read with: chapters/06-triton-kernel.md.

Motivation. A decode step has one query token per request, and its cost is
reading that request's whole K/V. The torch reference first gathers the K/V
through the block table into a new tensor; a kernel can instead read each
block in place, once, and keep the softmax running in registers.

Pseudo-code, one program per (request b, query head h) -- V1:

    m, l, acc = -inf, 0, 0                          # running max, sum of exp, weighted sum of V
    lo = max(0, seq_len[b] - window) if window else 0   # sliding window: the first key the query sees
    for each tile of BLOCK_N context positions lo <= p < seq_len[b], from the tile holding lo:
        slot  = block_table[b, p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
        s     = (q . K[slot]) * scale               # [BLOCK_N]
        m_new = max(m, max(s));  p_ = exp(s - m_new);  alpha = exp(m - m_new)
        l     = l * alpha + sum(p_);  acc = acc * alpha + p_ @ V[slot];  m = m_new
    out = acc / l                                   # the paper's Eq. 4, one block at a time

V2 splits the context into partitions of PARTITION_SIZE tokens, one program
each, so long contexts (or few requests x heads) still fill the GPU; every
partition writes its (m, l, acc / l) and a reduce program merges them:

    M = max_p m_p;  w_p = l_p * exp(m_p - M);  out = sum_p w_p * out_p / sum_p w_p

With a sliding window W > 0 the query (at position seq_len - 1) sees only the keys j > seq_len - 1 - W
(W keys, itself included: Hugging Face's `kv_idx > q_idx - sliding_window`); keys before the window are never
loaded, and V2 partitions wholly before it do nothing, like those past the end, and the reduce skips them.

Shapes: B decode requests, H query heads, KVH KV heads, D head dim; grouped-query
attention maps query head h to KV head h // (H / KVH).
vLLM v0.10.2 (the last release that ships them): csrc/attention/attention_kernels.cuh (v0.10.2)
(paged_attention_v1/v2 kernels and the reduce kernel), vllm/attention/ops/paged_attn.py (v0.10.2: the
V1/V2 choice). Today's vLLM reads the paged cache in FlashAttention / vllm/v1/attention/backends/ kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlab.errors import check

DEFAULT_PARTITION_SIZE = 512  # vLLM's _PARTITION_SIZE


@triton.jit
def _window_start(seq_len, window):
    """The first context position a decode query (at seq_len - 1) sees: seq_len - window, 0 without a window."""
    return tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)


@triton.jit
def _attend_range(
    q,
    b,
    kvh,
    start,
    end,
    window_start,
    block_table_ptr,
    stride_bt,
    k_cache_ptr,
    v_cache_ptr,
    stride_cb,
    stride_ct,
    stride_ch,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Online softmax of one query over context positions [max(start, window_start), end), walking BLOCK_N
    tiles from `start`; positions before `window_start` are masked out of every load: returns (m_i, l_i, acc)."""
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    m_i = tl.full([], -float("inf"), tl.float32)  # a typed scalar: the loop carries it
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        # BEGIN SOLUTION
        # TASK decode-tile (30 pts, launcher=paged_decode): the online-softmax update over one tile of the paged
        # context.
        offs_n = tile + tl.arange(0, BLOCK_N)
        mask_n = (offs_n >= window_start) & (offs_n < end)  # before the window: never loaded, score -inf
        block = tl.load(block_table_ptr + b * stride_bt + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
        rows = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_ct + kvh * stride_ch  # [BLOCK_N]
        mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale  # [BLOCK_N]
        s = tl.where(mask_n, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_cache_ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
        # END SOLUTION
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["window"])  # one compiled kernel serves every window
def paged_decode_v1_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    rows_ptr,
    q_index_ptr,
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
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)  # which decode request
    h = tl.program_id(1)  # which query head
    b = tl.load(rows_ptr + i)  # its row in the block table
    t = tl.load(q_index_ptr + i)  # its query token in q / out
    seq_len = tl.load(seq_lens_ptr + b)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + t * stride_qt + h * stride_qh + offs_d, mask=offs_d < HEAD_DIM, other=0.0).to(tl.float32)
    lo = _window_start(seq_len, window)
    m_i, l_i, acc = _attend_range(
        q,
        b,
        h // QUERIES_PER_KV,
        lo - lo % BLOCK_N,  # the walk starts at the tile holding the window's first key
        seq_len,
        lo,
        block_table_ptr,
        stride_bt,
        k_cache_ptr,
        v_cache_ptr,
        stride_cb,
        stride_ct,
        stride_ch,
        scale,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        BLOCK_SIZE,
    )
    out = acc / l_i
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@triton.jit(do_not_specialize=["window"])
def paged_decode_v2_kernel(
    tmp_out_ptr,
    max_ptr,
    sum_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    rows_ptr,
    q_index_ptr,
    stride_qt,
    stride_qh,
    stride_bt,
    stride_cb,
    stride_ct,
    stride_ch,
    scale,
    num_partitions,
    window,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    h = tl.program_id(1)
    part = tl.program_id(2)
    b = tl.load(rows_ptr + i)
    t = tl.load(q_index_ptr + i)
    seq_len = tl.load(seq_lens_ptr + b)
    start = part * PARTITION_SIZE
    offs_d = tl.arange(0, BLOCK_D)
    stat = (i * tl.num_programs(1) + h) * num_partitions + part  # index into [B, H, P]
    lo = _window_start(seq_len, window)
    # partitions past the end or wholly before the window write nothing; the reduce skips them
    if (start < seq_len) & (start + PARTITION_SIZE > lo):
        # BEGIN SOLUTION
        # TASK v2-partition (10 pts, launcher=paged_decode): one V2 partition: attend over its slice of the context
        # and store its (max, sum, normalized output) for the reduce.
        q = tl.load(q_ptr + t * stride_qt + h * stride_qh + offs_d, mask=offs_d < HEAD_DIM, other=0.0)
        end = tl.minimum(start + PARTITION_SIZE, seq_len)
        m_i, l_i, acc = _attend_range(
            q.to(tl.float32),
            b,
            h // QUERIES_PER_KV,
            tl.maximum(start, lo - lo % BLOCK_N),  # the partition holding the window's start begins at its tile
            end,
            lo,
            block_table_ptr,
            stride_bt,
            k_cache_ptr,
            v_cache_ptr,
            stride_cb,
            stride_ct,
            stride_ch,
            scale,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            BLOCK_SIZE,
        )
        tl.store(max_ptr + stat, m_i)
        tl.store(sum_ptr + stat, l_i)
        tl.store(tmp_out_ptr + stat * BLOCK_D + offs_d, acc / l_i)
        # END SOLUTION


@triton.jit(do_not_specialize=["window"])
def paged_decode_reduce_kernel(
    out_ptr,
    tmp_out_ptr,
    max_ptr,
    sum_ptr,
    seq_lens_ptr,
    rows_ptr,
    q_index_ptr,
    stride_ot,
    stride_oh,
    num_partitions,
    window,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.load(rows_ptr + i)
    t = tl.load(q_index_ptr + i)
    seq_len = tl.load(seq_lens_ptr + b)
    used = tl.cdiv(seq_len, PARTITION_SIZE)  # partitions that hold context: [first, used) with a window
    first = _window_start(seq_len, window) // PARTITION_SIZE  # those before it wrote nothing: never read
    # BEGIN SOLUTION
    # TASK v2-reduce (15 pts, launcher=paged_decode): merge the partitions' (max, sum, output) into one softmax (V2
    # reduce).
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = (offs_p >= first) & (offs_p < used)
    base = (i * tl.num_programs(1) + h) * num_partitions
    m_i = tl.load(max_ptr + base + offs_p, mask=mask_p, other=-float("inf"))
    l_i = tl.load(sum_ptr + base + offs_p, mask=mask_p, other=0.0)
    w = l_i * tl.exp(m_i - tl.max(m_i, axis=0))  # each partition's share of the softmax mass
    w = tl.where(mask_p, w, 0.0)
    offs_d = tl.arange(0, BLOCK_D)
    parts = tl.load(tmp_out_ptr + (base + offs_p)[:, None] * BLOCK_D + offs_d[None, :], mask=mask_p[:, None], other=0.0)
    out = tl.sum(w[:, None] * parts, axis=0) / tl.sum(w, axis=0)
    # END SOLUTION
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def use_v1(max_seq_len: int, num_reqs: int, num_heads: int, partition_size: int) -> bool:
    """vLLM's rule: V1 unless the context is long enough to split and the batch alone cannot fill the GPU."""
    max_num_partitions = triton.cdiv(max_seq_len, partition_size)
    return max_seq_len <= 8192 and (max_num_partitions == 1 or num_reqs * num_heads > 512)


def paged_decode(
    out,
    q,
    k_cache,
    v_cache,
    block_table,
    seq_lens,
    rows,
    q_index,
    scale,
    *,
    max_seq_len: int,
    partition_size: int = DEFAULT_PARTITION_SIZE,
    version: str | None = None,
    window: int = 0,
):
    """Checked launcher. q/out [T, H, D]; caches [num_blocks, block_size, KVH, D]; block_table [B, MB];
    seq_lens [B]; rows / q_index [N]: the decode requests' table rows and query tokens. Returns the version run.
    window W > 0: sliding-window attention, the query at seq_len - 1 sees keys j > seq_len - 1 - W (W keys, itself
    included, as Hugging Face's sliding_window); block-table entries wholly before it are never read. 0: none."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    check(num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads")
    contiguous = k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(2) == 1 and out.stride(2) == 1
    check(contiguous, "caches must be contiguous, and q and out contiguous along the head dim")
    check(partition_size % 16 == 0, "partition_size must be a multiple of 16")
    window = window or 0  # None (a layer without a window, as the backends say it) is 0
    check(window >= 0, "window must be >= 0 (0: no sliding window)")
    n = rows.numel()
    if n == 0:
        return None
    version = version or ("v1" if use_v1(max_seq_len, n, num_heads, partition_size) else "v2")
    inputs = (q, k_cache, v_cache, block_table, seq_lens, rows, q_index)
    if version == "v1":
        _launch_v1(out, inputs, scale, window)
    else:
        _launch_v2(out, inputs, scale, triton.cdiv(max_seq_len, partition_size), partition_size, window)
    return version


def _shapes(q, k_cache, block_table) -> tuple[dict, tuple]:
    """The constexprs and the cache strides both decode kernels take."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    common = dict(
        QUERIES_PER_KV=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_N=16,
        BLOCK_SIZE=block_size,
    )
    return common, (block_table.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))


def _launch_v1(out, inputs, scale, window: int) -> None:
    """V1: one program per (request, query head)."""
    q, k_cache, _, block_table, _, rows, _ = inputs
    common, strides = _shapes(q, k_cache, block_table)
    grid = (rows.numel(), q.shape[1])
    q_strides = (q.stride(0), q.stride(1), out.stride(0), out.stride(1))
    paged_decode_v1_kernel[grid](out, *inputs, *q_strides, *strides, scale, window, **common)


def _launch_v2(out, inputs, scale, parts: int, partition_size: int, window: int) -> None:
    """V2: one program per (request, query head, partition) into fp32 scratch, then the reduce."""
    q, k_cache, _, block_table, seq_lens, rows, q_index = inputs
    common, strides = _shapes(q, k_cache, block_table)
    n, num_heads = rows.numel(), q.shape[1]
    stats = torch.empty((n, num_heads, parts), dtype=torch.float32, device=q.device)  # each partition's max
    sums = torch.empty_like(stats)  # each partition's softmax denominator
    tmp = torch.empty((n, num_heads, parts, common["BLOCK_D"]), dtype=torch.float32, device=q.device)
    paged_decode_v2_kernel[(n, num_heads, parts)](
        tmp, stats, sums, *inputs, q.stride(0), q.stride(1), *strides, scale, parts, window,
        PARTITION_SIZE=partition_size, **common,
    )  # fmt: skip
    paged_decode_reduce_kernel[(n, num_heads)](
        out, tmp, stats, sums, seq_lens, rows, q_index, out.stride(0), out.stride(1), parts, window,
        HEAD_DIM=common["HEAD_DIM"], BLOCK_D=common["BLOCK_D"], BLOCK_P=triton.next_power_of_2(parts),
        PARTITION_SIZE=partition_size,
    )  # fmt: skip
