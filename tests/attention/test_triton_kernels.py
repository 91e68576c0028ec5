"""Stage 6: each Triton kernel against the torch reference, under Triton's interpreter on a CPU.

Small shapes only (the interpreter runs every program in Python): block sizes 1 and 16, contexts
that end mid-block, GQA ratios 1 and 4, V1 and V2 (a low partition size forces V2), fp32 and fp16.
"""

from __future__ import annotations

import os

import pytest
import torch

from pagedlab.attention.base import causal_attention, repeat_kv
from tests.conftest import need_triton

pytestmark = pytest.mark.stage6

D = 32
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # interpreter: CPU tensors; else the GPU


def paged_case(seq_lens, q_lens, block_size, num_heads, num_kv_heads, dtype, seed=0):
    """A random paged cache holding every request's context, with shuffled block tables."""
    g = torch.Generator().manual_seed(seed)
    blocks_per = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, D, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, D, generator=g).to(dtype)
    width = max(blocks_per)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for b, n in enumerate(blocks_per):
        table[b, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
    qsl = torch.tensor([0] + q_lens).cumsum(0)
    q = torch.randn(int(qsl[-1]), num_heads, D, generator=g).to(dtype)
    return tuple(t.to(DEVICE) for t in (q, k_cache, v_cache, table, torch.tensor(seq_lens), qsl))


def reference(q, k_cache, v_cache, table, seq_lens, qsl, block_size):
    """The torch reference: gather each request's context through its block table, attend causally."""
    q, k_cache, v_cache, table, seq_lens, qsl = (t.cpu() for t in (q, k_cache, v_cache, table, seq_lens, qsl))
    out = torch.empty(q.shape, dtype=torch.float32)
    rep = q.shape[1] // k_cache.shape[2]
    for b, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n)
        slots = table[b, pos // block_size].long() * block_size + pos % block_size
        k = repeat_kv(k_cache.view(-1, *k_cache.shape[2:])[slots].float(), rep)
        v = repeat_kv(v_cache.view(-1, *v_cache.shape[2:])[slots].float(), rep)
        out[qsl[b] : qsl[b + 1]] = causal_attention(q[qsl[b] : qsl[b + 1]].float(), k, v, D**-0.5)
    return out


TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "version",
    [
        pytest.param("v1", marks=pytest.mark.task("decode-tile")),
        pytest.param("v2", marks=[pytest.mark.task("v2-partition"), pytest.mark.task("v2-reduce")]),
    ],
)
def test_paged_decode_matches_torch(block_size, num_heads, num_kv_heads, dtype, version):
    need_triton()
    from pagedlab.attention.triton.decode import paged_decode

    seq_lens = [37, 5, 16, 50]  # ends mid-block, short, exactly one block, several partitions
    q, kc, vc, table, lens, qsl = paged_case(seq_lens, [1] * 4, block_size, num_heads, num_kv_heads, dtype)
    out = torch.empty_like(q)
    rows = torch.arange(4)
    ran = paged_decode(
        out,
        q,
        kc,
        vc,
        table,
        lens,
        rows.to(DEVICE),
        qsl[:-1],
        D**-0.5,
        max_seq_len=50,
        partition_size=16,
        version=version,
    )
    assert ran == version
    torch.testing.assert_close(
        out.float().cpu(), reference(q, kc, vc, table, lens, qsl, block_size), atol=TOL[dtype], rtol=TOL[dtype]
    )


def test_the_launcher_picks_v1_or_v2_as_vllm_does():
    need_triton()
    from pagedlab.attention.triton.decode import use_v1

    assert use_v1(max_seq_len=512, num_reqs=1, num_heads=8, partition_size=512)  # one partition
    assert not use_v1(max_seq_len=4096, num_reqs=2, num_heads=8, partition_size=512)  # long, few programs
    assert use_v1(max_seq_len=4096, num_reqs=64, num_heads=32, partition_size=512)  # enough programs anyway
    assert not use_v1(max_seq_len=10000, num_reqs=64, num_heads=32, partition_size=512)  # too long for V1


@pytest.mark.task("prefill-tile")
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_paged_prefill_over_a_cached_prefix_matches_torch(block_size, num_heads, num_kv_heads, dtype):
    need_triton()
    from pagedlab.attention.triton.prefill import paged_prefill

    # request 0: a whole prompt of 21; request 1: a chunk of 7 after 30 cached tokens; request 2: 17 after 1
    seq_lens, q_lens = [21, 37, 18], [21, 7, 17]
    q, kc, vc, table, lens, qsl = paged_case(seq_lens, q_lens, block_size, num_heads, num_kv_heads, dtype, seed=1)
    out = torch.empty_like(q)
    paged_prefill(out, q, kc, vc, table, lens, qsl, torch.arange(3, device=DEVICE), D**-0.5, max_query_len=21)
    torch.testing.assert_close(
        out.float().cpu(), reference(q, kc, vc, table, lens, qsl, block_size), atol=TOL[dtype], rtol=TOL[dtype]
    )


@pytest.mark.task("store")
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_store_kv_writes_each_token_at_its_slot(block_size, dtype):
    need_triton()
    from pagedlab.attention.reference import store_kv as torch_store_kv
    from pagedlab.attention.triton.store import store_kv

    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(2, 9, 2, D, generator=g)
    slots = torch.randperm(4 * block_size, generator=g)[:5] if block_size > 1 else torch.tensor([3, 0, 2])
    k, v = k[: len(slots)], v[: len(slots)]
    got = [torch.zeros(4, block_size, 2, D, dtype=dtype, device=DEVICE) for _ in range(2)]
    want = [torch.zeros(4, block_size, 2, D, dtype=dtype) for _ in range(2)]
    store_kv(got[0], got[1], k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE))
    torch_store_kv(want[0], want[1], k, v, slots)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.task("store")
def test_store_kv_skips_padding_slots():
    need_triton()
    from pagedlab.attention.triton.store import store_kv

    kc, vc = torch.zeros(2, 4, 1, D, device=DEVICE), torch.zeros(2, 4, 1, D, device=DEVICE)
    k = torch.ones(3, 1, D, device=DEVICE)
    store_kv(kc, vc, k, k, torch.tensor([5, -1, 2], device=DEVICE))
    assert kc.view(-1, D).sum(1).nonzero().flatten().tolist() == [2, 5]
