"""Stage 4: a trace replayed through the stage-4 manager (lessons/replay.py): each policy on small traces worked by
hand, MIN never beaten, the radix index beside the hash chain, and LRU equal to the engine's own run."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab import LLM, SamplingParams
from pagedlab.kv.eviction import EVICTION_POLICIES
from pagedlab.kv.hashing import hash_block_tokens
from pagedlab.lessons import replay as replay_module
from pagedlab.lessons.replay import INDEXES, Replay, ReplayResult, infinite_pool, replay
from pagedlab.lessons.traces import TOKEN_LIMIT, TRACE_BLOCK_SIZE, TraceRequest, infinite_ceiling

pytestmark = pytest.mark.stage4
BLOCK = TRACE_BLOCK_SIZE


def req(*ids, out=1, t=0):
    """A request whose prompt is exactly its blocks (ids), and which holds no block more for its answer."""
    return TraceRequest(t, BLOCK * len(ids), out, tuple(ids))


# Pool of 3 blocks, one request at a time:  [1 2]  [3]  [1 2]  [4]  [3]  [1 2]
# LRU  (request 4 evicts 3, 5 evicts 2, 6 evicts 4):                 hits 0 0 2 0 0 1
# FIFO (4 evicts 1, the oldest, hit or not; 2 is stranded under it;
#       6 finds 1 gone and recomputes both, evicting 2 and 3):       hits 0 0 2 0 1 0
# LFU, SLRU (1 and 2 were used twice: 4 evicts 3, 5 evicts 4):       hits 0 0 2 0 0 2
# MIN  (4 evicts 2, used last; 6 evicts 4, never used again):        hits 0 0 2 0 1 1
T1 = [req(1, 2), req(3), req(1, 2), req(4), req(3), req(1, 2)]
T1_HITS = {
    "lru": ([0, 0, 2, 0, 0, 1], [0, 0, 0, 1, 1, 1]),
    "fifo": ([0, 0, 2, 0, 1, 0], [0, 0, 0, 1, 0, 2]),
    "lfu": ([0, 0, 2, 0, 0, 2], [0, 0, 0, 1, 1, 0]),
    "slru": ([0, 0, 2, 0, 0, 2], [0, 0, 0, 1, 1, 0]),
    "min": ([0, 0, 2, 0, 1, 1], [0, 0, 0, 1, 0, 1]),
}


@pytest.mark.parametrize("policy", sorted(T1_HITS))
def test_each_policy_on_a_trace_worked_by_hand(policy):
    result = replay(T1, policy, 3)
    hits, evictions = T1_HITS[policy]
    assert (result.hits, result.evictions) == (hits, evictions)
    assert [h + m for h, m in zip(result.hits, result.misses)] == [len(r.hash_ids) for r in T1]
    assert result.prompt_blocks == 9 and result.refused == 0
    assert result.hit_ratio == sum(hits) / 9
    # FIFO strands 2 under the evicted 1 for the arrivals of requests 5 and 6; the others never strand a block
    assert result.dead_blocks_mean == (2 / 6 if policy == "fifo" else 0)


def test_a_tree_keeps_fifo_from_stranding_blocks():
    # request 4 would take 1 (the oldest) but 1 has a child cached: the tree takes the leaf 2, then 1 stays a hit
    result = replay(T1, "fifo", 3, index="radix")
    assert result.hits == [0, 0, 2, 0, 1, 1] and result.dead_blocks_mean == 0


# Pool of 4 (SLRU protects at most 3): [1] x5, [2] x2, [3] x2, [4] x2, then [5], [2], [1].
# At request 12, LFU evicts 2 (two uses against 1's five), SLRU evicts 1 (the oldest protected, demoted when 4
# became protected), LRU and FIFO evict 1 too, and MIN evicts 3 (never used again; 4 neither, but freed later).
T2 = [req(1)] * 5 + [req(2)] * 2 + [req(3)] * 2 + [req(4)] * 2 + [req(5), req(2), req(1)]
T2_LAST = {"lfu": [0, 0, 1], "slru": [0, 1, 0], "lru": [0, 1, 0], "fifo": [0, 1, 0], "min": [0, 1, 1]}


@pytest.mark.parametrize("policy", sorted(T2_LAST))
def test_old_popularity_lfu_keeps_and_slru_lets_go(policy):
    result = replay(T2, policy, 4)
    assert result.hits[:11] == [0, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1]
    assert result.hits[11:] == T2_LAST[policy]


def test_infinite_is_the_readme_count():
    result = replay(T1, "infinite")
    assert result.hits == [0, 0, 2, 0, 1, 2] and (sum(result.hits), 9) == infinite_ceiling(T1)
    assert result.pool_blocks is None and sum(result.evictions) == 0


def test_the_infinite_pool_holds_every_distinct_prompt_block_and_the_answers_in_flight(monkeypatch):
    # 10 requests, each one new prompt block and an answer of 5 blocks: 60 blocks in all, but one at a time the
    # pool never holds more than the 10 cached prompt blocks and one answer (15); two at a time, two answers (20).
    # An answer's blocks have no hash: freed, they are reused before the never-used blocks and the cached ones.
    trace = [req(i, out=5 * BLOCK) for i in range(10)] + [req(3), req(7)]
    built = []

    class Spy(Replay):  # notes the size of each pool the replay builds
        def __init__(self, requests, pool_blocks, *rest):
            built.append(pool_blocks)
            super().__init__(requests, pool_blocks, *rest)

    monkeypatch.setattr(replay_module, "Replay", Spy)
    for concurrency, pool in ((1, 15), (2, 20), (12, 60)):
        result = replay(trace, "infinite", concurrency=concurrency)
        assert built.pop() == pool == infinite_pool(trace, concurrency)
        assert result.hits == [0] * 10 + [1, 1] and sum(result.evictions) == 0


def test_an_infinite_pool_is_sized_by_what_the_trace_holds():
    # before, the pool was the sum of every request's blocks: one answer of 10**12 tokens, a MemoryError after 22 s
    with pytest.raises(ValueError, match=r"trace, request 2: output_length must be an integer in 0..16,777,216"):
        replay([req(1), TraceRequest(0, 1, 10**12, (2,))], "infinite")
    # 10 requests of 1 + 2**24 - 1 tokens (32,768 blocks: the prompt's and 32,767 for the answer) were 327,680 blocks;
    # one at a time, 10 prompt blocks and one answer do
    trace = [TraceRequest(0, 1, TOKEN_LIMIT, (i,)) for i in range(10)]
    assert infinite_pool(trace, 1) == 10 + 32_767 and infinite_pool(trace, 3) == 10 + 3 * 32_767
    with pytest.raises(ValueError, match="trace: a pool that never evicts it needs 327,680 blocks .* over the 300,000"):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(replay_module, "POOL_LIMIT", 300_000)
            replay(trace, "infinite", concurrency=10)


def test_the_bundled_synthetic_trace_reaches_the_readme_ceiling():
    assert f"{replay('synthetic', 'infinite').hit_ratio:.1%}" == "64.0%"


@pytest.mark.slow
def test_the_bundled_conversation_trace_reaches_the_readme_ceiling():
    assert f"{replay('conversation', 'infinite').hit_ratio:.1%}" == "36.6%"


def test_a_request_larger_than_the_pool_is_refused_and_its_blocks_missed():
    result = replay([req(1, 2, 3), req(1), req(1, 2, 3)], "lru", 2)
    assert result.refused == 2 and result.hits == [0, 0, 0] and result.prompt_blocks == 7
    assert result.misses == [3, 1, 3]


def test_an_answer_takes_blocks_too():
    # 512 prompt tokens and 600 generated: 1,111 tokens hold K/V, 3 blocks; a pool of 3 holds it, of 2 refuses it
    trace = [req(1, out=600), req(1)]
    assert replay(trace, "lru", 3).hits == [0, 1]
    assert replay(trace, "lru", 2).refused == 1


def test_requests_in_flight_share_their_blocks_and_wait_for_room():
    # with two in flight, request 2 hits block 1 while request 1 still holds it
    assert replay([req(1, 2), req(1, 3)], "lru", 4, concurrency=2).hits == [0, 1]
    # a pool of 3 cannot hold both: request 2 waits for request 1 to end (it is not refused)
    result = replay([req(1, 2), req(5, 6), req(1)], "lru", 3, concurrency=2)
    assert result.refused == 0 and result.hits == [0, 0, 1]


def test_a_host_tier_keeps_what_the_pool_evicts():
    # pool 2, tier 2: request 3 evicts 1 into the tier; request 4 finds it there (promoted), evicting 2 into it
    trace = [req(1), req(2), req(3), req(1), req(2)]
    result = replay(trace, "lru", 2, tier_blocks=2)
    assert result.hits == [0, 0, 0, 0, 0] and result.tier_hits == [0, 0, 0, 1, 1]
    assert result.misses == [1, 1, 1, 0, 0]
    assert result.hit_ratio == 2 / 5 and result.saved_ratio == pytest.approx(2 * 0.8 / 5)
    assert replay(trace, "lru", 2).hit_ratio == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "random"}, "policy: 'random' is not one of lru, fifo, lfu, slru, min, infinite"),
        ({"index": "trie"}, "index: 'trie' is not one of hash-chain, radix"),
        ({"pool_blocks": 0}, "pool_blocks must be an integer >= 1"),
        ({"tier_blocks": -1}, "tier_blocks must be an integer >= 0"),
        ({"concurrency": 1.5}, "concurrency must be an integer >= 1"),
        ({"pool_blocks": 1 << 40}, "pool_blocks must be at most 2,097,152 .*, got 1,099,511,627,776"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        replay(T1, **{"policy": "lru", "pool_blocks": 3, **kwargs})


def test_a_trace_is_a_name_a_path_or_requests():
    with pytest.raises(ValueError, match="trace: expected a name, a path, or a non-empty list of TraceRequest"):
        replay([], "lru", 3)


@st.composite
def random_traces(draw):
    """Requests walking a random tree of blocks (prefixes shared at random), answers of 0 to 2 blocks more."""
    ids: dict = {}
    trace = []
    for _ in range(draw(st.integers(1, 24))):
        path = draw(st.lists(st.integers(0, 2), min_size=1, max_size=5))
        hashes = tuple(ids.setdefault(tuple(path[: i + 1]), len(ids)) for i in range(len(path)))
        trace.append(TraceRequest(0, BLOCK * len(hashes), draw(st.sampled_from([1, 300, 900])), hashes))
    largest = max(r.num_blocks for r in trace)
    return trace, draw(st.integers(max(1, largest - 1), largest + 6))  # sometimes too small: refusals


@given(case=random_traces())
def test_min_is_never_beaten(case):
    """Belady's MIN is the ceiling of every policy and index, and the infinite pool is MIN's."""
    trace, pool = case
    best = sum(replay(trace, "min", pool).hits)
    for policy in set(EVICTION_POLICIES) - {"min"}:
        for index in INDEXES:
            assert sum(replay(trace, policy, pool, index=index).hits) <= best, (policy, index)
    assert best <= infinite_ceiling(trace)[0]


@given(case=random_traces())
def test_the_tree_gives_the_chains_hits_where_it_must_and_never_strands_a_block(case):
    """One at a time, LRU, LFU, SLRU and MIN never evict a block before its descendants (a parent is freed after
    its children, and used whenever they are), so the two indexes cannot differ; a tree never holds a block it
    cannot reach, whatever the policy."""
    trace, pool = case
    for policy in ("lru", "lfu", "slru", "min"):
        chain = replay(trace, policy, pool)
        assert chain.hits == replay(trace, policy, pool, index="radix").hits and chain.dead_blocks_mean == 0
    for policy in EVICTION_POLICIES:
        assert replay(trace, policy, pool, index="radix").dead_blocks_mean == 0


@given(case=random_traces())
def test_an_lru_tier_as_large_as_the_pool_is_a_pool_twice_as_large(case):
    """One at a time, an exclusive LRU tier of P behind an LRU pool of P is one LRU list of 2P cut in two: the pool
    hands out its blocks with no hash first, so cached blocks leave it oldest first, into the tier's newest end."""
    trace, pool = case
    pool = max(pool, max(r.num_blocks for r in trace))  # nothing refused by the smaller pool
    tiered, doubled = replay(trace, "lru", pool, tier_blocks=pool), replay(trace, "lru", 2 * pool)
    assert [a + b for a, b in zip(tiered.hits, tiered.tier_hits)] == doubled.hits


