"""The torch backends against a plain per-request attention: the reference (stages 1-4) and the tiled decode
(stage 5), which must give the same numbers.

The tiled path reads each context in tiles of block_size and merges the tiles' softmaxes; these tests
pin both paths to `causal_attention` over each request's own slots, for contexts that end mid-tile, at
a tile's edge, and for one token; GQA ratios 1, 2 and 4; fp32 and fp16; decodes and prefill chunks in
one step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlab.attention.contiguous import ContiguousAttention
from pagedlab.attention.metadata import AttentionMetadata
from pagedlab.attention.paged import PagedAttention
from pagedlab.attention.tiled import TiledPagedAttention
from tests.attention.test_triton_kernels import TOL, D, paged_case, reference

pytestmark = [pytest.mark.stage2, pytest.mark.numerics]  # the paged reference; a stage-1 regions test is stage1 too


def metadata(backend, table, seq_lens, q_lens, block_size) -> AttentionMetadata:
    """One step's metadata, as the runner builds it: q_lens new tokens end each request's seq_lens."""
    seq, new = np.array(seq_lens), np.array(q_lens)
    qsl = np.concatenate([[0], np.cumsum(new)])
    req = np.repeat(np.arange(len(new)), new)
    positions = np.arange(qsl[-1]) - qsl[req] + (seq - new)[req]
    decode, prefill = np.flatnonzero(new == 1), np.flatnonzero(new > 1)
    meta = AttentionMetadata(
        query_start_loc=torch.from_numpy(qsl),
        query_start_loc_cpu=qsl.tolist(),
        seq_lens=torch.from_numpy(seq),
        seq_lens_cpu=seq.tolist(),
        slot_mapping=torch.empty(0, dtype=torch.int64),  # set below: the backend knows where positions live
        block_table=table,
        max_seq_len=int(seq.max()),
        block_size=block_size,
        decode_rows=torch.from_numpy(decode),
        decode_rows_cpu=decode.tolist(),
        prefill_rows=torch.from_numpy(prefill),
        prefill_rows_cpu=prefill.tolist(),
        max_query_len=int(new.max()),
    )
    meta.slot_mapping = backend.context_slots(meta, torch.from_numpy(req), torch.from_numpy(positions))
    return meta


def run_backend(backend_cls, q, k_cache, v_cache, table, seq_lens, q_lens, block_size):
    """backend.forward for layer 0; the new tokens' K/V are the ones already in the cache (a no-op store)."""
    kv = torch.stack([k_cache, v_cache])[None].clone()  # [1 layer, 2, blocks, block_size, KVH, D]
    backend = backend_cls(kv, q.shape[1] // k_cache.shape[2], D)
    meta = metadata(backend, table, seq_lens, q_lens, block_size)
    k = k_cache.view(-1, *k_cache.shape[2:])[meta.slot_mapping]
    v = v_cache.view(-1, *v_cache.shape[2:])[meta.slot_mapping]
    backend.prepare(meta)  # as the runner does, once per step
    return backend.forward(0, q, k, v, meta), meta


@pytest.mark.task("paged-gather")
@pytest.mark.parametrize("backend_cls", [PagedAttention, TiledPagedAttention])
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_paged_decodes_and_prefills_equal_per_request_attention(
    backend_cls, block_size, num_heads, num_kv_heads, dtype
):
    seq_lens = [1, 16, 17, 40, 5, 33, 64]  # one token, tile edges, mid-tile ends
    q_lens = [1, 1, 1, 7, 1, 33, 1]  # decodes, a chunk over a cached prefix, a whole prompt
    q, k_cache, v_cache, table, lens, qsl = paged_case(seq_lens, q_lens, block_size, num_heads, num_kv_heads, dtype)
    out, meta = run_backend(backend_cls, q, k_cache, v_cache, table, seq_lens, q_lens, block_size)
    expected = reference(q, k_cache, v_cache, table, lens, qsl, block_size)
    torch.testing.assert_close(out.float(), expected, atol=TOL[dtype], rtol=TOL[dtype])
    assert out.dtype == dtype
    if backend_cls is TiledPagedAttention:
        assert meta.decode_plan is not None and len(meta.decode_plan.owner) == sum(
            -(-seq_lens[b] // block_size) for b in meta.decode_rows_cpu
        ), "a decode reads exactly its own tiles"


@pytest.mark.stage5
def test_the_tiled_plan_is_made_once_per_step_and_read_by_every_layer():
    seq_lens, q_lens = [9, 30], [1, 1]
    q, k_cache, v_cache, table, *_ = paged_case(seq_lens, q_lens, 4, 4, 2, torch.float32)
    kv = torch.stack([k_cache, v_cache])[None].repeat(2, 1, 1, 1, 1, 1)  # two layers
    backend = TiledPagedAttention(kv, 2, D)
    meta = metadata(backend, table, seq_lens, q_lens, 4)
    k = k_cache.view(-1, *k_cache.shape[2:])[meta.slot_mapping]
    backend.prepare(meta)
    plan = meta.decode_plan
    first = backend.forward(0, q, k, k, meta)
    assert meta.decode_plan is plan and torch.equal(backend.forward(1, q, k, k, meta), first)


@pytest.mark.stage1
def test_contiguous_regions_read_only_their_own_slots():
    """Stage 1: a context is region_start + 0 .. seq_len - 1. Regions ending mid-tile, at a tile's
    edge and at the cache's last slot; the slots after each region hold other data, never read."""
    block_size, num_blocks = 16, 4
    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(num_blocks, block_size, 2, D, generator=g)
    v_cache = torch.randn(num_blocks, block_size, 2, D, generator=g)
    table = torch.tensor([[0], [3], [2]], dtype=torch.int32)  # each row: its region's first block
    seq_lens, q_lens = [21, 16, 5], [1, 1, 1]
    q = torch.randn(3, 4, D, generator=g)
    out, _ = run_backend(ContiguousAttention, q, k_cache, v_cache, table, seq_lens, q_lens, block_size)
    flat_k, flat_v = k_cache.view(-1, 2, D), v_cache.view(-1, 2, D)
    for b, n in enumerate(seq_lens):
        start = int(table[b, 0]) * block_size
        kk = flat_k[start : start + n].repeat_interleave(2, dim=1)  # [n, H, D]: GQA 2
        vv = flat_v[start : start + n].repeat_interleave(2, dim=1)
        probs = torch.softmax(torch.einsum("hd,thd->ht", q[b], kk) * D**-0.5, dim=-1)
        torch.testing.assert_close(out[b], torch.einsum("ht,thd->hd", probs, vv), atol=2e-5, rtol=2e-5)
