"""Stage 5: random workloads for the differential test against vLLM's scheduler: eight families, seeded.

Builds on: engine/replay.py (a workload is a recording; ReplayEngine plays it on pagedlab's scheduler),
lessons/vllm_peer.py (run_vllm plays it on vLLM's), viz/compare.py (where the two part).
Read with: chapters/09-graduate-to-vllm.md.

Each family stresses one part of the scheduler; a seed draws its settings, requests, arrival steps and
the token each request samples at each position (EOS included, so some requests stop early):

    roomy      a pool and budget nothing runs short of            admission, finishing, seats
    tight      a pool a little larger than the longest request    recompute preemption, re-admission
    chunked    a token budget of a few tokens, long prompts       chunked prefill, the long-prefill cap
    prefix     prompts on a few shared prefixes, caching on       hits, eviction, num_cached_tokens, a block
                                                                  computed twice in one step
    priority   priorities and staggered arrivals, a tight pool    the priority queue, its victims
    mixed      long and short prompts and outputs together        all of the above at once
    window     a sliding-window model; half with caching, small   freeing behind the window, the null block,
               chunks and a pool that barely holds a prompt        hits behind the window at admission
    hybrid     full and sliding layers in one model (two to four  one table per KV cache group over one pool,
               KV cache groups); shared prompts, caching on or    all-or-none allocation, hits every group
               off, a pool a little larger than the longest       serves, freeing behind each window

No model runs: the tokens are drawn here, and both schedulers are fed the same ones.
"""

from __future__ import annotations

import random

from pagedlab.kv.block_pool import cdiv
from pagedlab.kv.cache_groups import kv_cache_groups

FAMILIES = ("roomy", "tight", "chunked", "prefix", "priority", "mixed", "window", "hybrid")
EOS = 2  # the workloads' end-of-sequence token; other tokens are drawn from 3 .. VOCAB - 1
VOCAB = 60
MAX_MODEL_LEN = 160


def workload(family: str, seed: int) -> dict:
    """One recording (engine/replay.py's format) of `family`, drawn from `seed`."""
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {family!r}")
    rng = random.Random(f"{family}-{seed}")
    config, shapes = _FAMILY[family](rng)
    requests = [_request(rng, f"r{i:02d}", *shape) for i, shape in enumerate(shapes)]
    # At least what the door asks of the longest request (KVCacheManager.can_ever_admit: its every token but the
    # last sampled one), and the null block of a window
    longest = max(cdiv(len(r["prompt_token_ids"]) + r["max_tokens"] - 1, config["block_size"]) for r in requests)
    if "layer_windows" in config:  # a hybrid model: that many blocks in every group, and the null block
        groups = len(kv_cache_groups(config["layer_windows"]))
        config["num_kv_blocks"] = max(config["num_kv_blocks"], groups * longest + 1)
    config["num_kv_blocks"] = max(config["num_kv_blocks"], longest + bool(config["sliding_window"]))
    return {"config": config, "requests": requests, "ends": []}


def _config(rng: random.Random, **given) -> dict:
    """vLLM refuses max_num_batched_tokens < max_num_seqs: every family keeps the budget at least that large."""
    base = {
        "block_size": rng.choice((4, 8, 16)),
        "num_kv_blocks": 0,  # raised to fit the longest request (workload)
        "max_num_seqs": rng.randint(2, 8),
        "max_num_batched_tokens": 256,
        "max_model_len": MAX_MODEL_LEN,
        "long_prefill_token_threshold": 0,
        "enable_prefix_caching": rng.random() < 0.5,
        "preemption_mode": "recompute",
        "num_swap_blocks": 0,
        "scheduling_policy": "fcfs",
        "sliding_window": 0,
    }
    return base | given


def _request(rng: random.Random, rid: str, prompt: list[int], max_tokens: int, arrival: int, priority: int = 0):
    ignore_eos = rng.random() < 0.3
    outputs = [EOS if rng.random() < 0.08 else rng.randrange(3, VOCAB) for _ in range(max_tokens)]
    return {
        "id": rid, "prompt_token_ids": prompt, "output_token_ids": outputs, "max_tokens": max_tokens,
        "arrival_step": arrival, "priority": priority, "eos_token_ids": [EOS], "ignore_eos": ignore_eos,
        "stop_token_ids": [],
    }  # fmt: skip


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def _shapes(rng, n, prompt=(1, 40), output=(1, 24), arrivals=(1, 8), priorities=0) -> list[tuple]:
    """(prompt, max_tokens, arrival step, priority) for n requests."""
    return [
        (_tokens(rng, rng.randint(*prompt)), rng.randint(*output), rng.randint(*arrivals), rng.randint(0, priorities))
        for _ in range(n)
    ]


def _roomy(rng):
    config = _config(rng, num_kv_blocks=400, max_num_seqs=rng.randint(4, 8))
    return config, _shapes(rng, rng.randint(4, 10))


def _tight(rng):
    return _config(rng, num_kv_blocks=rng.randint(4, 12)), _shapes(rng, rng.randint(4, 10), arrivals=(1, 4))