@given(case=random_traces(), concurrency=st.integers(1, 4), policy=st.sampled_from(sorted(EVICTION_POLICIES)),
       index=st.sampled_from(sorted(INDEXES)), tier=st.integers(0, 3))  # fmt: skip
def test_any_replay_keeps_the_pools_invariants_and_frees_everything(case, concurrency, policy, index, tier):
    trace, pool = case
    run = Replay(trace, pool, EVICTION_POLICIES[policy], index, tier, concurrency)
    result = ReplayResult("random", policy, index, pool, tier, concurrency)
    run.run(result)
    run.kv.check_invariants()
    assert run.kv.pool.num_free == pool and not run.kv.req_to_blocks
    assert 0 <= result.hit_ratio <= 1 and len(result.hits) == len(trace)
    assert result.hit_ratio <= infinite_ceiling(trace)[0] / result.prompt_blocks
    # the infinite pool, sized by the distinct blocks and the answers in flight, evicts nothing (replay checks it)
    ceiling = replay(trace, "infinite", index=index, concurrency=concurrency)
    assert (sum(ceiling.hits), ceiling.prompt_blocks) == infinite_ceiling(trace) and ceiling.refused == 0


def stage4_and_trace(seed: int):
    """Prompts of real tokens sharing beginnings, each 4k + 1 tokens (k full blocks of 4 and one token), with the
    trace that names the same blocks: ids for the full blocks' prefixes, a fresh id for the last token's block, and
    the lengths scaled by 128 so that each request holds as many blocks of 512 as the engine's of 4. Answers are 5 to
    7 tokens: the engine's last prompt block then fills and is cached (to the free queue's tail, as the replay's
    cached last block), and its one answer block is not (to the head, as the replay's answer block); an answer of
    1 to 4 tokens would leave the engine's last block unhashed while the replay caches it under its id."""
    rng = random.Random(seed)
    starts = [[rng.randrange(3, 60) for _ in range(8)] for _ in range(3)]
    prompts, outs = [], []
    for _ in range(16):
        base = rng.choice(starts + [p[: 4 * ((len(p) - 1) // 4)] for p in prompts])
        prompt = base + [rng.randrange(3, 60) for _ in range(4 * rng.randrange(0, 2))] + [rng.randrange(3, 60)]
        prompts.append(prompt), outs.append(rng.randrange(5, 8))
    ids: dict = {}
    trace = []
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        k = (len(prompt) - 1) // 4
        hashes = [ids.setdefault(tuple(prompt[: 4 * (j + 1)]), len(ids)) for j in range(k)] + [10_000 + i]
        trace.append(TraceRequest(0, BLOCK * k + 1, 128 * out, tuple(hashes)))
    return prompts, outs, trace, ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lru_replay_equals_the_engines_own_stage4_run(seed):
    """The engine serves the prompts one at a time (max_num_seqs=1) in a pool of 12 blocks of 4; the replay of the
    same blocks through a pool of 12 finds the same hits, and ends with the same prompt blocks cached."""
    prompts, outs, trace, ids = stage4_and_trace(seed)
    llm = LLM(stage="prefix", block_size=4, num_kv_blocks=12, max_num_seqs=1, seed=0)
    params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for o in outs]
    engine_hits = [o.num_cached_tokens // 4 for o in llm.generate(prompts, params, use_tqdm=False)]
    run = Replay(trace, 12, EVICTION_POLICIES["lru"], "hash-chain", 0, 1)
    result = ReplayResult("real tokens", "lru", "hash-chain", 12, 0, 1)
    run.run(result)
    assert result.hits == engine_hits and sum(engine_hits) > 0
    kv = llm.engine.kv_manager
    cached = kv.pool.index.cached_block_hash_to_block
    engine_cached = {i for prefix, i in ids.items() if _hash(kv.none_hash, prefix) in cached}
    assert engine_cached == {h for h in run.kv.pool.index.cached_block_hash_to_block if h < 10_000}


def _hash(none_hash, prefix):
    parent = none_hash
    for j in range(0, len(prefix), 4):
        parent = hash_block_tokens(parent, prefix[j : j + 4])
    return parent
