"""Stage 6: each Triton kernel against the torch reference, under Triton's interpreter on a CPU.

Small shapes only (the interpreter runs every program in Python): block sizes 1 and 16, contexts
that end mid-block, GQA ratios 1 and 4, V1 and V2 (a low partition size forces V2), fp32 and fp16.
Sliding windows (keys i - W < j <= i, Hugging Face's convention) are checked against the same reference,
with the blocks wholly before every window replaced by a NaN block that must never be read.
"""

from __future__ import annotations

import os

import pytest
import torch

from pagedlab.attention.paged import paged_reference
from tests.conftest import need_triton

pytestmark = [pytest.mark.stage6, pytest.mark.numerics]

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


def reference(q, k_cache, v_cache, table, seq_lens, qsl, block_size, window=0):
    """The one torch reference (attention/paged.py): each request's context gathered through its block table,
    attended causally (within the last `window` keys of each query when window > 0)."""
    return paged_reference(q, k_cache, v_cache, table, seq_lens.tolist(), qsl.tolist(), window or None)


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


# --- sliding windows -------------------------------------------------------------------------------------------

DECODE_LENS = [37, 5, 16, 50]  # as test_paged_decode_matches_torch: with partition_size 16, windows span partitions
PREFILL_LENS, PREFILL_Q_LENS = [21, 37, 18], [21, 7, 17]  # as test_paged_prefill_over_a_cached_prefix_matches_torch
# windows 1 (only itself), 5 (inside one block of 16), 8, 16 (a whole partition), 40 (past every context: no window)
WINDOW_CASES = [
    *(pytest.param(w, bs, torch.float32, id=f"w{w}-bs{bs}-fp32") for w in (1, 5, 8, 16, 40) for bs in (1, 16)),
    pytest.param(8, 16, torch.float16, id="w8-bs16-fp16"),
]
DECODE_VERSIONS = [
    pytest.param("v1", marks=pytest.mark.task("decode-tile")),
    pytest.param("v2", marks=[pytest.mark.task("v2-partition"), pytest.mark.task("v2-reduce")]),
]


def run_decode(version, case, **kw):
    """paged_decode of a case from paged_case (one query per request), as test_paged_decode_matches_torch runs it."""
    from pagedlab.attention.triton.decode import paged_decode

    q, kc, vc, table, lens, qsl = case
    out = torch.empty_like(q)
    rows = torch.arange(len(lens), device=DEVICE)
    max_len = int(lens.max())
    ran = paged_decode(
        out, q, kc, vc, table, lens, rows, qsl[:-1], D**-0.5,
        max_seq_len=max_len, partition_size=16, version=version, **kw,
    )  # fmt: skip
    assert ran == version
    return out


def run_prefill(case, **kw):
    """paged_prefill of a case from paged_case, every request at once."""
    from pagedlab.attention.triton.prefill import paged_prefill

    q, kc, vc, table, lens, qsl = case
    out = torch.empty_like(q)
    max_q = int((qsl[1:] - qsl[:-1]).max())
    paged_prefill(
        out, q, kc, vc, table, lens, qsl, torch.arange(len(lens), device=DEVICE), D**-0.5, max_query_len=max_q, **kw
    )
    return out


