"""Course: stage 6's scenarios: every kernel's inner loop, through its launcher, against nothing but plain numbers.

Builds on: attention/triton/ (store, decode V1 and V2, prefill), course/scenarios/common.py.
Read with: chapters/98-assignments.md (Scenarios), chapters/06-triton-kernel.md.

The shapes are small (Triton's interpreter runs every program in Python on a CPU): a few requests, contexts
that end mid-block, GQA ratios 1 and 2, block sizes 1 to 16, sliding windows now and then. The outputs are
compared within the tests' tolerances (fp32 2e-5, fp16 2e-3).
"""

from __future__ import annotations

import os

from pagedlab.course.scenarios import TaskScenarios
from pagedlab.course.scenarios.common import floats

D = 16  # head dim: tl.dot needs >= 16
TOL = {"float32": 2e-5, "float16": 2e-3}


def device() -> str:
    """Where the kernels run: the CPU under Triton's interpreter (TRITON_INTERPRET=1, the grader's choice without a
    GPU), else the GPU."""
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def paged_case(rng, seq_lens, q_lens, block_size, heads, kv_heads, dtype="float32"):
    """A random paged cache holding every request's context, shuffled block tables, the new tokens' queries."""
    import torch

    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    per = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per) + 2
    perm = torch.randperm(num_blocks, generator=g).tolist()
    cache = [torch.randn(num_blocks, block_size, kv_heads, D, generator=g).to(getattr(torch, dtype)) for _ in "kv"]
    table = torch.zeros(len(seq_lens), max(per), dtype=torch.int32)
    for b, n in enumerate(per):
        table[b, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
    qsl = torch.tensor([0, *q_lens]).cumsum(0)
    q = torch.randn(int(qsl[-1]), heads, D, generator=g).to(getattr(torch, dtype))
    dev = device()
    return tuple(t.to(dev) for t in (q, cache[0], cache[1], table, torch.tensor(seq_lens), qsl))


def decode(rng, version: str, seq_lens, block_size, heads=2, kv_heads=1, dtype="float32", window=0):
    """paged_decode, one query per request, partitions of 16 (V2 over several partitions at these lengths)."""
    import torch

    from pagedlab.attention.triton.decode import paged_decode

    q, kc, vc, table, lens, qsl = paged_case(rng, seq_lens, [1] * len(seq_lens), block_size, heads, kv_heads, dtype)
    out = torch.zeros_like(q)
    rows = torch.arange(len(seq_lens), device=q.device)
    paged_decode(out, q, kc, vc, table, lens, rows, qsl[:-1], D**-0.5, max_seq_len=max(seq_lens),
                 partition_size=16, version=version, window=window)  # fmt: skip
    return floats(out.float().cpu().flatten().tolist(), TOL[dtype])


def prefill(rng, seq_lens, q_lens, block_size, heads=2, kv_heads=1, dtype="float32", window=0):
    """paged_prefill of every request at once (tiles of 16 queries and 16 keys)."""
    import torch

    from pagedlab.attention.triton.prefill import paged_prefill

    q, kc, vc, table, lens, qsl = paged_case(rng, seq_lens, q_lens, block_size, heads, kv_heads, dtype)
    out = torch.zeros_like(q)
    rows = torch.arange(len(seq_lens), device=q.device)
    paged_prefill(out, q, kc, vc, table, lens, qsl, rows, D**-0.5, max_query_len=max(q_lens), window=window)
    return floats(out.float().cpu().flatten().tolist(), TOL[dtype])


def store(rng, num_tokens: int, block_size: int, num_blocks: int, dtype="float32", padding: bool = False):
    """store_kv of random K/V at distinct random slots (-1: a padding token, skipped); both caches after."""
    import torch

    from pagedlab.attention.triton.store import store_kv

    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    dev, kv_heads = device(), 2
    slots = rng.sample(range(num_blocks * block_size), num_tokens)
    if padding:
        slots[rng.randrange(num_tokens)] = -1
    k, v = torch.randn(2, num_tokens, kv_heads, D, generator=g)
    caches = [torch.zeros(num_blocks, block_size, kv_heads, D, dtype=getattr(torch, dtype), device=dev) for _ in "kv"]
    store_kv(caches[0], caches[1], k.to(dev), v.to(dev), torch.tensor(slots, device=dev))
    # A store copies: any wrong slot moves whole values. The tolerance is a float32 ulp's, not 0, because randn's
    # last bit may differ between torch's CPU kernels (ATEN_CPU_CAPABILITY), and 6 digits can round either way.
    return [floats(c.float().cpu().flatten().tolist(), 1e-6) for c in caches]


def stores_each_token_at_its_slot(rng):
    return store(rng, 5, 4, 3)


def skips_padding_in_half_precision(rng):
    return store(rng, 4, 16, 1, dtype="float16", padding=True)


def store_random(rng):
    bs = rng.choice((1, 2, 4, 16))
    blocks = rng.randrange(2, 5)
    return store(rng, rng.randrange(1, min(8, bs * blocks) + 1), bs, blocks, rng.choice(("float32", "float16")),
                 padding=rng.random() < 0.3)  # fmt: skip


def v1_over_blocks_that_end_mid_block(rng):
    return decode(rng, "v1", [37, 5, 16], 16)


def v1_blocks_of_one_and_a_window(rng):
    return decode(rng, "v1", [9, 3], 1, heads=2, kv_heads=2, window=4)


def v1_random(rng):
    return decode(rng, "v1", [rng.randrange(1, 40) for _ in range(rng.randrange(1, 4))], rng.choice((1, 4, 16)),
                  dtype=rng.choice(("float32", "float16")), window=rng.choice((0, 0, 5)))  # fmt: skip


def v2_over_several_partitions(rng):
    return decode(rng, "v2", [50, 5, 33], 16)


def v2_small_blocks_and_a_window(rng):
    return decode(rng, "v2", [40, 18], 4, heads=2, kv_heads=2, window=20)


def v2_random(rng):
    return decode(rng, "v2", [rng.randrange(1, 56) for _ in range(rng.randrange(1, 4))], rng.choice((2, 4, 16)),
                  dtype=rng.choice(("float32", "float16")), window=rng.choice((0, 0, 17)))  # fmt: skip


def a_prompt_and_a_chunk_after_a_cached_prefix(rng):
    return prefill(rng, [21, 30], [21, 7], 16)


def blocks_of_one_and_a_window(rng):
    return prefill(rng, [12, 18], [12, 17], 1, heads=2, kv_heads=2, window=5)


def prefill_random(rng):
    seq_lens = [rng.randrange(2, 36) for _ in range(rng.randrange(1, 3))]
    q_lens = [rng.randrange(2, n + 1) for n in seq_lens]
    return prefill(rng, seq_lens, q_lens, rng.choice((1, 4, 16)), dtype=rng.choice(("float32", "float16")),
                   window=rng.choice((0, 0, 6)))  # fmt: skip


DECODE = ("pagedlab.attention.triton.decode",)  # torch and Triton, imported before the first case
V2_CASES = (v2_over_several_partitions, v2_small_blocks_and_a_window)
SCENARIOS = [
    TaskScenarios("decode-tile", (), (v1_over_blocks_that_end_mid_block, v1_blocks_of_one_and_a_window), v1_random, 3,
                  DECODE),
    TaskScenarios("v2-partition", ("decode-tile", "v2-reduce"), V2_CASES, v2_random, 3, DECODE),
    TaskScenarios("v2-reduce", ("decode-tile", "v2-partition"), V2_CASES, v2_random, 3, DECODE),
    TaskScenarios("prefill-tile", (), (a_prompt_and_a_chunk_after_a_cached_prefix, blocks_of_one_and_a_window),
                  prefill_random, 3, ("pagedlab.attention.triton.prefill",)),
    TaskScenarios("store", (), (stores_each_token_at_its_slot, skips_padding_in_half_precision), store_random, 3,
                  ("pagedlab.attention.triton.store",)),
]  # fmt: skip
