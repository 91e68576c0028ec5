"""Stage 4: a trace replayed through the real prefix cache, block by block, with no model: what a bounded pool keeps.

Builds on: kv/prefix.py (the stage-4 manager: its caching pool, take_hits, free), kv/eviction.py (the policies),
kv/radix.py (the tree index), kv/tier.py (the host tier), lessons/traces.py (the traces).
Read with: chapters/04-prefix-caching.md (Real traffic).

Each request of the trace, in arrival order, with at most `concurrency` in flight:

    1. the oldest requests in flight end: `free` gives their blocks back, last block first, keeping their hashes
    2. its hash_ids are looked up: the longest run found in the pool (hits), then in the host tier (promoted)
    3. the manager takes the hits and allocates the rest of its blocks, prompt and answer; the pool evicts
       what the eviction policy gives it
    4. its prompt blocks are registered under their ids, each under its parent

The pool, the index, the free queue and the manager are the engine's own
stage-4 classes, driven without tokens: an id stands for a block's hash.
tests/lessons/test_replay.py checks that LRU here gives the hits a real
stage-4 run gives on the same prompts. Unlike the engine, the replay caches
the partly filled last block of a prompt under its id and lets a lookup reach
it, as the trace's README counts (the engine caches full blocks only and
always computes the last prompt token); a request's answer is never cached.

A request that needs more blocks than the whole pool is refused (counted; its
blocks are misses). Besides hits, the replay counts evictions and dead weight:
cached blocks one of whose ancestors is not cached, which no lookup can reach.

The infinite pool (policy "infinite") is sized by what the trace holds: its
distinct prompt blocks, and the answers in flight at most (`infinite_pool`).
It must evict nothing: an InvariantError says if it did.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import FreeKVCacheBlockQueue
from pagedlab.kv.eviction import EVICTION_POLICIES, BeladyQueue, LRUQueue, NextUse
from pagedlab.kv.hashing import HashChainIndex
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.kv.radix import RadixIndex
from pagedlab.kv.tier import HostTier
from pagedlab.lessons.traces import TRACE_BLOCK_SIZE, TraceRequest, check_request, load_trace

TRANSFER_COST = 0.2  # a block promoted from the host tier costs this share of computing it (chapter 4)
# blocks of a pool a replay may build: 1.1 G tokens, 32 x the bench's largest pool; each block is ~120
# bytes of Python objects here (250 MB at the limit), built at ~2 s per million
POOL_LIMIT = 1 << 21


class DeadWeight:
    """Mixed into an index class (see INDEXES): as the index inserts and evicts, it keeps which cached hashes are
    live (every ancestor cached), counts evictions, and demotes evicted hashes to the host tier. Dead weight =
    cached blocks - live ones. Each event is O(1) but for a block with cached children, whose subtree changes
    state with it (rare but for policies that ignore the chain, such as FIFO)."""

    def __init__(self):
        super().__init__()
        self.parent_of: dict = {}  # cached hash -> its parent's hash (None for a first block)
        self.children_of: dict = {}  # hash -> the cached hashes under it (no entry: none)
        self.live: set = set()  # cached hashes whose every ancestor is cached
        self.evictions = 0  # cached blocks evicted so far
        self.tier: HostTier | None = None  # where evicted hashes are demoted, if anywhere

    def insert(self, block, block_hash, parent=None) -> bool:
        if not super().insert(block, block_hash, parent):
            return False
        self.parent_of[block_hash] = parent
        siblings = self.children_of.get(parent)
        if siblings is None:
            self.children_of[parent] = {block_hash}
        else:
            siblings.add(block_hash)
        if self.tier is not None:
            self.tier.forget(block_hash)  # back in the pool: the tier stays exclusive
        if parent is None or parent in self.live:
            self.live.add(block_hash)
            if block_hash in self.children_of:  # cached blocks under it were dead: reachable again
                self._spread(block_hash, self.live.add, lambda h: h not in self.live)
        return True

    def evict(self, block) -> None:
        block_hash = block.block_hash
        if block_hash is None:  # (the pool asks for every block it takes, cached or not)
            return
        super().evict(block)
        self.evictions += 1
        parent = self.parent_of.pop(block_hash)
        siblings = self.children_of[parent]
        siblings.discard(block_hash)
        if not siblings:
            del self.children_of[parent]
        if block_hash in self.live:
            self.live.discard(block_hash)
            if block_hash in self.children_of:  # its cached subtree can no longer be reached
                self._spread(block_hash, self.live.discard, self.live.__contains__)
        if self.tier is not None:
            self.tier.demote(block_hash)

    def _spread(self, root, mark, follow) -> None:
        """Mark every cached block under `root` that `follow` accepts, and theirs."""
        stack = [c for c in self.children_of[root] if follow(c)]
        while stack:
            h = stack.pop()
            mark(h)
            stack.extend(c for c in self.children_of.get(h, ()) if follow(c))


INDEXES = {"hash-chain": HashChainIndex, "radix": RadixIndex}  # the prefix indexes, by name
_WATCHED = {name: type(f"Watched{cls.__name__}", (DeadWeight, cls), {}) for name, cls in INDEXES.items()}


@dataclass(slots=True)
class InFlight:
    """A replayed request, as the manager sees it (take_hits counts its tokens; free finds it by id)."""

    request_id: str
    num_tokens: int


@dataclass
class ReplayResult:
    """One replay: per request (in the trace's order) and in total."""

    trace: str  # the trace's name
    policy: str  # a name of EVICTION_POLICIES, or "infinite": a pool that never evicts (the ceiling)
    index: str  # a name of INDEXES
    pool_blocks: int | None  # the pool's blocks (None: infinite)
    tier_blocks: int  # the host tier's blocks (0: none)
    concurrency: int  # requests in flight at most
    hits: list[int] = field(default_factory=list)  # per request: prompt blocks found in the pool
    tier_hits: list[int] = field(default_factory=list)  # per request: prompt blocks promoted from the host tier
    misses: list[int] = field(default_factory=list)  # per request: prompt blocks computed (all, if refused)
    evictions: list[int] = field(default_factory=list)  # per request: cached blocks evicted to make its room
    prompt_blocks: int = 0  # every prompt block of the trace, refused requests' included
    refused: int = 0  # requests that need more blocks than the pool has
    dead_blocks_mean: float = 0.0  # cached blocks no lookup can reach, averaged over the requests' arrivals

    @property
    def hit_ratio(self) -> float:
        """Prompt blocks served from a cache (the pool or the tier) over all prompt blocks."""
        return (sum(self.hits) + sum(self.tier_hits)) / self.prompt_blocks

    @property
    def tier_hit_ratio(self) -> float:
        return sum(self.tier_hits) / self.prompt_blocks

    @property
    def saved_ratio(self) -> float:
        """Prefill saved, in blocks of compute: a tier hit saves all but TRANSFER_COST of a block."""
        return (sum(self.hits) + (1 - TRANSFER_COST) * sum(self.tier_hits)) / self.prompt_blocks


def replay(
    trace, policy: str = "lru", pool_blocks: int | None = 8192, *, index: str = "hash-chain", tier_blocks: int = 0,
    concurrency: int = 1,
) -> ReplayResult:  # fmt: skip
    """Replay `trace` (a name, a path or a list of TraceRequest) through a stage-4 pool of `pool_blocks` blocks of
    TRACE_BLOCK_SIZE tokens, evicting by `policy`, finding prefixes with `index`, over a host tier of
    `tier_blocks`. policy="infinite" ignores pool_blocks: a pool that never evicts."""
    _check(policy, index, pool_blocks, tier_blocks, concurrency)
    name, requests = _requests(trace)
    if policy == "infinite":
        pool_blocks, policy_cls = infinite_pool(requests, concurrency), EVICTION_POLICIES["lru"]
    else:
        policy_cls = EVICTION_POLICIES[policy]
    result = ReplayResult(name, policy, index, None if policy == "infinite" else pool_blocks, tier_blocks, concurrency)
    Replay(requests, pool_blocks, policy_cls, index, tier_blocks, concurrency).run(result)
    if policy == "infinite" and sum(result.evictions):
        raise InvariantError(f"the infinite pool of {pool_blocks} blocks evicted {sum(result.evictions)} blocks")
    return result


def infinite_pool(requests: list[TraceRequest], concurrency: int) -> int:
    """The blocks a pool needs never to evict on this trace: one per distinct prompt block (each is cached once, and
    stays), and the most answer blocks the requests in flight hold at once (the `concurrency` latest requests; an
    answer's blocks get no hash, so freed they are reused before any cached block and before the never-used ones).
    Sized by what the trace holds, not by the sum of every request's blocks, which an answer of many tokens in
    each of many requests makes larger than any memory; refused beyond POOL_LIMIT."""
    answers = [r.num_blocks - len(r.hash_ids) for r in requests]
    window = most = sum(answers[:concurrency])
    for i in range(concurrency, len(answers)):  # the sum over each run of `concurrency` requests in a row
        window += answers[i] - answers[i - concurrency]
        most = max(most, window)
    blocks = len({h for r in requests for h in r.hash_ids}) + most
    if blocks > POOL_LIMIT:
        raise ValueError(
            f"trace: a pool that never evicts it needs {blocks:,} blocks (its distinct prompt blocks and the answers "
            f"in flight), over the {POOL_LIMIT:,} a replay may build"
        )
    return max(1, blocks)


def _requests(trace) -> tuple[str, list[TraceRequest]]:
    if isinstance(trace, (list, tuple)):
        if not trace or not all(isinstance(r, TraceRequest) for r in trace):
            raise ValueError("trace: expected a name, a path, or a non-empty list of TraceRequest")
        for n, r in enumerate(trace, 1):  # as a file's line is checked: no count larger than a trace may hold
            check_request(r, f"trace, request {n}")
        return "custom", list(trace)
    return str(getattr(trace, "stem", trace)), list(load_trace(trace))


def _check(policy, index, pool_blocks, tier_blocks, concurrency) -> None:
    policies = (*EVICTION_POLICIES, "infinite")  # read at each call: a learner's own policy may have joined
    if policy not in policies:
        raise ValueError(f"policy: {policy!r} is not one of {', '.join(policies)}")
    if index not in INDEXES:
        raise ValueError(f"index: {index!r} is not one of {', '.join(INDEXES)}")
    counts = [("tier_blocks", tier_blocks, 0), ("concurrency", concurrency, 1)]
    if policy != "infinite":  # an infinite pool has no size
        counts.append(("pool_blocks", pool_blocks, 1))
    for name, value, low in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if policy != "infinite" and pool_blocks > POOL_LIMIT:  # (a tier is a map of the hashes it holds: no limit)
        raise ValueError(
            f"pool_blocks must be at most {POOL_LIMIT:,} (every block is built at once), got {pool_blocks:,}"
        )


class Replay:
    """One replay's state: the stage-4 manager, what watches its index, the tier, the requests in flight."""

    def __init__(self, requests, pool_blocks: int, policy_cls: type, index: str, tier_blocks: int, concurrency: int):
        self.requests = requests
        self.admitted = [r.num_blocks <= pool_blocks for r in requests]  # False: refused
        eviction, self.future = policy_cls, None
        if policy_cls is LRUQueue and index == "hash-chain":
            eviction = FreeKVCacheBlockQueue  # nothing to keep: the engine's own queue, exactly
        if policy_cls is BeladyQueue:  # MIN reads the future: the requests it will actually see
            self.future = NextUse([r.hash_ids for r, ok in zip(requests, self.admitted) if ok])
            eviction = BeladyQueue.for_future(self.future)
        self.kv = PrefixCachingKVCacheManager(
            pool_blocks, TRACE_BLOCK_SIZE, pool_blocks * TRACE_BLOCK_SIZE, prefix_index=_WATCHED[index],
            eviction=eviction,
        )  # fmt: skip
        self.tier = HostTier(tier_blocks) if tier_blocks else None
        self.watcher: DeadWeight = self.kv.pool.index  # the index, with DeadWeight mixed in
        self.watcher.tier = self.tier
        self.concurrency = concurrency
        self.in_flight: deque[InFlight] = deque()

    def run(self, result: ReplayResult) -> None:
        dead = 0
        for i, r in enumerate(self.requests):
            result.prompt_blocks += len(r.hash_ids)
            if not self.admitted[i]:
                result.refused += 1
                self.record(result, len(r.hash_ids), 0, 0, 0)  # every block a miss
                continue
            while len(self.in_flight) >= self.concurrency:
                self.kv.free(self.in_flight.popleft())
            dead += len(self.kv.pool.index) - len(self.watcher.live)
            self.admit(i, r, result)
        while self.in_flight:
            self.kv.free(self.in_flight.popleft())
        result.dead_blocks_mean = dead / max(1, len(self.requests) - result.refused)

    def admit(self, i: int, r: TraceRequest, result: ReplayResult) -> None:
        """Steps 2-4 for one request: look up, make room, take the hits, allocate, register."""
        ids, pool, kv = r.hash_ids, self.kv.pool, self.kv
        if self.future is not None:
            self.future.advance()
        hits = self.lookup(ids)
        promoted = self.promote(ids, len(hits))
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)  # taking them takes them off the free queue
        while r.num_blocks - len(hits) > pool.num_free - free_hits:  # wait for requests in flight to end
            released = self.in_flight.popleft()
            kv.free(released)
            free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        request = InFlight(str(i), r.input_length)
        kv.take_hits(request, hits)
        evictions = self.watcher.evictions
        table = kv.req_to_blocks[request.request_id]
        table.extend(pool.allocate(r.num_blocks - len(hits)))
        insert = pool.index.insert
        for j in range(len(hits), len(ids)):
            insert(table[j], ids[j], ids[j - 1] if j else None)
        self.in_flight.append(request)
        self.record(result, len(ids), len(hits), promoted, self.watcher.evictions - evictions)

    @staticmethod
    def record(result: ReplayResult, blocks: int, hits: int, promoted: int, evictions: int) -> None:
        result.hits.append(hits)
        result.tier_hits.append(promoted)
        result.misses.append(blocks - hits - promoted)
        result.evictions.append(evictions)

    def lookup(self, ids) -> list:
        """The longest run of the prompt's blocks cached in the pool (get_computed_blocks' walk)."""
        get, hits = self.kv.pool.index.get, []
        for h in ids:
            block = get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def promote(self, ids, start: int) -> int:
        """The run after the pool's hits that the host tier holds: each promoted (it will get a GPU block)."""
        if self.tier is None:
            return 0
        n = start
        while n < len(ids) and self.tier.promote(ids[n]):
            n += 1
        return n - start
