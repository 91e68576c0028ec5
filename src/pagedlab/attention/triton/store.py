"""Stage 6: `store_kv`, the Triton kernel that writes each new token's K and V into its cache slot.

Builds on: attention/contiguous.py (`store_kv`, the torch reference: two index_copy_ calls).
Read with: chapters/06-triton-kernel.md.

Motivation. Before attention can read a token's K/V from the paged cache,
something must put it there: vLLM's `reshape_and_cache` kernel. Each new
token has a slot (block_id * block_size + offset) from the slot mapping.

Pseudo-code, one program per (token t, KV head h):

    slot = slot_mapping[t]            # -1 marks padding: skip
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    k_cache[block, offset, h, :] = k[t, h, :]
    v_cache[block, offset, h, :] = v[t, h, :]

Shapes: T new tokens, KVH key/value heads, D head dim; caches [num_blocks, block_size, KVH, D].
vLLM: csrc/cache_kernels.cu (reshape_and_cache), vllm/v1/attention/ops/triton_reshape_and_cache_flash.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedlab.errors import check


@triton.jit
def store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_block,
    stride_cache_tok,
    stride_cache_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot >= 0:  # padding tokens carry slot -1
        # BEGIN SOLUTION
        # TASK store (15 pts, launcher=store_kv): write token t's K and V for head h into its slot of the caches.
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + offs_d, mask=mask_d)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + offs_d, mask=mask_d)
        dst = block * stride_cache_block + offset * stride_cache_tok + h * stride_cache_head + offs_d
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask_d)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask_d)
        # END SOLUTION


def store_kv(k_cache, v_cache, k, v, slot_mapping) -> None:
    """Checked launcher: k, v [T, KVH, D] into caches [num_blocks, block_size, KVH, D] at slot_mapping [T]."""
    t, kvh, d = k.shape
    check(v.shape == k.shape and slot_mapping.shape == (t,), "k, v and slot_mapping disagree on T")
    check(k_cache.shape == v_cache.shape and k_cache.shape[2:] == (kvh, d), "cache shape mismatch")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    check(k.stride(2) == 1 and v.stride(2) == 1, "the head dim must be contiguous")
    if t == 0:
        return
    # Convert to the cache dtype in torch: one rounding rule on every device (Triton's interpreter
    # rounds bfloat16 differently from CUDA).
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    store_kv_kernel[(t, kvh)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_SIZE=k_cache.shape[1],
    )