def with_null_blocks(case, block_size, first_seen):
    """The case with every block-table entry wholly before request b's first visible key `first_seen[b]` pointing
    at a spare block full of NaN (a "null block"): a kernel that reads any of them returns NaN."""
    q, kc, vc, table, lens, qsl = (t.clone() for t in case)
    used = {int(x) for b, n in enumerate(lens.tolist()) for x in table[b, : -(-n // block_size)].tolist()}
    null = min(set(range(kc.shape[0])) - used)
    kc[null], vc[null] = float("nan"), float("nan")
    nulled = 0
    for b, lo in enumerate(first_seen):
        table[b, : lo // block_size] = null
        nulled += lo // block_size
    assert nulled > 0, "the case must null some block"
    return q, kc, vc, table, lens, qsl


class _NanScratchTorch:
    """Stands in for decode.py's `torch` in one test: V2's scratch (torch.empty) starts as NaN, so a reduce that
    read a partition nobody wrote would return NaN."""

    float32 = torch.float32

    @staticmethod
    def empty(size, **kw):
        return torch.full(size, float("nan"), **kw)

    @staticmethod
    def empty_like(t):
        return torch.full_like(t, float("nan"))


@pytest.mark.parametrize("window, block_size, dtype", WINDOW_CASES)
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 1)])
@pytest.mark.parametrize("version", DECODE_VERSIONS)
def test_paged_decode_with_a_sliding_window_matches_torch(window, block_size, dtype, num_heads, num_kv_heads, version):
    need_triton()
    case = paged_case(DECODE_LENS, [1] * 4, block_size, num_heads, num_kv_heads, dtype)
    out = run_decode(version, case, window=window)
    want = reference(*case, block_size, window=window)
    torch.testing.assert_close(out.float().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("window", [1, 8, 18])  # 18: the window starts exactly at a partition (50 - 18 = 32)
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("version", DECODE_VERSIONS)
def test_paged_decode_never_reads_blocks_before_the_window(window, block_size, version, monkeypatch):
    need_triton()
    from pagedlab.attention.triton import decode

    case = paged_case(DECODE_LENS, [1] * 4, block_size, 4, 1, torch.float32)
    want = reference(*case, block_size, window=window)
    nulled = with_null_blocks(case, block_size, [max(0, n - window) for n in DECODE_LENS])
    monkeypatch.setattr(decode, "torch", _NanScratchTorch)  # V2's skipped partitions leave NaN scratch behind
    out = run_decode(version, nulled, window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu(), want, atol=TOL[torch.float32], rtol=TOL[torch.float32])


@pytest.mark.parametrize("version", DECODE_VERSIONS)
def test_paged_decode_window_0_or_past_the_context_is_no_window(version):
    need_triton()
    case = paged_case(DECODE_LENS, [1] * 4, 16, 4, 1, torch.float32)
    plain = run_decode(version, case)  # no window argument: the launcher's behaviour before windows
    for window in (0, 50, 1000):  # 50: the longest context exactly
        assert torch.equal(run_decode(version, case, window=window), plain), window


@pytest.mark.task("prefill-tile")
@pytest.mark.parametrize("window, block_size, dtype", WINDOW_CASES)
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 1)])
def test_paged_prefill_with_a_sliding_window_matches_torch(window, block_size, dtype, num_heads, num_kv_heads):
    need_triton()
    case = paged_case(PREFILL_LENS, PREFILL_Q_LENS, block_size, num_heads, num_kv_heads, dtype, seed=1)
    out = run_prefill(case, window=window)
    want = reference(*case, block_size, window=window)
    torch.testing.assert_close(out.float().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.task("prefill-tile")
@pytest.mark.parametrize("window", [1, 8])
@pytest.mark.parametrize("block_size", [1, 16])
def test_paged_prefill_never_reads_blocks_before_the_window(window, block_size):
    need_triton()
    case = paged_case(PREFILL_LENS, PREFILL_Q_LENS, block_size, 4, 1, torch.float32, seed=1)
    want = reference(*case, block_size, window=window)
    first = [max(0, n - m - window + 1) for n, m in zip(PREFILL_LENS, PREFILL_Q_LENS)]  # the first query's window
    out = run_prefill(with_null_blocks(case, block_size, first), window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu(), want, atol=TOL[torch.float32], rtol=TOL[torch.float32])


@pytest.mark.task("prefill-tile")
def test_paged_prefill_window_0_or_past_the_context_is_no_window():
    need_triton()
    case = paged_case(PREFILL_LENS, PREFILL_Q_LENS, 16, 4, 1, torch.float32, seed=1)
    plain = run_prefill(case)
    for window in (0, 37, 1000):  # 37: the longest context exactly
        assert torch.equal(run_prefill(case, window=window), plain), window


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