def _chunked(rng):
    budget = rng.randint(4, 24)
    config = _config(rng, max_num_batched_tokens=budget, max_num_seqs=rng.randint(2, min(8, budget)),
                     long_prefill_token_threshold=rng.choice((0, 0, 4, 8)),
                     num_kv_blocks=rng.randint(10, 60))  # fmt: skip
    return config, _shapes(rng, rng.randint(2, 7), prompt=(8, 90), arrivals=(1, 6))


def _prefix(rng):
    bases = [_tokens(rng, rng.randint(8, 40)) for _ in range(rng.randint(1, 3))]
    # chunks shorter than a shared prefix: two requests then compute the same blocks in one step (duplicates)
    config = _config(rng, enable_prefix_caching=True, num_kv_blocks=rng.randint(8, 30),
                     long_prefill_token_threshold=rng.choice((0, 8, 16)))  # fmt: skip
    shapes = []
    for prompt, max_tokens, arrival, _ in _shapes(rng, rng.randint(4, 10), prompt=(0, 12), arrivals=(1, 5)):
        shapes.append((rng.choice(bases) + prompt or [3], max_tokens, arrival, 0))
    return config, shapes


def _priority(rng):
    config = _config(rng, scheduling_policy="priority", num_kv_blocks=rng.randint(4, 16))
    return config, _shapes(rng, rng.randint(3, 9), arrivals=(1, 12), priorities=3)


def _mixed(rng):
    config = _config(rng, num_kv_blocks=rng.randint(12, 40), max_num_batched_tokens=rng.choice((32, 64, 256)),
                     long_prefill_token_threshold=rng.choice((0, 16)))  # fmt: skip
    long = _shapes(rng, rng.randint(1, 3), prompt=(40, 100), output=(10, 40))
    short = _shapes(rng, rng.randint(2, 6), prompt=(1, 6), output=(1, 6))
    return config, long + short


def _window(rng):
    if rng.random() < 0.5:
        config = _config(rng, sliding_window=rng.choice((8, 16, 24)), num_kv_blocks=rng.randint(6, 20),
                         max_num_batched_tokens=rng.choice((16, 64, 256)))  # fmt: skip
        return config, _shapes(rng, rng.randint(2, 8), prompt=(1, 60), output=(1, 30))
    # Window + caching + small chunks + a pool that barely holds a long shared prompt: once its first request ends,
    # the free blocks are mostly its cached ones. Hits behind the window are null blocks, so a later request's
    # hits can outnumber the blocks it may hold at once, while its chunk still needs a block of its own
    # (tests/sched/test_vllm_repros.py: the chunk must fit too).
    block_size, budget, window_blocks = rng.choice((4, 8)), rng.randint(2, 4), rng.randint(2, 4)
    base = _tokens(rng, block_size * (window_blocks + rng.randint(2, 4)))  # longer than the window by 2-4 blocks
    config = _config(rng, block_size=block_size, sliding_window=block_size * window_blocks, enable_prefix_caching=True,
                     num_kv_blocks=len(base) // block_size + 2, max_num_batched_tokens=budget,
                     max_num_seqs=rng.randint(2, min(4, budget)))  # fmt: skip
    shapes = [(base, 1, 1, 0)]
    for extra, max_tokens, arrival, _ in _shapes(rng, rng.randint(2, 5), prompt=(1, 2), output=(1, 2), arrivals=(2, 6)):
        cut = block_size * rng.choice((len(base) // block_size, window_blocks, rng.randint(1, len(base) // block_size)))
        shapes.append((base[:cut] + extra, max_tokens, arrival, 0))
    return config, shapes


def _hybrid(rng):
    """Layer patterns of real hybrid models, small: gpt-oss's alternation (two groups), a full layer among
    sliding ones (Gemma's n:1, here 1:3: four groups of one layer), two windows and full layers (three groups)."""
    block_size = rng.choice((4, 8))
    w = block_size * rng.randint(2, 4)
    layers = rng.choice(([w, None, w, None], [None, w], [w, w, w, None], [None, w, None, 2 * w]))
    caching = rng.random() < 0.6
    config = _config(rng, block_size=block_size, layer_windows=layers, enable_prefix_caching=caching,
                     num_kv_blocks=rng.randint(8, 40), max_num_batched_tokens=rng.choice((8, 16, 64, 256)),
                     long_prefill_token_threshold=rng.choice((0, 0, 8)))  # fmt: skip
    config["max_num_seqs"] = min(config["max_num_seqs"], config["max_num_batched_tokens"])
    bases = [_tokens(rng, rng.randint(8, 48)) for _ in range(rng.randint(1, 3))]
    shapes = []
    for prompt, max_tokens, arrival, _ in _shapes(rng, rng.randint(3, 9), prompt=(0, 16), output=(1, 30)):
        shapes.append((rng.choice(bases) + prompt, max_tokens, arrival, 0))
    return config, shapes


_FAMILY = {"roomy": _roomy, "tight": _tight, "chunked": _chunked, "prefix": _prefix, "priority": _priority,
           "mixed": _mixed, "window": _window, "hybrid": _hybrid}  # fmt: skip


def suite(seeds: int = 20) -> list[tuple[str, int, dict]]:
    """(family, seed, recording) for every family and seeds 0 .. seeds - 1."""
    return [(family, seed, workload(family, seed)) for family in FAMILIES for seed in range(seeds)]
