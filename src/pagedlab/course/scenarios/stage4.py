"""Course: stage 4's scenarios: chained block hashes, the prefix index, the caching pool, the lookup.

Builds on: kv/hashing.py, kv/prefix.py, course/scenarios/common.py.
Read with: chapters/98-assignments.md (Scenarios), chapters/04-prefix-caching.md.
"""

from __future__ import annotations

from pagedlab.course.scenarios import TaskScenarios
from pagedlab.course.scenarios.common import Arrival, attempt, random_arrivals, story
from pagedlab.kv.block_pool import KVCacheBlock
from pagedlab.kv.hashing import HashChainIndex, hash_block_tokens, make_none_hash, update_block_hashes
from pagedlab.kv.prefix import CachingBlockPool, PrefixCachingKVCacheManager
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams


def hexes(hashes) -> list:
    return [h.hex() if isinstance(h, bytes) else repr(h) for h in hashes]


# -- block-hashing ------------------------------------------------------------------------------------------------


def hashing_program(block_size: int, prompt: list[int], arrivals: list[list[int]], salt=None, seed=0) -> list:
    """A request's block hashes after its prompt, then after each batch of tokens appended to it."""
    r = Request("r", list(prompt), SamplingParams(max_tokens=64), 64, cache_salt=salt)
    none = make_none_hash(seed)
    seen = []
    for tokens in [[], *arrivals]:
        r.all_token_ids.extend(tokens)
        result = attempt(update_block_hashes, r, block_size, none)
        seen.append([result, hexes(r.block_hashes)])
    return seen


def hashes_chain_as_blocks_fill(rng):
    return hashing_program(4, list(range(2, 12)), [[12], [13, 14], [15, 16, 17, 18, 19], []])


def a_salt_changes_every_hash(rng):
    return hashing_program(2, [5, 6, 7, 8, 9], [[3, 4]], salt="tenant") + hashing_program(2, [5, 6, 7, 8, 9], [[3]])


def hashing_random(rng):
    prompt = [rng.randrange(2, 40) for _ in range(rng.randrange(0, 20))]
    arrivals = [[rng.randrange(2, 40) for _ in range(rng.randrange(0, 6))] for _ in range(rng.randrange(1, 6))]
    salt = rng.choice((None, None, "a", "b"))
    return hashing_program(rng.choice((1, 2, 3, 4, 16)), prompt, arrivals, salt, seed=rng.randrange(3))


# -- prefix-index -------------------------------------------------------------------------------------------------


def index_program(ops: list) -> list:
    """("insert", block, key) / ("get", key) / ("evict", block) on a HashChainIndex over blocks 0..7 (keys are
    hashes of small ints); after each: its result, every block's hash key (or None), the index's size."""
    index, blocks = HashChainIndex(), [KVCacheBlock(i) for i in range(8)]
    key = lambda k: hash_block_tokens(make_none_hash(0), (k,))  # noqa: E731
    names = {key(k): k for k in range(16)}
    calls = {
        "insert": lambda b, k: index.insert(blocks[b], key(k)),
        "get": lambda k: (lambda got: None if got is None else got.block_id)(index.get(key(k))),
        "evict": lambda b: index.evict(blocks[b]),
    }
    seen = []
    for op, *args in ops:
        result = attempt(calls[op], *args)
        seen.append([op, args, result, [names.get(b.block_hash, b.block_hash) for b in blocks], len(index)])
    return seen


def insert_once_get_and_forget(rng):
    ops = [("get", 1), ("insert", 0, 1), ("get", 1), ("insert", 3, 1), ("get", 1), ("evict", 0), ("get", 1),
           ("evict", 0), ("insert", 3, 1), ("get", 1), ("insert", 4, 2), ("evict", 5)]  # fmt: skip
    return index_program(ops)


def index_random(rng):
    ops = []
    for _ in range(30):
        op = rng.choice(("insert", "insert", "get", "get", "evict"))
        if op == "insert":
            ops.append((op, rng.randrange(8), rng.randrange(6)))
        else:
            ops.append((op, rng.randrange(8 if op == "evict" else 6)))
    return index_program(ops)


# -- caching-pool -------------------------------------------------------------------------------------------------


def pool_program(num_blocks: int, ops: list) -> list:
    """On a CachingBlockPool: ("allocate", n), ("free", ids), ("touch", ids), ("cache", id, key) (registered as a
    just-filled block). After each: its result, the free queue, every ref_cnt, the cached blocks' keys."""
    pool = CachingBlockPool(num_blocks)
    key = lambda k: hash_block_tokens(make_none_hash(0), (k,))  # noqa: E731
    names = {key(k): k for k in range(32)}
    calls = {
        "allocate": lambda n: [b.block_id for b in pool.allocate(n)],
        "free": lambda ids: pool.free([pool.blocks[i] for i in ids]),
        "touch": lambda ids: pool.touch([pool.blocks[i] for i in ids]),
        "cache": lambda i, k: pool.index.insert(pool.blocks[i], key(k)),
    }
    seen = []
    for op, *args in ops:
        result = attempt(calls[op], *args)
        free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        cached = sorted([b.block_id, names.get(b.block_hash)] for b in pool.index.blocks())
        seen.append([op, args, result, free, [b.ref_cnt for b in pool.blocks], cached])
    return seen


def a_hit_leaves_the_queue_and_reuse_evicts(rng):
    ops = [("allocate", 3), ("cache", 0, 7), ("cache", 1, 8), ("free", [2, 1, 0]), ("touch", [1]), ("allocate", 2),
           ("touch", [1]), ("free", [1]), ("free", [1]), ("allocate", 3)]  # fmt: skip
    return pool_program(5, ops)


def caching_pool_random(rng):
    if rng.random() < 0.5:
        return story(4, random_arrivals(rng, 4, rng.randrange(4, 9), 64, prefixes=2), block_size=rng.choice((1, 2, 4)),
                     num_kv_blocks=rng.randrange(24, 40), max_num_seqs=3)  # fmt: skip
    n, ops = rng.randrange(3, 10), []
    for k in range(20):
        op = rng.choice(("allocate", "free", "touch", "cache"))
        if op == "allocate":
            ops.append((op, rng.randrange(0, 3)))
        elif op == "cache":
            ops.append((op, rng.randrange(n), k % 5))
        else:
            ops.append((op, rng.sample(range(n), rng.randrange(1, 3))))
    return pool_program(n, ops)


# -- lookup -------------------------------------------------------------------------------------------------------


def lookup_program(block_size: int, num_blocks: int, prompts: list, caching: bool = True) -> list:
    """Admit each (id, tokens, salt) as the scheduler does (lookup_prefix, then allocate the rest), or free a
    request ("free", id). After each: the tokens it hit, its table, the cached blocks, the counters."""
    kv = PrefixCachingKVCacheManager(num_blocks, block_size, max_model_len=256, enable_caching=caching)
    live: dict[str, Request] = {}

    def admit(r):
        r.num_computed_tokens = hit = kv.lookup_prefix(r)
        new = kv.allocate_slots(r, r.num_tokens - hit)
        r.num_computed_tokens = r.num_tokens if new is not None else hit
        return [hit, new, [b.block_id for b in kv.get_computed_blocks(r)]]

    seen = []
    for rid, tokens, *salt in prompts:
        if tokens == "free":
            result = attempt(kv.free, live.pop(rid))
        else:
            live[rid] = Request(rid, list(tokens), SamplingParams(max_tokens=4), 4, cache_salt=(salt or [None])[0])
            result = attempt(admit, live[rid])
        cached = sorted(b.block_id for b in kv.pool.index.blocks())
        tables = {q: kv.get_block_ids(r) for q, r in live.items()}
        seen.append([rid, result, tables, cached, kv.prefix_cache_queries, kv.prefix_cache_hits])
    seen.append(attempt(kv.reset_prefix_cache))
    return seen


def the_longest_cached_run_hits(rng):
    a, b = list(range(2, 12)), list(range(2, 10)) + [40, 41, 42]
    return lookup_program(4, 8, [("a", a), ("a", "free"), ("b", b), ("c", a[:8]), ("d", a, "salt"), ("b", "free")])


def the_last_token_is_always_computed(rng):
    return lookup_program(2, 12, [("a", [5, 6, 7, 8]), ("b", [5, 6, 7, 8]), ("c", [5, 6, 7, 8, 9]), ("c", "free")])


def shared_prefixes_in_the_engine(rng):
    head = [7, 8, 9, 10, 11, 12]
    arrivals = [Arrival(0, "a", head + [2, 3], 2), Arrival(2, "b", head + [4], 3), Arrival(4, "c", head + [2, 3], 2),
                Arrival(5, "d", head, 2, n=2)]  # fmt: skip
    return story(4, arrivals, block_size=2, num_kv_blocks=16, max_num_seqs=2)


def lookup_random(rng):
    if rng.random() < 0.5:
        return story(4, random_arrivals(rng, 4, rng.randrange(4, 9), 64, prefixes=2), block_size=rng.choice((1, 2, 4)),
                     num_kv_blocks=rng.randrange(20, 40), max_num_seqs=rng.randrange(2, 4))  # fmt: skip
    heads = [[rng.randrange(2, 30) for _ in range(rng.randrange(2, 12))] for _ in range(2)]
    prompts, live = [], []
    for i in range(10):
        if live and rng.random() < 0.35:
            prompts.append((live.pop(rng.randrange(len(live))), "free"))
        else:
            tail = [rng.randrange(2, 30) for _ in range(rng.randrange(0, 5))]
            prompts.append((f"r{i}", rng.choice(heads) + tail, *(["s"] if rng.random() < 0.15 else [])))
            live.append(f"r{i}")
    return lookup_program(rng.choice((1, 2, 4)), rng.randrange(12, 30), prompts, caching=rng.random() < 0.9)


SCENARIOS = [
    TaskScenarios("block-hashing", (), (hashes_chain_as_blocks_fill, a_salt_changes_every_hash), hashing_random),
    TaskScenarios("prefix-index", (), (insert_once_get_and_forget,), index_random),
    TaskScenarios(
        "caching-pool", ("prefix-index", "block-hashing", "lookup"), (a_hit_leaves_the_queue_and_reuse_evicts,),
        caching_pool_random,
    ),
    TaskScenarios(
        "lookup",
        ("block-hashing", "prefix-index", "caching-pool"),
        (the_longest_cached_run_hits, the_last_token_is_always_computed, shared_prefixes_in_the_engine),
        lookup_random,
    ),
]  # fmt: skip
